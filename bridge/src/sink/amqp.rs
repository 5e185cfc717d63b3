//! RabbitMQ (AMQP 0-9-1) through lapin. Publisher confirms are on; every message
//! is persistent (delivery mode 2), carries its dedup id as `message_id` and is
//! published `mandatory` to a topic exchange (declared durable if missing) with
//! the routing key `PREFIX.envelope.NODE` or `PREFIX.outbox.SUBJECT`, as NATS
//! subjects are built. The batch is delivered when the broker has confirmed every
//! message. A nack, or a message returned as unroutable (no queue bound for its
//! key), fails the whole batch: it is logged with the message's dedup id and
//! published again, never skipped (a binding added later lets it through; the
//! replays before carry the same `message_id`). After a failed batch the
//! connection is rebuilt, so confirms of an abandoned attempt cannot count for
//! the next one.
//!
//! Refused for good, and set aside while the rest flows:
//! - a routing key or message id over AMQP's 255-byte short-string limit (an
//!   outbox subject of more than about 240 bytes under the default prefix),
//!   found before sending;
//! - a message over the broker's `max_message_size`: RabbitMQ closes the channel
//!   with 406 PRECONDITION_FAILED, naming its limit, which the sink remembers to
//!   refuse larger messages before sending them.
//!
//! A broker whose `frame_max` is below 8192 (the protocol allows 4096) cannot
//! be connected to with lapin's own negotiation, which rounds the broker's value
//! up to 8192; when a connection attempt fails and the URL sets no `frame_max`,
//! it is tried again at once asking for 4096, which every broker takes.

use super::{subject, SinkError, SinkOptions};
use crate::message::Message;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};

pub struct Amqp {
    url: String,
    exchange: ShortString,
    prefix: String,
    format: super::PayloadFormat,
    session: Option<Session>,
    /// The broker's `max_message_size`, once a refusal named it.
    max_message_size: Option<usize>,
}

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
}

const SINK: &str = "amqp";

impl Amqp {
    pub async fn connect(url: &str, options: &SinkOptions) -> Result<Amqp, SinkError> {
        let exchange = ShortString::try_new(options.amqp_exchange.clone()).map_err(|_| {
            SinkError::permanent(
                SINK,
                "the exchange name is longer than AMQP's 255-byte limit",
            )
        })?;
        let mut amqp = Amqp {
            url: url.to_owned(),
            exchange,
            prefix: options.subject_prefix.clone(),
            format: options.format,
            session: None,
            max_message_size: None,
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
                .map_err(error)?;
            self.session = Some(Session {
                connection,
                channel,
            });
        }
        Ok(self.session.as_ref().expect("set above"))
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
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
                Err(Failed::Sink(e)) => break Err(e),
            }
        };
        // A refusal found before sending leaves a healthy channel, kept for the
        // next batch; any other failure starts again on a new connection.
        let healthy = self
            .session
            .as_ref()
            .is_some_and(|s| s.channel.status().connected());
        if result.is_err() && !(healthy && matches!(result, Err(SinkError::Refused { .. }))) {
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
        let prefix = self.prefix.clone();
        let max_message_size = self.max_message_size;
        // What the broker would refuse is found before sending: the batch goes up
        // to that message, and the refusal is reported after the rest is confirmed.
        let mut local = None;
        let mut prepared = Vec::with_capacity(batch.len());
        for (index, message) in batch.iter().enumerate() {
            let id = message.dedup_id();
            let key = subject(&prefix, '.', message);
            let payload = self.format.encode(message);
            let refusal = if key.len() > 255 {
                Some((
                    "ROUTING_KEY_TOO_LONG",
                    format!("routing key of {} bytes", key.len()),
                ))
            } else if id.len() > 255 {
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
                    format!("{id}: {why} (AMQP short strings hold 255 bytes; messages up to max_message_size)"),
                ));
                break;
            }
            let (Ok(key), Ok(id)) = (ShortString::try_new(key), ShortString::try_new(id)) else {
                unreachable!("lengths checked above");
            };
            prepared.push((message, key, id, payload));
        }
        let content_type = self.format.content_type();
        let session = self.session().await?;
        let error = |e: lapin::Error| SinkError::new(SINK, e);
        // Every message of the batch is handed to the connection before any is
        // awaited: lapin assigns the delivery tag and queues the frames when a
        // publish is first polled (in batch order here), and a publish's future
        // only waits for its frames to reach the socket. Awaiting them one by
        // one would cost a round trip to lapin's I/O loop per message.
        let publishes = prepared.iter().map(|(message, key, id, payload)| {
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(id.clone())
                .with_content_type(content_type.into())
                .with_type(message.kind().into());
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
        for (index, ((message, _, _, payload), confirm)) in
            prepared.iter().zip(confirms).enumerate()
        {
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
                                self.max_message_size = Some(max);
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
                    return Err(Failed::Sink(SinkError::new(
                        SINK,
                        format!(
                            "message {} returned by the broker ({} {}): no queue is bound for its routing key",
                            message.dedup_id(),
                            returned.reply_code,
                            returned.reply_text
                        ),
                    )));
                }
                Confirmation::Nack(_) => {
                    return Err(Failed::Sink(SinkError::new(
                        SINK,
                        format!("the broker nacked message {}", message.dedup_id()),
                    )));
                }
                Confirmation::NotRequested => {
                    return Err(Failed::Sink(SinkError::new(
                        SINK,
                        "publisher confirms are not on for this channel",
                    )));
                }
            }
        }
        local.map_or(Ok(()), |e| Err(Failed::Sink(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
