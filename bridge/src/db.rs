//! The bridge's Postgres session: one connection whose driver task forwards
//! NOTIFY messages to a channel. When the connection dies (server restart, a
//! terminated backend) the channel closes, which the loops take as "reconnect".

use futures_util::stream::{self, StreamExt};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

/// A connected session and its notifications.
pub struct Db {
    pub client: Client,
    pub notifications: mpsc::UnboundedReceiver<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database URL: {0}")]
    Url(String),
    #[error("connect: {}", chain(.0))]
    Connect(tokio_postgres::Error),
    #[error("TLS: {0}")]
    Tls(String),
}

impl DbError {
    /// The server's error, when it answered with one (a wrong password, an
    /// unknown database), for its SQLSTATE.
    pub fn postgres(&self) -> Option<&tokio_postgres::Error> {
        match self {
            DbError::Connect(e) => Some(e),
            _ => None,
        }
    }
}

/// After how long of silence the server ends a session of this bridge
/// (`--session-timeout`; zero: the server's own settings).
static SESSION_TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// Sets `--session-timeout` for the sessions opened from now on.
pub fn set_session_timeout(timeout: Duration) {
    let _ = SESSION_TIMEOUT.set(timeout);
}

fn session_timeout() -> Duration {
    SESSION_TIMEOUT
        .get()
        .copied()
        .unwrap_or(DEFAULT_SESSION_TIMEOUT)
}

/// `--session-timeout`'s default.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(15);

/// How often a bridge waiting for something else than its database (a bus)
/// shows the server it is alive: a third of the session timeout.
pub fn heartbeat_interval() -> Duration {
    let timeout = session_timeout();
    if timeout.is_zero() {
        Duration::from_secs(5)
    } else {
        (timeout / 3).max(Duration::from_millis(200))
    }
}

impl Db {
    /// One trivial statement, so that the server does not take the session for
    /// silent while the bridge waits for a bus (errors surface on the next real
    /// statement).
    pub async fn heartbeat(&self) {
        let _ = self.client.simple_query("SELECT 1").await;
    }
}

/// The session settings that let the server end a silent session of this
/// bridge within the timeout, and with it free its lease: idle (a stopped
/// process), idle in a transaction, or unacknowledged on the network (a cut,
/// where keepalives alone never fire: tcp_user_timeout).
fn session_settings(timeout: Duration) -> String {
    let ms = timeout.as_millis();
    let secs = timeout.as_secs().max(1);
    let probe = (secs / 3).max(1);
    format!(
        "SET idle_session_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}; \
         SET tcp_user_timeout = {ms}; SET tcp_keepalives_idle = {probe}; \
         SET tcp_keepalives_interval = {probe}; SET tcp_keepalives_count = 3"
    )
}

/// Connects to `url` (a libpq URL or key=value string).
pub async fn connect(url: &str, application_name: &str) -> Result<Db, DbError> {
    let mut config: Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| DbError::Url(e.to_string()))?;
    config.application_name(application_name);
    let timeout = session_timeout();
    if !timeout.is_zero() {
        // This side notices a dead server as soon as the server notices us.
        let probe = (timeout / 3).max(Duration::from_secs(1));
        config
            .keepalives(true)
            .keepalives_idle(probe)
            .keepalives_interval(probe)
            .keepalives_retries(3)
            .tcp_user_timeout(timeout);
    }
    let (client, notifications) = match crate::tls::connector(&config).map_err(DbError::Tls)? {
        Some(tls) => {
            let (client, connection) = config.connect(tls).await.map_err(DbError::Connect)?;
            (client, spawn_driver(connection))
        }
        None => {
            let (client, connection) = config.connect(NoTls).await.map_err(DbError::Connect)?;
            (client, spawn_driver(connection))
        }
    };
    if !timeout.is_zero() {
        client
            .batch_execute(&session_settings(timeout))
            .await
            .map_err(DbError::Connect)?;
        // The same bound for the holder of a lease this session waits for: a
        // holder silent for longer is ended and the lease taken (an extension
        // from before envelopes.lease_timeout refuses the setting: the standby
        // then waits for the holder's session to end, as it did).
        if let Err(e) = client
            .execute(
                "SELECT pg_catalog.set_config('envelopes.lease_timeout', $1, false)",
                &[&timeout.as_millis().to_string()],
            )
            .await
        {
            tracing::debug!(error = %chain(&e), "envelopes.lease_timeout not set");
        }
    }
    Ok(Db {
        client,
        notifications,
    })
}

/// An error with its causes, `outer: inner: ...` (tokio-postgres keeps the
/// interesting part, e.g. why a TLS handshake failed, in the source).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn spawn_driver<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
) -> mpsc::UnboundedReceiver<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        break;
                    }
                }
                Ok(AsyncMessage::Notice(notice)) => tracing::debug!(%notice, "server notice"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "database connection lost");
                    break;
                }
            }
        }
        // Dropping tx closes the channel: the owner reconnects.
    });
    rx
}
