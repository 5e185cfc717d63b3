/*
 * egress_counterexample_skip_uncommitted.pml -- MUST FAIL.
 *
 * Same database, bus and crash budget as egress.pml, but the egress ignores
 * the commit-safe horizon: its batch is the first one or two COMMITTED rows
 * after the cursor, wherever they are. With row 2 committed and row 1 still
 * running, it publishes row 2 and moves the cursor to 2; row 1 commits later,
 * below the cursor, and is never read.
 *
 * Property (ltl spec), the same as egress.pml:
 *   [] SAFE  : every row at or below the cursor is on the bus, none twice;
 *   <> DONE  : eventually every row is on the bus once and the cursor is N.
 * Expected: spin reports a violation (cursor past a row that is not on the
 * bus, which stays so forever).
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

		/* the bug: read the first committed rows after the cursor, ignoring
		   the horizon (a batch may jump over a row still being written) */
		atomic {
			(c < 1 && committed[1]) || (c < 2 && committed[2]) ||
			(c < 3 && committed[3]) ->
			lo = c + 1;
			do
			:: committed[lo] -> break
			:: else -> lo++
			od;
			hi = lo;
			if
			:: true ->			/* two rows, if there are */
				k = lo + 1;
				do
				:: k > N -> break
				:: else ->
					if
					:: committed[k] -> hi = k; break
					:: else -> k++
					fi
				od;
				k = 0
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
				k = (k < hi -> hi : hi + 1)	/* the batch is {lo, hi} */
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
