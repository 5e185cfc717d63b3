//! The NATS connection shared by egress (the JetStream sink) and ingress (the
//! JetStream source): authentication and connect options in one place.

use std::time::Duration;

/// How the bridge authenticates to NATS.
#[derive(Clone, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    CredsFile(std::path::PathBuf),
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

/// Connects with the given authentication, shared by egress and ingress. `url`
/// may list several servers of one cluster, comma-separated: the client starts
/// with any that answers and fails over among them (and the ones the cluster
/// announces).
pub async fn connect(url: &str, auth: &NatsAuth) -> Result<async_nats::Client, String> {
    let servers = url
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("server address {}: {e}", crate::redact::url(url)))?;
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)));
    options = match auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword(user, password) => {
            options.user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(token) => options.token(token.clone()),
        NatsAuth::CredsFile(path) => options
            .credentials_file(path)
            .await
            .map_err(|e| format!("credentials: {e}"))?,
    };
    options
        .connect(servers.as_slice())
        .await
        .map_err(|e| format!("connect {}: {e}", crate::redact::url(url)))
}
