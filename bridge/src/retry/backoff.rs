//! How long to wait before the next attempt: exponential backoff between the
//! bounds below, each delay jittered, and the schedule of a refused row.
//!
//! Bounds: a failing round waits [`FIRST_DELAY`] (100 ms) at first, twice as
//! long after each further failure, at most [`LONGEST_DELAY`] (5 s); a failure
//! that waiting will not cure (see [`super::classify::Class::Permanent`]) waits the
//! longest delay at once. A row its bus refused is tried again after
//! [`FIRST_REFUSAL_DELAY`] (250 ms), doubling up to [`LONGEST_REFUSAL_DELAY`]
//! (5 s). Jitter: every delay actually slept is the nominal one scaled by a
//! random factor in [0.8, 1.2) ([`jittered`]), so bridges (or rows) that failed
//! together do not all try again at the same instant; the sleeps therefore lie
//! between 80 ms and 6 s. The nominal delay is what logs report as
//! `retry_in_ms`.

use std::time::Duration;
use tokio::sync::watch;

/// The first delay.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay, also the pace at which permanent errors are retried.
pub const LONGEST_DELAY: Duration = Duration::from_secs(5);

/// The first delay before the bridge tries a row its bus refused once more (the
/// row is set aside meanwhile: nothing else waits for it).
pub const FIRST_REFUSAL_DELAY: Duration = Duration::from_millis(250);
/// The longest delay between two attempts of a refused row.
pub const LONGEST_REFUSAL_DELAY: Duration = Duration::from_secs(5);

/// How long after its `attempts`-th refusal (1 for the first) a refused row is
/// tried again: 250 ms doubling up to 5 s, with jitter.
pub fn refusal_delay(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    jittered((FIRST_REFUSAL_DELAY * 2u32.pow(doublings)).min(LONGEST_REFUSAL_DELAY))
}

/// `delay` scaled by a random factor in [0.8, 1.2), so that bridges (or rows)
/// that failed together do not all try again at the same instant.
pub fn jittered(delay: Duration) -> Duration {
    delay.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// Exponential backoff between retries: 100 ms doubling up to 5 s, each sleep
/// jittered by ±20% ([`jittered`]). It goes back
/// to the first delay only when the caller says an attempt *succeeded*
/// ([`Backoff::reset`]), not when a connection merely opened: a bridge whose
/// every session fails right after connecting keeps backing off.
#[derive(Default)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff::default()
    }

    pub fn reset(&mut self) {
        self.next = Duration::ZERO;
    }

    /// The next delay (nominal: [`Backoff::wait_at_least`] sleeps it jittered).
    pub fn peek(&self) -> Duration {
        self.next.max(FIRST_DELAY)
    }

    /// Sleeps for the next delay, or for `floor` if that is longer (a bus's own
    /// `Retry-After`); returns true if shutdown was requested meanwhile.
    pub async fn wait_at_least(
        &mut self,
        floor: Duration,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        let delay = jittered(self.peek()).max(floor);
        self.next = (self.peek() * 2).min(LONGEST_DELAY);
        crate::shutdown::sleep(delay, shutdown).await
    }

    /// Sleeps the longest delay (and stays there); for permanent errors.
    pub async fn wait_longest(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        self.next = LONGEST_DELAY;
        crate::shutdown::sleep(jittered(LONGEST_DELAY), shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backoff_grows_and_only_a_success_resets_it() {
        let (_tx, mut rx) = watch::channel(false);
        let mut b = Backoff::new();
        assert_eq!(b.peek(), FIRST_DELAY);
        b.wait_at_least(Duration::ZERO, &mut rx).await;
        b.wait_at_least(Duration::ZERO, &mut rx).await;
        assert_eq!(b.peek(), FIRST_DELAY * 4);
        b.reset();
        assert_eq!(b.peek(), FIRST_DELAY);
        b.next = LONGEST_DELAY;
        assert_eq!(b.peek(), LONGEST_DELAY);
    }

    #[test]
    fn refused_rows_are_tried_again_soon_and_then_at_most_every_five_seconds() {
        for _ in 0..100 {
            let first = refusal_delay(1);
            assert!(first >= Duration::from_millis(200) && first < Duration::from_millis(300));
            let third = refusal_delay(3);
            assert!(third >= Duration::from_millis(800) && third < Duration::from_millis(1200));
            assert!(refusal_delay(50) < Duration::from_secs(6));
            assert!(refusal_delay(u32::MAX) < Duration::from_secs(6));
        }
    }
}
