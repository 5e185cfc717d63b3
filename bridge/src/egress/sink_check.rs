//! Reaching the sink: connecting it before a session counts as working,
//! comparing its message limit with the store's once, and asking an idle sink
//! whether it still answers.

use super::deliver::connect_failed;
use super::{EgressConfig, Failure, State};
use crate::db::Db;
use crate::retry::{Backoff, DbFailure, Driver};
use crate::sink::Sink;
use std::time::{Duration, Instant};

/// Warns once, naming both values, when the store accepts larger envelopes
/// than the sink takes (NATS' default max_payload is 1 MiB, the store's
/// envelopes.max_envelope_bytes 4 MB): such a row would be set aside as a dead
/// letter by the default setup.
pub(super) async fn compare_limits(db: &Db, sink: &mut Sink) {
    let store_max = match db
        .client
        .query_opt(
            "SELECT s.setting::bigint * CASE s.unit WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
                    WHEN '8kB' THEN 8192 ELSE 1 END
               FROM pg_catalog.pg_settings s WHERE s.name = 'envelopes.max_envelope_bytes'",
            &[],
        )
        .await
    {
        Ok(Some(row)) => row.get::<_, i64>(0),
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(error = %DbFailure::new(&e), "could not read envelopes.max_envelope_bytes");
            return;
        }
    };
    // What a message adds around the envelope: topic, ids, framing, headers.
    const FRAMING: u64 = 1024;
    let Ok(store_max) = u64::try_from(store_max) else {
        return;
    };
    if store_max == 0 {
        return;
    }
    let Some((sink_max, limit)) = sink.max_message_bytes(store_max + FRAMING).await else {
        return;
    };
    tracing::warn!(
        store_max_envelope_bytes = store_max,
        sink_max_message_bytes = sink_max,
        sink_limit = limit,
        "the store accepts envelopes up to {store_max} bytes \
                    (envelopes.max_envelope_bytes) but {limit} is {sink_max} bytes: a larger \
                    row would be set aside as a dead letter; lower envelopes.max_envelope_bytes \
                    below the sink's limit (less about 1 KB of framing) or raise the sink's"
    );
}

/// How often an idle egress asks its sink whether it still answers.
pub(super) const SINK_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Connects the sink if it is not connected, retrying as a batch would (a bus
/// that refuses the bridge before it ever worked ends it, exit 78), keeping the
/// database session alive meanwhile.
pub(super) async fn ensure_sink(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<(), Failure> {
    let mut backoff = Backoff::new();
    while state.sink.is_none() {
        if driver.stopping() {
            return Err(Failure::Shutdown);
        }
        let metrics = driver.metrics().clone();
        // Connected, and asked once (a webhook's connect makes no connection).
        let connected = match Sink::connect(&config.sink, &config.name, &metrics).await {
            Ok(mut sink) => sink.check().await.map(|()| sink),
            Err(error) => Err(error),
        };
        match connected {
            Ok(mut sink) => {
                if !state.limits_compared {
                    state.limits_compared = true;
                    compare_limits(db, &mut sink).await;
                }
                state.sink = Some(sink);
                metrics.sink_stalled.set(0);
                if state.breaker.is_none() {
                    // The bus took the bridge's credentials again; a breaker
                    // waits for a row to go through.
                    metrics.sink_refusing.set(0);
                }
            }
            Err(error) => {
                connect_failed(config, driver, error, &mut backoff).await?;
                db.heartbeat().await;
            }
        }
    }
    state.sink_checked = Some(Instant::now());
    Ok(())
}

/// Asks an idle sink whether it still answers; one that does not is connected
/// again (and /readyz says not ready meanwhile: `sink_stalled`).
pub(super) async fn recheck_sink(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<(), Failure> {
    if let Some(sink) = state.sink.as_mut() {
        match sink.check().await {
            Ok(()) => {
                state.sink_checked = Some(Instant::now());
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(error = %error, "the sink does not answer while idle; connecting again");
                driver.metrics().sink_stalled.set(1);
                driver.metrics().failed(&error);
                state.sink = None;
            }
        }
    }
    ensure_sink(config, db, state, driver).await
}
