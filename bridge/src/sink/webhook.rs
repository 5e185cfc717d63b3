//! HTTP webhooks: one POST per batch to the sink's URL, the body a JSON array of
//! the messages (as the JSONL sink writes them) or, with `--webhook-format cbor`, a
//! CBOR array of them (as the buses carry them). Headers:
//!
//! - `Idempotency-Key: FIRST..LAST`, the dedup ids of the batch's first and last
//!   message (a receiver that stored that batch can answer 2xx again);
//! - `X-Envelopes-Signature: sha256=HEX`, an HMAC-SHA256 of the body with the
//!   secret of `--webhook-secret` (or `ENVELOPES_WEBHOOK_SECRET`), when one is set.
//!
//! A 2xx answer acknowledges the batch. A 429, a 5xx, a timeout or a failed
//! connection is the receiver being unavailable: the batch is sent again with
//! backoff, no sooner than a `Retry-After` the answer gave. Any other status is a
//! permanent error (the request itself is wrong for this receiver): logged with
//! the status and the start of the body, and retried at the longest backoff until
//! someone fixes it; nothing is skipped.

use super::SinkError;
use crate::message::Message;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

/// The body's encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WebhookFormat {
    Json,
    Cbor,
}

const SINK: &str = "webhook";

/// How much of an error answer's body is kept for the log.
const BODY_SHOWN: usize = 500;

/// The longest `Retry-After` honoured; a receiver asking for more is retried at
/// this pace (the bridge keeps polling its database meanwhile anyway).
const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

pub struct Webhook {
    client: reqwest::Client,
    url: String,
    format: WebhookFormat,
    secret: Option<Vec<u8>>,
}

impl Webhook {
    pub fn new(
        url: &str,
        format: WebhookFormat,
        secret: Option<&str>,
        timeout: Duration,
    ) -> Result<Webhook, SinkError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| SinkError::new(SINK, e))?;
        Ok(Webhook {
            client,
            url: url.to_owned(),
            format,
            secret: secret.map(|s| s.as_bytes().to_vec()),
        })
    }

    /// The request body for a batch.
    pub fn body(&self, batch: &[Message]) -> Vec<u8> {
        match self.format {
            WebhookFormat::Json => {
                let values: Vec<serde_json::Value> =
                    batch.iter().map(Message::to_json_value).collect();
                serde_json::to_vec(&values).expect("serializing JSON values into memory")
            }
            WebhookFormat::Cbor => {
                let mut out = Vec::new();
                ciborium::into_writer(batch, &mut out).expect("serializing messages into memory");
                out
            }
        }
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return Ok(());
        };
        let body = self.body(batch);
        let content_type = match self.format {
            WebhookFormat::Json => "application/json",
            WebhookFormat::Cbor => "application/cbor",
        };
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .header(
                "Idempotency-Key",
                format!("{}..{}", first.dedup_id(), last.dedup_id()),
            );
        if let Some(secret) = &self.secret {
            request = request.header("X-Envelopes-Signature", signature(secret, &body));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| SinkError::new(SINK, redacted(e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s).min(RETRY_AFTER_CAP));
        let text = response.text().await.unwrap_or_default();
        let shown: String = text.chars().take(BODY_SHOWN).collect();
        let message = format!("HTTP {status}: {shown}");
        if status.as_u16() == 429 || status.is_server_error() {
            Err(SinkError::unavailable_for(SINK, message, retry_after))
        } else {
            Err(SinkError::permanent(SINK, message))
        }
    }
}

/// `sha256=` and the hex HMAC-SHA256 of the body with the secret.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A request error without the URL's credentials, if it had any.
fn redacted(e: reqwest::Error) -> String {
    e.without_url().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
