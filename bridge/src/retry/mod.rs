//! When and how to try again: the backoff between attempts, and which errors are
//! worth retrying at all.
//!
//! Database errors are sorted by their SQLSTATE class. Connection, transaction,
//! resource and operator classes (08, 40, 53, 55, 57) and anything without a
//! SQLSTATE (a dropped socket, a timeout) are *transient*: retried with backoff.
//! Data and privilege classes (22, 23, 42) are *permanent*: the same statement
//! will fail the same way until someone changes the data, the schema or the
//! grants. Egress retries those too, at the longest backoff, because skipping a
//! row is never an option; ingress sets the offending message aside instead
//! (see `ingress.rs`). Other classes are treated as transient.

use std::fmt;
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

    /// The delay the next [`Backoff::wait`] will sleep.
    pub fn peek(&self) -> Duration {
        self.next.max(FIRST_DELAY)
    }

    /// Sleeps for the next delay; returns true if shutdown was requested meanwhile.
    pub async fn wait(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let delay = self.peek();
        self.next = (delay * 2).min(LONGEST_DELAY);
        crate::shutdown::sleep(jittered(delay), shutdown).await
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

/// Whether an error is worth retrying as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Transient,
    Permanent,
    /// The configuration is refused: a wrong password or role, a missing
    /// database, extension or consumer. Before the bridge ever worked this ends
    /// it (exit 78); afterwards it is retried like a permanent error (the
    /// database may be restarting, or being restored).
    Config,
}

impl Class {
    /// The class of a SQLSTATE (five characters; `None` when there is none).
    pub fn of_sqlstate(code: Option<&str>) -> Class {
        match code {
            Some("3D000" | "3F000" | "42883" | "42704") => return Class::Config,
            Some(c) if c.starts_with("28") => return Class::Config,
            _ => {}
        }
        match code.map(|c| c.get(..2).unwrap_or(c)) {
            Some("22") | Some("23") | Some("42") => Class::Permanent,
            _ => Class::Transient,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Class::Transient => "transient",
            Class::Permanent | Class::Config => "permanent",
        }
    }
}

/// A configuration the servers refuse, found before the bridge ever worked:
/// the process ends (exit 78) with the cause and what to do about it.
#[derive(Debug)]
pub struct Fatal {
    pub message: String,
    pub hint: String,
}

impl Fatal {
    /// For a database failure of class [`Class::Config`].
    pub fn database(error: &DbFailure) -> Fatal {
        let hint = match error.sqlstate.as_deref() {
            Some("28P01") => "check the password in --database-url",
            Some(c) if c.starts_with("28") => {
                "check the role in --database-url: it must exist and be allowed to log in \
                 (pg_hba.conf)"
            }
            Some("3D000") => "check the database name in --database-url",
            Some("3F000" | "42883") => {
                "install the extension in that database (CREATE EXTENSION pg_envelopes) or \
                 update it (ALTER EXTENSION pg_envelopes UPDATE), and grant the bridge's role \
                 its functions (envelopes.grant_consumer / grant_writer)"
            }
            Some("42704") => "check --name, or create the consumer (see --register)",
            _ => "fix the configuration",
        };
        Fatal {
            message: error.to_string(),
            hint: hint.to_owned(),
        }
    }
}

/// A database failure with what a log line needs: the SQLSTATE and the server's
/// own message and detail, never just "db error".
#[derive(Clone, Debug)]
pub struct DbFailure {
    pub sqlstate: Option<String>,
    pub message: String,
    pub class: Class,
}

impl DbFailure {
    pub fn new(error: &tokio_postgres::Error) -> DbFailure {
        match error.as_db_error() {
            Some(db) => {
                let mut message = db.message().to_owned();
                if let Some(detail) = db.detail().filter(|d| !d.is_empty()) {
                    message.push_str(" (");
                    message.push_str(detail);
                    message.push(')');
                }
                let code = db.code().code().to_owned();
                DbFailure {
                    class: Class::of_sqlstate(Some(&code)),
                    sqlstate: Some(code),
                    message,
                }
            }
            None => DbFailure {
                sqlstate: None,
                message: crate::db::chain(error),
                class: Class::Transient,
            },
        }
    }

    /// The SQLSTATE, or "-----" when the error came from the connection itself.
    pub fn code(&self) -> &str {
        self.sqlstate.as_deref().unwrap_or("-----")
    }
}

impl fmt::Display for DbFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.sqlstate {
            Some(code) => write!(f, "SQLSTATE {code}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl From<tokio_postgres::Error> for DbFailure {
    fn from(error: tokio_postgres::Error) -> DbFailure {
        DbFailure::new(&error)
    }
}

impl From<crate::db::DbError> for DbFailure {
    fn from(error: crate::db::DbError) -> DbFailure {
        match error.postgres() {
            Some(e) => DbFailure::new(e),
            None => DbFailure {
                sqlstate: None,
                message: error.to_string(),
                class: Class::Transient,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstate_classes_sort_errors() {
        for code in [
            "08006", "40001", "40P01", "53300", "55P03", "57P01", "XX000",
        ] {
            assert_eq!(Class::of_sqlstate(Some(code)), Class::Transient, "{code}");
        }
        for code in ["22001", "22003", "23505", "42501", "42P01"] {
            assert_eq!(Class::of_sqlstate(Some(code)), Class::Permanent, "{code}");
        }
        for code in ["28P01", "28000", "3D000", "3F000", "42883", "42704"] {
            assert_eq!(Class::of_sqlstate(Some(code)), Class::Config, "{code}");
        }
        assert_eq!(Class::of_sqlstate(None), Class::Transient);
    }

    #[tokio::test]
    async fn backoff_grows_and_only_a_success_resets_it() {
        let (_tx, mut rx) = watch::channel(false);
        let mut b = Backoff::new();
        assert_eq!(b.peek(), FIRST_DELAY);
        b.wait(&mut rx).await;
        b.wait(&mut rx).await;
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
