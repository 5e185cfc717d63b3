//! The delivery driver: the one round loop every delivery runs — egress'
//! sessions and each batch it publishes, whatever the sink, and ingress'
//! sessions. A failed round is counted, logged and waited out as its class
//! says; a configuration refused before any round worked ends the bridge; a
//! round that worked starts the backoff over.
//!
//! What differs between callers is only what a failure is: each describes its
//! own in a [`Failure`] (its class, its name for /readyz, its log line, its
//! fix), as vector's sinks describe theirs in a `RetryLogic`, and the driver
//! does the rest.

use super::backoff::{Backoff, LONGEST_DELAY};
use super::classify::{Class, Fatal};
use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How the next attempt after a failure waits, for the failure's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// After the backoff's next delay (nominal, before jitter; a bus's own
    /// `Retry-After` wins when it is longer).
    Backoff(Duration),
    /// After the longest delay: waiting will not cure this, someone must fix it.
    Longest,
}

impl Wait {
    /// The delay in milliseconds, for a log line's `retry_in_ms`.
    pub fn millis(self) -> u64 {
        match self {
            Wait::Backoff(delay) => delay.as_millis() as u64,
            Wait::Longest => LONGEST_DELAY.as_millis() as u64,
        }
    }
}

/// What to do after a failed round.
#[derive(Debug)]
pub enum Next {
    /// Try again: the wait is over.
    Retry,
    /// Shutdown was asked for (before or while waiting).
    Stop,
    /// The configuration is refused and no round ever worked: end the bridge
    /// (exit 78) with the cause.
    Fatal(Fatal),
}

/// A failed round as the driver sees it: how it is retried, what it is called,
/// how it is logged and, when it ends the bridge, why.
pub trait Failure {
    /// How the round is retried (see [`Class`]).
    fn class(&self) -> Class;

    /// The earliest the next attempt may come (a bus's own `Retry-After`).
    fn not_before(&self) -> Duration {
        Duration::ZERO
    }

    /// What failed, as /readyz reports it until a round works again.
    fn what(&self) -> String;

    /// Whether it counts in `errors_total`, under its class' label (database
    /// errors, and every failed round of ingress); every failure counts in
    /// `retried_total`.
    fn counts_as_error(&self) -> bool {
        false
    }

    /// Logs the failure, saying how the next attempt waits.
    fn log(&self, wait: Wait);

    /// The cause and the fix, when a [`Class::Config`] failure ends the bridge.
    fn fatal(&self) -> Fatal {
        Fatal::new(self.what(), "fix the configuration")
    }
}

/// The driver of one bridge process: its metrics, its shutdown signal, the
/// backoff between its sessions, and whether any round ever worked.
pub struct Driver {
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    /// Between sessions ([`Driver::run`]); the batches of a session that
    /// publish through [`Driver::failed`] bring their own.
    backoff: Backoff,
    worked: bool,
}

impl Driver {
    pub fn new(metrics: Arc<Metrics>, shutdown: watch::Receiver<bool>) -> Driver {
        Driver {
            metrics,
            shutdown,
            backoff: Backoff::new(),
            worked: false,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The shutdown signal, for the waits of the rounds themselves.
    pub fn shutdown(&mut self) -> &mut watch::Receiver<bool> {
        &mut self.shutdown
    }

    /// Whether shutdown was asked for.
    pub fn stopping(&self) -> bool {
        crate::shutdown::is_requested(&self.shutdown)
    }

    /// A whole round worked: /readyz says so, a refused configuration no longer
    /// ends the bridge, and the next failure starts backing off anew.
    pub fn worked(&mut self) {
        self.backoff.reset();
        self.worked = true;
        self.metrics.worked();
    }

    /// The round loop: runs `session` again and again until shutdown. A session
    /// that ends by itself (`Ok`) is started again at once; one that fails is
    /// started again after the wait its failure calls for ([`Driver::failed`]).
    /// Ends with the cause when a configuration is refused before any round
    /// worked.
    pub async fn run<F: Failure>(
        &mut self,
        mut session: impl AsyncFnMut(&mut Driver) -> Result<(), F>,
    ) -> Result<(), Fatal> {
        while !self.stopping() {
            if let Err(failure) = session(self).await {
                let mut backoff = std::mem::take(&mut self.backoff);
                let next = self.failed(&failure, &mut backoff).await;
                self.backoff = backoff;
                match next {
                    Next::Retry => {}
                    Next::Stop => break,
                    Next::Fatal(fatal) => return Err(fatal),
                }
            }
        }
        Ok(())
    }

    /// One failed attempt: counts it (`retried_total`, /readyz, and
    /// `errors_total` when it [counts as an error](Failure::counts_as_error)),
    /// then, by its class: ends the bridge if it is a configuration refused
    /// before any round worked; logs it and sleeps the backoff's next delay
    /// (jittered, no shorter than [`Failure::not_before`]) if it is transient;
    /// logs it and sleeps the longest delay otherwise. Nothing is counted or
    /// logged once shutdown was asked for.
    pub async fn failed(&mut self, failure: &impl Failure, backoff: &mut Backoff) -> Next {
        if self.stopping() {
            return Next::Stop;
        }
        self.metrics.failed(failure.what());
        if failure.counts_as_error() {
            self.metrics.error(failure.class().label());
        }
        let stop = match failure.class() {
            Class::Config if !self.worked => return Next::Fatal(failure.fatal()),
            Class::Transient => {
                failure.log(Wait::Backoff(backoff.peek()));
                backoff
                    .wait_at_least(failure.not_before(), &mut self.shutdown)
                    .await
            }
            Class::Permanent | Class::Config => {
                failure.log(Wait::Longest);
                backoff.wait_longest(&mut self.shutdown).await
            }
        };
        if stop {
            Next::Stop
        } else {
            Next::Retry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Test {
        class: Class,
        logged: Mutex<Vec<Wait>>,
    }

    impl Failure for Test {
        fn class(&self) -> Class {
            self.class
        }
        fn what(&self) -> String {
            "test".into()
        }
        fn counts_as_error(&self) -> bool {
            true
        }
        fn log(&self, wait: Wait) {
            self.logged.lock().unwrap().push(wait);
        }
    }

    fn failure(class: Class) -> Test {
        Test {
            class,
            logged: Mutex::new(Vec::new()),
        }
    }

    #[tokio::test]
    async fn a_refused_configuration_ends_the_bridge_only_before_a_round_worked() {
        let (_tx, rx) = watch::channel(false);
        let mut driver = Driver::new(Arc::new(Metrics::new(30)), rx);
        let mut backoff = Backoff::new();
        let config = failure(Class::Config);
        assert!(matches!(
            driver.failed(&config, &mut backoff).await,
            Next::Fatal(_)
        ));
        assert!(config.logged.lock().unwrap().is_empty());
        let transient = failure(Class::Transient);
        assert!(matches!(
            driver.failed(&transient, &mut backoff).await,
            Next::Retry
        ));
        assert_eq!(
            *transient.logged.lock().unwrap(),
            [Wait::Backoff(crate::retry::FIRST_DELAY)]
        );
        assert_eq!(backoff.peek(), crate::retry::FIRST_DELAY * 2);
        driver.worked();
        tokio::time::pause();
        assert!(matches!(
            driver.failed(&config, &mut backoff).await,
            Next::Retry
        ));
        assert_eq!(*config.logged.lock().unwrap(), [Wait::Longest]);
        assert_eq!(backoff.peek(), LONGEST_DELAY);
        let text = driver.metrics().render();
        assert!(text.contains("envelopes_bridge_retried_total 3"), "{text}");
    }

    #[tokio::test]
    async fn shutdown_stops_the_loop_without_counting() {
        let (tx, rx) = watch::channel(false);
        let mut driver = Driver::new(Arc::new(Metrics::new(30)), rx);
        tx.send(true).unwrap();
        let mut rounds = 0;
        let result = driver
            .run(async |_| {
                rounds += 1;
                Err(failure(Class::Transient))
            })
            .await;
        assert!(result.is_ok());
        assert_eq!(rounds, 0);
        let text = driver.metrics().render();
        assert!(text.contains("envelopes_bridge_retried_total 0"), "{text}");
    }
}
