//! MQTT 5 at QoS 1: each message carries its dedup id as the user property `id`.
//! A message counts as delivered when the broker answered its PUBLISH with a
//! PUBACK whose reason code is below 0x80 (0x00 success, 0x10 no matching
//! subscribers: accepted either way). The client's event loop runs in its own
//! task, which pairs each PUBACK with its message by packet id. After a failed
//! batch the connection is rebuilt from scratch, so late PUBACKs of an abandoned
//! attempt cannot be mistaken for the next one's.
//!
//! Refused for good, and set aside while the rest flows:
//! - a PUBACK with a reason code of 0x80 or more: 0x87 not authorized (an ACL),
//!   0x97 quota exceeded, 0x90 topic name invalid, 0x99 payload format invalid ...;
//! - 0x95 (packet too large), which mosquitto sends for a message over its
//!   `message_size_limit` although the protocol has no such PUBACK code: the
//!   client cannot parse that PUBACK and drops the connection, so the refused
//!   message is found as the first one the broker had not acknowledged; after
//!   one, messages at least that large are refused before sending, for a
//!   minute (then the broker is asked again);
//! - a topic with a wildcard, and a message larger than the maximum packet size
//!   the broker announced in its CONNACK (if it did), found before sending.

use super::error::SinkError;
use super::memory::SizeLimit;
use super::subject::mqtt_topic_problem;
use super::wire::Wire;
use crate::message::Message;
use clap::Args;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Request, StateError,
};
use rumqttc::NetworkOptions;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

const SINK: &str = "mqtt";

/// The MQTT sink's own options.
#[derive(Args)]
#[command(next_help_heading = "MQTT sink")]
pub struct MqttArgs {
    /// MQTT client id (default: envelopes-bridge-NAME).
    #[arg(long, env = "ENVELOPES_MQTT_CLIENT_ID")]
    pub mqtt_client_id: Option<String>,
}

impl MqttArgs {
    /// The client id: the one given, or one named after the consumer.
    pub fn client_id(&self, consumer: &str) -> String {
        self.mqtt_client_id
            .clone()
            .unwrap_or_else(|| format!("envelopes-bridge-{consumer}"))
    }
}

/// How long a connection attempt may take until the broker's CONNACK.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the broker may take to answer every PUBLISH of a batch.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between the event loop's attempts after a connection error.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// The keep-alive interval announced to the broker (a PINGREQ after this long
/// without traffic).
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// Requests (PUBLISHes) the client queues for its event loop.
const REQUEST_QUEUE: usize = 1000;

pub struct Mqtt {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    client_id: String,
    wire: Wire,
    session: Option<Session>,
    /// The smallest payload the broker refused as too large (0x95): larger ones
    /// are refused before sending (each 0x95 costs the connection). Learned anew
    /// with a new sink.
    refused_size: SizeLimit,
}

/// What the event loop task tells the publisher, by the message's sequence
/// number in this session.
enum Outcome {
    /// The broker answered the PUBLISH with this reason code.
    Answered {
        seq: u64,
        code: u8,
        reason: Option<String>,
    },
    /// The connection failed. `refused` is the message the broker refused with
    /// an answer the client could not parse, and that answer's code, when it can
    /// be told.
    Broken {
        error: String,
        refused: Option<(u64, u8)>,
    },
}

struct Session {
    client: AsyncClient,
    /// Whether the connection is up: set at each CONNACK, cleared when the
    /// event loop finds it broken (a closed socket, a missed keep-alive).
    connected: watch::Receiver<bool>,
    /// The broker's maximum packet size, from its CONNACK (0: none announced).
    max_packet: watch::Receiver<u32>,
    errors: watch::Receiver<Option<String>>,
    /// Sequence numbers of the messages handed to the client, in order, not yet
    /// given a packet id by the event loop.
    order: Arc<Mutex<VecDeque<u64>>>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    next_seq: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The protocol's code of a PUBACK reason.
fn code(reason: PubAckReason) -> u8 {
    match reason {
        PubAckReason::Success => 0x00,
        PubAckReason::NoMatchingSubscribers => 0x10,
        PubAckReason::UnspecifiedError => 0x80,
        PubAckReason::ImplementationSpecificError => 0x83,
        PubAckReason::NotAuthorized => 0x87,
        PubAckReason::TopicNameInvalid => 0x90,
        PubAckReason::PacketIdentifierInUse => 0x91,
        PubAckReason::QuotaExceeded => 0x97,
        PubAckReason::PayloadFormatInvalid => 0x99,
    }
}

/// A name for a refusal code, for logs and dead letters.
fn code_name(code: u8) -> &'static str {
    match code {
        0x80 => "unspecified error",
        0x83 => "implementation specific error",
        0x87 => "not authorized",
        0x90 => "topic name invalid",
        0x91 => "packet identifier in use",
        0x95 => "packet too large",
        0x97 => "quota exceeded",
        0x99 => "payload format invalid",
        _ => "refused",
    }
}

/// Runs the client's event loop: pairs packet ids with sequence numbers and
/// reports what the broker answered.
async fn drive(
    mut eventloop: EventLoop,
    order: Arc<Mutex<VecDeque<u64>>>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    connected: watch::Sender<bool>,
    max_packet: watch::Sender<u32>,
    errors: watch::Sender<Option<String>>,
) {
    let mut inflight: HashMap<u16, u64> = HashMap::new();
    let answered = |inflight: &mut HashMap<u16, u64>, ack: &rumqttc::v5::mqttbytes::v5::PubAck| {
        if let Some(seq) = inflight.remove(&ack.pkid) {
            let _ = outcomes.send(Outcome::Answered {
                seq,
                code: code(ack.reason),
                reason: ack
                    .properties
                    .as_ref()
                    .and_then(|p| p.reason_string.clone()),
            });
        }
    };
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                let max = ack.properties.and_then(|p| p.max_packet_size).unwrap_or(0);
                let _ = max_packet.send(max);
                let _ = connected.send(true);
            }
            Ok(Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) if pkid != 0 => {
                let seq = order.lock().map(|mut o| o.pop_front()).ok().flatten();
                if let Some(seq) = seq {
                    inflight.insert(pkid, seq);
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => answered(&mut inflight, &ack),
            Ok(_) => {}
            Err(e) => {
                // PUBACKs read before the failure but not yet handed out.
                let late: Vec<Event> = eventloop.state.events.drain(..).collect();
                for event in late {
                    if let Event::Incoming(Packet::PubAck(ack)) = event {
                        answered(&mut inflight, &ack);
                    }
                }
                // A PUBACK the client could not parse: mosquitto acknowledges in
                // order, so it answered the first PUBLISH still unacknowledged.
                let refused = match &e {
                    ConnectionError::MqttState(StateError::Deserialization(
                        rumqttc::v5::mqttbytes::Error::InvalidConnectReturnCode(code),
                    )) => eventloop.pending.iter().find_map(|r| match r {
                        Request::Publish(p) => inflight.get(&p.pkid).map(|seq| (*seq, *code)),
                        _ => None,
                    }),
                    _ => None,
                };
                let error = match &e {
                    ConnectionError::ConnectionRefused(code) => {
                        refused_credentials(*code).unwrap_or_else(|| e.to_string())
                    }
                    _ => e.to_string(),
                };
                let _ = connected.send(false);
                let _ = errors.send(Some(error.clone()));
                let _ = outcomes.send(Outcome::Broken { error, refused });
                inflight.clear();
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
}

/// How a refused CONNECT that names the bridge's credentials or client id is
/// reported (the bridge's configuration: exit 78 before it ever worked).
const REFUSED_CREDENTIALS: &str = "the broker refuses the bridge's credentials";

/// The message for a CONNACK refusal about the bridge's credentials or client
/// id; `None` for the others (a busy or unavailable server is an outage).
fn refused_credentials(code: rumqttc::v5::mqttbytes::v5::ConnectReturnCode) -> Option<String> {
    use rumqttc::v5::mqttbytes::v5::ConnectReturnCode as Code;
    let name = match code {
        Code::BadUserNamePassword => "bad user name or password",
        Code::NotAuthorized => "not authorized",
        Code::BadAuthenticationMethod => "bad authentication method",
        Code::Banned => "banned",
        Code::ClientIdentifierNotValid | Code::BadClientId => "client id not valid",
        _ => return None,
    };
    Some(format!("{REFUSED_CREDENTIALS} ({name})"))
}

impl Mqtt {
    /// The broker's maximum packet size from its CONNACK, if it announced one.
    pub fn max_packet_size(&self) -> Option<u64> {
        self.session
            .as_ref()
            .map(|s| *s.max_packet.borrow())
            .filter(|max| *max > 0)
            .map(u64::from)
    }

    pub async fn connect(
        host: &str,
        port: u16,
        username: Option<String>,
        password: Option<String>,
        client_id: String,
        wire: &Wire,
    ) -> Result<Mqtt, SinkError> {
        let mut mqtt = Mqtt {
            host: host.to_owned(),
            port,
            username,
            password,
            client_id,
            wire: wire.clone(),
            session: None,
            refused_size: SizeLimit::default(),
        };
        mqtt.session = Some(mqtt.open().await?);
        Ok(mqtt)
    }

    async fn open(&self) -> Result<Session, SinkError> {
        let mut options = MqttOptions::new(&self.client_id, &self.host, self.port);
        options.set_keep_alive(KEEP_ALIVE);
        // Each PUBLISH leaves at once (TCP_NODELAY): with Nagle's algorithm,
        // the client's default, a PUBLISH written while an earlier segment is
        // unacknowledged waits for that ACK, and with the broker's Receive
        // Maximum (mosquitto: 20) the next PUBLISHes of a batch are written
        // exactly then, one per PUBACK (bench/RESULTS.md, run `sinks`).
        let mut network = NetworkOptions::new();
        network.set_tcp_nodelay(true);
        network.set_connection_timeout(CONNECT_TIMEOUT.as_secs());
        options.set_network_options(network);
        if let Some(user) = &self.username {
            options.set_credentials(user.clone(), self.password.clone().unwrap_or_default());
        }
        let (client, eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
        let (outcome_tx, outcomes) = mpsc::unbounded_channel();
        let (err_tx, errors) = watch::channel(None);
        let (connected_tx, connected) = watch::channel(false);
        let (max_tx, max_packet) = watch::channel(0u32);
        let order = Arc::new(Mutex::new(VecDeque::new()));
        let task = tokio::spawn(drive(
            eventloop,
            order.clone(),
            outcome_tx,
            connected_tx,
            max_tx,
            err_tx,
        ));
        let mut session = Session {
            client,
            connected,
            max_packet,
            errors,
            order,
            outcomes,
            next_seq: 0,
            task,
        };
        let up = matches!(
            tokio::time::timeout(CONNECT_TIMEOUT, session.connected.wait_for(|c| *c)).await,
            Ok(Ok(_))
        );
        if !up {
            let why = session
                .errors
                .borrow_and_update()
                .clone()
                .unwrap_or_else(|| "no CONNACK".into());
            if why.starts_with(REFUSED_CREDENTIALS) {
                return Err(SinkError::Config {
                    sink: SINK,
                    message: format!(
                        "connect {}:{}: {why} (check the user and password in the URL, \
                         mqtt://USER:PASSWORD@HOST, and --mqtt-client-id)",
                        self.host, self.port
                    ),
                });
            }
            return Err(SinkError::new(
                SINK,
                format!("connect {}:{}: {why}", self.host, self.port),
            ));
        }
        Ok(session)
    }

    /// Whether the broker still answers, asked without sending a row: the
    /// connection is up (the event loop's keep-alive finds a silent broker
    /// within about 1.5 keep-alive intervals, a closed socket at once). A
    /// connection found down is given up (the caller connects anew, and the
    /// broker's CONNACK may then refuse the bridge: a configuration error).
    pub async fn check(&mut self) -> Result<(), SinkError> {
        let up = self.session.as_ref().is_some_and(|s| *s.connected.borrow());
        if up {
            return Ok(());
        }
        let why = self
            .session
            .take()
            .and_then(|s| s.errors.borrow().clone())
            .unwrap_or_else(|| "not connected".into());
        Err(SinkError::new(
            SINK,
            format!(
                "the connection to {}:{} is down: {why}",
                self.host, self.port
            ),
        ))
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        if self.session.is_none() {
            self.session = Some(self.open().await?);
        }
        let (result, broken) = self.publish_on_session(batch).await;
        // A refusal the broker answered (0x87 ...) or found before sending keeps
        // the connection; anything that broke it starts clean on the next attempt,
        // so that late PUBACKs of an abandoned attempt cannot count for it.
        if broken || matches!(result, Err(SinkError::Unavailable { .. })) {
            self.session = None;
        }
        result
    }

    /// Publishes on the open session; the second value says whether the
    /// connection broke meanwhile.
    async fn publish_on_session(&mut self, batch: &[Message]) -> (Result<(), SinkError>, bool) {
        let wire = self.wire.clone();
        let refused_size = self.refused_size.get();
        let Some(session) = self.session.as_mut() else {
            return (Err(SinkError::new(SINK, "not connected")), true);
        };
        let max_packet = *session.max_packet.borrow();
        let mut sizes = Vec::with_capacity(batch.len());
        let base = session.next_seq;
        let mut local = None;
        let mut sent = 0usize;
        for (index, message) in batch.iter().enumerate() {
            let topic = wire.subject('/', message);
            let payload = wire.format.encode(message);
            let id = message.dedup_id();
            if let Some(problem) = mqtt_topic_problem(&topic) {
                local = Some(SinkError::refused(
                    SINK,
                    index,
                    "TOPIC",
                    format!("{id}: topic {topic:?}: {problem}"),
                ));
                break;
            }
            // Fixed header, topic, packet id, properties: well under 64 KiB more.
            let size = payload.len() + topic.len() + id.len() + 64;
            if max_packet > 0 && size > max_packet as usize {
                local = Some(SinkError::refused(
                    SINK,
                    index,
                    "MAX_PACKET_SIZE",
                    format!(
                        "{id}: {size} bytes, over the broker's maximum packet size of {max_packet}"
                    ),
                ));
                break;
            }
            if refused_size.is_some_and(|refused| payload.len() >= refused) {
                local = Some(SinkError::refused(
                    SINK,
                    index,
                    "MQTT_0x95",
                    format!(
                        "{id}: {} bytes, no smaller than a message the broker refused as too large",
                        payload.len()
                    ),
                ));
                break;
            }
            sizes.push(payload.len());
            let properties = PublishProperties {
                user_properties: vec![("id".into(), id.clone())],
                content_type: Some(wire.format.content_type().into()),
                ..Default::default()
            };
            if let Ok(mut order) = session.order.lock() {
                order.push_back(base + index as u64);
            }
            if let Err(e) = session
                .client
                .publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties)
                .await
            {
                return (Err(SinkError::new(SINK, format!("{id}: {e}"))), true);
            }
            sent += 1;
        }
        session.next_seq = base + sent as u64;

        // Every PUBLISH sent is answered, or the connection breaks, or time runs out.
        let mut answers: HashMap<usize, (u8, Option<String>)> = HashMap::new();
        let mut broken: Option<(String, Option<(usize, u8)>)> = None;
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        while answers.len() < sent && broken.is_none() {
            match tokio::time::timeout_at(deadline, session.outcomes.recv()).await {
                Ok(Some(Outcome::Answered { seq, code, reason })) => {
                    if let Some(index) = seq.checked_sub(base).map(|i| i as usize) {
                        if index < sent {
                            answers.insert(index, (code, reason));
                        }
                    }
                }
                Ok(Some(Outcome::Broken { error, refused })) => {
                    let refused = refused.and_then(|(seq, code)| {
                        let index = seq.checked_sub(base)? as usize;
                        (index < sent).then_some((index, code))
                    });
                    broken = Some((error, refused));
                }
                Ok(None) => broken = Some(("the MQTT event loop ended".into(), None)),
                Err(_) => break,
            }
        }

        // The first refusal, of whatever kind; every message before it must have
        // been accepted for it to count as a refusal of that one message.
        let mut first_refused: Option<(usize, u8, Option<String>)> = answers
            .iter()
            .filter(|(_, (code, _))| *code >= 0x80)
            .map(|(i, (code, reason))| (*i, *code, reason.clone()))
            .min_by_key(|(i, _, _)| *i);
        if let Some((_, Some((index, code)))) = &broken {
            if first_refused.as_ref().is_none_or(|(i, _, _)| index < i) {
                first_refused = Some((*index, *code, None));
            }
        }
        let accepted_before = |end: usize| {
            (0..end).all(|i| matches!(answers.get(&i), Some((code, _)) if *code < 0x80))
        };
        if let Some((index, code, reason)) = first_refused {
            if accepted_before(index) {
                if code == 0x95 {
                    let size = sizes[index];
                    self.refused_size.refused(size);
                }
                let id = batch[index].dedup_id();
                let text = match reason {
                    Some(r) => format!("{id}: PUBACK 0x{code:02x} ({}): {r}", code_name(code)),
                    None => format!("{id}: PUBACK 0x{code:02x} ({})", code_name(code)),
                };
                let refused = SinkError::refused(SINK, index, format!("MQTT_0x{code:02X}"), text);
                return (Err(refused), broken.is_some());
            }
        }
        if let Some((error, _)) = broken {
            return (Err(SinkError::new(SINK, error)), true);
        }
        if answers.len() < sent {
            let why = session
                .errors
                .borrow()
                .clone()
                .unwrap_or_else(|| "no PUBACK in time".into());
            return (Err(SinkError::new(SINK, why)), true);
        }
        (local.map_or(Ok(()), Err), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_codes_are_the_protocol_s() {
        assert_eq!(code(PubAckReason::Success), 0);
        assert_eq!(code(PubAckReason::NoMatchingSubscribers), 0x10);
        assert_eq!(code(PubAckReason::NotAuthorized), 0x87);
        assert_eq!(code(PubAckReason::QuotaExceeded), 0x97);
        assert_eq!(code_name(0x95), "packet too large");
    }
}
