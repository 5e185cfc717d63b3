//! A total-queue checker in the spirit of Jepsen's: from what the writers were
//! told was committed, what the store holds after the run, and what a consumer
//! using the bus's own client received (in the bus's order), it counts per
//! originator (or per other key: the outbox is one):
//!
//! * **lost**: acknowledged to a writer, never delivered (with those bytes);
//! * **phantom**: delivered, but not in the store after the run, or in the
//!   store with other bytes;
//! * **duplicates**: deliveries of an id beyond its first;
//! * **order violations**: rows of one key delivered in an order other than
//!   the one their writer was told they committed in, among rows whose sequence
//!   ids follow that order (a row written late, below one already committed,
//!   goes its own way by design): a first delivery of X after Y, where X was
//!   acknowledged before Y and has the lower sequence id.
//!
//! Messages are `(key, sequence, id, bytes)`: the id is what dedup goes by,
//! the sequence what order goes by.

use std::collections::{BTreeMap, BTreeSet};

/// One message: its key (originator), its position in that key's order, its
/// dedup id and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub seq: i64,
    pub id: String,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub acknowledged: usize,
    pub delivered: usize,
    pub lost: usize,
    pub phantom: usize,
    pub duplicates: usize,
    pub order_violations: usize,
}

/// Counts per key; see the module documentation.
pub fn check(
    acknowledged: &[Item],
    store: &[Item],
    delivered: &[Item],
) -> BTreeMap<String, Counts> {
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    let stored: BTreeMap<&str, &[u8]> = store
        .iter()
        .map(|i| (i.id.as_str(), i.bytes.as_slice()))
        .collect();
    let mut seen: BTreeSet<(&str, &[u8])> = BTreeSet::new();
    let mut first: BTreeSet<&str> = BTreeSet::new();
    // Per key, (sequence id, acknowledgement index) of the rows delivered so far.
    let mut earlier: BTreeMap<&str, Vec<(i64, usize)>> = BTreeMap::new();
    let acked_at: BTreeMap<&str, usize> = acknowledged
        .iter()
        .enumerate()
        .map(|(i, item)| (item.id.as_str(), i))
        .collect();
    for item in delivered {
        let c = counts.entry(item.key.clone()).or_default();
        c.delivered += 1;
        seen.insert((item.id.as_str(), item.bytes.as_slice()));
        if stored.get(item.id.as_str()) != Some(&item.bytes.as_slice()) {
            c.phantom += 1;
        }
        if !first.insert(item.id.as_str()) {
            c.duplicates += 1;
            continue;
        }
        let Some(&acked) = acked_at.get(item.id.as_str()) else {
            continue; // never acknowledged: no order was promised for it
        };
        let before = earlier.entry(item.key.as_str()).or_default();
        if before.iter().any(|&(seq, at)| seq > item.seq && at > acked) {
            c.order_violations += 1;
        }
        before.push((item.seq, acked));
    }
    for item in acknowledged {
        let c = counts.entry(item.key.clone()).or_default();
        c.acknowledged += 1;
        if !seen.contains(&(item.id.as_str(), item.bytes.as_slice())) {
            c.lost += 1;
        }
    }
    counts
}

/// The counts summed over every key.
pub fn total(counts: &BTreeMap<String, Counts>) -> Counts {
    counts.values().fold(Counts::default(), |mut t, c| {
        t.acknowledged += c.acknowledged;
        t.delivered += c.delivered;
        t.lost += c.lost;
        t.phantom += c.phantom;
        t.duplicates += c.duplicates;
        t.order_violations += c.order_violations;
        t
    })
}

/// The counts as a table, one line per key and the total.
pub fn table(title: &str, counts: &BTreeMap<String, Counts>) -> String {
    let mut out = format!(
        "{title}\n{:<10} {:>12} {:>10} {:>6} {:>8} {:>11} {:>16}\n",
        "key", "acknowledged", "delivered", "lost", "phantom", "duplicates", "order violations"
    );
    let all = total(counts);
    for (key, c) in counts
        .iter()
        .chain(std::iter::once((&"total".to_owned(), &all)))
    {
        out.push_str(&format!(
            "{:<10} {:>12} {:>10} {:>6} {:>8} {:>11} {:>16}\n",
            key, c.acknowledged, c.delivered, c.lost, c.phantom, c.duplicates, c.order_violations
        ));
    }
    out
}
