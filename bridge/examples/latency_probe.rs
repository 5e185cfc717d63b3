//! Benchmark helper: reads what the bridge forwards, with each bus's own client,
//! and prints p50, p99 and max of (arrival time - commit-side timestamp) in
//! milliseconds once it has seen COUNT messages. The timestamp is gateway_time for
//! envelopes and created_at for outbox rows, both now() in the inserting
//! transaction; with small autocommit transactions that is within a fraction of a
//! millisecond of the commit, so this bounds commit -> bus latency from above.
//!
//! The SINK argument is the bridge's own `--sink` value, and the probe is the
//! consumer on the far side of it:
//!
//! - `nats://HOST:PORT`: a core subscription to `PREFIX.envelope.>` (`PREFIX.>`
//!   with `--with-outbox`);
//! - `redis://HOST:PORT`: XREAD BLOCK on `--redis-stream` from its end;
//! - `mqtt://HOST:PORT`: a QoS 1 subscription to `PREFIX/#`;
//! - `amqp://...`: a private queue bound to `--amqp-exchange` for `PREFIX.#`;
//! - `http://HOST:PORT/...`: the webhook receiver itself, answering 200 to each
//!   POST (keep-alive, as a real receiver would), or 413 to a body over
//!   `--max-body` bytes;
//! - `jsonl:PATH`: follows the file from its end, as `tail -f` does.
//!
//! usage: latency_probe SINK PREFIX COUNT [--with-outbox] [--redis-stream KEY]
//!            [--amqp-exchange NAME]
//!            one line "p50 p99 max count" (a second for outbox rows with
//!            --with-outbox, envelopes first)
//!        latency_probe SINK --delete NAME   (removes what a benchmark left on a
//!            shared bus: a JetStream stream, a Redis stream key, an AMQP exchange)

use clap::Parser;
use futures_util::StreamExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
struct Args {
    /// The bridge's --sink.
    sink: String,
    /// The bridge's --subject-prefix.
    prefix: Option<String>,
    /// Messages to wait for.
    count: Option<usize>,
    /// Count outbox rows too (subscribes to every kind).
    #[arg(long)]
    with_outbox: bool,
    /// Delete this JetStream stream, Redis key or AMQP exchange and exit.
    #[arg(long)]
    delete: Option<String>,
    #[arg(long, default_value = "envelopes")]
    redis_stream: String,
    #[arg(long, default_value = "envelopes")]
    amqp_exchange: String,
    /// As the webhook receiver: answer 413 to a body over this many bytes.
    #[arg(long)]
    max_body: Option<usize>,
    /// Give up after this many seconds without a message.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
}

/// The commit-side timestamp of a message, in the CBOR the buses carry or the
/// JSON the webhook and JSONL sinks write (both name the fields alike).
#[derive(serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Probe {
    Envelope { gateway_time_us: i64 },
    Outbox { created_at_us: i64 },
}

/// One arrival: whether it is an outbox row, and its commit-side timestamp.
type Arrival = (bool, i64);

fn summary(mut latencies: Vec<f64>) -> String {
    if latencies.is_empty() {
        return "0 0 0 0".into();
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    format!(
        "{:.2} {:.2} {:.2} {}",
        pick(0.5),
        pick(0.99),
        latencies[latencies.len() - 1],
        latencies.len()
    )
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn arrival(probe: Probe) -> Arrival {
    match probe {
        Probe::Envelope { gateway_time_us } => (false, gateway_time_us),
        Probe::Outbox { created_at_us } => (true, created_at_us),
    }
}

fn from_cbor(bytes: &[u8]) -> Result<Arrival, Error> {
    Ok(arrival(ciborium::from_reader::<Probe, _>(bytes)?))
}

fn from_json(bytes: &[u8]) -> Result<Arrival, Error> {
    Ok(arrival(serde_json::from_slice::<Probe>(bytes)?))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    if let Some(name) = &args.delete {
        return delete(&args.sink, name).await;
    }
    let (Some(prefix), Some(count)) = (args.prefix.clone(), args.count) else {
        return Err("usage: latency_probe SINK PREFIX COUNT [--with-outbox]".into());
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Arrival>();
    let sink = args.sink.clone();
    if sink.starts_with("nats://") {
        nats(&sink, &prefix, args.with_outbox, tx).await?;
    } else if sink.starts_with("redis://") {
        redis_stream(&sink, &args.redis_stream, tx).await?;
    } else if sink.starts_with("mqtt://") {
        mqtt(&sink, &prefix, tx).await?;
    } else if sink.starts_with("amqp://") {
        amqp(&sink, &args.amqp_exchange, &prefix, tx).await?;
    } else if sink.starts_with("http://") {
        webhook(&sink, args.max_body, tx).await?;
    } else if let Some(path) = sink.strip_prefix("jsonl:") {
        jsonl(path, tx).await?;
    } else {
        return Err(format!("no probe for sink {sink:?}").into());
    }
    println!("ready");
    let (mut envelopes, mut outbox) = (Vec::with_capacity(count), Vec::new());
    while envelopes.len() + outbox.len() < count {
        // Give up after --idle-secs without a message and report what arrived.
        let next = tokio::time::timeout(Duration::from_secs(args.idle_secs), rx.recv()).await;
        let Ok(Some((is_outbox, at))) = next else {
            break;
        };
        let ms = (now_us() - at) as f64 / 1000.0;
        if is_outbox {
            if args.with_outbox {
                outbox.push(ms);
            }
        } else {
            envelopes.push(ms);
        }
    }
    if envelopes.is_empty() && outbox.is_empty() {
        return Err("no message arrived".into());
    }
    println!("{}", summary(envelopes));
    if args.with_outbox {
        println!("{}", summary(outbox));
    }
    Ok(())
}

async fn delete(sink: &str, name: &str) -> Result<(), Error> {
    if sink.starts_with("nats://") {
        let js = async_nats::jetstream::new(async_nats::connect(sink).await?);
        js.delete_stream(name).await?;
    } else if sink.starts_with("redis://") {
        let client = redis::Client::open(sink)?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let _: i64 = redis::cmd("DEL").arg(name).query_async(&mut c).await?;
    } else if sink.starts_with("amqp://") {
        let connection =
            lapin::Connection::connect(sink, lapin::ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .exchange_delete(
                name.into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await?;
        connection.close(200, "deleted".into()).await?;
    }
    Ok(())
}

/// Each source is ready (subscribed, bound, listening) when its function returns;
/// a task then feeds `tx` until the probe exits.
async fn nats(
    url: &str,
    prefix: &str,
    with_outbox: bool,
    tx: mpsc::UnboundedSender<Arrival>,
) -> Result<(), Error> {
    let client = async_nats::connect(url).await?;
    let subject = if with_outbox {
        format!("{prefix}.>")
    } else {
        format!("{prefix}.envelope.>")
    };
    let mut sub = client.subscribe(subject).await?;
    client.flush().await?; // the server has the subscription before we say ready
    tokio::spawn(async move {
        let _client = client;
        while let Some(message) = sub.next().await {
            if let Ok(a) = from_cbor(&message.payload) {
                let _ = tx.send(a);
            }
        }
    });
    Ok(())
}

async fn redis_stream(
    url: &str,
    key: &str,
    tx: mpsc::UnboundedSender<Arrival>,
) -> Result<(), Error> {
    use redis::streams::{StreamReadOptions, StreamReadReply};
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    // The stream's current last id: reading starts after it.
    let last: Vec<(String, Vec<(String, redis::Value)>)> = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut c)
        .await?;
    let mut after = last.first().map_or("0-0".to_owned(), |(id, _)| id.clone());
    let key = key.to_owned();
    tokio::spawn(async move {
        let options = StreamReadOptions::default().block(100).count(2000);
        loop {
            let reply: Result<StreamReadReply, _> = redis::AsyncCommands::xread_options(
                &mut c,
                &[key.as_str()],
                &[after.as_str()],
                &options,
            )
            .await;
            let Ok(reply) = reply else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            for stream in reply.keys {
                for entry in stream.ids {
                    after = entry.id.clone();
                    if let Some(redis::Value::BulkString(body)) = entry.map.get("body") {
                        if let Ok(a) = from_cbor(body) {
                            let _ = tx.send(a);
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

async fn mqtt(url: &str, prefix: &str, tx: mpsc::UnboundedSender<Arrival>) -> Result<(), Error> {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let hostport = url.trim_start_matches("mqtt://");
    let (host, port) = hostport.rsplit_once(':').ok_or("mqtt://HOST:PORT")?;
    let id = format!("latency-probe-{}", std::process::id());
    let mut options = MqttOptions::new(id, host, port.parse()?);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(options, 10_000);
    client
        .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
        .await?;
    loop {
        if let Event::Incoming(Packet::SubAck(_)) = events.poll().await? {
            break;
        }
    }
    tokio::spawn(async move {
        let _client = client;
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if let Ok(a) = from_cbor(&p.payload) {
                        let _ = tx.send(a);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok(())
}

async fn amqp(
    url: &str,
    exchange: &str,
    prefix: &str,
    tx: mpsc::UnboundedSender<Arrival>,
) -> Result<(), Error> {
    use lapin::options::*;
    use lapin::types::FieldTable;
    let connection =
        lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    // Declared as the bridge declares it, so whichever comes first wins.
    channel
        .exchange_declare(
            exchange.into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.name().as_str().into(),
            exchange.into(),
            format!("{prefix}.#").as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.name().as_str().into(),
            "latency-probe".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    tokio::spawn(async move {
        let _keep = (connection, channel);
        while let Some(Ok(delivery)) = consumer.next().await {
            if let Ok(a) = from_cbor(&delivery.data) {
                let _ = tx.send(a);
            }
        }
    });
    Ok(())
}

/// A minimal HTTP/1.1 receiver: reads each request's headers and
/// `Content-Length` body, answers `200` with an empty body (`413` to a body over
/// `max_body`), keeps the connection.
async fn webhook(
    url: &str,
    max_body: Option<usize>,
    tx: mpsc::UnboundedSender<Arrival>,
) -> Result<(), Error> {
    let rest = url.trim_start_matches("http://");
    let hostport = rest.split('/').next().unwrap_or(rest);
    let listener = tokio::net::TcpListener::bind(hostport).await?;
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = serve(socket, max_body, tx).await;
            });
        }
    });
    Ok(())
}

async fn serve(
    socket: tokio::net::TcpStream,
    max_body: Option<usize>,
    tx: mpsc::UnboundedSender<Arrival>,
) -> Result<(), Error> {
    let (read, mut write) = socket.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse()?;
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).await?;
        if max_body.is_some_and(|max| body.len() > max) {
            write
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n")
                .await?;
            continue;
        }
        if let Ok(values) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) {
            for v in values {
                if let Ok(a) = serde_json::from_value::<Probe>(v) {
                    let _ = tx.send(arrival(a));
                }
            }
        } else if let Ok(values) = ciborium::from_reader::<Vec<ciborium::Value>, _>(&body[..]) {
            for v in values {
                if let Ok(a) = v.deserialized::<Probe>() {
                    let _ = tx.send(arrival(a));
                }
            }
        }
        write
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await?;
    }
}

/// Follows a JSONL file from its current end; a line is counted once complete.
async fn jsonl(path: &str, tx: mpsc::UnboundedSender<Arrival>) -> Result<(), Error> {
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(path)
        .await?;
    file.seek(std::io::SeekFrom::End(0)).await?;
    tokio::spawn(async move {
        let mut reader = BufReader::new(file);
        let mut pending = Vec::new();
        loop {
            match reader.read_until(b'\n', &mut pending).await {
                Ok(0) | Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                Ok(_) if pending.ends_with(b"\n") => {
                    if let Ok(a) = from_json(&pending) {
                        let _ = tx.send(a);
                    }
                    pending.clear();
                }
                Ok(_) => {}
            }
        }
    });
    Ok(())
}
