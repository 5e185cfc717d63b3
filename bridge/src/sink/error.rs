//! The one error every sink's publish and connect return, sorted by what the
//! caller does about it: publish the batch again, set one message aside, send
//! the batch in halves, or stop on a refused configuration.

/// A failed publish.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The bus could not be reached or did not acknowledge in time: publish the
    /// whole batch again, not before `retry_after` if the bus named a time. When
    /// `permanent`, the bus said the request itself is wrong (an HTTP 4xx): it is
    /// retried at the longest backoff until someone fixes it.
    #[error("{sink}: {message}")]
    Unavailable {
        sink: &'static str,
        message: String,
        retry_after: Option<std::time::Duration>,
        permanent: bool,
    },
    /// The bus refuses message `index` of the batch, and would again: the
    /// messages before it were acknowledged.
    #[error("{sink} refuses message {index} of the batch ({code}): {reason}")]
    Refused {
        sink: &'static str,
        index: usize,
        /// A short code for the refusal (the bus's own where it has one).
        code: String,
        reason: String,
    },
    /// The bus refuses the bridge itself: its credentials, its virtual host, its
    /// URL. Before the bridge ever worked this ends it (exit 78); afterwards it
    /// is retried at the longest backoff.
    #[error("{sink}: {message}")]
    Config { sink: &'static str, message: String },
    /// The bus took the first `delivered` messages of the request and pushes
    /// back on the next (a publisher nack: a queue full with `reject-publish`, a
    /// message returned as unroutable): the delivered ones count and are never
    /// published again; the rest goes again after a backoff, in smaller requests
    /// that grow while the bus takes them. `overtaken` counts the later
    /// messages of the request the bus took anyway (room freed up meanwhile):
    /// they are ahead of the pushed-back one and go again in their place, the
    /// only messages published twice.
    #[error(
        "{sink} took {delivered} messages of the request and pushes back on the next: {message}"
    )]
    Backpressure {
        sink: &'static str,
        delivered: usize,
        overtaken: usize,
        message: String,
    },
    /// The broker has blocked the bridge's publishing (RabbitMQ
    /// `connection.blocked`: a memory or disk alarm) for longer than the
    /// sink's bound: nothing unconfirmed counts, and egress gives up its lease
    /// for a while so that a standby (connected to another broker node) can
    /// take over.
    #[error("{sink}: {message}")]
    Blocked { sink: &'static str, message: String },
    /// The bus refuses the batch as a whole as too large (an HTTP 413), without
    /// saying which message: nothing of it counts. The caller publishes it again
    /// in halves, down to single messages; a single message refused this way is
    /// refused for good.
    #[error("{sink} refuses the batch as too large ({code}): {reason}")]
    TooLarge {
        sink: &'static str,
        code: String,
        reason: String,
    },
}

impl SinkError {
    pub fn new(sink: &'static str, message: impl ToString) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after: None,
            permanent: false,
        }
    }

    /// Unavailable, and asking not to be tried again before `retry_after`.
    pub fn unavailable_for(
        sink: &'static str,
        message: impl ToString,
        retry_after: Option<std::time::Duration>,
    ) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after,
            permanent: false,
        }
    }

    /// The bus refuses the request as such, and will until someone changes it.
    pub fn permanent(sink: &'static str, message: impl ToString) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after: None,
            permanent: true,
        }
    }

    pub fn too_large(sink: &'static str, code: impl ToString, reason: impl ToString) -> SinkError {
        SinkError::TooLarge {
            sink,
            code: code.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn refused(
        sink: &'static str,
        index: usize,
        code: impl ToString,
        reason: impl ToString,
    ) -> SinkError {
        SinkError::Refused {
            sink,
            index,
            code: code.to_string(),
            reason: reason.to_string(),
        }
    }
}
