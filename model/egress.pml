/*
 * egress.pml -- database -> bus with a durable cursor.
 *
 * Rows 1..N are written by N writer transactions that may commit in any
 * order (row 2 can commit before row 1); a row's id stands for its place in
 * commit-visibility order. The commit-safe horizon is the oldest row whose
 * transaction has not committed yet: nothing at or above it may be read.
 *
 * The egress reads a batch of one or two rows right after its durable
 * cursor and below the horizon (so it reads the committed prefix after the
 * cursor), publishes each row to the bus and waits for the bus ack (a publish
 * can be lost, then no ack comes and it publishes again), and only when the
 * whole batch is acked moves the durable cursor to the last row of the batch
 * in a database transaction (which may roll back: the batch is then read and
 * published again). The bus deduplicates by message id: publishing an id it
 * already holds is a no-op. The egress can crash between any two steps and
 * restarts from the durable cursor, so it may publish a row again.
 *
 * Property (ltl spec):
 *   [] SAFE  : (a) every row at or below the durable cursor is on the bus,
 *              and no row is on the bus more than once;
 *   <> DONE  : (b) eventually every row (all N commit) is on the bus exactly
 *              once and the cursor is N -- with weak fairness and finitely many
 *              crashes, lost publishes and rollbacks;
 *   assert   : (c) the cursor only ever moves forward (checked at each update).
 * The macros below spell out k = 1..3: extend them if N changes.
 */

#define N              3
#define MAX_CRASHES    2
#define MAX_LOST       1
#define MAX_ROLLBACKS  1

/* database */
bool committed[N+2];	/* committed[k]: row k's writer has committed */
byte cursor;		/* the egress's durable cursor */

/* bus: copies of each message id on the stream */
byte copies[N+1];

byte crashes;
byte lost;
byte rollbacks;

/* oldest row not yet committed, N+1 when every row is */
#define HORIZON (!committed[1] -> 1 : (!committed[2] -> 2 : (!committed[3] -> 3 : N+1)))

#define ON_BUS(k)      (copies[k] > 0)
#define BEHIND_OK(k)   (cursor < k || ON_BUS(k))
#define SAFE           (BEHIND_OK(1) && BEHIND_OK(2) && BEHIND_OK(3) && \
                        copies[1] <= 1 && copies[2] <= 1 && copies[3] <= 1)
#define DONE           (copies[1] == 1 && copies[2] == 1 && copies[3] == 1 && \
                        cursor == N)

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

active proctype Writers() {
	do
	:: !committed[1] -> committed[1] = true
	:: !committed[2] -> committed[2] = true
	:: !committed[3] -> committed[3] = true
	:: else -> break
	od
}

active proctype Egress() {
	byte c;			/* durable cursor as read at (re)start */
	byte lo, hi, k;		/* the batch is rows lo..hi */

restart:
	skip;
	d_step { lo = 0; hi = 0; k = 0 };
	c = cursor;

	do
	:: MAYBE_CRASH;

		/* read one or two rows after the cursor, below the horizon */
		atomic {
			c + 1 < HORIZON ->
			lo = c + 1;
			hi = lo;
			if
			:: hi + 1 < HORIZON -> hi++	/* two rows */
			:: true				/* one row */
			fi
		};
		MAYBE_CRASH;

		/* publish each row and wait for its ack */
		k = lo;
		do
		:: k > hi -> break
		:: else ->
publish:
			if
			:: lost < MAX_LOST ->
				lost++;		/* lost on the way: no ack, try again */
				MAYBE_CRASH;
				goto publish
			:: bus_store(k);
				MAYBE_CRASH;	/* stored, ack not yet received */
				assert(ON_BUS(k));	/* the ack vouches for it */
				k++
			fi
		od;
		MAYBE_CRASH;

		/* the whole batch is acked: UPDATE cursor; COMMIT */
		if
		:: rollbacks < MAX_ROLLBACKS ->
			rollbacks++	/* rolled back: the cursor stays, redo */
		:: d_step {
			assert(hi > cursor);	/* (c) never backwards */
			cursor = hi;
			c = hi
		   }
		fi;
		d_step { lo = 0; hi = 0; k = 0 }
	od;

crashed:
	goto restart
}
