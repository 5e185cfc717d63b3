//! The subject rules of the buses: where a message goes (`PREFIX.envelope.NODE`,
//! `PREFIX.outbox.SUBJECT`) and which subjects or topics a bus would refuse.

use crate::message::Message;

/// The bus subject of a message: `{prefix}.envelope.{node}` or
/// `{prefix}.outbox.{subject}`, with `sep` between parts.
pub fn subject(prefix: &str, sep: char, message: &Message) -> String {
    match message {
        Message::Envelope(e) => format!("{prefix}{sep}envelope{sep}{}", e.originator_node_id),
        Message::Outbox(o) => format!("{prefix}{sep}outbox{sep}{}", o.subject),
    }
}

/// Why a NATS server would refuse this subject in a publish: an empty token, a
/// wildcard, whitespace (the extension refuses such outbox subjects since 0.3.0;
/// older rows may still have them).
pub fn nats_subject_problem(subject: &str) -> Option<&'static str> {
    for token in subject.split('.') {
        if token.is_empty() {
            return Some("empty token");
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Some("whitespace or control character");
        }
        if token == "*" || token == ">" || token.contains(['*', '>']) {
            return Some("wildcard");
        }
    }
    None
}

/// Why an MQTT broker would refuse this topic in a publish: a wildcard or NUL.
pub fn mqtt_topic_problem(topic: &str) -> Option<&'static str> {
    if topic.contains(['+', '#']) {
        return Some("wildcard");
    }
    if topic.contains('\0') {
        return Some("NUL character");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_the_buses_refuse_are_named() {
        assert_eq!(
            nats_subject_problem("envelopes.outbox.orders.created"),
            None
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a..b"),
            Some("empty token")
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a.*"),
            Some("wildcard")
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a b"),
            Some("whitespace or control character")
        );
        assert_eq!(mqtt_topic_problem("envelopes/outbox/a.b"), None);
        assert_eq!(mqtt_topic_problem("envelopes/outbox/a/+"), Some("wildcard"));
    }
}
