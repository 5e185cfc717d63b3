//! One bridge per shard into one JetStream stream replicated on a three-node NATS
//! cluster: writes go through the router (pg_envelopes_router) while one bridge
//! is killed with SIGKILL and restarted and one NATS node is stopped; every
//! committed envelope and outbox row must be in the stream exactly once.
//!
//! The shard servers come from `scripts/shards.sh up` (`ENVELOPES_TEST_SHARDS`,
//! its env file); the test makes databases of its own on them and runs its own
//! NATS cluster, since it stops one of its nodes.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The proxy's and the shards' servers (connection strings without a database).
fn servers() -> (String, Vec<String>) {
    let path = std::env::var("ENVELOPES_TEST_SHARDS")
        .expect("ENVELOPES_TEST_SHARDS is not set: run through scripts/test.sh");
    let text = std::fs::read_to_string(&path).expect("the shards env file");
    let strip = |s: &str| {
        s.replace(" dbname=envelopes", "")
            .replace(" user=postgres", "")
    };
    let (mut proxy, mut shards) = (String::new(), Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("PROXY_CONNSTR=") {
            proxy = strip(v.trim_matches('"'));
        } else if let Some(v) = line.strip_prefix("SHARD_CONNSTRS=(") {
            shards = v
                .trim_end_matches(')')
                .split('"')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(strip)
                .collect();
        }
    }
    (proxy, shards)
}

fn client(connstr: &str) -> postgres::Client {
    postgres::Client::connect(&format!("{connstr} user=postgres"), postgres::NoTls)
        .unwrap_or_else(|e| panic!("connect {connstr}: {e}"))
}

/// `postgres://` URL of a database on a server given as `host=... port=...`.
fn url(server: &str, db: &str) -> String {
    let port = server
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap();
    format!("postgres://postgres@127.0.0.1:{port}/{db}")
}

/// Databases of this test on every shard server and the proxy; dropped at the end.
struct Store {
    name: String,
    proxy_server: String,
    shard_servers: Vec<String>,
}

impl Store {
    fn new() -> Store {
        let (proxy_server, shard_servers) = servers();
        let name = unique("sh_");
        let create = |server: &str, extension: &str| {
            client(&format!("{server} dbname=postgres"))
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .unwrap();
            client(&format!("{server} dbname={name}"))
                .batch_execute(&format!(
                    "SET client_min_messages = warning; CREATE EXTENSION {extension} CASCADE"
                ))
                .unwrap();
        };
        for s in &shard_servers {
            create(s, "pg_envelopes");
        }
        create(&proxy_server, "pg_envelopes_router");
        let shards: Vec<String> = shard_servers
            .iter()
            .map(|s| format!("{s} dbname={name}"))
            .collect();
        client(&format!("{proxy_server} dbname={name}"))
            .query("SELECT envelopes_router.set_shards($1, 16)", &[&shards])
            .unwrap();
        Store {
            name,
            proxy_server,
            shard_servers,
        }
    }

    fn proxy(&self) -> postgres::Client {
        client(&format!("{} dbname={}", self.proxy_server, self.name))
    }

    fn shard(&self, i: usize) -> postgres::Client {
        client(&format!("{} dbname={}", self.shard_servers[i], self.name))
    }

    /// Every committed row's dedup id, over all shards (outbox ids scoped by shard).
    fn committed(&self) -> Vec<String> {
        let mut ids = std::collections::BTreeSet::new();
        for i in 0..self.shard_servers.len() {
            ids.extend(committed_ids_in(
                &mut self.shard(i),
                Some(&format!("shard{i}")),
            ));
        }
        ids.into_iter().collect()
    }

    fn pending(&self) -> i64 {
        (0..self.shard_servers.len())
            .map(|i| {
                self.shard(i)
                    .query_one(
                        "SELECT COALESCE(outbox_pending, 0) + COALESCE(envelopes_pending, 0)
                           FROM envelopes.consumer_status WHERE consumer = 'fwd'",
                        &[],
                    )
                    .map(|r| r.get::<_, i64>(0))
                    .unwrap_or(i64::MAX / 8)
            })
            .sum()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let mut servers = self.shard_servers.clone();
        servers.push(self.proxy_server.clone());
        for s in servers {
            if let Ok(mut c) = postgres::Client::connect(
                &format!("{s} dbname=postgres user=postgres"),
                postgres::NoTls,
            ) {
                let _ = c.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                ));
            }
        }
    }
}

/// A three-node NATS cluster with JetStream, of this test's own.
struct NatsCluster {
    ports: Vec<u16>,
    routes: Vec<u16>,
    nodes: Vec<Option<Killed>>,
    dir: std::path::PathBuf,
}

impl NatsCluster {
    fn start() -> NatsCluster {
        let mut cluster = NatsCluster {
            ports: (0..3).map(|_| free_port()).collect(),
            routes: (0..3).map(|_| free_port()).collect(),
            nodes: vec![None, None, None],
            dir: std::env::temp_dir().join(unique("natscluster")),
        };
        for i in 0..3 {
            cluster.start_node(i);
        }
        cluster
    }

    /// Starts node `i` (again) on its ports and its store.
    fn start_node(&mut self, i: usize) {
        let route_list = self
            .routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let store = self.dir.join(format!("n{i}"));
        std::fs::create_dir_all(&store).unwrap();
        let name = format!("n{i}");
        let cluster = format!("nats://127.0.0.1:{}", self.routes[i]);
        self.nodes[i] = Some(start_nats(
            self.ports[i],
            &store,
            &[
                "-n",
                &name,
                "--cluster_name",
                "envelopes-test",
                "--cluster",
                &cluster,
                "--routes",
                &route_list,
            ],
        ));
    }

    fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn bridges_per_shard_deliver_every_row_once_through_a_bridge_kill_and_a_nats_node_down() {
    let store = Store::new();
    let mut nats = NatsCluster::start();
    let stream = unique("SHARDS").to_uppercase();
    let prefix = unique("shards");
    // The stream, replicated on all three nodes (the cluster elects its JetStream
    // leader first: retried until it has one).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let first = format!("nats://127.0.0.1:{}", nats.ports[0]);
    let created = Instant::now();
    loop {
        let made = runtime.block_on(async {
            let js = async_nats::jetstream::new(async_nats::connect(first.as_str()).await.ok()?);
            js.create_stream(async_nats::jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                num_replicas: 3,
                ..Default::default()
            })
            .await
            .ok()
        });
        if made.is_some() {
            break;
        }
        assert!(created.elapsed() < Duration::from_secs(60), "no R3 stream");
        thread::sleep(Duration::from_millis(500));
    }

    // One consumer on every shard, registered through the router.
    store
        .proxy()
        .execute("SELECT envelopes.consumer_register('fwd')", &[])
        .unwrap();
    let sink = nats.urls();
    let start_bridge = |i: usize| {
        let scope = format!("shard{i}");
        Bridge::egress_with_url(
            &url(&store.shard_servers[i], &store.name),
            "fwd",
            &sink,
            &[
                "--nats-stream",
                &stream,
                "--subject-prefix",
                &prefix,
                "--outbox-scope",
                &scope,
                "--batch-size",
                "20",
            ],
            &[],
        )
    };
    let mut bridges: Vec<Bridge> = (0..store.shard_servers.len()).map(start_bridge).collect();

    // Writes through the router: 64 originators one row at a time, a batch over
    // all of them, and an outbox row next to an originator's envelopes.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let mut proxy = store.proxy();
        thread::spawn(move || {
            let mut round = 0i64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                for o in 1..=64i32 {
                    proxy
                        .execute(
                            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
                            &[&o, &(round * 2)],
                        )
                        .unwrap();
                }
                let ids: Vec<i32> = (1..=64).collect();
                let seqs: Vec<i64> = ids.iter().map(|_| round * 2 + 1).collect();
                let blobs: Vec<Vec<u8>> = ids.iter().map(|_| vec![3u8]).collect();
                proxy
                    .execute(
                        "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $3)",
                        &[&ids, &seqs, &blobs],
                    )
                    .unwrap();
                let key = (round % 64) as i32 + 1;
                proxy
                    .execute(
                        "SELECT envelopes.publish('note', '\\x05', '{}', $1)",
                        &[&key],
                    )
                    .unwrap();
                thread::sleep(Duration::from_millis(50));
            }
            round
        })
    };
    thread::sleep(Duration::from_secs(3));
    bridges[0].kill9();
    thread::sleep(Duration::from_millis(700));
    bridges[0] = start_bridge(0);
    thread::sleep(Duration::from_secs(2));
    nats.stop(1);
    thread::sleep(Duration::from_secs(4));
    bridges[2].kill9();
    bridges[2] = start_bridge(2);
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds >= 10, "only {rounds} rounds written");

    wait_until(
        "every shard's backlog to drain",
        Duration::from_secs(90),
        || store.pending() == 0,
    );
    for b in &mut bridges {
        b.terminate();
    }
    // The stopped node comes back and catches up; the stream is read once all
    // three hold it (a consumer on a stream with a replica missing can time out).
    nats.start_node(1);
    let live = format!("nats://127.0.0.1:{}", nats.ports[0]);
    wait_until(
        "the stream's replicas to be current",
        Duration::from_secs(60),
        || {
            runtime.block_on(async {
                let Ok(client) = async_nats::connect(live.as_str()).await else {
                    return false;
                };
                let js = async_nats::jetstream::new(client);
                let Ok(mut s) = js.get_stream(&stream).await else {
                    return false;
                };
                let Ok(info) = s.info().await else {
                    return false;
                };
                info.cluster
                    .as_ref()
                    .is_some_and(|c| c.replicas.len() == 2 && c.replicas.iter().all(|r| r.current))
            })
        },
    );
    let stored = runtime.block_on(read_stream(&live, &stream));
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (id, _) in &stored {
        *counts.entry(id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "in the stream more than once: {twice:?}");
    let committed = store.committed();
    let delivered: Vec<String> = counts.keys().cloned().collect();
    let missing: Vec<_> = committed
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "lost {} rows: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(delivered, committed);
    assert!(committed.iter().any(|id| id.starts_with("outbox:shard")));
    runtime.block_on(delete_stream(&live, &stream));
}
