//! One active bridge per name: before it reads or acknowledges anything, a
//! bridge takes its name's lease in the database (`consumer_lease` for egress,
//! `ingress_lease` for ingress: a session-level lock the server releases when the
//! session ends). While another instance holds it, this one waits as a hot
//! standby, connected, asking again every [`STANDBY_POLL`]; when the active one's
//! session ends (it stopped, crashed, or its connection broke) the standby takes
//! over within that interval. The extension refuses acknowledgements from any
//! other session while the lease is held (55006), so even an instance that did not
//! wait cannot move the positions the active one relies on.

use crate::db::Db;
use crate::metrics::Metrics;
use crate::retry::DbFailure;
use std::time::Duration;
use tokio::sync::watch;

/// How often a standby asks for the lease again.
pub const STANDBY_POLL: Duration = Duration::from_millis(250);

/// What the lease is for.
pub enum Lease<'a> {
    Egress { consumer: &'a str },
    Ingress { consumer: &'a str, stream: &'a str },
}

impl Lease<'_> {
    fn describe(&self) -> String {
        match self {
            Lease::Egress { consumer } => format!("consumer {consumer:?}"),
            Lease::Ingress { consumer, stream } => {
                format!("ingress consumer {consumer:?} on stream {stream:?}")
            }
        }
    }

    async fn take(&self, db: &Db) -> Result<(bool, Option<i32>), DbFailure> {
        let row = match self {
            Lease::Egress { consumer } => {
                db.client
                    .query_one(
                        "SELECT acquired, holder_pid FROM envelopes.consumer_lease($1)",
                        &[consumer],
                    )
                    .await?
            }
            Lease::Ingress { consumer, stream } => {
                db.client
                    .query_one(
                        "SELECT acquired, holder_pid FROM envelopes.ingress_lease($1, $2)",
                        &[consumer, stream],
                    )
                    .await?
            }
        };
        Ok((row.get(0), row.get(1)))
    }
}

/// Waits until this session holds the lease. `Ok(true)` when it does, `Ok(false)`
/// when shutdown was asked for meanwhile.
pub async fn acquire(
    db: &Db,
    lease: Lease<'_>,
    metrics: &Metrics,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, DbFailure> {
    let mut waiting_since: Option<std::time::Instant> = None;
    loop {
        let (acquired, holder) = lease.take(db).await?;
        if acquired {
            metrics.active.set(1);
            match waiting_since {
                Some(since) => tracing::info!(lease = %lease.describe(),
                                              waited_ms = since.elapsed().as_millis() as u64,
                                              "the active instance is gone: this one takes over"),
                None => tracing::info!(lease = %lease.describe(), "active (holding the lease)"),
            }
            return Ok(true);
        }
        metrics.active.set(0);
        if waiting_since.is_none() {
            waiting_since = Some(std::time::Instant::now());
            tracing::info!(lease = %lease.describe(), holder_backend_pid = holder.unwrap_or(0),
                           "another instance is active under this name: standing by until it stops");
        }
        if crate::shutdown::sleep(STANDBY_POLL, shutdown).await {
            return Ok(false);
        }
    }
}
