/*
 * egress_counterexample_cursor_before_publish.pml -- MUST FAIL.
 *
 * Same database, bus and crash budget as egress.pml, but the egress commits
 * its durable cursor past the batch BEFORE it publishes the batch and gets the
 * acks. A crash after that commit and before the publishes leaves the cursor
 * beyond rows the bus never received; the restarted egress resumes after them.
 *
 * Property (ltl spec), the same as egress.pml:
 *   [] SAFE  : every row at or below the cursor is on the bus, none twice;
 *   <> DONE  : eventually every row is on the bus once and the cursor is N.
 * Expected: spin reports a violation of SAFE (cursor ahead of the bus).
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

		/* the bug: UPDATE cursor; COMMIT before publishing */
		if
		:: rollbacks < MAX_ROLLBACKS ->
			rollbacks++;	/* rolled back: the cursor stays, redo */
			goto next_batch
		:: d_step {
			assert(hi > cursor);	/* (c) never backwards */
			cursor = hi;
			c = hi
		   }
		fi;
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
next_batch:
		skip;
		d_step { lo = 0; hi = 0; k = 0 }
	od;

crashed:
	goto restart
}
