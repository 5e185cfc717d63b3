//! MQTT 5 at QoS 1: each message carries its dedup id as the user property `id`;
//! the batch counts as delivered when the broker has sent a PUBACK for each. The
//! client's event loop runs in its own task and counts PUBACKs. After a failed
//! batch the connection is rebuilt from scratch, so late PUBACKs of an abandoned
//! attempt cannot be mistaken for the next one's.
//!
//! Refused for good: a topic with a wildcard, and a message larger than the
//! maximum packet size the broker announced in its CONNACK (if it did).

use super::{mqtt_topic_problem, subject, SinkError, SinkOptions};
use crate::message::Message;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::time::Duration;
use tokio::sync::watch;

pub struct Mqtt {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    client_id: String,
    prefix: String,
    session: Option<Session>,
}

struct Session {
    client: AsyncClient,
    /// The broker's maximum packet size, from its CONNACK (0: none announced).
    max_packet: watch::Receiver<u32>,
    acks: watch::Receiver<u64>,
    errors: watch::Receiver<Option<String>>,
    sent: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mqtt {
    pub async fn connect(
        host: &str,
        port: u16,
        username: Option<String>,
        password: Option<String>,
        options: &SinkOptions,
    ) -> Result<Mqtt, SinkError> {
        let mut mqtt = Mqtt {
            host: host.to_owned(),
            port,
            username,
            password,
            client_id: options.mqtt_client_id.clone(),
            prefix: options.subject_prefix.clone(),
            session: None,
        };
        mqtt.session = Some(mqtt.open().await?);
        Ok(mqtt)
    }

    async fn open(&self) -> Result<Session, SinkError> {
        let mut options = MqttOptions::new(&self.client_id, &self.host, self.port);
        options.set_keep_alive(Duration::from_secs(10));
        if let Some(user) = &self.username {
            options.set_credentials(user.clone(), self.password.clone().unwrap_or_default());
        }
        let (client, mut eventloop) = AsyncClient::new(options, 1000);
        let (ack_tx, acks) = watch::channel(0u64);
        let (err_tx, errors) = watch::channel(None);
        let (connected_tx, mut connected) = watch::channel(false);
        let (max_tx, max_packet) = watch::channel(0u32);
        let task = tokio::spawn(async move {
            let mut count = 0u64;
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        let max = ack.properties.and_then(|p| p.max_packet_size).unwrap_or(0);
                        let _ = max_tx.send(max);
                        let _ = connected_tx.send(true);
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        count += 1;
                        let _ = ack_tx.send(count);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = err_tx.send(Some(e.to_string()));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let mut session = Session {
            client,
            max_packet,
            acks,
            errors,
            sent: 0,
            task,
        };
        let up = tokio::time::timeout(Duration::from_secs(5), connected.wait_for(|c| *c)).await;
        if !matches!(up, Ok(Ok(_))) {
            let why = session
                .errors
                .borrow_and_update()
                .clone()
                .unwrap_or_else(|| "no CONNACK".into());
            return Err(SinkError::new(
                "mqtt",
                format!("connect {}:{}: {why}", self.host, self.port),
            ));
        }
        Ok(session)
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        if self.session.is_none() {
            self.session = Some(self.open().await?);
        }
        let result = self.publish_on_session(batch).await;
        if let Err(SinkError::Unavailable { .. }) = result {
            self.session = None; // start clean on the next attempt
        }
        result
    }

    async fn publish_on_session(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let prefix = self.prefix.clone();
        let session = self
            .session
            .as_mut()
            .ok_or_else(|| SinkError::new("mqtt", "not connected"))?;
        let max_packet = *session.max_packet.borrow();
        let mut refused = None;
        for (index, message) in batch.iter().enumerate() {
            let topic = subject(&prefix, '/', message);
            let payload = message.to_cbor();
            let id = message.dedup_id();
            if let Some(problem) = mqtt_topic_problem(&topic) {
                refused = Some(SinkError::refused(
                    "mqtt",
                    index,
                    "TOPIC",
                    format!("{id}: topic {topic:?}: {problem}"),
                ));
                break;
            }
            // Fixed header, topic, packet id, properties: well under 64 KiB more.
            let size = payload.len() + topic.len() + id.len() + 64;
            if max_packet > 0 && size > max_packet as usize {
                refused = Some(SinkError::refused(
                    "mqtt",
                    index,
                    "MAX_PACKET_SIZE",
                    format!(
                        "{id}: {size} bytes, over the broker's maximum packet size of {max_packet}"
                    ),
                ));
                break;
            }
            let properties = PublishProperties {
                user_properties: vec![("id".into(), id.clone())],
                ..Default::default()
            };
            session
                .client
                .publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties)
                .await
                .map_err(|e| SinkError::new("mqtt", format!("{id}: {e}")))?;
            session.sent += 1;
        }
        let target = session.sent;
        let acked = tokio::time::timeout(
            Duration::from_secs(10),
            session.acks.wait_for(|n| *n >= target),
        )
        .await;
        match acked {
            Ok(Ok(_)) => refused.map_or(Ok(()), Err),
            _ => {
                let why = session
                    .errors
                    .borrow()
                    .clone()
                    .unwrap_or_else(|| "no PUBACK in time".into());
                Err(SinkError::new("mqtt", why))
            }
        }
    }
}
