//! Which stream ingress reads and where it resumes: the stream's incarnation
//! (its identity, stored with the position), the resume point after a purge or
//! a re-creation, the gap counted when messages were gone before they were
//! read, and NATS subject matching for the dead-letter subject.

use super::{Failure, IngressConfig};
use crate::metrics::Metrics;
use async_nats::jetstream;
use std::time::Duration;

/// How often an idle ingress checks that its stream is still the one it reads.
pub(super) const IDENTITY_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Which incarnation of a stream this is: its creation time (a stream deleted
/// and re-created under the same name has another one, and numbers its
/// messages from 1 again). Stored with the position.
pub(super) fn stream_identity(info: &jetstream::stream::Info) -> String {
    format!("jetstream:created:{}", info.created.unix_timestamp_nanos())
}

/// Where a session starts reading, and what it found on the way.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Resume {
    /// The first stream sequence to ask for.
    pub(super) start: u64,
    /// Sequence numbers between the stored position and `start` that are gone
    /// (purged, removed by limits or age) and will never be read.
    pub(super) gone: u64,
    /// The stored position counts in another incarnation of the stream.
    pub(super) reset: bool,
}

/// Where to resume on a stream whose messages run from `first` to `last` and
/// whose identity is `current`, after `position` stored under identity `stored`.
///
/// The same stream: after the position, or at the first message still there
/// (what lies between is gone). Another stream (re-created): from its first
/// message; the old position means nothing in it. A position stored without an
/// identity (before 0.4.0) counts as the same stream unless it lies beyond the
/// stream's end, which only a restarted numbering explains.
pub(super) fn resume(
    position: u64,
    stored: Option<&str>,
    current: &str,
    first: u64,
    last: u64,
) -> Resume {
    let first = first.max(1);
    let same = match stored {
        Some(identity) => identity == current,
        None => position <= last,
    };
    if !same {
        return Resume {
            start: first,
            gone: if last > 0 { first - 1 } else { 0 },
            reset: true,
        };
    }
    let next = position + 1;
    if position > 0 && first > next && last > 0 {
        // Purged: `first` may be last + 1 (nothing left yet).
        Resume {
            start: first,
            gone: first - next,
            reset: false,
        }
    } else {
        Resume {
            start: next,
            gone: 0,
            reset: false,
        }
    }
}

/// Ends the session when the stream is no longer the incarnation `identity`
/// names (deleted, or deleted and re-created): the next one starts afresh.
pub(super) async fn check_identity(
    stream: &mut jetstream::stream::Stream,
    identity: &str,
) -> Result<(), Failure> {
    let info = stream
        .info()
        .await
        .map_err(|e| Failure::Bus(format!("reading the stream's info: {e}")))?;
    let now = stream_identity(info);
    if now != identity {
        return Err(Failure::Retry(format!(
            "the stream was re-created while ingress read it ({identity} -> {now})"
        )));
    }
    Ok(())
}

/// After a batch whose sequences jumped ahead (`(expected, got)`), counts and
/// logs the sequence numbers that are gone from the stream's head (first
/// sequence now past them): purged or removed by limits or age before they were
/// read. Jumps over messages still there are other subjects' (the filter).
pub(super) async fn count_gone(
    stream: &mut jetstream::stream::Stream,
    config: &IngressConfig,
    jumps: &[(u64, u64)],
    metrics: &Metrics,
) -> Result<(), Failure> {
    let info = stream
        .info()
        .await
        .map_err(|e| Failure::Bus(format!("reading the stream's info: {e}")))?;
    let first = info.state.first_sequence;
    let gone: u64 = jumps
        .iter()
        .filter(|(expected, _)| first > *expected)
        .map(|(expected, got)| first.min(*got) - expected)
        .sum();
    if gone > 0 {
        metrics.ingress_gone.inc_by(gone);
        tracing::warn!(stream = %config.stream, gone, first_sequence = first,
                       "messages were gone from the stream before ingress read them (purged, or \
                        removed by the stream's limits or age); they cannot be stored");
    }
    Ok(())
}

/// Whether the NATS subject `subject` (no wildcards) matches `pattern`
/// (`*` one token, `>` one or more at the end).
pub(super) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for want in pattern.split('.') {
        match (want, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (want, Some(got)) if want == got => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_nats_wildcards() {
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(subject_matches("a.*.c", "a.b.c"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("dead", "dead"));
        assert!(!subject_matches("dead", "dead.x"));
        assert!(!subject_matches(
            "envelopes.envelope.>",
            "envelopes-dead-letter"
        ));
        assert!(subject_matches(">", "envelopes-dead-letter"));
    }

    #[test]
    fn the_same_stream_resumes_after_the_position() {
        let r = resume(3000, Some("a"), "a", 1, 5000);
        assert_eq!((r.start, r.gone, r.reset), (3001, 0, false));
        // Nothing stored yet: from the start, nothing counted as gone.
        let r = resume(0, None, "a", 40, 5000);
        assert_eq!((r.start, r.gone, r.reset), (1, 0, false));
    }

    #[test]
    fn a_re_created_stream_is_read_from_its_first_message() {
        let r = resume(3000, Some("old"), "new", 1, 8000);
        assert_eq!((r.start, r.gone, r.reset), (1, 0, true));
        // Empty new stream (JetStream reports 0, 0).
        let r = resume(3000, Some("old"), "new", 0, 0);
        assert_eq!((r.start, r.gone, r.reset), (1, 0, true));
        // Stored before identities were: a position past the end means the
        // numbering restarted.
        let r = resume(3000, None, "new", 1, 200);
        assert_eq!((r.start, r.gone, r.reset), (1, 0, true));
        // The new stream already lost its head (max age).
        let r = resume(3000, Some("old"), "new", 51, 800);
        assert_eq!((r.start, r.gone, r.reset), (51, 50, true));
    }

    #[test]
    fn a_purged_stream_resumes_at_its_first_message_and_counts_the_gap() {
        let r = resume(100, Some("a"), "a", 151, 250);
        assert_eq!((r.start, r.gone, r.reset), (151, 50, false));
        // Purged with nothing after: first = last + 1.
        let r = resume(100, Some("a"), "a", 151, 150);
        assert_eq!((r.start, r.gone, r.reset), (151, 50, false));
    }
}
