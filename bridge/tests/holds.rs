//! A hold is visible while it lasts: rows a bridge holds back for the standbys
//! (`--forward-after standby-flush`, the default `auto` while
//! `synchronous_standby_names` is set) count in its lag, rows and age, and
//! `standby_wait_seconds_total` grows during the wait, not only when it ends.
//!
//! A private server names a standby that never connects; the writers commit
//! with `synchronous_commit = local`. On 211056c the bridge showed lag 0 rows,
//! 0 s and no wait time while every row waited.

mod common;

use common::cluster::Cluster;
use common::target::jsonl_ids;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn rows_held_for_the_standbys_show_in_the_lag_and_the_wait_grows_during_the_wait() {
    let server = Cluster::start("holds", &[]);
    let db = "holds";
    server.create_db(db);
    // The band and the consumer exist before the setting: their creation
    // commits at synchronous_commit = on, which would then wait for the standby.
    server
        .client(db)
        .batch_execute(
            "SELECT envelopes.ensure_gateway_parts(1, 1);
             SELECT envelopes.consumer_register('holds')",
        )
        .unwrap();
    // Set only now: with it, every commit at synchronous_commit = on waits.
    let mut admin = server.client("postgres");
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    let mut writer = server.client(db);
    writer
        .batch_execute("SET synchronous_commit = local")
        .unwrap();
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("holds")));
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    // The bridge's own commits (its lease, its acknowledgements) must not
    // wait for the standby either.
    let url = format!("{}?options=-c%20synchronous_commit%3Dlocal", server.url(db));
    let mut bridge = Bridge::egress_with_url(
        &url,
        "holds",
        &format!("jsonl:{}", path.display()),
        &["--metrics-addr", &addr],
        &[],
    );
    for seq in 1..=200 {
        insert(&mut writer, 1, seq);
    }
    let written = Instant::now();
    wait_for_bridge(
        &bridge,
        "the hold to start",
        Duration::from_secs(30),
        || metric(&try_scrape(metrics), "envelopes_bridge_standby_waiting") == 1.0,
    );
    std::thread::sleep(Duration::from_secs(3));
    let first = try_scrape(metrics);
    std::thread::sleep(Duration::from_millis(1500));
    let second = try_scrape(metrics);
    let waited = |t: &str| metric(t, "envelopes_bridge_standby_wait_seconds_total");
    assert_eq!(metric(&second, "envelopes_bridge_standby_waiting"), 1.0);
    assert!(
        waited(&first) >= 1.0 && waited(&second) >= waited(&first) + 1.0,
        "standby_wait_seconds_total does not grow during the wait: {} then {}",
        waited(&first),
        waited(&second)
    );
    assert!(
        metric(&second, "envelopes_bridge_lag_rows") >= 200.0,
        "held rows not in the lag:\n{second}"
    );
    let age = metric(&second, "envelopes_bridge_lag_seconds");
    assert!(
        age >= 4.0 && age <= written.elapsed().as_secs_f64() + 1.0,
        "lag_seconds {age} while the rows waited {:?}",
        written.elapsed()
    );
    assert!(jsonl_ids(&path).is_empty(), "rows passed the hold");
    // The setting emptied: auto mode forwards at commit again.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for_bridge(&bridge, "the held rows", Duration::from_secs(30), || {
        jsonl_ids(&path).len() >= 200
    });
    wait_until("the lag to clear", Duration::from_secs(15), || {
        let text = try_scrape(metrics);
        metric(&text, "envelopes_bridge_lag_rows") == 0.0
            && metric(&text, "envelopes_bridge_standby_waiting") == 0.0
    });
    bridge.terminate();
    let _ = std::fs::remove_file(&path);
}
