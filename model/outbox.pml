/*
 * outbox.pml -- database -> bus for the outbox (and any feed whose ids are
 * drawn from a sequence, like the late feed of egress.pml): drawn-feed
 * markers, the id sequence's last value L, the cursor.
 *
 * Writers. Outbox row ids 1..N come from one sequence, drawn in increasing
 * order (nextval); commit order is not id order. A writer transaction
 *   1. takes a drawn-feed marker naming the sequence's LAST value at that
 *      moment (so every id it draws afterwards is above the marker);
 *   2. draws its id (or two ids, one after the other, with the one marker
 *      taken before the first) and inserts the row;
 *   3. commits -- or rolls back (at most MAX_ABORTS times): its ids are never
 *      used again (sequences do not roll back), which leaves a gap.
 * Either three writers drawing one id each, or one drawing one id and one
 * drawing two. One more transaction never touches the feed: it began before
 * every writer and stays open forever. Nothing here looks at it (no
 * cluster-wide xmin horizon), and DONE must hold although it never ends
 * (outbox_counterexample_horizon_gated.pml shows what it does otherwise).
 *
 * The egress (one batch), in this order:
 *   a. L := the sequence's last value;
 *   b. M := the lowest marker value held now (no bound if none);
 *   c. S := what is committed now;
 *   d. hands out, in id order, the rows with id in (cursor, min(L, M)]
 *      visible in S, at most 1 or 2 of them (its budget).
 * Why nothing is skipped: an id <= L was drawn before L was read, so its
 * writer took its marker before the listing: either it is listed (and its
 * marker value is below its ids, which caps the batch) or it has ended, and
 * then S sees its rows or they were rolled back. A writer that takes its
 * marker after L was read draws ids above L.
 * Writers run between any two of these steps. The egress publishes each row,
 * waits for the bus ack (a publish can be lost: no ack, publish again), and
 * when all are acked moves its durable cursor to the last row handed out, in
 * a database transaction that may roll back (the next batch reads the rows
 * again). The bus deduplicates by message id. The egress can crash between
 * any two steps and restarts from the durable cursor.
 *
 * Property (ltl spec):
 *   [] SAFE  : (a) every committed row at or below the cursor is on the bus,
 *              and (b) no row is on the bus more than once;
 *   <> DONE  : (c) eventually every writer has ended, every row that
 *              committed is on the bus exactly once, and the cursor is at
 *              the highest committed row (nothing left to hand out) -- with
 *              weak fairness and finitely many crashes, rollbacks and lost
 *              publishes, while the unrelated transaction is still open;
 *   assert   : (d) the cursor only ever moves forward (checked at each
 *              update).
 * The macros below spell out ids 1..3 and writers 1..3: extend them if N
 * changes.
 */

#define N              3
#define MAX_CRASHES    2
#define MAX_ABORTS     1
#define MAX_LOST       1
#define MAX_ROLLBACKS  1
#define NONE           (N+1)	/* "no marker" */

/* database: the outbox */
byte last;		/* the id sequence's last value (ids 1..last drawn) */
bool committed[N+1];	/* committed[k]: the row with id k committed */
byte marker[N+1];	/* marker[w]: the value writer w's marker names, NONE if none */
bool finished[N+1];	/* finished[w]: writer w committed or rolled back */
byte cursor;		/* the egress's durable cursor (last row handed out) */

bool unrelated_open;	/* the transaction that never touches the feed */

/* bus: copies of each message id on the stream */
byte copies[N+1];

/* how much bad luck has been spent (bounded so that "eventually" can hold) */
byte crashes;
byte aborts;
byte lost;
byte rollbacks;

/* a snapshot: bit k set when row k is committed */
#define SNAPSHOT       ((committed[1] -> 2 : 0) | (committed[2] -> 4 : 0) | \
                        (committed[3] -> 8 : 0))
#define IN(snap, k)    ((snap & (1 << (k))) != 0)
#define MIN(a, b)      (a < b -> a : b)
/* the lowest marker value held right now, NONE if there is none */
#define LOWEST_MARKER  MIN(marker[1], MIN(marker[2], marker[3]))
/* the cursor is at the highest committed row (0 if none); spelled without
   "a -> b : c", which an ltl formula would read as an implication */
#define AT_TOP         ((committed[3] && cursor == 3) || \
                        (!committed[3] && committed[2] && cursor == 2) || \
                        (!committed[3] && !committed[2] && committed[1] && cursor == 1) || \
                        (!committed[3] && !committed[2] && !committed[1] && cursor == 0))

#define ON_BUS(k)      (copies[k] > 0)
#define BEHIND_OK(k)   ((cursor < k || !committed[k] || ON_BUS(k)) && copies[k] <= 1)
#define SAFE           (BEHIND_OK(1) && BEHIND_OK(2) && BEHIND_OK(3))
#define ROW_DONE(k)    (!committed[k] || copies[k] == 1)
#define DONE           (finished[1] && finished[2] && finished[3] && \
                        ROW_DONE(1) && ROW_DONE(2) && ROW_DONE(3) && AT_TOP)

ltl spec { [] SAFE && <> DONE }

/* the same safety part as a plain assertion, so a break of it is reported by
   name instead of only as an acceptance cycle of the claim */
active proctype Safety() {
	atomic { !SAFE -> assert(SAFE) }
}

/* the process may die here: all volatile state is lost */
#define MAYBE_CRASH \
	if \
	:: crashes < MAX_CRASHES -> crashes++; goto crashed \
	:: true \
	fi

/* the bus stores the message unless it already holds that id */
inline bus_store(k) {
	if
	:: copies[k] == 0 -> copies[k] = 1
	:: else -> skip
	fi
}

/* publish row k and wait for the ack (lost publishes are sent again) */
inline publish(k) {
	do
	:: lost < MAX_LOST ->
		lost++;			/* lost on the way: no ack, try again */
		MAYBE_CRASH
	:: bus_store(k);
		MAYBE_CRASH;		/* stored, ack not yet received */
		assert(ON_BUS(k));	/* the ack vouches for it */
		break
	od
}

/* writer w draws `draws` ids (1 or 2) in one transaction */
proctype Writer(byte w; byte draws) {
	byte first, second;	/* the ids it drew, 0 if none */

	marker[w] = last;			/* 1. marker: the last value */
	d_step { last++; first = last };	/* 2. nextval; INSERT */
	if
	:: draws == 2 ->
		d_step { last++; second = last }	/* nextval; INSERT */
	:: else -> skip
	fi;
	if
	:: d_step {				/* 3. COMMIT */
		committed[first] = true;
		if
		:: second != 0 -> committed[second] = true
		:: else -> skip
		fi;
		marker[w] = NONE;
		finished[w] = true;
		first = 0; second = 0
	   }
	:: aborts < MAX_ABORTS ->		/* 3'. ROLLBACK: the ids are a gap */
		d_step {
			aborts++;
			marker[w] = NONE;
			finished[w] = true;
			first = 0; second = 0
		}
	fi
}

/* who writes what (N = 3 ids in all); the unrelated transaction began before
   all of them */
init {
	atomic {
		marker[1] = NONE; marker[2] = NONE; marker[3] = NONE;
		unrelated_open = true;	/* BEGIN; writes elsewhere; never ends */
		if
		:: run Writer(1, 1); run Writer(2, 1); run Writer(3, 1)
		:: run Writer(1, 1); run Writer(2, 2); finished[3] = true
		fi
	}
}

active proctype Egress() {
	byte c;			/* durable cursor as last known */
	byte L;			/* the sequence's last value, read first */
	byte m;			/* lowest marker value in the listing */
	byte s;			/* snapshot S */
	byte bound;		/* min(L, M): hand out ids up to here */
	byte room;		/* budget: rows in the batch */
	byte batch;		/* rows handed out (bit k for row k) */
	byte hi;		/* highest row of the batch, 0 if none */
	byte k, n;

restart:
	skip;
	d_step { L = 0; m = 0; s = 0; bound = 0; room = 0; batch = 0; hi = 0; k = 0; n = 0 };
	c = cursor;

	do
	:: MAYBE_CRASH;
		/* steps a-c only read, so a crash between two of them is the same
		   as the crash after d (the writers may run in between either way) */
		L = last;				/* a. */
		m = LOWEST_MARKER;			/* b. */
		s = SNAPSHOT;				/* c. */

		/* d. the rows in (cursor, min(L, M)] visible in S, in id order */
		if
		:: room = 1
		:: room = 2
		fi;
		d_step {
			bound = MIN(L, m);
			k = c + 1;
			do
			:: k > bound || n == room -> break
			:: else ->
				if
				:: IN(s, k) -> n++; batch = batch | (1 << k); hi = k
				:: else -> skip		/* rolled back: a gap */
				fi;
				k++
			od;
			k = 0; n = 0; L = 0; m = 0; s = 0; bound = 0; room = 0
		};
		MAYBE_CRASH;

		/* publish the batch, in order */
		k = c + 1;
		do
		:: k > hi -> break
		:: else ->
			if
			:: IN(batch, k) -> publish(k)
			:: else -> skip
			fi;
			k++
		od;
		k = 0;
		MAYBE_CRASH;

		/* all acked: UPDATE the cursor; COMMIT */
		if
		:: hi > 0 ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(hi > cursor);	/* (d) never backwards */
				cursor = hi;
				c = hi
			   }
			fi
		:: else -> skip
		fi;
		d_step { batch = 0; hi = 0 }
	od;

crashed:
	goto restart
}
