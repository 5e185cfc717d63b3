//! Logging that can never stop the bridge: lines go to stderr, and a write that
//! fails (a closed pipe, a full disk, `/dev/full`) is dropped, not reported.
//! tracing-subscriber reports its own write failures by printing to stderr
//! with `eprintln!`, which panics when stderr itself is the failing writer: a
//! bridge whose log reader went away would die in the middle of a batch, or
//! (the panic taking its signal task down) never see SIGTERM again. Colours
//! only when stderr is a terminal; library chatter (NATS connection events,
//! rumqttc's internals) at `warn` unless `ENVELOPES_LOG` says otherwise.
//! lapin's own lines are off: it logs each failure it also returns (which the
//! bridge reports in words, with the fix) as an ERROR in Rust Debug text
//! (`AMQPError { kind: Soft(ACCESSREFUSED), .. }`), once per layer it passes
//! through; `ENVELOPES_LOG=info,lapin=warn` shows them.

use std::io::{IsTerminal, Write};
use tracing_subscriber::fmt::MakeWriter;

/// The level filter when `ENVELOPES_LOG` is not set.
const DEFAULT_FILTER: &str = "info,async_nats=warn,lapin=off,rumqttc=warn,tokio_postgres=warn";

/// Stderr, where every write succeeds as far as the caller knows.
#[derive(Clone, Copy)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A failed write loses the line; the bridge goes on.
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

pub fn init(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ENVELOPES_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Prints a line to stdout for a command's own output (`status`, `register`);
/// false when stdout is gone (its reader exited), so the caller can stop.
pub fn out(line: impl std::fmt::Display) -> bool {
    writeln!(std::io::stdout().lock(), "{line}").is_ok()
}

/// Prints a line to stderr for the user, ignoring a failure.
pub fn err(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
