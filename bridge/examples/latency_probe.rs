//! Benchmark helper: subscribes to the envelopes the bridge publishes on NATS and
//! prints p50, p99 and max of (arrival time - gateway_time) in milliseconds once it
//! has seen COUNT messages. With single-row autocommit inserts, gateway_time
//! (now() at insert) is within a fraction of a millisecond of the commit, so this
//! bounds commit -> bus latency from above.
//!
//! usage: latency_probe NATS_URL SUBJECT_PREFIX COUNT
//!        latency_probe NATS_URL --delete STREAM   (removes a benchmark stream)

use futures_util::StreamExt;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(serde::Deserialize)]
struct Probe {
    gateway_time_us: i64,
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
    let [_, url, prefix, count] = &args[..] else {
        return Err("usage: latency_probe NATS_URL SUBJECT_PREFIX COUNT".into());
    };
    let count: usize = count.parse()?;
    let client = async_nats::connect(url.as_str()).await?;
    let mut sub = client.subscribe(format!("{prefix}.envelope.>")).await?;
    client.flush().await?; // the server has the subscription before we say ready
    println!("ready");
    let mut latencies = Vec::with_capacity(count);
    while latencies.len() < count {
        // Give up after 10 idle seconds and report what arrived.
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next()).await;
        let Ok(Some(message)) = next else { break };
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as i64;
        let probe: Probe = ciborium::from_reader(&message.payload[..])?;
        latencies.push((now - probe.gateway_time_us) as f64 / 1000.0);
    }
    if latencies.is_empty() {
        return Err("no message arrived".into());
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "{:.2} {:.2} {:.2} {}",
        pick(0.5),
        pick(0.99),
        latencies[latencies.len() - 1],
        latencies.len()
    );
    Ok(())
}
