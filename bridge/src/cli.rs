//! The command line: the subcommands and their own options, grouped by what
//! they are for (the database, the service, each subcommand's own); the options
//! of each sink come from that sink ([`crate::sink::SinkArgs`]), NATS'
//! authentication from the NATS connection ([`crate::nats::NatsAuthArgs`]).
//! Every option also reads an environment variable, and a `--config FILE` (see
//! [`crate::config`]) may give any of them: flags win over the environment, the
//! environment over the file, the file over the defaults.

use crate::nats::NatsAuthArgs;
use crate::sink::SinkArgs;
use crate::standby::ForwardAfter;
use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Forward committed pg_envelopes rows to a message bus, at least once and in
/// commit-safe order, with a durable cursor in the database.
#[derive(Parser)]
#[command(name = "envelopes-bridge", version, propagate_version = true)]
pub struct Cli {
    /// Log as JSON lines instead of text (true/false, 1/0, yes/no, on/off).
    #[arg(long, global = true, env = "ENVELOPES_LOG_JSON", value_parser = BoolishValueParser::new(),
          default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub log_json: bool,
    /// A TOML file giving any option of the subcommand by its long name (e.g.
    /// `database-url = "..."`), at the top or under `[egress]`, `[ingress]`,
    /// `[register]` or `[status]`; checked whole (exit 78 naming file, line, key);
    /// flags and environment variables win over it.
    #[arg(long, global = true, env = "ENVELOPES_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the command line, the environment and the --config file, then exit
    /// (0 when they parse, as `run` would take them) without connecting anywhere.
    #[arg(long, global = true)]
    pub check_config: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Publish committed envelopes and outbox rows to a sink, then advance the
    /// consumer's cursor. Runs until SIGTERM/SIGINT.
    Egress(Box<EgressArgs>),
    /// Store envelopes from a NATS JetStream stream, committing each batch together
    /// with the stream position, and acknowledge the batch only after that commit.
    Ingress(Box<IngressArgs>),
    /// Run what the --config file's `command` key names (egress or ingress), with
    /// the options it gives: one file per service instance.
    Run,
    /// Create a consumer (egress needs one that exists, unless --register).
    Register(RegisterArgs),
    /// Print each consumer's cursor, pending rows and their age.
    Status(StatusArgs),
    /// Follow what egress publishes on NATS or RabbitMQ, one JSON line per
    /// message.
    Watch(WatchArgs),
}

#[derive(Args)]
#[command(next_help_heading = "Database")]
pub struct DatabaseArgs {
    /// Postgres connection URL (postgres://user:password@host:port/db?sslmode=...)
    /// or key=value string. Never logged with its password.
    #[arg(long, env = "ENVELOPES_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// PEM file of the CA the database server's certificate must chain to (also
    /// checks the host name). Without it, sslmode=require encrypts but does not
    /// verify the certificate, as libpq does.
    #[arg(long, env = "ENVELOPES_DATABASE_CA")]
    pub database_ca: Option<PathBuf>,
    /// Seconds after which the database ends a session of this bridge that has
    /// gone silent — the bridge stopped (SIGSTOP, a frozen VM), or cut off by
    /// the network with data unacknowledged — which frees its lease for a
    /// standby. Set on each session (idle_session_timeout,
    /// idle_in_transaction_session_timeout, tcp_user_timeout, TCP keepalives);
    /// a working bridge is never silent that long (it sends a heartbeat while it
    /// waits for a bus). A standby also ends an active session silent for
    /// longer (envelopes.lease_timeout: a stopped bridge, a lease left on a
    /// pooled server connection) and takes the lease; give every instance of a
    /// name the same value. 0 leaves the server's settings.
    #[arg(long, env = "ENVELOPES_SESSION_TIMEOUT", default_value_t = 15)]
    pub session_timeout: u64,
}

impl DatabaseArgs {
    pub fn apply(&self) {
        if let Some(ca) = &self.database_ca {
            crate::tls::set_database_ca(ca.clone());
        }
        crate::db::set_session_timeout(std::time::Duration::from_secs(self.session_timeout));
    }
}

/// How the service is watched.
#[derive(Args)]
#[command(next_help_heading = "Service")]
pub struct ServiceArgs {
    /// Serve Prometheus metrics (/metrics), liveness (/healthz) and readiness
    /// (/readyz) on this address (e.g. 127.0.0.1:9187).
    #[arg(long, env = "ENVELOPES_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// /readyz answers 200 while the last round that worked is at most this many
    /// seconds old, 503 otherwise (and while standing by).
    #[arg(long, env = "ENVELOPES_READY_AFTER", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ready_after: u64,
}

#[derive(Args)]
pub struct EgressArgs {
    /// Consumer name: the durable cursor is stored under it. It must exist (see
    /// --register and `envelopes-bridge register`).
    #[arg(long, env = "ENVELOPES_BRIDGE_NAME")]
    pub name: String,
    /// Create the consumer if it does not exist yet (at the beginning of every
    /// feed). Without it an unknown name is refused, so that a typo does not
    /// replay the whole store under a new name.
    #[arg(long, env = "ENVELOPES_REGISTER", value_parser = BoolishValueParser::new(),
          default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub register: bool,
    /// Rows per read and per publish.
    #[arg(long, env = "ENVELOPES_BATCH_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(i32).range(1..=100_000))]
    pub batch_size: i32,
    /// Bytes (topics, envelopes, payloads) per read and per publish; a batch always
    /// holds at least one row. Bounds the bridge's memory.
    #[arg(long, env = "ENVELOPES_BATCH_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub batch_bytes: i64,
    /// Attempts in all a message the bus refuses (too large, a subject or key it
    /// does not take, an ACL) gets: it is set aside in envelopes.dead_letters at
    /// the first refusal while the rest flows, and tried again on a short
    /// schedule until this many attempts; then it waits for retry_dead_letters().
    #[arg(long, env = "ENVELOPES_DEAD_LETTER_AFTER", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub dead_letter_after: u32,
    /// Outbox ids are per database: bridges of several databases (the shards of
    /// a router) publishing into one stream each set their own scope, which goes
    /// into outbox dedup ids (`outbox:SCOPE:ID`) so those stay apart. Envelope
    /// ids (`NODE:SEQ`) are the same on every shard and need none.
    #[arg(long, env = "ENVELOPES_OUTBOX_SCOPE")]
    pub outbox_scope: Option<String>,
    /// Read even without a notification after this many milliseconds.
    #[arg(long, env = "ENVELOPES_POLL_INTERVAL_MS", default_value_t = 200)]
    pub poll_interval_ms: u64,
    /// The NOTIFY channel to listen on (envelopes.notify_channel).
    #[arg(long, env = "ENVELOPES_NOTIFY_CHANNEL", default_value = "envelopes")]
    pub channel: String,
    /// Read the consumer's lag from the database every round (the lag metrics,
    /// the progress line), at most ten times a second and at most 3% of the
    /// time; off, every 5 seconds.
    #[arg(long, env = "ENVELOPES_LAG_EVERY_ROUND", value_parser = BoolishValueParser::new(),
          default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub lag_every_round: bool,
    /// Log one INFO line every this many seconds with what egress did (rows
    /// forwarded, rows dead-lettered, the lag), idle or not; 0: never.
    #[arg(long, env = "ENVELOPES_SUMMARY_SECS", default_value_t = 60)]
    pub summary_secs: u64,
    /// When a batch may go to the bus: `standby-flush` once the synchronous
    /// standbys (without synchronous_standby_names: every streaming standby, at
    /// least one) have flushed the WAL it was read at, so that a failover cannot
    /// take back a row already forwarded; `commit` as soon as it is committed on
    /// the primary; `auto`: standby-flush while synchronous_standby_names is set.
    #[arg(long, env = "ENVELOPES_FORWARD_AFTER", value_enum, default_value_t = ForwardAfter::Auto)]
    pub forward_after: ForwardAfter,
    #[command(flatten)]
    pub service: ServiceArgs,
    // The sink and its options (each sink's own group).
    #[command(flatten)]
    pub sink: SinkArgs,
    // Last: the database's heading would otherwise carry over to the
    // subcommand's own options in --help.
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Args)]
pub struct IngressArgs {
    /// Consumer name: its stream position is stored in envelopes.ingress_positions
    /// (per stream).
    #[arg(long, env = "ENVELOPES_BRIDGE_NAME")]
    pub name: String,
    /// The bus to read from: nats://HOST[:PORT] (JetStream; several servers of a
    /// cluster comma-separated).
    #[arg(long, env = "ENVELOPES_SOURCE", hide_env_values = true,
          value_parser = parse_source)]
    pub source: String,
    /// JetStream stream ingress reads.
    #[arg(long, env = "ENVELOPES_NATS_STREAM", default_value = "ENVELOPES")]
    pub nats_stream: String,
    /// Only messages on this subject (wildcards allowed); default: the envelope
    /// subjects egress writes, PREFIX.envelope.> (not its outbox rows).
    #[arg(long, env = "ENVELOPES_SOURCE_SUBJECT")]
    pub subject: Option<String>,
    /// The subject prefix egress writes under (for the default --subject).
    #[arg(long, env = "ENVELOPES_SUBJECT_PREFIX", default_value = "envelopes")]
    pub subject_prefix: String,
    /// Where malformed messages go, with the reason in the Envelopes-Error header.
    /// Keep it outside the source stream's subjects.
    #[arg(
        long,
        env = "ENVELOPES_DEAD_LETTER_SUBJECT",
        default_value = "envelopes-dead-letter"
    )]
    pub dead_letter_subject: String,
    /// Messages per pull and per transaction.
    #[arg(long, env = "ENVELOPES_BATCH_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: u32,
    /// Log one INFO line every this many seconds with what ingress did
    /// (messages stored, messages dead-lettered, the stream position), idle or
    /// not; 0: never.
    #[arg(long, env = "ENVELOPES_SUMMARY_SECS", default_value_t = 60)]
    pub summary_secs: u64,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    // Last: the database's heading would otherwise carry over to the
    // subcommand's own options in --help.
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Ingress reads JetStream: `nats://` or `tls://` servers, comma-separated.
fn parse_source(source: &str) -> Result<String, String> {
    for server in source.split(',') {
        let server = server.trim();
        if !(server.starts_with("nats://") || server.starts_with("tls://")) {
            return Err(format!(
                "{}: ingress reads NATS JetStream only: nats://HOST:PORT (or tls://), \
                 several comma-separated",
                crate::redact::url(server)
            ));
        }
    }
    Ok(source.to_owned())
}

#[derive(Args)]
pub struct RegisterArgs {
    /// The consumer to create (nothing happens if it exists); from a --config
    /// file, its `name`.
    #[arg(env = "ENVELOPES_BRIDGE_NAME")]
    pub name: String,
    /// Start at the current end of every feed instead of the beginning.
    #[arg(long, env = "ENVELOPES_REGISTER_FROM_END", value_parser = BoolishValueParser::new(),
          default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub from_end: bool,
    // Last: the database's heading would otherwise carry over to the
    // subcommand's own options in --help.
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Also show the error and dead-letter counters of running bridges, read from
    /// their --metrics-addr (repeatable, e.g. 127.0.0.1:9187).
    #[arg(
        long = "bridge-metrics",
        env = "ENVELOPES_BRIDGE_METRICS",
        value_delimiter = ','
    )]
    pub bridge_metrics: Vec<SocketAddr>,
    // Last: the database's heading would otherwise carry over to the
    // subcommand's own options in --help.
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// `envelopes-bridge watch` (see [`crate::watch`]).
#[derive(clap::Args)]
pub struct WatchArgs {
    /// The bus: nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST, as egress's
    /// --sink.
    pub url: String,
    /// The subject prefix egress publishes under.
    #[arg(long, env = "ENVELOPES_SUBJECT_PREFIX", default_value = "envelopes")]
    pub subject_prefix: String,
    /// The AMQP exchange egress publishes to.
    #[arg(long, env = "ENVELOPES_AMQP_EXCHANGE", default_value = "envelopes")]
    pub amqp_exchange: String,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
}
