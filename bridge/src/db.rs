//! The bridge's Postgres session: one connection whose driver task forwards
//! NOTIFY messages to a channel. When the connection dies (server restart, a
//! terminated backend) the channel closes, which the loops take as "reconnect".

use futures_util::stream::{self, StreamExt};
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

/// Connects to `url` (a libpq URL or key=value string).
pub async fn connect(url: &str, application_name: &str) -> Result<Db, DbError> {
    let mut config: Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| DbError::Url(e.to_string()))?;
    config.application_name(application_name);
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
