//! TLS for the Postgres connection, chosen by the URL's sslmode. Without TLS
//! support compiled in, `sslmode=require` and stricter modes are refused rather
//! than silently connecting in the clear.

use tokio_postgres::config::SslMode;
use tokio_postgres::Config;

/// The connector to use, or `None` for a plain connection.
pub fn connector(config: &Config) -> Result<Option<tokio_postgres::NoTls>, String> {
    match config.get_ssl_mode() {
        SslMode::Disable | SslMode::Prefer => Ok(None),
        _ => Err("sslmode=require needs a TLS-enabled build of envelopes-bridge".into()),
    }
}
