//! The one crash hook of the bridge, for tests: `ENVELOPES_BRIDGE_CRASH=<point>:<n>`
//! aborts the process (no cleanup, like kill -9) the n-th time execution reaches
//! `point`. Egress points: before_publish, after_publish, after_ack; ingress:
//! before_commit, after_commit. Unset in production, where [`reached`] is a
//! cheap no-op.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

struct Hook {
    point: String,
    at: u64,
    seen: AtomicU64,
}

fn hook() -> Option<&'static Hook> {
    static HOOK: OnceLock<Option<Hook>> = OnceLock::new();
    HOOK.get_or_init(|| {
        let spec = std::env::var("ENVELOPES_BRIDGE_CRASH").ok()?;
        let (point, at) = spec.split_once(':')?;
        Some(Hook {
            point: point.to_owned(),
            at: at.parse().ok()?,
            seen: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// Marks that execution reached `point`; aborts when the hook says so.
pub fn reached(point: &str) {
    let Some(hook) = hook() else { return };
    if hook.point == point && hook.seen.fetch_add(1, Ordering::SeqCst) + 1 >= hook.at {
        eprintln!(
            "envelopes-bridge: crash hook {point}:{} reached, aborting",
            hook.at
        );
        std::process::abort();
    }
}
