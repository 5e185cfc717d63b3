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

use super::{subject, SinkError, SinkOptions};
use crate::message::Message;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};

pub struct Amqp {
    url: String,
    exchange: String,
    prefix: String,
    session: Option<Session>,
}

struct Session {
    connection: Connection,
    channel: lapin::Channel,
}

const SINK: &str = "amqp";

impl Amqp {
    pub async fn connect(url: &str, options: &SinkOptions) -> Result<Amqp, SinkError> {
        let mut amqp = Amqp {
            url: url.to_owned(),
            exchange: options.amqp_exchange.clone(),
            prefix: options.subject_prefix.clone(),
            session: None,
        };
        amqp.session().await?;
        Ok(amqp)
    }

    /// The open session, connecting (and declaring the exchange) when there is none.
    async fn session(&mut self) -> Result<&Session, SinkError> {
        if self.session.is_none() {
            let error = |e: lapin::Error| SinkError::new(SINK, e);
            let connection = Connection::connect(&self.url, ConnectionProperties::default())
                .await
                .map_err(error)?;
            let channel = connection.create_channel().await.map_err(error)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(error)?;
            channel
                .exchange_declare(
                    self.exchange.as_str().into(),
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
        let result = self.try_publish(batch).await;
        if result.is_err() {
            if let Some(session) = self.session.take() {
                let _ = session.connection.close(0, "batch failed".into()).await;
            }
        }
        result
    }

    async fn try_publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let exchange = self.exchange.clone();
        let prefix = self.prefix.clone();
        let session = self.session().await?;
        let error = |e: lapin::Error| SinkError::new(SINK, e);
        // Every message of the batch is handed to the connection before any is
        // awaited: lapin assigns the delivery tag and queues the frames when a
        // publish is first polled (in batch order here), and a publish's future
        // only waits for its frames to reach the socket. Awaiting them one by
        // one would cost a round trip to lapin's I/O loop per message.
        let keys: Vec<String> = batch.iter().map(|m| subject(&prefix, '.', m)).collect();
        let payloads: Vec<Vec<u8>> = batch.iter().map(Message::to_cbor).collect();
        let publishes = batch
            .iter()
            .zip(&keys)
            .zip(&payloads)
            .map(|((message, key), payload)| {
                let properties = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_message_id(message.dedup_id().into())
                    .with_content_type("application/cbor".into())
                    .with_type(message.kind().into());
                session.channel.basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    payload,
                    properties,
                )
            });
        let confirms = futures_util::future::try_join_all(publishes)
            .await
            .map_err(error)?;
        for (message, confirm) in batch.iter().zip(confirms) {
            match confirm.await.map_err(error)? {
                Confirmation::Ack(None) => {}
                Confirmation::Ack(Some(returned)) => {
                    return Err(SinkError::new(
                        SINK,
                        format!(
                            "message {} returned by the broker ({} {}): no queue is bound for its routing key",
                            message.dedup_id(),
                            returned.reply_code,
                            returned.reply_text
                        ),
                    ));
                }
                Confirmation::Nack(_) => {
                    return Err(SinkError::new(
                        SINK,
                        format!("the broker nacked message {}", message.dedup_id()),
                    ));
                }
                Confirmation::NotRequested => {
                    return Err(SinkError::new(
                        SINK,
                        "publisher confirms are not on for this channel",
                    ));
                }
            }
        }
        Ok(())
    }
}
