//! Prometheus metrics on `--metrics-addr` (`/metrics`, and any other path but
//! these two), with a liveness probe (`/healthz`: 200 while the process runs)
//! and a readiness probe (`/readyz`: 200 while this instance is the active one
//! and its last round that worked is at most `--ready-after` seconds old, 503
//! with a JSON reason otherwise).

use crate::message::Message;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub published: Family<KindLabel, Counter>,
    pub retried: Counter,
    /// Messages the bus took after pushing back on an earlier one of the same
    /// request (ahead of it), published again in order: each is a duplicate a
    /// consumer sees under the same dedup id.
    pub republished: Counter,
    pub lag_rows: Gauge,
    pub lag_seconds: Gauge<f64, AtomicU64>,
    pub batch_latency: Histogram,
    pub ingested: Counter,
    /// Stream sequence numbers ingress found gone before it read them.
    pub ingress_gone: Counter,
    /// Times ingress found its stream deleted and re-created (or its numbering
    /// restarted) and started over from the new stream's first message.
    pub ingress_stream_resets: Counter,
    /// 1 while this instance holds its name's lease (active), 0 while it stands by.
    pub active: Gauge,
    /// 1 while egress holds a batch back until the standbys have flushed it
    /// (`--forward-after standby-flush`).
    pub standby_waiting: Gauge,
    /// Time spent holding batches back for the standbys.
    pub standby_wait_seconds: Counter<f64, AtomicU64>,
    /// 1 while egress holds a batch its sink failed to take (a full disk, a bus
    /// away or blocking publishers) and tries it again, 0 once the sink takes it.
    pub sink_stalled: Gauge,
    /// 1 while the bus refuses the bridge rather than its rows (the breaker:
    /// different rows refused with the same code and none taken between them;
    /// or its credentials, its permissions, the request as such), 0 once it
    /// takes a row again.
    pub sink_refusing: Gauge,
    /// 1 while the broker blocks the bridge's publishing (RabbitMQ
    /// `connection.blocked`, a memory or disk alarm).
    pub sink_blocked: Gauge,
    /// Why, as the broker said.
    blocked_reason: Mutex<String>,
    dead_lettered: Family<KindLabel, Counter>,
    refused: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    /// When a round last worked (ms since the epoch; 0: never).
    last_worked_ms: AtomicU64,
    /// What went wrong last, for /readyz.
    last_failure: Mutex<String>,
    ready_after: Duration,
}

/// How long `status` waits for another bridge's metrics: to connect, and to
/// read the answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Metrics {
    pub fn new(ready_after_secs: u64) -> Metrics {
        let mut registry = Registry::with_prefix("envelopes_bridge");
        let published = Family::<KindLabel, Counter>::default();
        let retried = Counter::default();
        let republished = Counter::default();
        let lag_rows = Gauge::default();
        let lag_seconds = Gauge::<f64, AtomicU64>::default();
        let batch_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let ingested = Counter::default();
        let ingress_gone = Counter::default();
        let ingress_stream_resets = Counter::default();
        let dead_lettered = Family::<KindLabel, Counter>::default();
        let refused = Family::<KindLabel, Counter>::default();
        let active = Gauge::default();
        let errors = Family::<KindLabel, Counter>::default();
        let standby_waiting = Gauge::default();
        let standby_wait_seconds = Counter::<f64, AtomicU64>::default();
        let sink_stalled = Gauge::default();
        let sink_blocked = Gauge::default();
        let sink_refusing = Gauge::default();
        registry.register(
            "sink_refusing",
            "1 while the bus refuses the bridge rather than its rows (different rows refused \
             with the same code and none taken between them: revoked permissions or \
             credentials, an ACL for every subject, a limit below every message; or the \
             bridge's credentials, or the request as such: an HTTP 4xx, Redis NOPERM); \
             egress stalls at its position, sets nothing aside and asks again at the \
             longest backoff; 0 once the bus takes a row",
            sink_refusing.clone(),
        );
        registry.register(
            "sink_blocked",
            "1 while the broker blocks the bridge's publishing (RabbitMQ connection.blocked: \
             a memory or disk alarm); /readyz answers 503 meanwhile",
            sink_blocked.clone(),
        );
        registry.register(
            "sink_stalled",
            "1 while egress holds a batch the sink failed to take (a full disk, the bus \
             away or blocking publishers) and tries it again, nothing after it moving \
             meanwhile, or finds its sink away while idle; for ingress, 1 while its source \
             does not answer",
            sink_stalled.clone(),
        );
        registry.register(
            "standby_waiting",
            "1 while egress holds a batch back until the standbys have flushed its WAL \
             (--forward-after standby-flush), 0 otherwise",
            standby_waiting.clone(),
        );
        registry.register(
            "standby_wait_seconds",
            "Time egress spent holding batches back until the standbys flushed them",
            standby_wait_seconds.clone(),
        );
        registry.register(
            "published",
            "Messages acknowledged by the bus",
            published.clone(),
        );
        registry.register(
            "retried",
            "Rounds tried again after a failure: database and bus connects, reads, publishes and acknowledgements",
            retried.clone(),
        );
        registry.register(
            "republished",
            "Messages the bus took ahead of an earlier one it pushed back on, published again \
             in order (consumers see them twice, under the same dedup id)",
            republished.clone(),
        );
        registry.register(
            "lag_rows",
            "Rows committed but not yet acknowledged",
            lag_rows.clone(),
        );
        registry.register(
            "lag_seconds",
            "Age of the oldest row committed but not yet acknowledged",
            lag_seconds.clone(),
        );
        registry.register(
            "batch_latency_seconds",
            "Time from publishing a batch to the bus acknowledging all of it",
            batch_latency.clone(),
        );
        registry.register("ingested", "Envelopes stored by ingress", ingested.clone());
        registry.register(
            "ingress_gone",
            "Stream sequence numbers gone before ingress read them (purged, removed by the \
             stream's limits or age, or in a stream re-created meanwhile); with a subject \
             filter, messages of other subjects may be among them",
            ingress_gone.clone(),
        );
        registry.register(
            "ingress_stream_resets",
            "Times ingress found its stream deleted and re-created and started over from \
             the new stream's first message",
            ingress_stream_resets.clone(),
        );
        registry.register(
            "dead_lettered",
            "Rows set aside for good: egress rows the bus still refused after the bridge's \
             own attempts (envelopes.dead_letters, until retry_dead_letters()), ingress \
             messages that are malformed or that the database refuses (the dead-letter \
             subject)",
            dead_lettered.clone(),
        );
        registry.register(
            "refused",
            "Refusals by the bus of one message (each attempt), which set the row aside \
             in envelopes.dead_letters while the rest of the feed flows",
            refused.clone(),
        );
        registry.register(
            "active",
            "1 while this instance holds its name's lease and works, 0 while it stands by",
            active.clone(),
        );
        registry.register(
            "errors",
            "Database and sink errors, by kind: transient (retried with backoff) or \
             permanent (data or privileges, a request the bus refuses as such; retried at \
             the longest backoff)",
            errors.clone(),
        );
        Metrics {
            registry,
            published,
            retried,
            republished,
            lag_rows,
            lag_seconds,
            batch_latency,
            ingested,
            ingress_gone,
            ingress_stream_resets,
            active,
            standby_waiting,
            standby_wait_seconds,
            sink_stalled,
            sink_refusing,
            sink_blocked,
            blocked_reason: Mutex::new(String::new()),
            dead_lettered,
            refused,
            errors,
            last_worked_ms: AtomicU64::new(0),
            last_failure: Mutex::new(String::new()),
            ready_after: Duration::from_secs(ready_after_secs),
        }
    }

    /// A round worked (a read, publish and acknowledgement, or an idle read).
    pub fn worked(&self) {
        self.last_worked_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Something failed and will be tried again (a database round or connect, a
    /// bus connect or publish): counted in `retried_total`, and /readyz says so
    /// until a round works again.
    pub fn failed(&self, what: impl ToString) {
        self.retried.inc();
        if let Ok(mut last) = self.last_failure.lock() {
            *last = what.to_string();
        }
    }

    /// The broker blocks publishing (with its reason), or no longer does (`None`).
    pub fn sink_blocked(&self, reason: Option<String>) {
        self.sink_blocked.set(i64::from(reason.is_some()));
        if let (Ok(mut last), Some(reason)) = (self.blocked_reason.lock(), reason) {
            *last = reason;
        }
    }

    /// Whether this instance is ready, and why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.sink_blocked.get() != 0 {
            let reason = self
                .blocked_reason
                .lock()
                .map(|r| r.clone())
                .unwrap_or_default();
            return Err(format!(
                "the broker blocks publishing (connection.blocked: {reason})"
            ));
        }
        if self.active.get() == 0 {
            return Err(
                "not active: connecting, or standing by while another instance \
                        holds this name's lease"
                    .into(),
            );
        }
        let last = self.last_worked_ms.load(Ordering::Relaxed);
        let failure = self
            .last_failure
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if self.sink_refusing.get() != 0 {
            return Err(format!(
                "the bus refuses the bridge (every row with the same code, none taken \
                 between them): delivery stalls until it takes a row; last failure: {failure}"
            ));
        }
        if self.sink_stalled.get() != 0 {
            // Ready means the sink takes the bridge's messages, not that the
            // database answered.
            return Err(format!(
                "the bus does not take the bridge's messages (egress) or does not answer \
                 (ingress); last failure: {failure}"
            ));
        }
        if last == 0 {
            return Err(format!("no round has worked yet; last failure: {failure}"));
        }
        let age = Duration::from_millis(now_ms().saturating_sub(last));
        if age > self.ready_after {
            return Err(format!(
                "the last round that worked was {} s ago (more than {} s); last failure: {failure}",
                age.as_secs(),
                self.ready_after.as_secs()
            ));
        }
        Ok(())
    }

    /// Rows published, and rows set aside for good, so far (both kinds).
    pub fn totals(&self) -> (u64, u64) {
        let sum = |family: &Family<KindLabel, Counter>| {
            ["envelope", "outbox"]
                .iter()
                .map(|kind| family.get_or_create(&KindLabel { kind }).get())
                .sum::<u64>()
        };
        (sum(&self.published), sum(&self.dead_lettered))
    }

    /// Counts a row (`"envelope"` or `"outbox"`) set aside.
    pub fn dead_lettered(&self, kind: &'static str) {
        self.dead_lettered.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one refusal by the bus of a row of this kind.
    pub fn refused(&self, kind: &'static str) {
        self.refused.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts an error of this kind (`transient` or `permanent`, see
    /// `retry::Class::label`).
    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }

    pub fn published(&self, batch: &[Message]) {
        for m in batch {
            self.published
                .get_or_create(&KindLabel { kind: m.kind() })
                .inc();
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves the metrics until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "metrics listening");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let path = String::from_utf8_lossy(&request[..n])
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("/")
                    .to_owned();
                let (status, content_type, body) = match path.as_str() {
                    "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
                    "/readyz" => match metrics.readiness() {
                        Ok(()) => (
                            "200 OK",
                            "application/json",
                            "{\"ready\":true}\n".to_owned(),
                        ),
                        Err(reason) => (
                            "503 Service Unavailable",
                            "application/json",
                            format!(
                                "{}\n",
                                serde_json::json!({"ready": false, "reason": reason})
                            ),
                        ),
                    },
                    _ => (
                        "200 OK",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        metrics.render(),
                    ),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(())
}

/// Reads the metrics another bridge serves (for `envelopes-bridge status`).
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let connect = tokio::net::TcpStream::connect(addr);
    let mut stream = tokio::time::timeout(SCRAPE_TIMEOUT, connect)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bridge\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    tokio::time::timeout(SCRAPE_TIMEOUT, stream.read_to_end(&mut response))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
    let text = String::from_utf8_lossy(&response);
    Ok(text
        .split_once("\r\n\r\n")
        .map_or(text.as_ref(), |(_, body)| body)
        .to_owned())
}
