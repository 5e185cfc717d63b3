//! Benchmark helper: subscribes to the messages the bridge publishes on NATS and
//! prints p50, p99 and max of (arrival time - commit-side timestamp) in
//! milliseconds once it has seen COUNT messages. The timestamp is gateway_time for
//! envelopes and created_at for outbox rows, both now() in the inserting
//! transaction; with small autocommit transactions that is within a fraction of a
//! millisecond of the commit, so this bounds commit -> bus latency from above.
//!
//! usage: latency_probe NATS_URL SUBJECT_PREFIX COUNT
//!            envelopes only: one line "p50 p99 max count"
//!        latency_probe NATS_URL SUBJECT_PREFIX COUNT --with-outbox
//!            envelopes and outbox rows: a line for each, envelopes first
//!        latency_probe NATS_URL --delete STREAM   (removes a benchmark stream)

use futures_util::StreamExt;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Probe {
    Envelope { gateway_time_us: i64 },
    Outbox { created_at_us: i64 },
}

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, url, flag, stream] = &args[..] {
        if flag == "--delete" {
            let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await?);
            js.delete_stream(stream).await?;
            return Ok(());
        }
    }
    let (url, prefix, count, with_outbox) = match &args[..] {
        [_, url, prefix, count] => (url, prefix, count, false),
        [_, url, prefix, count, flag] if flag == "--with-outbox" => (url, prefix, count, true),
        _ => {
            return Err("usage: latency_probe NATS_URL SUBJECT_PREFIX COUNT [--with-outbox]".into())
        }
    };
    let count: usize = count.parse()?;
    let client = async_nats::connect(url.as_str()).await?;
    let subject = if with_outbox {
        format!("{prefix}.>")
    } else {
        format!("{prefix}.envelope.>")
    };
    let mut sub = client.subscribe(subject).await?;
    client.flush().await?; // the server has the subscription before we say ready
    println!("ready");
    let (mut envelopes, mut outbox) = (Vec::with_capacity(count), Vec::new());
    while envelopes.len() + outbox.len() < count {
        // Give up after 10 idle seconds and report what arrived.
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next()).await;
        let Ok(Some(message)) = next else { break };
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as i64;
        match ciborium::from_reader::<Probe, _>(&message.payload[..])? {
            Probe::Envelope { gateway_time_us } => {
                envelopes.push((now - gateway_time_us) as f64 / 1000.0)
            }
            Probe::Outbox { created_at_us } => outbox.push((now - created_at_us) as f64 / 1000.0),
        }
    }
    if envelopes.is_empty() && outbox.is_empty() {
        return Err("no message arrived".into());
    }
    println!("{}", summary(envelopes));
    if with_outbox {
        println!("{}", summary(outbox));
    }
    Ok(())
}
