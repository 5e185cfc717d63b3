//! What a bus said about the bridge's messages, remembered for a while and no
//! longer: the smallest body a receiver answered 413, the smallest message a
//! broker refused as too large, the size limit a broker named. While it is
//! remembered, a message at least that large is refused without sending it
//! (each refusal costs a request, or the connection); after [`MEMORY`] without
//! a new refusal the bus is asked again, so an operator who raised the limit
//! is heard without restarting the bridge: no cache outlives the condition.

use std::time::{Duration, Instant};

/// How long a bus' answer about a size stands for like messages.
pub const MEMORY: Duration = Duration::from_secs(60);

/// A size the bus stated or refused, with when it did.
#[derive(Default)]
pub struct SizeLimit {
    said: Option<(usize, Instant)>,
}

impl SizeLimit {
    /// The size, while it is remembered.
    pub fn get(&self) -> Option<usize> {
        self.get_at(Instant::now())
    }

    fn get_at(&self, now: Instant) -> Option<usize> {
        self.said
            .filter(|(_, at)| now.saturating_duration_since(*at) < MEMORY)
            .map(|(size, _)| size)
    }

    /// The bus refused a message of `size` as too large: the smallest such
    /// size is remembered.
    pub fn refused(&mut self, size: usize) {
        let smallest = self.get().map_or(size, |known| known.min(size));
        self.said = Some((smallest, Instant::now()));
    }

    /// The bus named its limit.
    pub fn named(&mut self, size: usize) {
        self.said = Some((size, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_refusal_is_kept_and_forgotten_after_the_memory() {
        let mut limit = SizeLimit::default();
        assert_eq!(limit.get(), None);
        limit.refused(1000);
        limit.refused(2000);
        assert_eq!(limit.get(), Some(1000));
        limit.refused(500);
        assert_eq!(limit.get(), Some(500));
        let later = Instant::now() + MEMORY + Duration::from_secs(1);
        assert_eq!(limit.get_at(later), None, "asked again after the memory");
        limit.named(4096);
        assert_eq!(limit.get(), Some(4096));
    }
}
