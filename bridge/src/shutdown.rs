//! Stopping: the first SIGTERM or SIGINT asks the bridge to stop after the batch
//! in hand (published, acknowledged, positions moved), a second one ends the
//! process at once. The watch the loops wait on stays open for the life of the
//! process, and a closed one counts as a stop request too, so no loop can end
//! up spinning on a `changed()` that returns at once.

use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Exit code of a second signal: 128 + the signal's number, as a shell reports
/// a process a signal ended.
fn exit_code(kind: SignalKind) -> i32 {
    128 + kind.as_raw_value()
}

/// A watch that turns true on the first SIGTERM or SIGINT.
pub fn on_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (t, i) => {
            let error = t
                .err()
                .or(i.err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            crate::logging::err(format!(
                "envelopes-bridge: cannot install the signal handlers: {error}"
            ));
            std::process::exit(crate::exit::FAILURE);
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!(
            "shutdown requested: finishing the batch in hand (a second signal ends at once)"
        );
        let _ = tx.send(true);
        let kind = tokio::select! {
            _ = term.recv() => SignalKind::terminate(),
            _ = int.recv() => SignalKind::interrupt(),
        };
        crate::logging::err("envelopes-bridge: second signal, exiting at once");
        std::process::exit(exit_code(kind));
    });
    rx
}

/// Waits until a stop is requested (or the watch is gone, which counts as one).
pub async fn requested(shutdown: &mut watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

/// Whether a stop was requested.
pub fn is_requested(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}

/// Sleeps for `delay` unless a stop is requested first; true if it was.
pub async fn sleep(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = requested(shutdown) => {}
    }
    is_requested(shutdown)
}
