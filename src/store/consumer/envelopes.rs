//! Envelope batches, pending counts and acknowledgements of a consumer.

use super::late;
use super::owner::{self, Owner, OWNER_COLUMNS};
use super::state::{with_consumer, Access, Known};
use super::{Budget, ConsumerError};
use crate::store::feed::clock;
use crate::store::feed::late::Positions;
use crate::store::feed::markers::Drawn;
use crate::store::feed::{Gate, Sample};
use crate::store::partition::{self, PartitionError};
use crate::store::read::{self, Blobs, EnvelopeRow, Flow};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::Spi;
use std::collections::HashMap;

/// One row of an envelope batch: the envelope, and its late-feed id when it
/// comes from the late feed (the position to acknowledge).
pub type BatchRow = (EnvelopeRow, Option<i64>);

/// The next envelopes `consumer` has not acknowledged, within `budget` (see
/// `consumer_envelope_batch`).
pub fn envelope_batch(consumer: &str, budget: Budget) -> Result<Vec<BatchRow>, ConsumerError> {
    // The originator list and partition cache then reflect every partition
    // attached so far.
    crate::pg::invalidation::accept();
    let sample = Sample::take()?;
    let nodes = partition::originators()?;
    with_consumer(consumer, Access::Act, |known| {
        if let Some(clocks) = &sample.clocks {
            if known.envelopes_idle(clocks, sample.last_drawn(Drawn::Late), &nodes) {
                return Ok(Vec::new()); // nothing can have committed since
            }
        }
        // Rows held back only because the high-water marks did not cover them
        // yet (written around the functions, or read first since a restart) are
        // handed out by a gate opened now (Gate::cap): a call returns nothing
        // only when nothing can be handed out.
        let (out, step_over) = Gate::read_settled_from(sample, &nodes, |gate| {
            let (out, step_over) = read_batch(known, gate, &nodes, budget.clone())?;
            if !out.is_empty() {
                gate.keep_answer();
            }
            Ok::<_, ConsumerError>((out, step_over))
        })?;
        if !step_over.is_empty() {
            move_cursor(consumer, step_over.into_iter().collect())?;
        }
        Ok(out)
    })
}

/// One batch through `gate`: the late rows first, then each originator's rows in
/// order; and where the cursor steps over late rows.
fn read_batch(
    known: &mut Known,
    gate: &Gate,
    nodes: &[i32],
    mut budget: Budget,
) -> Result<(Vec<BatchRow>, HashMap<i32, i64>), ConsumerError> {
    let last_late = gate.sample.last_drawn(Drawn::Late);
    let mut out = Vec::new();

    // Late arrivals first, in the order they were recorded.
    let ceiling = gate.drawn_ceiling(Drawn::Late);
    let mut delivered_late = known.late_id;
    let complete = late::late_rows(known.late_id, ceiling, gate.rows(), Blobs::All, |late| {
        if !budget.take(late.row.bytes()) {
            return false;
        }
        delivered_late = late.position;
        out.push((late.row, Some(late.position)));
        true
    })?;
    known.late_clean = (complete && ceiling == last_late).then_some((last_late, delivered_late));

    // Then each originator after the vector clock. A read that stops at
    // the step-over budget inside a run of late rows moves on from where it
    // stopped in a further round, as long as the batch is still empty: the
    // budget bounds the work of a call that has rows to return, never makes
    // a call return nothing while rows are deliverable.
    let mut step_over: HashMap<i32, i64> = HashMap::new();
    let mut round: Vec<(i32, i64)> = Vec::with_capacity(nodes.len());
    for &node in nodes {
        if let Some(clocks) = &gate.sample.clocks {
            if known.node_is_clean(node, clocks) {
                continue;
            }
        }
        known.clean.remove(&node);
        round.push((node, known.cursor_of(node)));
    }
    while !round.is_empty() {
        let mut again = Vec::new();
        for (node, after) in round {
            if budget.exhausted() {
                break;
            }
            let pass = read_in_order(node, after, gate, &mut budget, &mut out)?;
            if let Some(seq) = pass.stepped_to {
                step_over.insert(node, seq);
            }
            if pass.clean {
                if let Some(clocks) = &gate.sample.clocks {
                    known.clean.insert(
                        node,
                        (
                            clocks[clock::bucket(node)],
                            clocks[clock::ALL],
                            pass.reached,
                        ),
                    );
                }
            }
            if let Some(from) = pass.go_on_from {
                again.push((node, from));
            }
        }
        round = if out.is_empty() { again } else { Vec::new() };
    }
    Ok((out, step_over))
}

/// Late rows one read of the in-order part steps over at most before it lets the
/// other originators have their turn; a longer run is read on in the next round
/// of the same call while the batch is empty, else in the next batch.
const MAX_LATE_STEPPED_OVER: usize = 10_000;

/// What one read of an originator's in-order rows ([`read_in_order`]) did.
struct Pass {
    /// How far the originator's rows were handed out or stepped over.
    reached: i64,
    /// The cursor stepped over a run of late rows right after it, to here.
    stepped_to: Option<i64>,
    /// Read to the end with nothing held back: the originator is clean.
    clean: bool,
    /// Stopped at [`MAX_LATE_STEPPED_OVER`] having stepped over every row it
    /// read: another read from here makes progress.
    go_on_from: Option<i64>,
}

/// Reads `node`'s rows after `after` for an envelope batch through `gate`:
/// hands the in-order ones out into `out` (within `budget`) up to the last one
/// whose transaction had ended when the markers were listed (see
/// [`crate::store::feed`]), and steps over the late rows right after `after` (the late
/// feed hands those out), at most [`MAX_LATE_STEPPED_OVER`] of them.
fn read_in_order(
    node: i32,
    after: i64,
    gate: &Gate,
    budget: &mut Budget,
    out: &mut Vec<BatchRow>,
) -> Result<Pass, ConsumerError> {
    let limit = gate.markers.envelope_limit(node);
    let upto = limit.unwrap_or(i64::MAX);
    let mut read = Vec::new();
    let mut room = budget.clone();
    let mut late_seen = 0usize;
    let reached_end = read::originator_rows(
        node,
        after,
        upto,
        gate.rows(),
        Blobs::NotOfLateRows,
        |row| {
            if row.late {
                // Bounds the read like any row (it is committed); the late feed
                // hands it out. Read without its bytes, and only so many.
                late_seen += 1;
                read.push(row);
                return if late_seen < MAX_LATE_STEPPED_OVER {
                    Flow::Continue
                } else {
                    Flow::Stop
                };
            }
            if !room.take(row.bytes()) {
                return Flow::Stop;
            }
            read.push(row);
            Flow::Continue
        },
    )?;
    let read_len = read.len();
    let last_read = read.last().map(|row| row.seq);
    // Hand out rows only up to the last one whose transaction had ended before
    // the markers were listed (see crate::store::feed).
    let settled = read
        .iter()
        .rposition(|row| gate.settled(row.inserted_xid))
        .map_or(0, |i| i + 1);
    let mut tail_unsettled = settled < read.len();
    read.truncate(settled);
    // Nothing above what the high-water marks covered (rows written around the
    // functions): see Gate::cap.
    if let Some(last) = read.last().map(|row| row.seq) {
        let cap = gate.cap(node, last);
        if cap < last {
            tail_unsettled = true;
            read.truncate(read.partition_point(|row| row.seq <= cap));
        }
    }
    // Late rows right after the cursor: nothing of this feed is left to hand out
    // below the last of them, so the cursor may step over them without a
    // delivery (the bridge's acknowledgement only covers the rows it was handed).
    let leading_late = read.iter().take_while(|row| row.late).last().map(|r| r.seq);
    let mut reached = after;
    for row in read {
        if row.late {
            continue;
        }
        budget.take(row.bytes());
        reached = reached.max(row.seq);
        out.push((row, None));
    }
    let mut stepped_to = None;
    if let Some(seq) = leading_late.filter(|_| reached == after) {
        stepped_to = Some(seq);
        reached = seq;
    }
    // Stopped at the budget with every row read stepped over: read on from there.
    let go_on_from = (late_seen >= MAX_LATE_STEPPED_OVER
        && settled == read_len
        && stepped_to.is_some()
        && stepped_to == last_read)
        .then_some(reached);
    Ok(Pass {
        reached,
        stepped_to,
        clean: limit.is_none() && reached_end && !tail_unsettled,
        go_on_from,
    })
}

/// Moves `consumer`'s vector clock forward (never back) for the given
/// originators, raising its version as an acknowledgement does: when a batch
/// steps over a run of late rows (see [`envelope_batch`]), and when a consumer is
/// registered at the end of the feeds.
pub fn move_cursor(consumer: &str, moves: Vec<(i32, i64)>) -> Result<(), ConsumerError> {
    let (nodes, seqs): (Vec<i32>, Vec<i64>) = moves.into_iter().unzip();
    Spi::run_with_args(
        "WITH v AS (
             UPDATE envelopes.consumers SET version = version + 1 WHERE name = $1 RETURNING version)
         INSERT INTO envelopes.consumer_envelope_cursors AS c
                (consumer, originator_node_id, sequence_id, version)
         SELECT $1, t.node, t.seq, v.version
           FROM v, ROWS FROM (pg_catalog.unnest($2::int[]), pg_catalog.unnest($3::bigint[])) AS t(node, seq)
         ON CONFLICT ON CONSTRAINT consumer_envelope_cursors_pkey
         DO UPDATE SET sequence_id = GREATEST(c.sequence_id, EXCLUDED.sequence_id),
                       version = EXCLUDED.version",
        &[
            DatumWithOid::from(consumer),
            DatumWithOid::from(nodes),
            DatumWithOid::from(seqs),
        ],
    )?;
    Ok(())
}

/// What `consumer` has not acknowledged yet among the envelopes it can read:
/// in-order rows up to each originator's ceiling, and late arrivals after its
/// late-feed position; and the oldest of them (`gateway_time`, or when a late
/// one was recorded). Originators this backend found settled are not read again.
pub fn envelopes_pending(
    consumer: &str,
) -> Result<(i64, Option<TimestampWithTimeZone>), ConsumerError> {
    // As for a batch.
    crate::pg::invalidation::accept();
    let sample = Sample::take()?;
    let nodes = partition::originators()?;
    with_consumer(consumer, Access::Look, |known| {
        if let Some(clocks) = &sample.clocks {
            if known.envelopes_idle(clocks, sample.last_drawn(Drawn::Late), &nodes) {
                return Ok((0, None));
            }
        }
        // Rows held back for the high-water marks are counted by a gate opened
        // now (Gate::cap).
        Gate::read_settled_from(sample, &nodes, |gate| count_pending(known, gate, &nodes))
    })
}

/// What [`envelopes_pending`] counts, through `gate`.
fn count_pending(
    known: &Known,
    gate: &Gate,
    nodes: &[i32],
) -> Result<(i64, Option<TimestampWithTimeZone>), ConsumerError> {
    let mut pending = 0i64;
    let mut oldest: Option<TimestampWithTimeZone> = None;
    let ceiling = gate.drawn_ceiling(Drawn::Late);
    late::late_rows(known.late_id, ceiling, gate.rows(), Blobs::None, |late| {
        pending += 1;
        let t = late.recorded_at.unwrap_or(late.row.gateway_time);
        oldest = Some(oldest.map_or(t, |o| o.min(t)));
        true
    })?;
    for &node in nodes {
        if let Some(clocks) = &gate.sample.clocks {
            if known.node_is_clean(node, clocks) {
                continue;
            }
        }
        let (rows, first) = count_in_order(node, known.cursor_of(node), gate)?;
        pending += rows;
        if let Some(t) = first {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
    }
    Ok((pending, oldest))
}

/// What a count of one originator's in-order rows has seen up to some row.
#[derive(Clone, Copy, Default)]
struct Tally {
    rows: i64,
    /// The oldest `gateway_time` counted, as kept (see [`read::At::gateway_time_raw`]).
    oldest: Option<i64>,
}

/// `node`'s in-order rows after `after` up to its ceiling through `gate` (as
/// [`Gate::envelope_ceiling`] sets it), and the oldest one's time, in one read
/// of its meta bands without their blobs: the ceiling is the last row read
/// whose transaction had ended before the markers were listed (the highest
/// committed row [`Gate::envelope_ceiling`] looks for with the snapshot taken
/// then), below every marker of the originator and at most what the high-water
/// marks covered ([`Gate::cap`], which raises the marks when it holds rows
/// back). One index range per originator, its locks and no second read.
fn count_in_order(
    node: i32,
    after: i64,
    gate: &Gate,
) -> Result<(i64, Option<TimestampWithTimeZone>), ConsumerError> {
    let upto = gate.markers.envelope_limit(node).unwrap_or(i64::MAX);
    let covered = gate.covered(node);
    let mut seen = Tally::default();
    // Up to the last settled row read; and up to the last row at or below
    // what the marks covered.
    let mut at_settled = Tally::default();
    let mut last_settled: Option<i64> = None;
    let mut at_covered = Tally::default();
    read::walk_originator(node, after, upto, gate.rows(), Blobs::None, |mut at| {
        if !at.late() {
            seen.rows += 1;
            let t = at.gateway_time_raw()?;
            seen.oldest = Some(seen.oldest.map_or(t, |o| o.min(t)));
        }
        if at.seq <= covered {
            at_covered = seen;
        }
        if gate.settled(at.inserted_xid()?) {
            at_settled = seen;
            last_settled = Some(at.seq);
        }
        Ok(Flow::Continue)
    })?;
    let Some(last) = last_settled else {
        return Ok((0, None));
    };
    let counted = if gate.cap(node, last) < last {
        // Rows above the marks wait for the next gate (which counts them).
        at_covered
    } else {
        at_settled
    };
    let oldest = counted
        .oldest
        .map(TimestampWithTimeZone::try_from)
        .transpose()
        .map_err(|_| PartitionError::Catalog("a gateway_time out of range"))?;
    Ok((counted.rows, oldest))
}

/// What an acknowledgement moved: rows acknowledged, and their first and last
/// `gateway_time` (or, for late ones, when they were recorded).
#[derive(Default)]
struct Acknowledged {
    rows: i64,
    first: Option<TimestampWithTimeZone>,
    last: Option<TimestampWithTimeZone>,
}

impl Acknowledged {
    fn add(&mut self, at: Option<TimestampWithTimeZone>) {
        self.rows += 1;
        if let Some(at) = at {
            self.first = Some(self.first.map_or(at, |f| f.min(at)));
            self.last = Some(self.last.map_or(at, |l| l.max(at)));
        }
    }
}

/// Moves `consumer`'s positions forward to `targets` (per originator, the
/// highest sequence id delivered from the in-order part of its batches) and
/// `late_id` (see `consumer_envelope_ack`); returns the envelopes acknowledged.
pub fn envelope_ack(
    consumer: &str,
    targets: HashMap<i32, i64>,
    late_id: Option<i64>,
) -> Result<i64, ConsumerError> {
    // The consumer's row, locked: acknowledgements of one consumer take turns.
    let locked = Spi::connect_mut(|client| {
        let rows = client.update(
            &format!(
                "SELECT c.late_id, {OWNER_COLUMNS},
                        (SELECT e.extowner FROM pg_catalog.pg_extension e
                          WHERE e.extname = 'pg_envelopes')
                   FROM envelopes.consumers c WHERE c.name = $1 FOR UPDATE"
            ),
            None,
            &[DatumWithOid::from(consumer)],
        )?;
        if rows.is_empty() {
            return Ok::<_, ConsumerError>(None);
        }
        let row = rows.first();
        Ok(Some((
            row.get::<i64>(1)?.unwrap_or(0),
            Owner::read(row.get::<pg_sys::Oid>(2)?, row.get::<bool>(3)?),
            row.get::<pg_sys::Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
        )))
    })?;
    let Some((acked_late, owner, extension_owner)) = locked else {
        return Err(ConsumerError::Unknown(consumer.to_owned()));
    };
    owner::check_owner(consumer, owner, extension_owner)?;
    crate::store::lease::check(crate::store::lease::Kind::Egress, consumer, "")?;
    if let Some(id) = late_id {
        // A position names a drawn entry (ids start at 1), or is 0: nothing.
        let entry = Positions::current().entry(id);
        if entry > Drawn::Late.last_drawn()? || (entry == 0 && id > 0) {
            return Err(ConsumerError::NeverDrawn(id));
        }
    }
    let target_nodes: Vec<i32> = targets.keys().copied().collect();
    let mut moved: Vec<(i32, i64, i64)> = Vec::new();
    Spi::connect(|client| {
        let mut current: HashMap<i32, i64> = HashMap::new();
        for row in client.select(
            "SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors
              WHERE consumer = $1 AND originator_node_id = ANY ($2)",
            None,
            &[
                DatumWithOid::from(consumer),
                DatumWithOid::from(target_nodes),
            ],
        )? {
            if let (Some(node), Some(seq)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) {
                current.insert(node, seq);
            }
        }
        for (node, seq) in targets {
            let old = current.get(&node).copied().unwrap_or(0);
            if seq > old {
                moved.push((node, old, seq));
            }
        }
        Ok::<_, ConsumerError>(())
    })?;
    let late_moved = late_id.filter(|&id| id > acked_late);
    if moved.is_empty() && late_moved.is_none() {
        return Ok(0);
    }
    // Count what the acknowledgement covers, for the delivery log.
    let snapshot = crate::pg::snapshot::Latest::take();
    let mut acked = Acknowledged::default();
    for &(node, old, new) in &moved {
        read::originator_rows(node, old, new, snapshot.as_ptr(), Blobs::None, |row| {
            if !row.late {
                acked.add(Some(row.gateway_time));
            }
            Flow::Continue
        })?;
    }
    if let Some(id) = late_moved {
        late::late_rows(
            acked_late,
            Positions::current().entry(id),
            snapshot.as_ptr(),
            Blobs::None,
            |late| {
                if late.position > id {
                    return false;
                }
                acked.add(late.recorded_at);
                true
            },
        )?;
    }
    let (nodes, seqs): (Vec<i32>, Vec<i64>) = moved.iter().map(|&(n, _, s)| (n, s)).unzip();
    Spi::run_with_args(
        "WITH v AS (
             UPDATE envelopes.consumers
                SET version = version + (CASE WHEN pg_catalog.cardinality($2::int[]) > 0 THEN 1 ELSE 0 END),
                    late_id = GREATEST(late_id, COALESCE($4, late_id)), acked_at = pg_catalog.now()
              WHERE name = $1 RETURNING version
         ), c AS (
             INSERT INTO envelopes.consumer_envelope_cursors AS c
                    (consumer, originator_node_id, sequence_id, version)
             SELECT $1, t.node, t.seq, v.version
               FROM v, ROWS FROM (pg_catalog.unnest($2::int[]), pg_catalog.unnest($3::bigint[])) AS t(node, seq)
             ON CONFLICT ON CONSTRAINT consumer_envelope_cursors_pkey
             DO UPDATE SET sequence_id = GREATEST(c.sequence_id, EXCLUDED.sequence_id),
                           version = EXCLUDED.version
         )
         INSERT INTO envelopes.delivery_log (consumer, kind, rows, committed_from, committed_to)
         SELECT $1, 'envelopes', $5, $6, $7 FROM v",
        &[
            DatumWithOid::from(consumer),
            DatumWithOid::from(nodes),
            DatumWithOid::from(seqs),
            DatumWithOid::from(late_moved),
            DatumWithOid::from(acked.rows),
            DatumWithOid::from(acked.first),
            DatumWithOid::from(acked.last),
        ],
    )?;
    Ok(acked.rows)
}
