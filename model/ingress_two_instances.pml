/*
 * ingress_two_instances.pml -- two ingress instances under one name and stream,
 * as a rolling deploy or two replicas run them, each as ingress.pml runs one
 * (see there for the bus, the transaction and the crashes).
 *
 * Before it reads its position an instance takes the lease of its name and
 * stream (ingress_lease: a session-level lock); the other one waits until the
 * lease is free. Storing the position is refused to any session but the
 * lease holder (ingress_store_position checks it in the committing
 * transaction), and a crash ends the session, which releases the lease. The
 * instance that takes over makes the consumer anew at its position + 1.
 * Messages are acknowledged one by one (explicit acks).
 *
 * Property: as in ingress.pml, whatever the two instances do.
 */

#define N              3
#define MAX_CRASHES    2
#define MAX_ROLLBACKS  1
#define MAX_LOST_ACKS  1

/* database: envelope rows per message id, and the ingress source position */
byte copies[N+1];
byte position;

/* bus: the stream holds 1..published; the consumer's ack state and the next
   sequence it hands out */
byte published;
bool acked[N+1];
byte next = 1;

/* how much bad luck has been spent (bounded so that "eventually" can hold) */
byte crashes;
byte rollbacks;
byte lost_acks;

/* the lease: 0 while no instance holds it, else the instance that does */
byte holder;

#define STORED(k)       (copies[k] > 0)
#define COVERED_OK(k)   (position < k || STORED(k))
#define ROWS            (copies[1] + copies[2] + copies[3])
#define SAFE            (COVERED_OK(1) && COVERED_OK(2) && COVERED_OK(3) && \
                         copies[1] <= 1 && copies[2] <= 1 && copies[3] <= 1)
#define DONE            (STORED(1) && STORED(2) && STORED(3) && ROWS == N && \
                         position == N)

ltl spec { [] SAFE && <> DONE }

/* the same safety part as a plain assertion, so a break of it is reported by
   name instead of only as an acceptance cycle of the claim */
active proctype Safety() {
	atomic { !SAFE -> assert(SAFE) }
}

#define DELIVERABLE(k)  (next <= k && k <= published && !acked[k])
#define ANY_DELIVERABLE (DELIVERABLE(1) || DELIVERABLE(2) || DELIVERABLE(3))

/* the process may die here: all volatile state is lost */
#define MAYBE_CRASH \
	if \
	:: crashes < MAX_CRASHES -> crashes++; goto crashed \
	:: true \
	fi

/* INSERT .. ON CONFLICT (id) DO NOTHING, applied at commit */
inline insert_envelope(k) {
	if
	:: copies[k] == 0 -> copies[k] = 1
	:: else -> skip		/* already stored: the insert changes nothing */
	fi
}

/* fire-and-forget ack: the server may never see it */
inline ack(k) {
	if
	:: lost_acks < MAX_LOST_ACKS -> lost_acks++
	:: acked[k] = true
	fi
}

active proctype Producer() {
	do
	:: published < N -> published++
	:: else -> break
	od
}

/* ack wait expired: the consumer starts again from its oldest unacked message */
active proctype Bus() {
	byte k;
	do
	:: atomic {
		k = 1;
		do
		:: k > published -> break
		:: else ->
			if
			:: acked[k] -> k++
			:: else -> break
			fi
		od;
		next = k;
		k = 0
	   }
	od
}

proctype Ingress(byte me) {
	byte p0;		/* position read at (re)start */
	byte b1, b2, last;	/* the batch; b2 == 0 when it holds one message */
	bool keep1, keep2;	/* not covered by p0: to be inserted */
	bool ins1, ins2;	/* inserts pending in the open transaction */
	byte j;

restart:
	skip;
	d_step {
		b1 = 0; b2 = 0; last = 0;
		keep1 = false; keep2 = false;
		ins1 = false; ins2 = false
	};
	/* take the lease; the other instance stands by until it is free */
	atomic { holder == 0 -> holder = me };
	/* read the checkpoint and make the consumer anew right after it */
	atomic {
		p0 = position;
		next = position + 1
	};

	do
	:: MAYBE_CRASH;

		/* pull one or two messages, in stream order */
		atomic {
			ANY_DELIVERABLE ->
			b1 = next;
			do
			:: DELIVERABLE(b1) -> break
			:: else -> b1++
			od;
			b2 = b1 + 1;
			do
			:: b2 > published -> b2 = 0; break
			:: else ->
				if
				:: acked[b2] -> b2++
				:: else -> break
				fi
			od;
			if
			:: true			/* take two if there are two */
			:: b2 = 0		/* take one */
			fi;
			last = (b2 != 0 -> b2 : b1);
			next = last + 1;
			keep1 = (b1 > p0);
			keep2 = (b2 != 0 && b2 > p0)
		};
		MAYBE_CRASH;

		if
		:: keep1 || keep2 ->
begin:			/* BEGIN */
			ins1 = false; ins2 = false;
			MAYBE_CRASH;
			if
			:: keep1 -> ins1 = true
			:: else -> skip
			fi;
			MAYBE_CRASH;
			if
			:: keep2 -> ins2 = true
			:: else -> skip
			fi;
			MAYBE_CRASH;
			/* UPDATE position (same transaction), then COMMIT */
			if
			:: rollbacks < MAX_ROLLBACKS ->
				rollbacks++;	/* rolled back: nothing applied; retry */
				goto begin
			:: d_step {
				/* ingress_store_position: refused (55006) unless this
				   session holds the lease; it does, until it ends */
				assert(holder == me);
				if
				:: ins1 -> insert_envelope(b1)
				:: else -> skip
				fi;
				if
				:: ins2 -> insert_envelope(b2)
				:: else -> skip
				fi;
				if
				:: last > position -> position = last
				:: else -> skip
				fi
			   }
			fi
		:: else -> skip		/* all covered by the checkpoint */
		fi;
		MAYBE_CRASH;

		/* committed: now, and only now, ack */
		ack(b1);
		MAYBE_CRASH;
		if
		:: b2 != 0 -> ack(b2)
		:: else -> skip
		fi;
		d_step {
			b1 = 0; b2 = 0; last = 0;
			keep1 = false; keep2 = false;
			ins1 = false; ins2 = false
		}
	od;

crashed:
	/* the session ended: the server releases its lease */
	if
	:: holder == me -> holder = 0
	:: else -> skip
	fi;
	goto restart
}

init {
	atomic {
		run Ingress(1);
		run Ingress(2)
	}
}
