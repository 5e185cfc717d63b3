//! RabbitMQ (AMQP 0-9-1) through lapin. Publisher confirms are on; every message
//! is persistent (delivery mode 2), carries its dedup id as `message_id` and is
//! published `mandatory` to a topic exchange (declared durable if missing) with
//! the routing key `PREFIX.envelope.NODE` or `PREFIX.outbox.SUBJECT`, as NATS
//! subjects are built. The batch is delivered when the broker has confirmed every
//! message. A nack (a queue full with `overflow = reject-publish`) or a message
//! returned as unroutable (no queue bound for its key) is back-pressure: the
//! messages confirmed before it count and are not published again, the rest goes
//! again at the broker's pace ([`SinkError::Backpressure`]; egress then sends one
//! message per request for a while), never skipped. The channel is kept: every
//! confirm of the request is awaited first. After any other failure the
//! connection is rebuilt, so confirms of an abandoned attempt cannot count for
//! the next one.
//!
//! A broker under a memory or disk alarm blocks its publishers
//! (`connection.blocked`): the sink logs it at once and reports it
//! (`sink_blocked`, /readyz), the batch waits, and after `--amqp-blocked-timeout`
//! seconds it fails with [`SinkError::Blocked`], on which egress gives up its
//! lease for a few seconds so that a standby connected to another node takes
//! over.
//!
//! Refused for good, and set aside while the rest flows:
//! - a routing key or message id over AMQP's 255-byte short-string limit (an
//!   outbox subject of more than about 240 bytes under the default prefix),
//!   found before sending;
//! - a message over the broker's `max_message_size`: RabbitMQ closes the channel
//!   with 406 PRECONDITION_FAILED, naming its limit, which the sink remembers
//!   for a minute to refuse larger messages before sending them.
//!
//! A broker whose `frame_max` is below 8192 (the protocol allows 4096) cannot
//! be connected to with lapin's own negotiation, which rounds the broker's value
//! up to 8192; when a connection attempt fails and the URL sets no `frame_max`,
//! it is tried again at once asking for 4096, which every broker takes.

use super::error::SinkError;
use super::memory::SizeLimit;
use super::wire::Wire;
use crate::message::Message;
use crate::metrics::Metrics;
use clap::Args;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The RabbitMQ sink's own options.
#[derive(Args)]
#[command(next_help_heading = "RabbitMQ sink")]
pub struct AmqpArgs {
    /// AMQP topic exchange the messages are published to (declared durable if
    /// missing); the routing keys are the NATS subjects.
    #[arg(long, env = "ENVELOPES_AMQP_EXCHANGE", default_value = "envelopes")]
    pub amqp_exchange: String,
    /// Seconds a batch may wait while the broker blocks publishing (a memory or
    /// disk alarm: connection.blocked) before this instance gives up its lease
    /// for a few seconds, so that a standby connected to another broker node can
    /// take over.
    #[arg(long, env = "ENVELOPES_AMQP_BLOCKED_TIMEOUT", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub amqp_blocked_timeout: u64,
}

pub struct Amqp {
    url: String,
    exchange: ShortString,
    wire: Wire,
    session: Option<Session>,
    /// The broker's `max_message_size`, once a refusal named it (for a while:
    /// see [`super::memory`]).
    max_message_size: SizeLimit,
    /// How long a batch may wait while the broker blocks publishing.
    blocked_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// How often a batch in flight looks whether the broker blocks the connection.
const BLOCKED_CHECK: Duration = Duration::from_millis(250);

/// Whether this process asks brokers for the protocol's smallest frame size (see
/// the module documentation): set once that was what made a connection work, and
/// kept for the connections after it.
static SMALL_FRAMES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The smallest `frame_max` the protocol allows a broker to announce.
const PROTOCOL_MIN_FRAME: u32 = 4096;

/// A failed connection: the broker refusing the login (403 ACCESS_REFUSED) or
/// the virtual host (530 NOT_ALLOWED, e.g. `amqp://host:5672/` with its
/// trailing slash names the empty vhost) is the bridge's configuration; anything
/// else an outage.
fn connect_error(e: lapin::Error) -> SinkError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        if matches!(amqp.get_id(), 403 | 530) {
            return SinkError::Config {
                sink: SINK,
                message: format!(
                    "{} (check the user, password and virtual host in the URL: \
                     amqp://user:pass@host:port/%2f is the default vhost \"/\")",
                    amqp.get_message().as_str()
                ),
            };
        }
    }
    SinkError::new(SINK, e)
}

/// A failed exchange declaration: an exchange of that name with another type
/// or other arguments (406 PRECONDITION_FAILED) or a user without configure
/// permission on it (403 ACCESS_REFUSED) is the bridge's configuration;
/// anything else an outage.
fn exchange_error(exchange: &ShortString, e: lapin::Error) -> SinkError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        if matches!(amqp.get_id(), 403 | 406) {
            return SinkError::Config {
                sink: SINK,
                message: format!(
                    "exchange {}: {} (check --amqp-exchange: the bridge declares a durable \
                     topic exchange, and its user needs configure and write permission on it)",
                    exchange.as_str(),
                    amqp.get_message().as_str()
                ),
            };
        }
    }
    SinkError::new(SINK, e)
}

/// Why an attempt at a batch ended early.
enum Failed {
    Sink(SinkError),
    /// The broker named its `max_message_size` when it closed the channel; the
    /// first `confirmed` messages were confirmed, the rest not.
    Learned {
        confirmed: usize,
    },
}

impl From<SinkError> for Failed {
    fn from(e: SinkError) -> Failed {
        Failed::Sink(e)
    }
}

/// RabbitMQ's limit from its refusal: "... message size N is larger than
/// configured max size M".
fn max_size_named(text: &str) -> Option<usize> {
    let (_, rest) = text.split_once("max size ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

struct Session {
    connection: Connection,
    channel: lapin::Channel,
    /// Follows the connection's events: logs and reports `connection.blocked`
    /// and `connection.unblocked` as they come, whether or not a batch is in
    /// flight.
    events: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.events.abort();
        self.metrics.sink_blocked(None);
    }
}

/// Logs and reports the broker blocking and unblocking the connection.
fn follow_events(connection: &Connection, metrics: Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    use futures_util::StreamExt;
    let events = connection.events_listener();
    tokio::spawn(async move {
        futures_util::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                lapin::Event::ConnectionBlocked(reason) => {
                    tracing::warn!(reason = %reason,
                                   "RabbitMQ blocks the bridge's publishing (connection.blocked: \
                                    a memory or disk alarm); batches wait until it unblocks");
                    metrics.sink_blocked(Some(reason));
                }
                lapin::Event::ConnectionUnblocked => {
                    tracing::info!("RabbitMQ unblocked the connection: publishing resumes");
                    metrics.sink_blocked(None);
                }
                _ => {}
            }
        }
    })
}

const SINK: &str = "amqp";

/// How long the size probe at start may take (it waits for the broker's
/// confirm, which a blocked connection withholds).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

impl Amqp {
    /// Whether the connection to the broker is still up (no round trip: lapin
    /// tracks it with heartbeats); an idle egress asks it so that readiness
    /// means the bus works.
    pub fn check(&self) -> Result<(), SinkError> {
        match &self.session {
            Some(session) if !session.connection.status().connected() => Err(SinkError::new(
                SINK,
                "the connection to the broker is closed",
            )),
            _ => Ok(()),
        }
    }

    pub async fn connect(
        url: &str,
        args: &AmqpArgs,
        wire: &Wire,
        metrics: Arc<Metrics>,
    ) -> Result<Amqp, SinkError> {
        let exchange = ShortString::try_new(args.amqp_exchange.clone()).map_err(|_| {
            SinkError::permanent(
                SINK,
                "the exchange name is longer than AMQP's 255-byte limit",
            )
        })?;
        let mut amqp = Amqp {
            url: url.to_owned(),
            exchange,
            wire: wire.clone(),
            session: None,
            max_message_size: SizeLimit::default(),
            blocked_timeout: Duration::from_secs(args.amqp_blocked_timeout),
            metrics,
        };
        amqp.session().await?;
        Ok(amqp)
    }

    /// The open session, connecting (and declaring the exchange) when there is none.
    async fn session(&mut self) -> Result<&Session, SinkError> {
        if self.session.is_none() {
            let error = |e: lapin::Error| SinkError::new(SINK, e);
            let mut uri: AMQPUri = self
                .url
                .parse()
                .map_err(|e: String| SinkError::permanent(SINK, format!("AMQP URL: {e}")))?;
            let own_frame_max = uri.query.frame_max.is_some();
            let small_frames = SMALL_FRAMES.load(std::sync::atomic::Ordering::Relaxed);
            if small_frames && !own_frame_max {
                uri.query.frame_max = Some(PROTOCOL_MIN_FRAME);
            }
            let connection =
                match Connection::connect_uri(uri.clone(), ConnectionProperties::default()).await {
                    Ok(c) => c,
                    Err(e) if !own_frame_max && !small_frames => {
                        // Perhaps a broker whose frame_max lapin rounds up: ask for
                        // the smallest at once, and keep doing so if that works.
                        uri.query.frame_max = Some(PROTOCOL_MIN_FRAME);
                        let c = Connection::connect_uri(uri, ConnectionProperties::default())
                            .await
                            .map_err(|_| connect_error(e))?;
                        tracing::info!(
                            "the broker took the protocol's smallest frame size \
                             ({PROTOCOL_MIN_FRAME}) where lapin's own negotiation failed"
                        );
                        SMALL_FRAMES.store(true, std::sync::atomic::Ordering::Relaxed);
                        c
                    }
                    Err(e) => return Err(connect_error(e)),
                };
            let channel = connection.create_channel().await.map_err(error)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(error)?;
            channel
                .exchange_declare(
                    self.exchange.clone(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| exchange_error(&self.exchange, e))?;
            let events = follow_events(&connection, self.metrics.clone());
            self.session = Some(Session {
                connection,
                channel,
                events,
                metrics: self.metrics.clone(),
            });
        }
        Ok(self.session.as_ref().expect("set above"))
    }

    /// RabbitMQ does not announce its `max_message_size`, but names it when it
    /// refuses a larger message: asks with a probe of `size` zero bytes on a
    /// channel of its own, published to the default exchange under a routing
    /// key no queue has, not mandatory (a broker that takes it drops it at
    /// once). The broker's limit when it refuses the probe (remembered, so that
    /// larger rows are refused before sending), `None` when it takes it (its
    /// limit is at least `size`) or the probe could not tell (logged).
    pub async fn probe_max_message_size(&mut self, size: usize) -> Option<u64> {
        let result = match tokio::time::timeout(PROBE_TIMEOUT, self.probe(size)).await {
            Ok(result) => result,
            Err(_) => {
                tracing::info!(
                    "RabbitMQ did not answer the size probe within {} s: its max_message_size \
                     is not known; keep it above envelopes.max_envelope_bytes by hand",
                    PROBE_TIMEOUT.as_secs()
                );
                return None;
            }
        };
        match result {
            Ok(()) => None,
            Err(e) => {
                if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
                    if amqp.get_id() == 406 {
                        if let Some(max) = max_size_named(amqp.get_message().as_str()) {
                            self.max_message_size.named(max);
                            return Some(max as u64);
                        }
                    }
                }
                tracing::info!(error = %e,
                               "the size probe did not tell RabbitMQ's max_message_size; keep it \
                                above envelopes.max_envelope_bytes by hand");
                None
            }
        }
    }

    async fn probe(&mut self, size: usize) -> Result<(), lapin::Error> {
        let Ok(session) = self.session().await else {
            return Ok(());
        };
        let channel = session.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let key = format!(
            "envelopes-bridge.size-probe.{}.{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let body = vec![0u8; size];
        channel
            .basic_publish(
                ShortString::from(""),
                ShortString::from(key.as_str()),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default(),
            )
            .await?
            .await?;
        let _ = channel.close(200, "size probe done".into()).await;
        Ok(())
    }

    /// Publishes the batch; while the broker blocks the connection the batch
    /// waits, for at most the blocked timeout ([`SinkError::Blocked`] then).
    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let status = self.session().await?.connection.status().clone();
        let timeout = self.blocked_timeout;
        let work = self.publish_unblocked(batch);
        tokio::pin!(work);
        let mut blocked_since: Option<Instant> = None;
        let mut check = tokio::time::interval(BLOCKED_CHECK);
        loop {
            tokio::select! {
                result = &mut work => return result,
                _ = check.tick() => {
                    if !status.blocked() {
                        blocked_since = None;
                        continue;
                    }
                    let since = *blocked_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= timeout {
                        return Err(SinkError::Blocked {
                            sink: SINK,
                            message: format!(
                                "the broker has blocked publishing (connection.blocked) for more \
                                 than {} s (--amqp-blocked-timeout) with {} messages unconfirmed",
                                timeout.as_secs(),
                                batch.len()
                            ),
                        });
                    }
                }
            }
        }
    }

    async fn publish_unblocked(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        // After a 406 that named the broker's limit but failed an earlier message
        // than the oversized one (its confirm was still pending when the channel
        // closed), the rest is published again at once on a new channel, now
        // checked against the limit, so that the refusal names the right message.
        let mut from = 0;
        let result = loop {
            match self.try_publish(&batch[from..]).await {
                Ok(()) => break Ok(()),
                Err(Failed::Learned { confirmed }) if from + confirmed < batch.len() => {
                    self.close().await;
                    from += confirmed;
                }
                Err(Failed::Learned { .. }) => {
                    break Err(SinkError::new(SINK, "the broker closed the channel (406)"))
                }
                Err(Failed::Sink(SinkError::Refused {
                    sink,
                    index,
                    code,
                    reason,
                })) => {
                    break Err(SinkError::Refused {
                        sink,
                        index: from + index,
                        code,
                        reason,
                    })
                }
                Err(Failed::Sink(SinkError::Backpressure {
                    sink,
                    delivered,
                    overtaken,
                    message,
                })) => {
                    break Err(SinkError::Backpressure {
                        sink,
                        delivered: from + delivered,
                        overtaken,
                        message,
                    })
                }
                Err(Failed::Sink(e)) => break Err(e),
            }
        };
        // A refusal found before sending leaves a healthy channel, kept for the
        // next batch; any other failure starts again on a new connection.
        let healthy = self
            .session
            .as_ref()
            .is_some_and(|s| s.channel.status().connected());
        let keep = matches!(
            result,
            Err(SinkError::Refused { .. } | SinkError::Backpressure { .. })
        );
        if result.is_err() && !(healthy && keep) {
            self.close().await;
        }
        result
    }

    async fn close(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.connection.close(0, "batch failed".into()).await;
        }
    }

    async fn try_publish(&mut self, batch: &[Message]) -> Result<(), Failed> {
        let exchange = self.exchange.clone();
        let wire = self.wire.clone();
        let max_message_size = self.max_message_size.get();
        // What the broker would refuse is found before sending: the batch goes up
        // to that message, and the refusal is reported after the rest is confirmed.
        let mut local = None;
        let mut prepared = Vec::with_capacity(batch.len());
        for (index, message) in batch.iter().enumerate() {
            let id = message.dedup_id();
            let (key, whole_key) = routing_key(wire.subject('.', message));
            let payload = wire.format.encode(message);
            let refusal = if id.len() > 255 {
                Some((
                    "MESSAGE_ID_TOO_LONG",
                    format!("message id of {} bytes", id.len()),
                ))
            } else {
                max_message_size
                    .filter(|max| payload.len() > *max)
                    .map(|max| {
                        (
                            "AMQP_406",
                            format!(
                                "{} bytes, over the broker's max_message_size of {max}",
                                payload.len()
                            ),
                        )
                    })
            };
            if let Some((code, why)) = refusal {
                local = Some(SinkError::refused(
                    SINK,
                    index,
                    code,
                    format!("{id}: {why} (AMQP message ids hold 255 bytes; messages up to max_message_size)"),
                ));
                break;
            }
            let (Ok(key), Ok(id)) = (ShortString::try_new(key), ShortString::try_new(id)) else {
                unreachable!("lengths checked above");
            };
            prepared.push((message, key, id, payload, whole_key));
        }
        let content_type = wire.format.content_type();
        let session = self.session().await?;
        let error = |e: lapin::Error| SinkError::new(SINK, e);
        // Every message of the batch is handed to the connection before any is
        // awaited: lapin assigns the delivery tag and queues the frames when a
        // publish is first polled (in batch order here), and a publish's future
        // only waits for its frames to reach the socket. Awaiting them one by
        // one would cost a round trip to lapin's I/O loop per message.
        let publishes = prepared
            .iter()
            .map(|(message, key, id, payload, whole_key)| {
                let mut properties = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_message_id(id.clone())
                    .with_content_type(content_type.into())
                    .with_type(message.kind().into());
                if let Some(whole) = whole_key {
                    let mut headers = FieldTable::default();
                    headers.insert(
                        WHOLE_KEY_HEADER.into(),
                        AMQPValue::LongString(whole.as_str().into()),
                    );
                    properties = properties.with_headers(headers);
                }
                session.channel.basic_publish(
                    exchange.clone(),
                    key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    payload,
                    properties,
                )
            });
        // A publish fails at once when the channel is already closed (after the
        // broker refused an earlier message of the batch): each result is looked
        // at in batch order, so the first failure is the one that names the cause.
        let confirms = futures_util::future::join_all(publishes).await;
        // The first message the broker pushed back on (a nack, a return): the
        // ones before it count; the confirms after it are still awaited so
        // that the channel carries none of this batch into the next.
        let mut pushed_back: Option<(usize, String)> = None;
        // Messages after the pushed-back one that the broker took anyway (room
        // freed up meanwhile): they are ahead of it in the queue, and go again
        // in their place.
        let mut overtaking = 0usize;
        for (index, ((message, _, _, payload, _), confirm)) in
            prepared.iter().zip(confirms).enumerate()
        {
            if pushed_back.is_some() {
                if let Ok(confirm) = confirm {
                    if let Ok(Confirmation::Ack(None)) = confirm.await {
                        overtaking += 1;
                    }
                }
                continue;
            }
            let confirmed = match confirm {
                Ok(confirm) => confirm.await,
                Err(e) => Err(e),
            };
            let confirmation = match confirmed {
                Ok(c) => c,
                Err(e) => {
                    // 406 closes the channel: the first message it fails is the
                    // one the broker refused, when it is over the limit named.
                    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
                        if amqp.get_id() == 406 {
                            let text = amqp.get_message().as_str().to_owned();
                            let max = max_size_named(&text);
                            if let Some(max) = max {
                                self.max_message_size.named(max);
                            }
                            if max.is_none_or(|max| payload.len() > max) {
                                return Err(Failed::Sink(SinkError::refused(
                                    SINK,
                                    index,
                                    "AMQP_406",
                                    format!("{}: {text}", message.dedup_id()),
                                )));
                            }
                            if max.is_some() {
                                return Err(Failed::Learned { confirmed: index });
                            }
                        }
                    }
                    return Err(Failed::Sink(error(e)));
                }
            };
            match confirmation {
                Confirmation::Ack(None) => {}
                Confirmation::Ack(Some(returned)) => {
                    pushed_back = Some((
                        index,
                        format!(
                            "message {} returned by the broker ({} {}): no queue is bound for its routing key",
                            message.dedup_id(),
                            returned.reply_code,
                            returned.reply_text
                        ),
                    ));
                }
                Confirmation::Nack(_) => {
                    pushed_back = Some((
                        index,
                        format!(
                            "the broker nacked message {} (a queue full with overflow \
                             reject-publish, or an internal error)",
                            message.dedup_id()
                        ),
                    ));
                }
                Confirmation::NotRequested => {
                    return Err(Failed::Sink(SinkError::new(
                        SINK,
                        "publisher confirms are not on for this channel",
                    )));
                }
            }
        }
        if let Some((delivered, mut message)) = pushed_back {
            if overtaking > 0 {
                message.push_str(&format!(
                    "; {overtaking} later messages of the request were taken anyway, ahead of \
                     it: they are published again in order (duplicates under the same \
                     message_id)"
                ));
            }
            return Err(Failed::Sink(SinkError::Backpressure {
                sink: SINK,
                delivered,
                overtaken: overtaking,
                message,
            }));
        }
        local.map_or(Ok(()), |e| Err(Failed::Sink(e)))
    }
}

/// The header that carries a routing key [`routing_key`] had to shorten, whole.
pub const WHOLE_KEY_HEADER: &str = "envelopes-routing-key";

/// AMQP routing keys are short strings of at most 255 bytes; `publish()` takes
/// outbox subjects up to 255 bytes, so with the prefix a key can be longer.
/// Such a key is mapped, not refused (no broker could ever take it): its leading
/// words that fit, then `~` and 16 hex digits of the SHA-256 of the whole key.
/// A binding on the leading words (`PREFIX.outbox.orders.#`, `PREFIX.#`) still
/// routes the message, two long keys that share their leading words stay apart,
/// and the whole key travels in the [`WHOLE_KEY_HEADER`] header. Returns the key
/// to publish under, and the whole key when it was mapped.
fn routing_key(key: String) -> (String, Option<String>) {
    const MAX: usize = 255;
    if key.len() <= MAX {
        return (key, None);
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let suffix: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    // Room for ".~" and the digits; cut on a character, then back to a word.
    let mut end = MAX - 2 - suffix.len();
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    let head = &key[..end];
    let head = head.rfind('.').map_or(head, |dot| &head[..dot]);
    (format!("{head}.~{suffix}"), Some(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_routing_keys_are_mapped_onto_their_leading_words() {
        let short = "envelopes.outbox.orders.created".to_owned();
        assert_eq!(routing_key(short.clone()), (short, None));
        let exact = format!("p.{}", "a".repeat(253));
        assert_eq!(routing_key(exact.clone()).1, None);
        let long = format!("envelopes.outbox.orders.{}.x", "w".repeat(235));
        let (key, whole) = routing_key(long.clone());
        assert!(key.len() <= 255, "{}", key.len());
        assert!(key.starts_with("envelopes.outbox.orders."), "{key}");
        assert_eq!(whole.as_deref(), Some(long.as_str()));
        assert_eq!(key.split('.').next_back().map(|w| w.len()), Some(17));
        // Keys that share their first 255 bytes stay apart; the same key maps
        // the same way every time.
        let other = format!("{long}y");
        assert_ne!(routing_key(other).0, key);
        assert_eq!(routing_key(long).0, key);
        // Multi-byte characters are never cut, with or without a dot to go back to.
        let wide = "é".repeat(200);
        let (key, _) = routing_key(wide.clone());
        assert!(key.len() <= 255 && wide.starts_with(key.split(".~").next().unwrap()));
    }

    #[test]
    fn the_broker_s_limit_is_read_from_its_refusal() {
        assert_eq!(
            max_size_named(
                "PRECONDITION_FAILED - message size 1048577 is larger than configured max size 1048576"
            ),
            Some(1_048_576)
        );
        assert_eq!(
            max_size_named("PRECONDITION_FAILED - inequivalent arg"),
            None
        );
    }
}
