//! Which failures are worth retrying, and how: database errors by their
//! SQLSTATE class, a sink's failures by what the bus said, and the cause and
//! fix of a configuration the servers refuse.
//!
//! Database errors are sorted by their SQLSTATE class. Connection, transaction,
//! resource and operator classes (08, 40, 53, 55, 57) and anything without a
//! SQLSTATE (a dropped socket, a timeout) are *transient*: retried with backoff.
//! Data and privilege classes (22, 23, 42) are *permanent*: the same statement
//! will fail the same way until someone changes the data, the schema or the
//! grants. Egress retries those too, at the longest backoff, because skipping a
//! row is never an option; ingress sets the offending message aside instead
//! (see `ingress/`). Other classes are treated as transient. A wrong password
//! or role, a missing database, extension or consumer, and a privilege the role
//! lacks (42501: no grant, a consumer owned by another role) are *config*.

use crate::sink::SinkError;
use std::fmt;

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
            // 42501: the role may not do what the bridge needs (no grant, a
            // consumer owned by another role); the same statement fails the
            // same way until someone grants it.
            Some("3D000" | "3F000" | "42883" | "42704" | "42501") => return Class::Config,
            Some(c) if c.starts_with("28") => return Class::Config,
            _ => {}
        }
        match code.map(|c| c.get(..2).unwrap_or(c)) {
            Some("22") | Some("23") | Some("42") => Class::Permanent,
            _ => Class::Transient,
        }
    }

    /// How a sink's failure to connect is retried: a bus that refuses the
    /// bridge's configuration (credentials, virtual host) is [`Class::Config`];
    /// anything else, however the sink calls it, is the bus being unavailable.
    pub fn of_sink_connect(error: &SinkError) -> Class {
        match error {
            SinkError::Config { .. } => Class::Config,
            _ => Class::Transient,
        }
    }

    /// How a failed publish of a whole batch is retried: a request the bus
    /// refuses as such (an HTTP 4xx), or a bus that refuses the bridge after it
    /// had connected (which cannot be told from an outage this late, so it never
    /// ends the bridge), is [`Class::Permanent`]; an outage is transient. (A
    /// refusal of one message, or of the request as too large, is no failure of
    /// the batch: the caller sets the message aside, or sends the batch in
    /// halves.)
    pub fn of_sink_publish(error: &SinkError) -> Class {
        match error {
            SinkError::Unavailable {
                permanent: true, ..
            }
            | SinkError::Config { .. } => Class::Permanent,
            _ => Class::Transient,
        }
    }

    /// The `kind` label of `errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            Class::Transient => "transient",
            Class::Permanent | Class::Config => "permanent",
        }
    }
}

/// A configuration the servers refuse, found before the bridge ever worked:
/// the process ends (exit 78) with the cause and what to do about it.
#[derive(Clone, Debug)]
pub struct Fatal {
    pub message: String,
    pub hint: String,
    /// The SQLSTATE, when the database refused.
    pub sqlstate: Option<String>,
}

impl Fatal {
    pub fn new(message: impl ToString, hint: impl ToString) -> Fatal {
        Fatal {
            message: message.to_string(),
            hint: hint.to_string(),
            sqlstate: None,
        }
    }

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
            Some("42501") => {
                "grant the bridge's role what it needs: envelopes.grant_consumer(role) for \
                 egress, envelopes.grant_writer(role) for ingress; a consumer registered by \
                 another role is handed over with envelopes.consumer_set_owner(name, role)"
            }
            _ => "fix the configuration",
        };
        // For a refused privilege the extension's own hint says it best (who
        // owns the consumer, what to call), when it gave one; for the others
        // the server's hints are Postgres' generic ones ("add explicit type
        // casts") and the bridge's say more.
        let hint = match (&error.hint, error.sqlstate.as_deref()) {
            (Some(server), Some("42501")) => server.clone(),
            _ => hint.to_owned(),
        };
        Fatal {
            message: error.without_hint(),
            hint,
            sqlstate: error.sqlstate.clone(),
        }
    }
}

/// A database failure with what a log line needs: the SQLSTATE and the server's
/// own message, detail and hint, never just "db error".
#[derive(Clone, Debug)]
pub struct DbFailure {
    pub sqlstate: Option<String>,
    /// The server's message, its detail in parentheses and its hint after
    /// `; HINT: ` (what every log line of the failure shows).
    pub message: String,
    /// The server's HINT alone.
    pub hint: Option<String>,
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
                let hint = db.hint().filter(|h| !h.is_empty()).map(str::to_owned);
                if let Some(hint) = &hint {
                    message.push_str("; HINT: ");
                    message.push_str(hint);
                }
                let code = db.code().code().to_owned();
                DbFailure {
                    class: Class::of_sqlstate(Some(&code)),
                    sqlstate: Some(code),
                    message,
                    hint,
                }
            }
            None => DbFailure {
                sqlstate: None,
                message: crate::db::chain(error),
                hint: None,
                class: Class::Transient,
            },
        }
    }

    /// The failure as [`Display`](fmt::Display) shows it, without the hint.
    pub fn without_hint(&self) -> String {
        let text = self.to_string();
        match &self.hint {
            Some(hint) => text
                .strip_suffix(&format!("; HINT: {hint}"))
                .map(str::to_owned)
                .unwrap_or(text),
            None => text,
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
                hint: None,
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
        for code in ["22001", "22003", "23505", "42P01"] {
            assert_eq!(Class::of_sqlstate(Some(code)), Class::Permanent, "{code}");
        }
        for code in [
            "28P01", "28000", "3D000", "3F000", "42883", "42704", "42501",
        ] {
            assert_eq!(Class::of_sqlstate(Some(code)), Class::Config, "{code}");
        }
        assert_eq!(Class::of_sqlstate(None), Class::Transient);
    }

    #[test]
    fn sink_failures_are_sorted_by_what_the_bus_said() {
        let config = SinkError::Config {
            sink: "amqp",
            message: "ACCESS_REFUSED".into(),
        };
        let permanent = SinkError::permanent("webhook", "HTTP 400");
        let outage = SinkError::new("nats", "connection refused");
        assert_eq!(Class::of_sink_connect(&config), Class::Config);
        assert_eq!(Class::of_sink_connect(&permanent), Class::Transient);
        assert_eq!(Class::of_sink_connect(&outage), Class::Transient);
        assert_eq!(Class::of_sink_publish(&config), Class::Permanent);
        assert_eq!(Class::of_sink_publish(&permanent), Class::Permanent);
        assert_eq!(Class::of_sink_publish(&outage), Class::Transient);
    }
}
