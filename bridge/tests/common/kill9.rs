//! The kill -9 scenario of the delivery suite and of the sink conformance
//! suite, written once: envelopes — each tenth arriving late, after the nine
//! above it were committed and forwarded (the retried-insert shape), and
//! outbox rows in the same transactions when asked for — are written while
//! the bridge is killed with SIGKILL at random moments; then a last bridge
//! drains the backlog, and the test compares what was committed with what
//! reached the bus.

use super::target::Target;
use super::*;
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// How a run writes and kills.
pub struct Kill9 {
    /// Label of the test database.
    pub label: &'static str,
    /// The consumer (registered before the first bridge starts).
    pub consumer: &'static str,
    /// The originator written.
    pub node: i32,
    /// Each in-order envelope is committed together with an outbox row
    /// (subject `CONSUMER.created`) instead of on its own.
    pub with_outbox: bool,
    /// The writer goes on until the bridges were killed and at least this
    /// sequence id was written.
    pub until: i64,
    /// The pause after each group of nine, before the late one commits (the
    /// bridge forwards the nine meanwhile).
    pub pause: Duration,
    /// Bridges started and killed, each living a random time in
    /// `lifetime_ms` (milliseconds), drawn from a generator seeded with `seed`.
    pub kills: usize,
    pub seed: u64,
    pub lifetime_ms: Range<u64>,
    /// How long the last bridge may take to drain the backlog.
    pub drain: Duration,
    /// How long to wait after the drain before stopping it: what the last
    /// batch published reaches a subscriber a moment later.
    pub settle: Duration,
}

/// What a run left: the database (for checks of its own), every committed
/// row's dedup id, and the ids that reached the bus, with repeats.
pub struct Outcome {
    pub db: TestDb,
    pub committed: BTreeSet<String>,
    pub delivered: Vec<String>,
}

impl Outcome {
    /// The delivered ids without repeats.
    pub fn delivered_set(&self) -> BTreeSet<String> {
        self.delivered.iter().cloned().collect()
    }

    /// Committed rows that never reached the bus.
    pub fn lost(&self) -> Vec<&String> {
        missing(&self.committed, &self.delivered_set())
    }

    /// Rows that reached the bus more than once (counted once per repeat).
    pub fn duplicates(&self) -> usize {
        self.delivered.len() - self.delivered_set().len()
    }
}

impl Kill9 {
    /// Runs the scenario against `target`.
    pub fn run(&self, target: &Target) -> Outcome {
        let db = TestDb::new(self.label);
        db.client()
            .execute("SELECT envelopes.consumer_register($1)", &[&self.consumer])
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let conninfo = db.conninfo();
            let stop = stop.clone();
            let (node, until, pause, with_outbox) =
                (self.node, self.until, self.pause, self.with_outbox);
            let subject = format!("{}.created", self.consumer);
            thread::spawn(move || {
                let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
                let mut base = 1i64;
                while !stop.load(Ordering::Relaxed) || base < until {
                    {
                        let mut tx = c.transaction().unwrap();
                        insert(&mut tx, node, base);
                        tx.rollback().unwrap();
                    }
                    for seq in base + 1..base + 10 {
                        if with_outbox {
                            let mut tx = c.transaction().unwrap();
                            insert(&mut tx, node, seq);
                            tx.execute("SELECT envelopes.publish($1, '\\x01')", &[&subject])
                                .unwrap();
                            tx.commit().unwrap();
                        } else {
                            insert(&mut c, node, seq);
                        }
                        thread::sleep(Duration::from_millis(3));
                    }
                    thread::sleep(pause); // let the bridge forward them
                    assert_eq!(insert(&mut c, node, base), 1); // the retry lands late
                    base += 10;
                }
            })
        };
        let mut rng = fastrand::Rng::with_seed(self.seed);
        for _ in 0..self.kills {
            let mut bridge = Bridge::egress(&db, self.consumer, &target.sink, &target.args(), &[]);
            thread::sleep(Duration::from_millis(rng.u64(self.lifetime_ms.clone())));
            bridge.kill9();
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let mut bridge = Bridge::egress(&db, self.consumer, &target.sink, &target.args(), &[]);
        wait_until("the backlog to drain", self.drain, || {
            lag(&db, self.consumer) == 0
        });
        thread::sleep(self.settle);
        bridge.terminate();
        Outcome {
            committed: committed_ids(&db),
            delivered: target.delivered(),
            db,
        }
    }
}
