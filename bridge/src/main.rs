//! envelopes-bridge: moves committed pg_envelopes rows to message buses (egress)
//! and envelopes from a bus into the store (ingress), without losing any. This
//! file declares the modules, starts the runtime and runs the subcommand the
//! command line names; the exit codes are in [`exit`].

mod cli;
mod config;
mod crash;
mod db;
mod egress;
mod exit;
mod ingress;
mod lease;
mod logging;
mod message;
mod metrics;
mod nats;
mod pooler;
mod redact;
mod register;
mod retry;
mod shutdown;
mod sink;
mod standby;
mod status;
mod tls;
mod watch;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// How long the runtime waits, at exit, for tasks still waiting on a bus or the
/// database; they are not waited for longer.
const RUNTIME_SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

fn main() -> ExitCode {
    // The configuration file goes into the environment before anything else
    // runs (one thread still), then the command line is parsed over it.
    let args = match config::apply(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            logging::err(format!("envelopes-bridge: {e}"));
            return ExitCode::from(exit::CONFIG as u8);
        }
    };
    let cli = Cli::parse_from(args);
    if cli.check_config {
        // Everything the command takes has parsed (clap exits 2 otherwise, a bad
        // file 78 above); nothing is connected to.
        logging::out("envelopes-bridge: configuration ok");
        return ExitCode::SUCCESS;
    }
    logging::init(cli.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            logging::err(format!("envelopes-bridge: cannot start the runtime: {e}"));
            return ExitCode::from(exit::FAILURE as u8);
        }
    };
    let code = runtime.block_on(run(cli.command));
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_WAIT);
    ExitCode::from(code as u8)
}

async fn run(command: Command) -> i32 {
    match command {
        Command::Egress(args) => {
            args.database.apply();
            let metrics = Arc::new(metrics::Metrics::new(args.service.ready_after));
            if let Err(code) = serve_metrics(args.service.metrics_addr, &metrics).await {
                return code;
            }
            tracing::info!(database = %redact::url(&args.database.database_url), sink = %args.sink.sink,
                           consumer = %args.name, "starting egress");
            let args = *args;
            let config = egress::EgressConfig {
                database_url: args.database.database_url,
                name: args.name,
                register: args.register,
                sink: args.sink,
                batch_size: args.batch_size,
                batch_bytes: args.batch_bytes,
                poll_interval: Duration::from_millis(args.poll_interval_ms.max(1)),
                channel: args.channel,
                dead_letter_after: args.dead_letter_after,
                outbox_scope: args.outbox_scope,
                lag_every_round: args.lag_every_round,
                summary_every: Duration::from_secs(args.summary_secs),
                forward_after: args.forward_after,
            };
            finish(egress::run(config, metrics, shutdown::on_signal()).await)
        }
        Command::Ingress(args) => {
            args.database.apply();
            let metrics = Arc::new(metrics::Metrics::new(args.service.ready_after));
            if let Err(code) = serve_metrics(args.service.metrics_addr, &metrics).await {
                return code;
            }
            tracing::info!(database = %redact::url(&args.database.database_url),
                           source = %redact::url(&args.source), consumer = %args.name, "starting ingress");
            let subject = args
                .subject
                .clone()
                .unwrap_or_else(|| format!("{}.envelope.>", args.subject_prefix));
            let config = ingress::IngressConfig {
                database_url: args.database.database_url.clone(),
                nats_auth: args.nats_auth.auth(),
                name: args.name.clone(),
                source: args.source.clone(),
                stream: args.nats_stream.clone(),
                subject,
                dead_letter_subject: args.dead_letter_subject.clone(),
                batch_size: args.batch_size as usize,
                summary_every: Duration::from_secs(args.summary_secs),
            };
            finish(ingress::run(config, metrics, shutdown::on_signal()).await)
        }
        Command::Run => {
            // config::apply replaced `run` by the file's command; reaching this
            // means there was none.
            logging::err("envelopes-bridge run: --config FILE with a `command` key is needed");
            exit::CONFIG
        }
        Command::Register(args) => one_shot("register", register::run(args).await),
        Command::Watch(args) => {
            // SIGTERM/SIGINT end a watch as its normal end (0), not by the
            // signal's default action (143).
            let mut stop = shutdown::on_signal();
            tokio::select! {
                result = watch::run(args) => match result {
                    Ok(()) => 0,
                    Err(watch::WatchError { message, fix: Some(fix) }) => {
                        logging::err(format!("envelopes-bridge watch: {message} ({fix})"));
                        exit::CONFIG
                    }
                    Err(watch::WatchError { message, fix: None }) => {
                        logging::err(format!("envelopes-bridge watch: {message}"));
                        exit::FAILURE
                    }
                },
                _ = shutdown::requested(&mut stop) => 0,
            }
        }
        Command::Status(args) => one_shot("status", status::run(args).await),
    }
}

/// The exit code of a one-shot command: 0, 78 with the cause and the fix when
/// the database refuses the configuration (a wrong password, role, database,
/// a missing grant), 1 for anything else.
fn one_shot(command: &str, result: Result<(), retry::DbFailure>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if e.class == retry::Class::Config => {
            let fatal = retry::Fatal::database(&e);
            logging::err(format!(
                "envelopes-bridge {command}: {} ({})",
                fatal.message, fatal.hint
            ));
            exit::CONFIG
        }
        Err(e) => {
            logging::err(format!("envelopes-bridge {command}: {e}"));
            exit::FAILURE
        }
    }
}

async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    metrics: &Arc<metrics::Metrics>,
) -> Result<(), i32> {
    if let Some(addr) = addr {
        if let Err(e) = metrics::serve(addr, metrics.clone()).await {
            tracing::error!(error = %e, %addr, "cannot serve metrics");
            return Err(exit::FAILURE);
        }
    }
    Ok(())
}

/// The exit code of a loop that ended: 0, or 78 with the cause and the fix.
fn finish(result: Result<(), retry::Fatal>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(fatal) => {
            tracing::error!(error = %fatal.message, fix = %fatal.hint,
                            "configuration refused before the bridge ever worked; exiting (78)");
            if fatal.hint.is_empty() {
                logging::err(format!("envelopes-bridge: {}", fatal.message));
            } else {
                logging::err(format!(
                    "envelopes-bridge: {} ({})",
                    fatal.message, fatal.hint
                ));
            }
            exit::CONFIG
        }
    }
}
