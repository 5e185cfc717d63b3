//! prune_expired against busy writers: what it keeps, that writers do not wait
//! for it, that it sees rows its caller's snapshot cannot, and that it never
//! deadlocks with partition creation.

use pg_envelopes_tests::{sqlstate, TestDb};
use postgres::{Client, NoTls};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn bands(c: &mut Client, node: i32) -> Vec<i64> {
    c.query(
        "SELECT band_start FROM envelopes.partitions() WHERE originator_node_id = $1 ORDER BY 1",
        &[&node],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn insert(c: &mut impl postgres::GenericClient, node: i32, seq: i64, expiry: Option<i64>) {
    c.query_one(
        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02', expiry => $3)",
        &[&node, &seq, &expiry],
    )
    .expect("insert");
}

/// Bands created ahead of the data stay, whatever as_of says; so do the newest
/// band and the band holding the highest row. Empty bands below the highest row
/// go, whether they were emptied or never filled.
#[test]
fn pre_created_bands_stay() {
    let db = TestDb::new("prune_keep");
    let mut c = db.connect();
    // Rows in bands 0 and 1 expire; band 3 holds the highest row, which does not;
    // bands 2 (between), 4 and 5 (ahead) are created empty.
    for seq in [5, 1_000_005] {
        insert(&mut c, 1, seq, Some(100));
    }
    insert(&mut c, 1, 3_000_005, None);
    for seq in [2_000_000i64, 4_000_000, 5_000_000] {
        c.execute("SELECT envelopes.ensure_gateway_parts(1, $1)", &[&seq])
            .unwrap();
    }
    // Nothing has expired yet: of the empty bands only the gap below the highest
    // row goes (an insert would create it again); the ones ahead stay.
    let rows = c
        .query(
            "SELECT band_start, deleted_rows, dropped
               FROM envelopes.prune_expired(as_of => -9223372036854775808)",
            &[],
        )
        .unwrap();
    let got: Vec<(i64, i64, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(got, [(2_000_000, 0, true)]);
    assert_eq!(
        bands(&mut c, 1),
        [0, 1_000_000, 3_000_000, 4_000_000, 5_000_000]
    );
    // Everything expired: bands 0 and 1 go; 3 (the highest row), 4 and 5 stay.
    let rows = c
        .query(
            "SELECT band_start, deleted_rows, dropped FROM envelopes.prune_expired(as_of => 200)
              ORDER BY 1",
            &[],
        )
        .unwrap();
    let got: Vec<(i64, i64, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(got, [(0, 1, true), (1_000_000, 1, true)]);
    assert_eq!(bands(&mut c, 1), [3_000_000, 4_000_000, 5_000_000]);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
        0
    );
}

/// A caller whose snapshot predates a commit: the row that commit put into an
/// emptied band is seen (prune reads with a snapshot of its own after locking),
/// so the band is not dropped; in both modes.
#[test]
fn a_repeatable_read_caller_does_not_drop_a_filled_band() {
    let db = TestDb::new("prune_rr");
    let mut setup = db.connect();
    for in_transaction in [false, true] {
        let node = if in_transaction { 2 } else { 1 };
        insert(&mut setup, node, 5, Some(100)); // band 0, expires
        insert(&mut setup, node, 2_000_005, None); // band 2: the highest row
                                                   // Empty band 0 out first.
        db.int8(&format!(
            "SELECT count(*) FROM envelopes.prune_expired(as_of => 200, lock_timeout_ms => 1)
              WHERE originator_node_id = {node} AND NOT dropped"
        ));
        c_insert_band(&db, node);
        let mut caller = db.connect();
        let mut tx = caller
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()
            .unwrap();
        // The caller's snapshot, taken by a statement that touches no table (a
        // read of the originator would lock its partitions until commit, and a
        // worker could then drop nothing).
        tx.query_one("SELECT 1", &[]).unwrap();
        // A late row lands in band 1 and commits.
        insert(&mut setup, node, 1_000_007, None);
        let dropped: i64 = tx
            .query_one(
                "SELECT count(*) FROM envelopes.prune_expired(as_of => 200, in_transaction => $1)
                  WHERE dropped AND band_start = 1000000",
                &[&in_transaction],
            )
            .unwrap()
            .get(0);
        assert_eq!(dropped, 0, "in_transaction = {in_transaction}");
        tx.commit().unwrap();
        assert!(
            bands(&mut setup, node).contains(&1_000_000),
            "in_transaction = {in_transaction}"
        );
        assert_eq!(
            db.int8(&format!(
                "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = {node}"
            )),
            2
        );
    }
}

/// Creates band 1 of `node`, empty.
fn c_insert_band(db: &TestDb, node: i32) {
    db.connect()
        .execute(
            "SELECT envelopes.ensure_gateway_parts($1, 1000000)",
            &[&node],
        )
        .unwrap();
}

/// The prune-stall case: one band to drop for originator 1, then 30 originators
/// whose old bands are held by an open transaction, each costing prune its
/// lock_timeout_ms. Inserts into originator 1 go on once its band is dropped,
/// while prune is still busy with the others: it committed that band already and
/// holds nothing of originator 1.
#[test]
fn prune_does_not_stall_the_originators_it_pruned() {
    let db = TestDb::new("prune_stall");
    let mut c = db.connect();
    for node in 1..=31 {
        insert(&mut c, node, 5, Some(100)); // band 0: expired
        insert(&mut c, node, 1_000_005, None); // band 1: the highest row
    }
    // Originators 2..31: an open transaction keeps their band 0 busy.
    let mut holder = db.connect();
    let mut hold = holder.transaction().unwrap();
    for node in 2..=31 {
        hold.execute(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1
               AND originator_sequence_id < 1000000",
            &[&node],
        )
        .unwrap();
    }
    let url = db.url();
    let pruner = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let started = Instant::now();
        let rows = c
            .query(
                "SELECT originator_node_id, dropped FROM envelopes.prune_expired(lock_timeout_ms => 300)",
                &[],
            )
            .expect("prune");
        let dropped: Vec<i32> = rows
            .iter()
            .filter(|r| r.get::<_, bool>(1))
            .map(|r| r.get(0))
            .collect();
        (dropped, started.elapsed())
    });
    // Wait for originator 1's band 0 to be gone (committed by the worker).
    let mut writer = db.connect();
    writer
        .batch_execute("SET statement_timeout = '2s'")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while bands(&mut writer, 1).contains(&0) {
        assert!(
            Instant::now() < deadline,
            "band 0 of originator 1 was never dropped"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // Prune is still working through the busy bands (30 x 300 ms), and an insert
    // into originator 1 - into its band 1, and into the band prune just dropped -
    // does not wait for it.
    insert(&mut writer, 1, 1_000_006, None);
    insert(&mut writer, 1, 7, None);
    assert!(!pruner.is_finished(), "prune finished too early to tell");
    let (dropped, _) = pruner.join().unwrap();
    assert_eq!(dropped, [1]);
    hold.commit().unwrap();
    assert_eq!(
        bands(&mut c, 2),
        [0, 1_000_000],
        "busy bands are left for the next run"
    );
}

/// Thirty-two writers keep crossing into new bands of eight shared originators
/// while prune runs in a loop, in both creation modes, on a server with
/// max_worker_processes = 8: no writer or pruner error (no deadlock, no lock
/// timeout), no row lost, nothing orphaned, and bands did get dropped.
#[test]
fn creation_and_pruning_never_deadlock() {
    for mode in ["worker", "transaction"] {
        creation_and_pruning_under_load(mode, Duration::from_secs(20));
    }
}

fn creation_and_pruning_under_load(mode: &str, duration: Duration) {
    let db = TestDb::new(&format!("prune_load_{mode}"));
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{0}\" SET envelopes.band_width = 64;
             ALTER DATABASE \"{0}\" SET envelopes.create_partitions_in = {mode}",
            db.name
        ))
        .unwrap();
    let workers: i64 = db.int8("SELECT current_setting('max_worker_processes')::bigint");
    assert!(
        workers <= 8,
        "the test is meant for a server with few worker slots"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let kept = Arc::new(AtomicI64::new(0));
    let writers: Vec<_> = (0..32i64)
        .map(|w| {
            let (url, stop, kept) = (db.url(), stop.clone(), kept.clone());
            thread::spawn(move || -> Vec<String> {
                let mut c = Client::connect(&url, NoTls).unwrap();
                let node = (w % 8) as i32;
                let mut errors = Vec::new();
                let mut i = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    // Four writers per originator, interleaved ids: each crosses
                    // into a new band every 16 rows. Three bands in four hold only
                    // rows born expired, so they empty out behind the writers; the
                    // fourth keeps its rows.
                    let seq = 1 + i * 4 + w / 8;
                    let expiry = if (seq / 64) % 4 == 3 { None } else { Some(1i64) };
                    match c.query_one(
                        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02', expiry => $3)",
                        &[&node, &seq, &expiry],
                    ) {
                        Ok(row) => {
                            if expiry.is_none() {
                                kept.fetch_add(row.get::<_, i64>(0), Ordering::Relaxed);
                            }
                        }
                        Err(e) => errors.push(format!("{} {e}", sqlstate(&e))),
                    }
                    i += 1;
                }
                errors
            })
        })
        .collect();
    let mut pruner = db.connect();
    let (mut dropped, mut prune_errors) = (0i64, Vec::new());
    let end = Instant::now() + duration;
    while Instant::now() < end {
        match pruner.query_one(
            "SELECT count(*) FILTER (WHERE dropped) FROM envelopes.prune_expired(lock_timeout_ms => 50)",
            &[],
        ) {
            Ok(row) => dropped += row.get::<_, i64>(0),
            Err(e) => prune_errors.push(format!("{} {e}", sqlstate(&e))),
        }
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for w in writers {
        errors.extend(w.join().unwrap());
    }
    assert!(
        errors.is_empty(),
        "{mode}: writer errors: {:?}",
        &errors[..errors.len().min(5)]
    );
    assert!(
        prune_errors.is_empty(),
        "{mode}: prune errors: {prune_errors:?}"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE expiry IS NULL"),
        kept.load(Ordering::Relaxed),
        "{mode}: rows lost"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        "{mode}"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
        0,
        "{mode}"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.partitions() WHERE meta_partition IS NULL OR blob_partition IS NULL"),
        0,
        "{mode}: a band lost its twin"
    );
    assert!(
        dropped > 0,
        "{mode}: no band was ever dropped; the test exercises nothing"
    );
}

/// Expired rows in `bands` bands of `node` (width 10), below a row that stays.
fn expired_bands(db: &TestDb, node: i32, bands: i64) {
    let mut c = db.connect();
    c.batch_execute("SET envelopes.band_width = 10").unwrap();
    let seqs: Vec<i64> = (0..bands).map(|s| s * 10 + 1).collect();
    let n = seqs.len();
    c.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_fill($1::int, ARRAY[$2::int]), $3,
                    array_fill('\\x01'::bytea, ARRAY[$2::int]), array_fill('\\x02'::bytea, ARRAY[$2::int]),
                    expiries => array_fill(1::bigint, ARRAY[$2::int]))",
        &[&node, &(n as i32), &seqs],
    )
    .unwrap();
    insert(&mut c, node, bands * 10 + 5, None);
}

/// Two prunes at once share the work: neither fails, every band is dropped once.
#[test]
fn concurrent_prunes_share_the_work() {
    let db = TestDb::new("prune_twice");
    expired_bands(&db, 71, 60);
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let url = db.url();
            thread::spawn(move || {
                let mut c = Client::connect(&url, NoTls).unwrap();
                c.query(
                    "SELECT band_start FROM envelopes.prune_expired() WHERE dropped",
                    &[],
                )
                .map(|rows| rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>())
                .map_err(|e| format!("{} {e}", sqlstate(&e)))
            })
        })
        .collect();
    let mut dropped = Vec::new();
    for h in handles {
        dropped.extend(h.join().unwrap().expect("a concurrent prune must not fail"));
    }
    dropped.sort();
    let before = dropped.len();
    dropped.dedup();
    assert_eq!(before, dropped.len(), "a band reported dropped twice");
    // 60 expired bands; the band of the row that stays is the newest.
    assert_eq!(dropped.len(), 60);
    let mut c = db.connect();
    assert_eq!(bands(&mut c, 71), [600]);
}

/// Pruning in the caller's transaction waits for nothing: a row another session
/// has locked is skipped, so a prune holding one originator's drop locks never
/// waits on that session, and that session's insert into the pruned originator
/// waits for the prune's commit instead of deadlocking with it.
#[test]
fn pruning_in_a_transaction_does_not_deadlock_with_row_locks() {
    let db = TestDb::new("prune_rowlock");
    expired_bands(&db, 84, 3);
    expired_bands(&db, 85, 3);
    let mut s = db.connect();
    s.batch_execute(
        "BEGIN;
         UPDATE envelopes.gateway_envelopes_meta SET expiry = expiry
          WHERE originator_node_id = 85 AND originator_sequence_id = 1",
    )
    .unwrap();
    let mut p = db.connect();
    p.batch_execute("SET statement_timeout = '10s'").unwrap();
    let mut p_tx = p.transaction().unwrap();
    let dropped: Vec<(i32, i64)> = p_tx
        .query(
            "SELECT originator_node_id, band_start FROM envelopes.prune_expired(in_transaction => true)
              WHERE dropped ORDER BY 1, 2",
            &[],
        )
        .expect("prune must not wait for the locked row")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // 85's band 0 holds the locked row: kept; its other expired bands go.
    assert!(
        dropped.contains(&(84, 0)) && !dropped.contains(&(85, 0)),
        "{dropped:?}"
    );
    let url = db.url();
    let writer = thread::spawn(move || -> Result<(), String> {
        let mut w = Client::connect(&url, NoTls).unwrap();
        insert(&mut w, 84, 1000, None);
        Ok(())
    });
    // The session holding the row lock inserts into 84 too: it waits for the
    // prune's commit (a deadlock would fail one of them with 40P01).
    let holder = thread::spawn(move || {
        let result = s
            .query_one(
                "SELECT envelopes.insert_gateway_envelope(84, 7, '\\x01', '\\x02')",
                &[],
            )
            .map(|_| ())
            .map_err(|e| format!("{} {e}", sqlstate(&e)));
        s.batch_execute("COMMIT").unwrap();
        result
    });
    thread::sleep(Duration::from_millis(500));
    p_tx.commit().unwrap();
    holder.join().unwrap().expect("the holder's insert");
    writer.join().unwrap().unwrap();
}
