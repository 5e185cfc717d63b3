//! HTTP webhooks: one POST per batch to the sink's URL, the body a JSON array of
//! the messages (as the JSONL sink writes them) or, with `--webhook-format cbor`, a
//! CBOR array of them (as the buses carry them, each with its dedup id as `id`
//! beside the other fields). Headers:
//!
//! - `Idempotency-Key: FIRST..LAST`, the dedup ids of the batch's first and last
//!   message (a receiver that stored that batch can answer 2xx again);
//! - `X-Envelopes-Signature: sha256=HEX`, an HMAC-SHA256 of the body with the
//!   secret of `--webhook-secret` (or `ENVELOPES_WEBHOOK_SECRET`), when one is set.
//!
//! A 2xx answer to the POST itself acknowledges the batch. Redirects that keep
//! the method and the body (307, 308) are followed, up to [`MAX_REDIRECTS`]
//! hops, each logged; a 301, 302 or 303 is not: a client that follows one turns
//! the POST into a GET without the body, whose 2xx would acknowledge rows the
//! receiver never saw. Such an answer is a permanent error naming its `Location`
//! (point the bridge at that URL instead).
//!
//! A 413 (the body is over the receiver's limit) refuses the request as too
//! large: the batch is sent again in halves, and a single row still refused is
//! set aside as a dead letter. After one, bodies at least that large are refused
//! so without sending them for a minute, then asked about again (a receiver
//! whose limit was raised meanwhile takes them). A 429, a 5xx, a timeout or a failed connection is
//! the receiver being unavailable: the batch is sent again with backoff, no
//! sooner than a `Retry-After` the answer gave. Any other status is a permanent
//! error (the request itself is wrong for this receiver): logged with the status
//! and the start of the body, and retried at the longest backoff until someone
//! fixes it; nothing is skipped.

use super::error::SinkError;
use super::memory::SizeLimit;
use crate::message::Message;
use clap::Args;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

/// The webhook sink's own options.
#[derive(Args)]
#[command(next_help_heading = "Webhook sink")]
pub struct WebhookArgs {
    /// Webhook body: a JSON array of the messages, or a CBOR array.
    #[arg(
        long,
        env = "ENVELOPES_WEBHOOK_FORMAT",
        value_enum,
        default_value = "json"
    )]
    pub webhook_format: WebhookFormat,
    /// Key of the webhook's X-Envelopes-Signature header (HMAC-SHA256 of the body).
    #[arg(long, env = "ENVELOPES_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Webhook request timeout, in milliseconds.
    #[arg(long, env = "ENVELOPES_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    pub webhook_timeout_ms: u64,
}

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

/// Redirects (307/308) followed for one request.
pub const MAX_REDIRECTS: usize = 5;

/// Follows only the redirects that keep the method and the body.
fn redirect_policy() -> reqwest::redirect::Policy {
    use reqwest::StatusCode;
    reqwest::redirect::Policy::custom(|attempt| match attempt.status() {
        StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => {
            // previous(): the first URL and every one redirected from since.
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                tracing::info!(status = attempt.status().as_u16(),
                               to = %crate::redact::url(attempt.url().as_str()),
                               "webhook redirects the POST; following it");
                attempt.follow()
            }
        }
        // 301/302/303 would make the POST a GET without its body: hand the answer
        // back, where it is reported as a permanent error.
        _ => attempt.stop(),
    })
}

pub struct Webhook {
    client: reqwest::Client,
    url: String,
    format: WebhookFormat,
    secret: Option<Vec<u8>>,
    /// How long a connection may take (`--webhook-timeout-ms`).
    connect_timeout: Duration,
    /// The smallest body the receiver answered 413: bodies at least that large
    /// are refused as too large without sending them, for a while (see
    /// [`super::memory`]).
    refused_body: SizeLimit,
}

impl Webhook {
    pub fn new(url: &str, args: &WebhookArgs) -> Result<Webhook, SinkError> {
        let timeout = Duration::from_millis(args.webhook_timeout_ms);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(redirect_policy())
            .build()
            .map_err(|e| SinkError::new(SINK, e))?;
        Ok(Webhook {
            client,
            url: url.to_owned(),
            format: args.webhook_format,
            secret: args.webhook_secret.as_ref().map(|s| s.as_bytes().to_vec()),
            connect_timeout: timeout,
            refused_body: SizeLimit::default(),
        })
    }

    /// Whether the receiver still answers, asked without sending a row: a TCP
    /// connection to the URL's host and port, closed at once (no request is
    /// made, so a receiver sees nothing). Behind a proxy (`HTTPS_PROXY`,
    /// `HTTP_PROXY`, `ALL_PROXY` in the environment) the receiver cannot be
    /// reached that way, and only the next POST tells.
    pub async fn check(&self) -> Result<(), SinkError> {
        let proxied = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"]
            .iter()
            .any(|v| std::env::var_os(v).is_some() || std::env::var_os(v.to_lowercase()).is_some());
        if proxied {
            return Ok(());
        }
        let url = reqwest::Url::parse(&self.url).map_err(|e| SinkError::new(SINK, e))?;
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Ok(());
        };
        // An IPv6 literal comes in brackets.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let shown = crate::redact::url(&self.url);
        match tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SinkError::new(SINK, format!("connect {shown}: {e}"))),
            Err(_) => Err(SinkError::new(
                SINK,
                format!(
                    "connect {shown}: no answer within {} ms",
                    self.connect_timeout.as_millis()
                ),
            )),
        }
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
                let elements: Vec<crate::message::WithId> = batch
                    .iter()
                    .map(|message| crate::message::WithId {
                        id: message.dedup_id(),
                        message,
                    })
                    .collect();
                let mut out = Vec::new();
                ciborium::into_writer(&elements, &mut out)
                    .expect("serializing messages into memory");
                out
            }
        }
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return Ok(());
        };
        let body = self.body(batch);
        if let Some(refused) = self.refused_body.get().filter(|r| body.len() >= *r) {
            return Err(SinkError::too_large(
                SINK,
                "HTTP_413",
                format!(
                    "a body of {} bytes, no smaller than one of {refused} the receiver answered 413",
                    body.len()
                ),
            ));
        }
        let size = body.len();
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
        let response = request.body(body).send().await.map_err(|e| {
            if e.is_redirect() {
                SinkError::permanent(SINK, redacted(e))
            } else {
                SinkError::new(SINK, redacted(e))
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| {
                    response
                        .url()
                        .join(l)
                        .map(|u| crate::redact::url(u.as_str()))
                        .unwrap_or_else(|_| l.to_owned())
                })
                .unwrap_or_else(|| "(none)".into());
            return Err(SinkError::permanent(
                SINK,
                format!(
                    "HTTP {status} redirect to {location}: not followed, since it would turn the \
                     POST into a GET without the batch; give the bridge that URL"
                ),
            ));
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
        if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE {
            self.refused_body.refused(size);
            Err(SinkError::too_large(SINK, "HTTP_413", message))
        } else if status.as_u16() == 429 || status.is_server_error() {
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

/// A request error with its causes (why the connection failed), without the
/// URL's credentials, if it had any.
fn redacted(e: reqwest::Error) -> String {
    crate::db::chain(&e.without_url())
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
