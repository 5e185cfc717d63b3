//! envelopes-bridge: moves committed pg_envelopes rows to message buses (egress)
//! and envelopes from a bus into the store (ingress), without losing any.

mod crash;
mod db;
mod egress;
mod ingress;
mod lease;
mod message;
mod metrics;
mod nats;
mod redact;
mod retry;
mod sink;
mod tls;

use clap::{Args, Parser, Subcommand};
use sink::{NatsAuth, SinkOptions, SinkSpec};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Forward committed pg_envelopes rows to a message bus, at least once and in
/// commit-safe order, with a durable cursor in the database.
#[derive(Parser)]
#[command(name = "envelopes-bridge", version, propagate_version = true)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "ENVELOPES_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Publish committed envelopes and outbox rows to a sink, then advance the
    /// consumer's cursor. Runs until SIGTERM/SIGINT.
    Egress(Box<EgressArgs>),
    /// Store envelopes from a NATS JetStream stream, committing each batch together
    /// with the stream position, and acknowledge the batch only after that commit.
    Ingress(Box<IngressArgs>),
    /// Print each consumer's cursor, pending rows and their age.
    Status(StatusArgs),
}

#[derive(Args)]
struct DatabaseArgs {
    /// Postgres connection URL (postgres://user:password@host:port/db?sslmode=...)
    /// or key=value string. Never logged with its password.
    #[arg(long, env = "ENVELOPES_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// PEM file of the CA the database server's certificate must chain to (also
    /// checks the host name). Without it, sslmode=require encrypts but does not
    /// verify the certificate, as libpq does.
    #[arg(long, env = "ENVELOPES_DATABASE_CA")]
    database_ca: Option<PathBuf>,
}

impl DatabaseArgs {
    fn apply(&self) {
        if let Some(ca) = &self.database_ca {
            tls::set_database_ca(ca.clone());
        }
    }
}

#[derive(Args)]
struct EgressArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Consumer name: the durable cursor is stored under it (created if missing).
    #[arg(long, env = "ENVELOPES_BRIDGE_NAME")]
    name: String,
    /// Where to publish: stdout (JSON lines), jsonl:PATH, nats://HOST:PORT
    /// (JetStream), redis://HOST:PORT (Redis Streams, XADD) or mqtt://HOST:PORT
    /// (MQTT 5, QoS 1). Credentials may be embedded (mqtt://user:pass@host:port,
    /// redis://:pass@host:port) and are never logged.
    #[arg(
        long,
        env = "ENVELOPES_SINK",
        default_value = "stdout",
        hide_env_values = true
    )]
    sink: SinkSpec,
    /// Rows per read and per publish.
    #[arg(long, env = "ENVELOPES_BATCH_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(i32).range(1..=100_000))]
    batch_size: i32,
    /// Bytes (topics, envelopes, payloads) per read and per publish; a batch always
    /// holds at least one row. Bounds the bridge's memory.
    #[arg(long, env = "ENVELOPES_BATCH_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = clap::value_parser!(i64).range(1..))]
    batch_bytes: i64,
    /// Attempts in all a message the bus refuses (too large, a subject or key it
    /// does not take, an ACL) gets: it is set aside in envelopes.dead_letters at
    /// the first refusal while the rest flows, and tried again on a short
    /// schedule until this many attempts; then it waits for retry_dead_letters().
    #[arg(long, env = "ENVELOPES_DEAD_LETTER_AFTER", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    dead_letter_after: u32,
    /// Outbox ids are per database: bridges of several databases (the shards of
    /// a router) publishing into one stream each set their own scope, which goes
    /// into outbox dedup ids (`outbox:SCOPE:ID`) so those stay apart. Envelope
    /// ids (`NODE:SEQ`) are the same on every shard and need none.
    #[arg(long, env = "ENVELOPES_OUTBOX_SCOPE")]
    outbox_scope: Option<String>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9187).
    #[arg(long, env = "ENVELOPES_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Read even without a notification after this many milliseconds.
    #[arg(long, env = "ENVELOPES_POLL_INTERVAL_MS", default_value_t = 200)]
    poll_interval_ms: u64,
    /// The NOTIFY channel to listen on (envelopes.notify_channel).
    #[arg(long, env = "ENVELOPES_NOTIFY_CHANNEL", default_value = "envelopes")]
    channel: String,
    #[command(flatten)]
    bus: BusArgs,
}

#[derive(Args)]
struct BusArgs {
    /// JetStream stream: egress publishes into it (created if missing), ingress
    /// reads from it.
    #[arg(long, env = "ENVELOPES_NATS_STREAM", default_value = "ENVELOPES")]
    nats_stream: String,
    /// Replicas of the JetStream stream when egress creates it (3 on a
    /// three-node cluster; an existing stream keeps its own).
    #[arg(long, env = "ENVELOPES_NATS_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    nats_replicas: u8,
    /// Subject prefix: envelopes go to PREFIX.envelope.NODE, outbox rows to
    /// PREFIX.outbox.SUBJECT (MQTT: PREFIX/envelope/NODE ...).
    #[arg(long, env = "ENVELOPES_SUBJECT_PREFIX", default_value = "envelopes")]
    subject_prefix: String,
    /// Redis stream key.
    #[arg(long, env = "ENVELOPES_REDIS_STREAM", default_value = "envelopes")]
    redis_stream: String,
    /// NATS user (with --nats-password).
    #[arg(long, env = "ENVELOPES_NATS_USER")]
    nats_user: Option<String>,
    /// NATS password.
    #[arg(long, env = "ENVELOPES_NATS_PASSWORD", hide_env_values = true)]
    nats_password: Option<String>,
    /// NATS token.
    #[arg(long, env = "ENVELOPES_NATS_TOKEN", hide_env_values = true)]
    nats_token: Option<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "ENVELOPES_NATS_CREDS")]
    nats_creds: Option<PathBuf>,
    /// MQTT client id (default: envelopes-bridge-NAME).
    #[arg(long, env = "ENVELOPES_MQTT_CLIENT_ID")]
    mqtt_client_id: Option<String>,
    /// AMQP topic exchange the messages are published to (declared durable if
    /// missing); the routing keys are the NATS subjects.
    #[arg(long, env = "ENVELOPES_AMQP_EXCHANGE", default_value = "envelopes")]
    amqp_exchange: String,
    /// Webhook body: a JSON array of the messages, or a CBOR array.
    #[arg(
        long,
        env = "ENVELOPES_WEBHOOK_FORMAT",
        value_enum,
        default_value = "json"
    )]
    webhook_format: sink::WebhookFormat,
    /// Key of the webhook's X-Envelopes-Signature header (HMAC-SHA256 of the body).
    #[arg(long, env = "ENVELOPES_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Webhook request timeout, in milliseconds.
    #[arg(long, env = "ENVELOPES_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    webhook_timeout_ms: u64,
}

impl BusArgs {
    fn options(&self, name: &str) -> SinkOptions {
        let nats_auth = if let Some(path) = &self.nats_creds {
            NatsAuth::CredsFile(path.clone())
        } else if let Some(token) = &self.nats_token {
            NatsAuth::Token(token.clone())
        } else if let Some(user) = &self.nats_user {
            NatsAuth::UserPassword(user.clone(), self.nats_password.clone().unwrap_or_default())
        } else {
            NatsAuth::None
        };
        SinkOptions {
            nats_stream: self.nats_stream.clone(),
            nats_replicas: usize::from(self.nats_replicas),
            subject_prefix: self.subject_prefix.clone(),
            redis_stream: self.redis_stream.clone(),
            nats_auth,
            mqtt_client_id: self
                .mqtt_client_id
                .clone()
                .unwrap_or_else(|| format!("envelopes-bridge-{name}")),
            amqp_exchange: self.amqp_exchange.clone(),
            webhook_format: self.webhook_format,
            webhook_secret: self.webhook_secret.clone(),
            webhook_timeout: Duration::from_millis(self.webhook_timeout_ms),
        }
    }
}

#[derive(Args)]
struct IngressArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Consumer name: its stream position is stored in envelopes.ingress_positions.
    #[arg(long, env = "ENVELOPES_BRIDGE_NAME")]
    name: String,
    /// The bus to read from: nats://HOST:PORT (JetStream).
    #[arg(long, env = "ENVELOPES_SOURCE", hide_env_values = true)]
    source: String,
    /// Only messages on this subject (wildcards allowed); default: the whole stream.
    #[arg(long, env = "ENVELOPES_SOURCE_SUBJECT", default_value = "")]
    subject: String,
    /// Where malformed messages go, with the reason in the Envelopes-Error header.
    /// Keep it outside the source stream's subjects.
    #[arg(
        long,
        env = "ENVELOPES_DEAD_LETTER_SUBJECT",
        default_value = "envelopes-dead-letter"
    )]
    dead_letter_subject: String,
    /// Messages per pull and per transaction.
    #[arg(long, env = "ENVELOPES_BATCH_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch_size: u32,
    /// Serve Prometheus metrics on this address.
    #[arg(long, env = "ENVELOPES_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    #[command(flatten)]
    bus: BusArgs,
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Also show the error and dead-letter counters of running bridges, read from
    /// their --metrics-addr (repeatable, e.g. 127.0.0.1:9187).
    #[arg(
        long = "bridge-metrics",
        env = "ENVELOPES_BRIDGE_METRICS",
        value_delimiter = ','
    )]
    bridge_metrics: Vec<SocketAddr>,
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ENVELOPES_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A watch that turns true on SIGTERM or SIGINT.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot install SIGTERM handler");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutdown requested");
        let _ = tx.send(true);
    });
    rx
}

async fn status(args: StatusArgs) -> Result<(), String> {
    args.database.apply();
    let db = db::connect(&args.database.database_url, "envelopes-bridge status")
        .await
        .map_err(|e| retry::DbFailure::from(e).to_string())?;
    let failure = |e: tokio_postgres::Error| retry::DbFailure::new(&e).to_string();
    let rows = db
        .client
        .query(
            "SELECT consumer, outbox_id, late_id, outbox_pending,
                    COALESCE(extract(epoch FROM outbox_oldest_pending_age), 0)::float8,
                    envelopes_pending,
                    COALESCE(extract(epoch FROM envelopes_oldest_pending_age), 0)::float8,
                    dead_letters, COALESCE(last_acknowledged_at::text, '-'), notification_queue_usage
               FROM envelopes.consumer_status ORDER BY consumer",
            &[],
        )
        .await
        .map_err(failure)?;
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}  {:<32} {:>8}",
        "consumer",
        "outbox id",
        "late id",
        "outbox lag",
        "oldest (s)",
        "env. lag",
        "oldest (s)",
        "dead",
        "last ack",
        "notify q"
    );
    for r in rows {
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>10.1} {:>10} {:>10.1} {:>6}  {:<32} {:>8.4}",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, f64>(4),
            r.get::<_, i64>(5),
            r.get::<_, f64>(6),
            r.get::<_, i64>(7),
            r.get::<_, String>(8),
            r.get::<_, f64>(9),
        );
    }
    let dead = db
        .client
        .query(
            "SELECT id, consumer, CASE kind WHEN 'envelope'
                        THEN originator_node_id || ':' || originator_sequence_id
                        ELSE 'outbox:' || outbox_id END,
                    attempts, COALESCE(error, '-'), reason, last_attempt_at::text,
                    retry_requested_at IS NOT NULL, next_attempt_at IS NOT NULL
               FROM envelopes.consumer_dead_letters() ORDER BY id",
            &[],
        )
        .await
        .map_err(failure)?;
    if !dead.is_empty() {
        println!("\ndead letters (envelopes.retry_dead_letters() asks for them again):");
        for r in dead {
            println!(
                "  #{:<6} {:<20} {:<24} attempts {:<3} {:<12} {}  (last {}{})",
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
                r.get::<_, i32>(3),
                r.get::<_, String>(4),
                r.get::<_, String>(5),
                r.get::<_, String>(6),
                if r.get::<_, bool>(7) {
                    ", retry asked"
                } else if r.get::<_, bool>(8) {
                    ", the bridge tries it again shortly"
                } else {
                    ""
                },
            );
        }
    }
    for addr in &args.bridge_metrics {
        match metrics::scrape(*addr).await {
            Ok(text) => {
                println!("\nbridge at {addr}:");
                for line in text.lines().filter(|l| {
                    [
                        "_errors_total",
                        "_dead_lettered_total",
                        "_retried_total",
                        "_published_total",
                    ]
                    .iter()
                    .any(|m| l.starts_with("envelopes_bridge") && l.contains(m))
                }) {
                    println!("  {line}");
                }
            }
            Err(e) => println!("\nbridge at {addr}: not reachable ({e})"),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json);
    match cli.command {
        Command::Egress(args) => {
            args.database.apply();
            let metrics = Arc::new(metrics::Metrics::new());
            if let Some(addr) = args.metrics_addr {
                if let Err(e) = metrics::serve(addr, metrics.clone()).await {
                    tracing::error!(error = %e, %addr, "cannot serve metrics");
                    return std::process::ExitCode::FAILURE;
                }
            }
            tracing::info!(database = %redact::url(&args.database.database_url), sink = %args.sink,
                           consumer = %args.name, "starting egress");
            let config = egress::EgressConfig {
                database_url: args.database.database_url,
                sink_options: args.bus.options(&args.name),
                name: args.name.clone(),
                sink: args.sink.clone(),
                batch_size: args.batch_size,
                batch_bytes: args.batch_bytes,
                poll_interval: Duration::from_millis(args.poll_interval_ms.max(1)),
                channel: args.channel,
                dead_letter_after: args.dead_letter_after,
                outbox_scope: args.outbox_scope,
            };
            egress::run(config, metrics, shutdown_signal()).await;
            std::process::ExitCode::SUCCESS
        }
        Command::Ingress(args) => {
            args.database.apply();
            let metrics = Arc::new(metrics::Metrics::new());
            if let Some(addr) = args.metrics_addr {
                if let Err(e) = metrics::serve(addr, metrics.clone()).await {
                    tracing::error!(error = %e, %addr, "cannot serve metrics");
                    return std::process::ExitCode::FAILURE;
                }
            }
            tracing::info!(database = %redact::url(&args.database.database_url),
                           source = %redact::url(&args.source), consumer = %args.name, "starting ingress");
            let config = ingress::IngressConfig {
                database_url: args.database.database_url,
                nats_auth: args.bus.options(&args.name).nats_auth,
                name: args.name,
                source: args.source,
                stream: args.bus.nats_stream.clone(),
                subject: args.subject,
                dead_letter_subject: args.dead_letter_subject,
                batch_size: args.batch_size as usize,
            };
            ingress::run(config, metrics, shutdown_signal()).await;
            std::process::ExitCode::SUCCESS
        }
        Command::Status(args) => match status(args).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("envelopes-bridge status: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}
