//! A sink under test, for every bus the bridge publishes to, and a way to read
//! back what reached it with that bus's own client (the JSONL file, a JetStream
//! consumer, XRANGE, an MQTT subscription, an AMQP queue bound to the exchange,
//! the webhook's own receiver).

use super::buses::*;
use super::*;
use std::sync::{Arc, Mutex};

/// The key of the webhook's signature header in the tests.
pub const WEBHOOK_SECRET: &str = "conformance-secret";

/// Dedup ids in a JSONL sink's file, with repeats (lines still being written
/// are skipped).
pub fn jsonl_ids(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect()
}

/// The buses a test can publish to and read back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bus {
    Jsonl,
    JetStream,
    Redis,
    Mqtt,
    Amqp,
    Webhook,
}

/// A sink under test and a way to read back what reached it: the sink
/// argument and options for the bridge, under names unique to the test (its
/// subject prefix, stream, key, exchange), cleaned up on drop.
pub struct Target {
    pub bus: Bus,
    /// The `--sink` argument.
    pub sink: String,
    args: Vec<String>,
    path: std::path::PathBuf,
    /// The unique name: subject prefix, Redis key, AMQP exchange and queue
    /// (and, upper-cased, the JetStream stream).
    pub name: String,
    /// The webhook's receiver.
    pub receiver: Option<Receiver>,
    mqtt_ids: Arc<Mutex<Vec<String>>>,
    pub runtime: tokio::runtime::Runtime,
    /// The AMQP connection and channel of the bound queue.
    pub amqp: Option<(lapin::Connection, lapin::Channel)>,
}

impl Target {
    pub fn new(bus: Bus) -> Target {
        let name = unique("conf");
        let path = std::env::temp_dir().join(format!("{name}.jsonl"));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let mut target = Target {
            bus,
            sink: String::new(),
            args: vec!["--subject-prefix".into(), name.clone()],
            path,
            name,
            receiver: None,
            mqtt_ids: Arc::new(Mutex::new(Vec::new())),
            runtime,
            amqp: None,
        };
        match bus {
            Bus::Jsonl => target.sink = format!("jsonl:{}", target.path.display()),
            Bus::JetStream => {
                target.sink = nats_url();
                target
                    .args
                    .extend(["--nats-stream".into(), target.name.to_uppercase()]);
            }
            Bus::Redis => {
                target.sink = redis_url();
                target
                    .args
                    .extend(["--redis-stream".into(), target.name.clone()]);
            }
            Bus::Mqtt => {
                target.sink = mqtt_url();
                target.subscribe_mqtt();
            }
            Bus::Amqp => {
                target.sink = amqp_url();
                target
                    .args
                    .extend(["--amqp-exchange".into(), target.name.clone()]);
                target.bind_amqp_queue();
            }
            Bus::Webhook => {
                let receiver = Receiver::start();
                target.sink = receiver.url();
                target.receiver = Some(receiver);
                target
                    .args
                    .extend(["--webhook-secret".into(), WEBHOOK_SECRET.into()]);
            }
        }
        target
    }

    /// The options for the bridge, with batches of 20 rows.
    pub fn args(&self) -> Vec<&str> {
        let mut a: Vec<&str> = self.args.iter().map(String::as_str).collect();
        a.extend(["--batch-size", "20"]);
        a
    }

    /// An MQTT subscription to PREFIX/# at QoS 1, made before the bridge publishes
    /// (the broker keeps nothing for a subscriber that was not there).
    fn subscribe_mqtt(&mut self) {
        self.mqtt_ids = mqtt_subscribe(&mqtt_url(), &self.name, false);
    }

    /// A queue bound to the exchange for every routing key under the prefix,
    /// declared before the bridge publishes.
    fn bind_amqp_queue(&mut self) {
        let (url, name) = (amqp_url(), self.name.clone());
        let (connection, channel) = self.runtime.block_on(async move {
            let (connection, channel) = connect_amqp(&url).await;
            declare_bound_queue(&channel, &name).await;
            (connection, channel)
        });
        self.amqp = Some((connection, channel));
    }

    /// Dedup ids delivered so far, with repeats, read with the bus's own client.
    pub fn delivered(&self) -> Vec<String> {
        match self.bus {
            Bus::Jsonl => jsonl_ids(&self.path),
            Bus::JetStream => self
                .runtime
                .block_on(read_stream(&nats_url(), &self.name.to_uppercase()))
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
            Bus::Redis => redis_ids(&self.runtime, &redis_url(), &self.name),
            Bus::Mqtt => self.mqtt_ids.lock().unwrap().clone(),
            Bus::Amqp => {
                let (_, channel) = self.amqp.as_ref().unwrap();
                self.runtime.block_on(take_ids(channel, &self.name))
            }
            Bus::Webhook => self.receiver.as_ref().unwrap().acknowledged_ids(),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        match self.bus {
            Bus::JetStream => {
                let stream = self.name.to_uppercase();
                self.runtime.block_on(delete_stream(&nats_url(), &stream));
            }
            Bus::Redis => {
                if let Ok(client) = redis::Client::open(redis_url()) {
                    let key = self.name.clone();
                    self.runtime.block_on(async move {
                        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                            let _: Result<i64, _> =
                                redis::cmd("DEL").arg(&key).query_async(&mut c).await;
                        }
                    });
                }
            }
            Bus::Amqp => {
                if let Some((_, channel)) = self.amqp.take() {
                    let name = self.name.clone();
                    self.runtime.block_on(async move {
                        use lapin::options::*;
                        let _ = channel
                            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                            .await;
                        let _ = channel
                            .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                            .await;
                    });
                }
            }
            _ => {}
        }
    }
}
