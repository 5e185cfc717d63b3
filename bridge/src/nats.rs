//! The NATS connection shared by egress (the JetStream sink), ingress (the
//! JetStream source) and `watch`: its authentication options and its connect in
//! one place.

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// How long connecting to a NATS server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request (a JetStream API call, a publish's acknowledgement) may
/// wait for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args)]
#[command(next_help_heading = "NATS authentication")]
pub struct NatsAuthArgs {
    /// NATS user (with --nats-password).
    #[arg(long, env = "ENVELOPES_NATS_USER")]
    pub nats_user: Option<String>,
    /// NATS password.
    #[arg(long, env = "ENVELOPES_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// NATS token.
    #[arg(long, env = "ENVELOPES_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "ENVELOPES_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
}

impl NatsAuthArgs {
    pub fn auth(&self) -> NatsAuth {
        if let Some(path) = &self.nats_creds {
            NatsAuth::CredsFile(path.clone())
        } else if let Some(token) = &self.nats_token {
            NatsAuth::Token(token.clone())
        } else if let Some(user) = &self.nats_user {
            NatsAuth::UserPassword(user.clone(), self.nats_password.clone().unwrap_or_default())
        } else {
            NatsAuth::None
        }
    }
}

/// How the bridge authenticates to NATS.
#[derive(Clone, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    CredsFile(PathBuf),
}

impl std::fmt::Debug for NatsAuth {
    /// Names the method, never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsAuth::None => write!(f, "none"),
            NatsAuth::UserPassword(user, _) => write!(f, "user {user}"),
            NatsAuth::Token(_) => write!(f, "token"),
            NatsAuth::CredsFile(path) => write!(f, "creds file {}", path.display()),
        }
    }
}

/// Subjects the server refused a publish to (`-ERR 'Permissions Violation for
/// Publish to "SUBJECT"'`), as the client's event callback reports them, each
/// with when. The server says so only in that asynchronous error: the publish
/// itself gets no acknowledgement and would wait for its timeout. A refusal
/// stands for [`VIOLATION_MEMORY`]; after that the server is asked again, so a
/// permission granted meanwhile is heard (a row set aside for it and retried
/// goes through).
#[derive(Default)]
pub struct Violations {
    subjects: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    reported: tokio::sync::Notify,
}

/// How long a permissions violation stands for its subject.
pub const VIOLATION_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

impl Violations {
    /// Whether a publish to `subject` was refused for permissions lately.
    pub fn contains(&self, subject: &str) -> bool {
        self.subjects
            .lock()
            .map(|s| {
                s.get(subject)
                    .is_some_and(|at| at.elapsed() < VIOLATION_MEMORY)
            })
            .unwrap_or(false)
    }

    /// Waits until a publish to `subject` is reported refused.
    pub async fn refused(&self, subject: &str) {
        loop {
            let reported = self.reported.notified();
            tokio::pin!(reported);
            reported.as_mut().enable();
            if self.contains(subject) {
                return;
            }
            reported.await;
        }
    }

    fn record(&self, error: &str) {
        // Permissions Violation for Publish to "SUBJECT"
        let Some(rest) = error.split("Permissions Violation for Publish to").nth(1) else {
            return;
        };
        let subject = rest.trim().trim_matches(|c| c == '"' || c == '\'').trim();
        if let Ok(mut subjects) = self.subjects.lock() {
            subjects.retain(|_, at| at.elapsed() < VIOLATION_MEMORY);
            subjects.insert(subject.to_owned(), std::time::Instant::now());
        }
        self.reported.notify_waiters();
    }
}

/// Connects with the given authentication, shared by egress and ingress. `url`
/// may list several servers of one cluster, comma-separated: the client starts
/// with any that answers and fails over among them (and the ones the cluster
/// announces).
pub async fn connect(url: &str, auth: &NatsAuth) -> Result<async_nats::Client, ConnectFailure> {
    connect_watching(url, auth, None).await
}

/// Why a connection to NATS failed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConnectFailure {
    /// The server refused the bridge's credentials (authorization violation,
    /// authentication failed): waiting does not help.
    pub refused: bool,
    pub message: String,
}

impl ConnectFailure {
    fn other(message: String) -> ConnectFailure {
        ConnectFailure {
            refused: false,
            message,
        }
    }
}

/// The same, recording the subjects the server refuses publishes to.
pub async fn connect_watching(
    url: &str,
    auth: &NatsAuth,
    violations: Option<std::sync::Arc<Violations>>,
) -> Result<async_nats::Client, ConnectFailure> {
    let servers = url
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ConnectFailure::other(format!("server address {}: {e}", crate::redact::url(url)))
        })?;
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(CONNECT_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .event_callback(move |event| {
            let violations = violations.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::Other(error)) => {
                        tracing::debug!(%error, "NATS server error");
                        if let Some(v) = violations {
                            v.record(&error);
                        }
                    }
                    other => tracing::debug!(event = %other, "NATS connection event"),
                }
            }
        });
    options = match auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword(user, password) => {
            options.user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(token) => options.token(token.clone()),
        NatsAuth::CredsFile(path) => {
            options
                .credentials_file(path)
                .await
                .map_err(|e| ConnectFailure {
                    refused: true,
                    message: format!("credentials file: {e}"),
                })?
        }
    };
    options
        .connect(servers.as_slice())
        .await
        .map_err(|e| ConnectFailure {
            refused: matches!(
                e.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::Authentication
            ),
            message: format!("connect {}: {e}", crate::redact::url(url)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_violations_name_the_subject() {
        let v = Violations::default();
        v.record("Permissions Violation for Publish to \"env.outbox.denied\"");
        v.record("Authorization Violation");
        assert!(v.contains("env.outbox.denied"));
        assert!(!v.contains("env.outbox.other"));
    }
}
