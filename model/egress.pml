/*
 * egress.pml -- database -> bus through the change feed: envelope markers,
 * the gate (S0, marker listing, S), the per-originator cursor and the late
 * feed.
 *
 * Writers. Rows 1..N of ONE originator (the gate treats every originator on
 * its own, with its own cursor and markers, so one stands for all). Sequence
 * order is not commit order: any row may commit before a lower one. For each
 * row s it inserts, a writer transaction
 *   1. takes an envelope marker naming s (readers listing the markers see
 *      "someone is inserting s or above"); a transaction inserting two rows
 *      keeps only its lowest marker; markers go when it commits or aborts;
 *   2. checks whether another transaction has already brought a higher row
 *      of the originator to its PRE-COMMIT step, by the high-water marks in
 *      shared memory (highwater::note, the fast path of a READY slot): it
 *      raises the MARK (highest row noted) to s and looks at the value it had
 *      before; if that was at most s, row s is not late without looking
 *      further; otherwise it reads the COMMITTED mark (which each writer raises
 *      to its highest row in its pre-commit step, before its commit makes the
 *      rows visible) and row s is late when that is above s. A late row is
 *      flagged late and an entry for it is added to the late feed in the same
 *      transaction (visible when the row commits). A transaction may still
 *      abort after its pre-commit step; the marks stay raised (a later row may
 *      then be late needlessly, which costs an entry, never a row);
 *   3. inserts the row.
 * Then it commits -- or aborts (at most MAX_ABORTS times in all), and then the
 * rows are either retried by a new transaction (from step 1) or given up for
 * good (they never exist). Either one transaction per row, or row 1 alone and
 * rows 2 and 3 in one transaction (inserting 2 then 3, or 3 then 2). So "row 1
 * aborts, rows 2 and 3 commit and are delivered, row 1 is retried and commits"
 * is one of the runs: the late arrival.
 * Or: row 1 and row 3 through the functions, one transaction each, and row 2
 * written AROUND the functions (into a band leaf, COPY, a restore, logical
 * replication's apply, triggers off): one transaction that inserts it and
 * commits, with no marker, no lateness check and no raise of any mark; the
 * slot stays ready (nothing notices the write). Row 2 is then above row 1 and
 * below row 3, so both "a row below it is checked against marks that do not
 * know it" and "the marks are above it already, raised by row 3's writer" are
 * among the runs.
 * One more transaction never touches the feed: it began before every
 * writer and stays open forever. Nothing here looks at it (the gate asks of a
 * row only whether ITS transaction had ended when S0 was taken, never for the
 * cluster-wide xmin horizon), and DONE must hold although it never ends
 * (outbox_counterexample_horizon_gated.pml shows what it does otherwise).
 *
 * The egress (one gate per batch), in this order:
 *   a. S0 := what is committed now;
 *   a'. COV := the lower of the two high-water marks now;
 *   b. M  := the lowest marker held now (no bound if none);
 *   c. S  := what is committed now (later than S0), and how far the late feed
 *      reaches in S;
 *   d. reads the rows r with cursor < r <= M - 1 visible in S, in increasing
 *      order, until its budget of 1 or 2 rows that are not late is used up
 *      (late rows are read, but take no budget); X := the highest row read
 *      that was already committed in S0; the batch is every row read that is
 *      <= X and not flagged late (late rows are the late feed's);
 *   d'. CONFIRM: between a. and b. the egress has read the high-water marks
 *      (COV := the lower of the mark and the committed mark); now it raises
 *      both to X (highwater::cover) and hands out nothing above COV: the
 *      rows above it wait for the next gate, whose COV is at X. A row the
 *      marks do not know (written around the functions) is so never handed
 *      out before the marks know it: an insert below it that reads the marks
 *      after a'. is late; one that read them earlier took its marker earlier
 *      still, before b., so it is listed (the read stops below it) or had
 *      ended (S sees its row). Rows written through the functions raised the
 *      committed mark before they became visible, so they are below COV and
 *      wait for nothing. Raising the marks and listing the markers again
 *      after the read instead (Gate::confirm (b0ece98)) is NOT
 *      enough: an insert that read the marks before the raise and committed
 *      between S and the second listing is neither read nor listed
 *      (egress_counterexample_around_writer_raise_then_relist.pml);
 *   e. the late feed: every late entry after its durable late position, in
 *      feed order (an entry is readable once its row's transaction commits;
 *      the late feed's own markers are the drawn-feed protocol of outbox.pml).
 * Writers run between any two of these steps. The egress publishes the late
 * entries, then the batch, each waiting for the bus ack (a publish can be
 * lost: no ack, publish again); when all are acked it moves the late position
 * to the end of what it handed out, then the cursor to the highest row of the
 * batch, each in its own database transaction that may roll back (the next
 * gate reads them again). The bus deduplicates by message id (the envelope's
 * id, whichever feed hands it out). The egress can crash between any two
 * steps and restarts from the durable cursor and late position, so it may
 * publish a row again.
 *
 * Property (ltl spec):
 *   [] SAFE  : (a) every committed row written through the functions at or
 *              below the cursor is on the bus, or it arrived late and its late
 *              entry is after the late position (the late feed still hands it
 *              out); (b) every late entry at or below the late position is on
 *              the bus; (c) no row is on the bus more than once (the row
 *              written around the functions is held to (c) only: it may commit
 *              below the cursor and be skipped, as src/store/feed/mod.rs says);
 *   <> DONE  : (d) eventually every writer has finished, every row that
 *              committed through the functions is on the bus exactly once, the
 *              late position is at the end of the late feed and the cursor is
 *              at the highest committed row that is not late (nothing left to
 *              hand out) -- with weak fairness and finitely many crashes,
 *              aborts, lost publishes and rollbacks, while the unrelated
 *              transaction is still open;
 *   assert   : (e) the cursor and the late position only ever move forward
 *              (checked at each update).
 * The macros below spell out k = 1..3: extend them if N changes.
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
/* shared memory: the originator's high-water marks (a ready slot; rows as
   they are, where the Rust keeps row + 1 and 0 for none) */
byte mark;		/* the mark: highest row noted (highwater::note) */
byte cmark;		/* the committed mark: highest row raised at a pre-commit */
/* database: the egress's durable positions */
byte cursor;		/* the originator's cursor (highest row handed out) */
byte late_pos;		/* the late-feed position (last entry handed out) */

bool unrelated_open;	/* the transaction that never touches the feed */
byte around_row;	/* the row written around the functions, 0 if none */

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
/* the lateness check of row s (highwater::note on a ready slot), in two
   steps: raise the mark to s, and if it was above s already, has another
   transaction brought a higher row to its pre-commit step? (the checking
   transaction's own rows raise the committed mark only at its own pre-commit,
   after every check it makes). late[s] holds "the mark was above s" between
   the two steps. */
inline note(s) {
	d_step {
		late[s] = (mark > s);
		mark = (s > mark -> s : mark)
	};
	if
	:: late[s] -> late[s] = (cmark > s)
	:: else -> skip
	fi
}
/* the cursor is at the highest committed row that is not late (0 if none):
   late rows are the late feed's, and a late row with no committed row above it
   (late because a transaction that raised the mark then failed) leaves the
   cursor below it; spelled without "a -> b : c", which an ltl formula would
   read as an implication */
#define IN_ORDER(k)    (committed[k] && !late[k])
#define AT_TOP         ((IN_ORDER(3) && cursor == 3) || \
                        (!IN_ORDER(3) && IN_ORDER(2) && cursor == 2) || \
                        (!IN_ORDER(3) && !IN_ORDER(2) && IN_ORDER(1) && cursor == 1) || \
                        (!IN_ORDER(3) && !IN_ORDER(2) && !IN_ORDER(1) && cursor == 0))

#define ON_BUS(k)      (copies[k] > 0)
#define LATE_PENDING(k) (late_idx[k] > late_pos)
#define BEHIND_OK(k)   ((cursor < k || !committed[k] || ON_BUS(k) || LATE_PENDING(k) || \
                         k == around_row) && \
                        (late_idx[k] == 0 || LATE_PENDING(k) || ON_BUS(k)) && \
                        copies[k] <= 1)
#define SAFE           (BEHIND_OK(1) && BEHIND_OK(2) && BEHIND_OK(3))
#define ROW_DONE(k)    (finished[k] && (!committed[k] || copies[k] == 1 || k == around_row))
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
	note(a);				/* 2. lateness check */
	if					/* 3. INSERT a */
	:: b != 0 ->
		/* the second row: the transaction's marker becomes the lower of
		   the two (both stay set here, which is the same: a reader only
		   ever uses the lowest marker) */
		marker[b] = true;		/* 1. */
		note(b)				/* 2. (row a is its own: not committed) */
						/* 3. INSERT b */
	:: else -> skip
	fi;
	if
	:: d_step {				/* PRE-COMMIT: raise the mark */
		cmark = (a > cmark -> a : cmark);
		cmark = (b > cmark -> b : cmark)
	   };
		if
		:: d_step {			/* COMMIT */
			commit_row(a);
			if
			:: b != 0 -> commit_row(b)
			:: else -> skip
			fi
		   }
		:: aborts < MAX_ABORTS -> goto rollback	/* fails after it */
		fi
	:: aborts < MAX_ABORTS -> goto rollback
	fi;
	goto finish;
rollback:					/* ROLLBACK: nothing of it stays */
	skip;
	d_step {
		aborts++;
		marker[a] = false; late[a] = false;
		marker[b] = false; late[b] = false
	};
	if
	:: goto retry				/* a new transaction tries again */
	:: d_step {				/* or the rows are given up */
		finished[a] = true;
		finished[b] = true
	   }
	fi;
finish:
	skip
}

/* a transaction writing row r around the functions: no marker, no lateness
   check, no mark raised; it inserts the row and commits */
proctype Around(byte r) {
	d_step {
		committed[r] = true;
		finished[r] = true
	}
}

/* who writes what: rows 1 and 3 one transaction each and row 2 around the
   functions; or one transaction per row; or row 1 alone and rows 2 and 3 in
   one transaction (inserting 2 then 3, or 3 then 2); the unrelated
   transaction began before all of them */
init {
	atomic {
		unrelated_open = true;	/* BEGIN; writes elsewhere; never ends */
		run Writer(1, 0);
		if
		:: around_row = 2; run Writer(3, 0); run Around(2)
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
	byte cov;		/* the lower of the marks, sampled before the listing */
	byte batch;		/* rows handed out (bit k for row k) */
	byte hi;		/* highest row of the batch, 0 if none */
	byte k, n;

restart:
	skip;
	d_step { s0 = 0; s = 0; m = 0; nlate = 0; room = 0; x = 0; cov = 0; batch = 0; hi = 0; k = 0; n = 0 };
	d_step { c = cursor; lp = late_pos };

	do
	:: MAYBE_CRASH;
		/* steps a-d only read, so a crash between two of them is the same
		   as the crash after d (the writers may run in between either way) */
		s0 = SNAPSHOT;				/* a. */
		cov = (mark < cmark -> mark : cmark);	/* a'. what the marks cover */
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
			k = 0; n = 0; s0 = 0; s = 0; m = 0; room = 0
		};

		/* d'. confirm: hand out nothing above what the marks covered before
		   the listing; raise them to X for the next gate */
		if
		:: x > cov ->
			d_step {			/* highwater::cover */
				mark = (x > mark -> x : mark);
				cmark = (x > cmark -> x : cmark)
			};
			d_step {			/* the cap */
				hi = 0;
				k = c + 1;
				do
				:: k > N -> break
				:: k <= cov && IN(batch, k) -> hi = k; k++
				:: k > cov -> batch = batch & ~(1 << k); k++
				:: else -> k++
				od;
				k = 0; x = 0; cov = 0
			}
		:: else -> x = 0; cov = 0
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
		MAYBE_CRASH;

		/* all acked: UPDATE the late position; COMMIT */
		if
		:: nlate > lp ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(nlate > late_pos);	/* (e) never backwards */
				late_pos = nlate;
				lp = nlate
			   }
			fi;
			MAYBE_CRASH
		:: else -> skip
		fi;
		/* UPDATE the cursor; COMMIT */
		if
		:: hi > 0 ->
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++	/* rolled back: read again */
			:: d_step {
				assert(hi > cursor);	/* (e) never backwards */
				cursor = hi;
				c = hi
			   }
			fi
		:: else -> skip
		fi;
		d_step { nlate = 0; batch = 0; hi = 0 }
	od;

crashed:
	goto restart
}
