/*
 * egress_counterexample_cursor_before_publish.pml -- MUST FAIL.
 *
 * Same writers, unrelated transaction, bus, crash budget and gate (S0,
 * marker listing, S, X from S0, late feed) as egress.pml, but the egress
 * commits its late position and its cursor past the batch BEFORE it
 * publishes the batch and gets the acks. A crash after those commits and
 * before the publishes leaves the cursor beyond rows the bus never received;
 * the restarted egress resumes after them.
 *
 * Property (ltl spec), the same as egress.pml:
 *   [] SAFE  : every committed row at or below the cursor is on the bus or
 *              still pending in the late feed; every late entry at or below
 *              the late position is on the bus; no row twice;
 *   <> DONE  : eventually every committed row is on the bus once and nothing
 *              is left to hand out.
 * Expected: spin reports a violation of SAFE (cursor ahead of the bus).
 */

#define N              3
#define MAX_CRASHES    2
#define MAX_ABORTS     1
#define MAX_LOST       1
#define MAX_ROLLBACKS  1
#define NONE           (N+1)	/* "no marker": the read is not bounded */

/* database: the rows */
bool committed[N+1];	/* committed[k]: a transaction writing row k committed */
bool late[N+1];		/* late[k]: row k (its current attempt) is flagged late */
bool marker[N+1];	/* marker[k]: a running writer holds a marker naming k */
bool finished[N+1];	/* finished[k]: row k's writer committed or gave up */
/* database: the late feed, entries 1..late_len in feed order */
byte late_row[N+1];	/* late_row[i]: the row of late entry i */
byte late_idx[N+1];	/* late_idx[k]: row k's late entry, 0 if none */
byte late_len;		/* committed late entries */
/* database: the egress's durable positions */
byte cursor;		/* the originator's cursor (highest row handed out) */
byte late_pos;		/* the late-feed position (last entry handed out) */

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
/* the lowest marker held right now, NONE if there is none */
#define LOWEST_MARKER  (marker[1] -> 1 : (marker[2] -> 2 : (marker[3] -> 3 : NONE)))
/* the lateness check of row s: has another transaction committed a higher
   row? (the checking transaction's own rows are not committed yet, so every
   committed row is another's) */
#define COMMITTED_ABOVE(s) ((s < 2 && committed[2]) || (s < 3 && committed[3]))
/* the cursor is at the highest committed row (0 if none); spelled without
   "a -> b : c", which an ltl formula would read as an implication */
#define AT_TOP         ((committed[3] && cursor == 3) || \
                        (!committed[3] && committed[2] && cursor == 2) || \
                        (!committed[3] && !committed[2] && committed[1] && cursor == 1) || \
                        (!committed[3] && !committed[2] && !committed[1] && cursor == 0))

#define ON_BUS(k)      (copies[k] > 0)
#define LATE_PENDING(k) (late_idx[k] > late_pos)
#define BEHIND_OK(k)   ((cursor < k || !committed[k] || ON_BUS(k) || LATE_PENDING(k)) && \
                        (late_idx[k] == 0 || LATE_PENDING(k) || ON_BUS(k)) && \
                        copies[k] <= 1)
#define SAFE           (BEHIND_OK(1) && BEHIND_OK(2) && BEHIND_OK(3))
#define ROW_DONE(k)    (finished[k] && (!committed[k] || copies[k] == 1))
#define DONE           (ROW_DONE(1) && ROW_DONE(2) && ROW_DONE(3) && \
                        late_pos == late_len && AT_TOP)

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

/* row k commits with its transaction; a late row's entry commits with it */
inline commit_row(k) {
	committed[k] = true;
	if
	:: late[k] ->
		late_len++;
		late_row[late_len] = k;
		late_idx[k] = late_len
	:: else -> skip
	fi;
	marker[k] = false;
	finished[k] = true
}

/* a writer transaction inserting row a, then row b (b = 0: only row a) */
proctype Writer(byte a; byte b) {
retry:
	marker[a] = true;			/* 1. marker naming a */
	late[a] = COMMITTED_ABOVE(a);		/* 2. lateness check */
	if					/* 3. INSERT a */
	:: b != 0 ->
		/* the second row: the transaction's marker becomes the lower of
		   the two (both stay set here, which is the same: a reader only
		   ever uses the lowest marker) */
		marker[b] = true;		/* 1. */
		late[b] = COMMITTED_ABOVE(b)	/* 2. (row a is its own: not committed) */
						/* 3. INSERT b */
	:: else -> skip
	fi;
	if
	:: d_step {				/* COMMIT */
		commit_row(a);
		if
		:: b != 0 -> commit_row(b)
		:: else -> skip
		fi
	   }
	:: aborts < MAX_ABORTS ->		/* ROLLBACK: nothing of it stays */
		d_step {
			aborts++;
			marker[a] = false; late[a] = false;
			marker[b] = false; late[b] = false
		};
		if
		:: goto retry			/* a new transaction tries again */
		:: d_step {			/* or the rows are given up */
			finished[a] = true;
			finished[b] = true
		   }
		fi
	fi
}

/* who writes what: one transaction per row, or row 1 alone and rows 2 and 3
   in one transaction (inserting 2 then 3, or 3 then 2); the unrelated
   transaction began before all of them */
init {
	atomic {
		unrelated_open = true;	/* BEGIN; writes elsewhere; never ends */
		run Writer(1, 0);
		if
		:: run Writer(2, 0); run Writer(3, 0)
		:: run Writer(2, 3)
		:: run Writer(3, 2)
		fi
	}
}

active proctype Egress() {
	byte c, lp;		/* durable cursor and late position as last known */
	byte s0, s;		/* snapshots S0 and S */
	byte m;			/* lowest marker in the listing */
	byte nlate;		/* late entries visible in S */
	byte room;		/* budget: rows that are not late */
	byte x;			/* X: highest row read that was committed in S0 */
	byte batch;		/* rows handed out (bit k for row k) */
	byte hi;		/* highest row of the batch, 0 if none */
	byte k, n;

restart:
	skip;
	d_step { s0 = 0; s = 0; m = 0; nlate = 0; room = 0; x = 0; batch = 0; hi = 0; k = 0; n = 0 };
	d_step { c = cursor; lp = late_pos };

	do
	:: MAYBE_CRASH;
		/* steps a-d only read, so a crash between two of them is the same
		   as the crash after d (the writers may run in between either way) */
		s0 = SNAPSHOT;				/* a. */
		m = LOWEST_MARKER;			/* b. */
		d_step { s = SNAPSHOT; nlate = late_len };	/* c. */

		/* d. read after the cursor, below the lowest marker, visible in S */
		if
		:: room = 1
		:: room = 2
		fi;
		d_step {
			k = c + 1;
			do
			:: k >= m || k > N -> break
			:: else ->
				if
				:: IN(s, k) && late[k] ->	/* read, takes no budget */
					x = (IN(s0, k) -> k : x)
				:: IN(s, k) && !late[k] && n < room ->
					n++;
					x = (IN(s0, k) -> k : x)
				:: IN(s, k) && !late[k] && n == room -> break
				:: else -> skip			/* not visible in S */
				fi;
				k++
			od;
			/* the batch: the rows read up to X that are not late */
			k = c + 1;
			do
			:: k > x -> break
			:: else ->
				if
				:: IN(s, k) && !late[k] -> batch = batch | (1 << k); hi = k
				:: else -> skip
				fi;
				k++
			od;
			k = 0; n = 0; s0 = 0; s = 0; m = 0; x = 0; room = 0
		};
		MAYBE_CRASH;

		/* the bug: UPDATE the late position; COMMIT -- before publishing */
		if
		:: nlate > lp ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(nlate > late_pos);	/* (e) never backwards */
				late_pos = nlate	/* (lp moves after publishing) */
			   }
			fi;
			MAYBE_CRASH
		:: else -> skip
		fi;
		/* UPDATE the cursor; COMMIT -- before publishing */
		if
		:: hi > 0 ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(hi > cursor);	/* (e) never backwards */
				cursor = hi		/* (c moves after publishing) */
			   }
			fi
		:: else -> skip
		fi;
		MAYBE_CRASH;

		/* e. publish the late entries after the late position, in order */
		k = lp + 1;
		do
		:: k > nlate -> break
		:: else -> publish(late_row[k]); k++
		od;
		/* then the batch, in order */
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
		d_step { c = cursor; lp = late_pos; nlate = 0; batch = 0; hi = 0 }
	od;

crashed:
	goto restart
}
