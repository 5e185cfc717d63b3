//! Prometheus metrics, served as text on `--metrics-addr` (any path).

use crate::message::Message;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub published: Family<KindLabel, Counter>,
    pub retried: Counter,
    pub lag_rows: Gauge,
    pub lag_seconds: Gauge<f64, AtomicU64>,
    pub batch_latency: Histogram,
    pub ingested: Counter,
    /// 1 while this instance holds its name's lease (active), 0 while it stands by.
    pub active: Gauge,
    dead_lettered: Family<KindLabel, Counter>,
    refused: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("envelopes_bridge");
        let published = Family::<KindLabel, Counter>::default();
        let retried = Counter::default();
        let lag_rows = Gauge::default();
        let lag_seconds = Gauge::<f64, AtomicU64>::default();
        let batch_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let ingested = Counter::default();
        let dead_lettered = Family::<KindLabel, Counter>::default();
        let refused = Family::<KindLabel, Counter>::default();
        let active = Gauge::default();
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "published",
            "Messages acknowledged by the bus",
            published.clone(),
        );
        registry.register(
            "retried",
            "Batches published again after a failure",
            retried.clone(),
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
            "Database errors, by kind: transient (retried with backoff) or permanent \
             (data or privileges; retried at the longest backoff)",
            errors.clone(),
        );
        Metrics {
            registry,
            published,
            retried,
            lag_rows,
            lag_seconds,
            batch_latency,
            ingested,
            active,
            dead_lettered,
            refused,
            errors,
        }
    }

    /// Counts a row (`"envelope"` or `"outbox"`) set aside.
    pub fn dead_lettered(&self, kind: &'static str) {
        self.dead_lettered.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one refusal by the bus of a row of this kind.
    pub fn refused(&self, kind: &'static str) {
        self.refused.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts a database error of this class.
    pub fn error(&self, class: crate::retry::Class) {
        self.errors
            .get_or_create(&KindLabel {
                kind: class.label(),
            })
            .inc();
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
                let _ = stream.read(&mut request).await;
                let body = metrics.render();
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    let mut stream = tokio::time::timeout(std::time::Duration::from_secs(3), connect)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bridge\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(3),
        stream.read_to_end(&mut response),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
    let text = String::from_utf8_lossy(&response);
    Ok(text
        .split_once("\r\n\r\n")
        .map_or(text.as_ref(), |(_, body)| body)
        .to_owned())
}
