//! JetStream goes away while rows keep committing: nothing is lost, the backlog
//! drains when it is back, and nothing is stored twice.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;

#[test]
fn a_nats_outage_loses_nothing() {
    let outage = Duration::from_secs(
        std::env::var("ENVELOPES_TEST_NATS_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8),
    );
    let db = TestDb::new("natsdown");
    let port = free_port();
    let store = std::env::temp_dir().join(unique("natsstore"));
    let url = format!("nats://127.0.0.1:{port}");
    let mut nats = start_nats(port, &store, &[]);
    let mut bridge = Bridge::egress(
        &db,
        "natsdown",
        &url,
        &["--nats-stream", "OUTAGE", "--batch-size", "20"],
        &[],
    );
    let mut c = db.client();
    let mut seq = 0i64;
    let mut write = |n: i64, c: &mut postgres::Client| {
        for _ in 0..n {
            seq += 1;
            c.query_one(
                "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
                &[&seq],
            )
            .unwrap();
        }
    };
    write(50, &mut c);
    wait_until("the first rows on the bus", Duration::from_secs(20), || {
        lag(&db, "natsdown") == 0
    });

    // NATS goes down; rows keep committing.
    nats.kill().unwrap();
    nats.wait().unwrap();
    let down = std::time::Instant::now();
    while down.elapsed() < outage {
        write(10, &mut c);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        lag(&db, "natsdown") > 0,
        "rows must wait while the bus is down"
    );

    // Back: the backlog drains.
    let mut nats = start_nats(port, &store, &[]);
    wait_until("the backlog to drain", Duration::from_secs(60), || {
        lag(&db, "natsdown") == 0
    });
    bridge.terminate();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let messages = runtime.block_on(read_stream(&url, "OUTAGE"));
    let ids: Vec<String> = messages.into_iter().map(|(id, _)| id).collect();
    let set: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(set, committed_ids(&db), "lost or extra messages");
    assert_eq!(ids.len(), set.len(), "duplicates stored");
    assert!(
        bridge.log_text().contains("retrying"),
        "the outage was not noticed:\n{}",
        bridge.log_text()
    );
    let _ = nats.kill();
    let _ = nats.wait();
    let _ = std::fs::remove_dir_all(&store);
}
