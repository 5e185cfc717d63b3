/*
 * outbox_counterexample_horizon_gated.pml -- MUST FAIL.
 *
 * The old outbox: gated by the cluster-wide transaction horizon instead of
 * by markers. Every transaction gets a transaction id (xid) when it begins,
 * in increasing order; the outbox rows are ordered by (inserted xid, id) and
 * the egress's cursor is the xid of the last row it handed out (each writer
 * here writes one row, so the xid names the row). A batch hands out the
 * committed rows with cursor < xid < xmin, in xid order, 1 or 2 of them,
 * where xmin is the horizon of a fresh snapshot: the oldest xid still
 * running (pg_snapshot_xmin). So a row is delivered only when every
 * transaction that began before it has ended -- which is what makes it safe
 * (every xid below xmin has committed or rolled back), and what makes it
 * wait for transactions that have nothing to do with the outbox.
 *
 * Writers: three transactions, each drawing one id from the sequence and
 * inserting one row, then committing or rolling back (at most MAX_ABORTS
 * times: a gap). One more transaction never touches the outbox: it begins at
 * some point (it writes elsewhere, so it has an xid) and never ends. The bus
 * (dedup by message id), lost publishes, crashes and cursor rollbacks are
 * those of outbox.pml.
 *
 * If the unrelated transaction begins before a writer, xmin stays at its xid
 * for ever: that writer's row commits and is never handed out. Nothing is
 * lost and nothing is handed out wrongly -- SAFE holds -- but delivery stops.
 *
 * Property (ltl spec), the same as outbox.pml in terms of this cursor:
 *   [] SAFE  : (a) every committed row whose xid is at or below the cursor is
 *              on the bus, and (b) no row is on the bus more than once;
 *   <> DONE  : (c) eventually every writer has ended and every row that
 *              committed is on the bus exactly once.
 * Expected: spin reports an acceptance cycle (a run in which DONE never
 * holds: the egress reads empty batches for ever behind the open
 * transaction's xid).
 * The macros below spell out xids 1..4 (three writers and the unrelated
 * transaction) and ids 1..3: extend them if N changes.
 */

#define N              3	/* writers, and outbox ids */
#define X              (N+1)	/* xids: the writers' and the unrelated one's */
#define MAX_CRASHES    2
#define MAX_ABORTS     1
#define MAX_LOST       1
#define MAX_ROLLBACKS  1

/* database: transactions */
byte next_xid;		/* the last xid handed out */
bool running[X+1];	/* running[x]: the transaction with xid x has not ended */
/* database: the outbox, one row per writer, indexed by its xid */
byte last;		/* the id sequence's last value */
byte id_of[X+1];	/* id_of[x]: the id of the row xid x inserts, 0 if none */
bool committed[X+1];	/* committed[x]: xid x committed its row */
bool finished[N+1];	/* finished[w]: writer w committed or rolled back */
byte cursor;		/* the egress's durable cursor: xid of the last row */

/* bus: copies of each message id on the stream */
byte copies[N+1];

/* how much bad luck has been spent (bounded so that "eventually" can hold) */
byte crashes;
byte aborts;
byte lost;
byte rollbacks;

/* the horizon of a snapshot taken now: the oldest running xid, or the next
   xid if none is running */
#define XMIN           (running[1] -> 1 : (running[2] -> 2 : (running[3] -> 3 : \
                        (running[4] -> 4 : next_xid + 1))))
/* a snapshot of the writers' commits: bit x set when xid x committed */
#define SNAPSHOT       ((committed[1] -> 2 : 0) | (committed[2] -> 4 : 0) | \
                        (committed[3] -> 8 : 0) | (committed[4] -> 16 : 0))
#define IN(snap, x)    ((snap & (1 << (x))) != 0)

#define ROW_ON_BUS(x)  ((id_of[x] == 1 && copies[1] > 0) || \
                        (id_of[x] == 2 && copies[2] > 0) || \
                        (id_of[x] == 3 && copies[3] > 0))
#define BEHIND_OK(x)   (cursor < x || !committed[x] || ROW_ON_BUS(x))
#define SAFE           (BEHIND_OK(1) && BEHIND_OK(2) && BEHIND_OK(3) && BEHIND_OK(4) && \
                        copies[1] <= 1 && copies[2] <= 1 && copies[3] <= 1)
#define ROW_DONE(x)    (!committed[x] || ROW_ON_BUS(x))
#define DONE           (finished[1] && finished[2] && finished[3] && \
                        ROW_DONE(1) && ROW_DONE(2) && ROW_DONE(3) && ROW_DONE(4))

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

/* publish message id k and wait for the ack (lost publishes are sent again) */
inline publish(k) {
	do
	:: lost < MAX_LOST ->
		lost++;			/* lost on the way: no ack, try again */
		MAYBE_CRASH
	:: bus_store(k);
		MAYBE_CRASH;		/* stored, ack not yet received */
		assert(copies[k] > 0);	/* the ack vouches for it */
		break
	od
}

/* one writer transaction: BEGIN; nextval; INSERT; COMMIT or ROLLBACK */
proctype Writer(byte w) {
	byte x;			/* its xid */

	d_step { next_xid++; x = next_xid; running[x] = true };	/* BEGIN */
	d_step { last++; id_of[x] = last };	/* nextval; INSERT */
	if
	:: d_step {				/* COMMIT */
		committed[x] = true;
		running[x] = false;
		finished[w] = true;
		x = 0
	   }
	:: aborts < MAX_ABORTS ->		/* ROLLBACK: the id is a gap */
		d_step {
			aborts++;
			running[x] = false;
			finished[w] = true;
			x = 0
		}
	fi
}

/* BEGIN; writes elsewhere (so it has an xid); never ends */
active proctype Unrelated() {
	d_step { next_xid++; running[next_xid] = true }
}

init {
	atomic { run Writer(1); run Writer(2); run Writer(3) }
}

active proctype Egress() {
	byte c;			/* durable cursor as last known (an xid) */
	byte xmin;		/* the horizon of the snapshot */
	byte s;			/* the snapshot's commits */
	byte room;		/* budget: rows in the batch */
	byte batch;		/* xids whose rows are handed out (bit x) */
	byte hi;		/* highest xid of the batch, 0 if none */
	byte x, n;

restart:
	skip;
	d_step { xmin = 0; s = 0; room = 0; batch = 0; hi = 0; x = 0; n = 0 };
	c = cursor;

	do
	:: MAYBE_CRASH;
		/* a fresh snapshot: its horizon and what it sees */
		d_step { xmin = XMIN; s = SNAPSHOT };

		/* the committed rows with cursor < xid < xmin, in xid order */
		if
		:: room = 1
		:: room = 2
		fi;
		d_step {
			x = c + 1;
			do
			:: x >= xmin || n == room -> break
			:: else ->
				if
				:: IN(s, x) -> n++; batch = batch | (1 << x); hi = x
				:: else -> skip	/* rolled back, or the unrelated xid */
				fi;
				x++
			od;
			x = 0; n = 0; xmin = 0; s = 0; room = 0
		};
		MAYBE_CRASH;

		/* publish the batch, in xid order */
		x = c + 1;
		do
		:: x > hi -> break
		:: else ->
			if
			:: IN(batch, x) -> publish(id_of[x])
			:: else -> skip
			fi;
			x++
		od;
		x = 0;
		MAYBE_CRASH;

		/* all acked: UPDATE the cursor; COMMIT */
		if
		:: hi > 0 ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(hi > cursor);	/* never backwards */
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
