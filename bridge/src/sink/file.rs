//! The human-facing sinks: one JSON object a line, to stdout or appended to a file.
//! Written and flushed (the file also synced) before the batch counts as delivered.

use super::error::SinkError;
use crate::message::Message;
use std::path::Path;
use tokio::fs::{File, OpenOptions};
use tokio::io::AsyncWriteExt;

fn lines(batch: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in batch {
        out.extend_from_slice(m.to_json_line().as_bytes());
        out.push(b'\n');
    }
    out
}

pub struct Stdout {
    out: tokio::io::Stdout,
}

impl Stdout {
    pub fn new() -> Stdout {
        Stdout {
            out: tokio::io::stdout(),
        }
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        self.out
            .write_all(&lines(batch))
            .await
            .map_err(|e| SinkError::new("stdout", e))?;
        self.out
            .flush()
            .await
            .map_err(|e| SinkError::new("stdout", e))
    }
}

pub struct Jsonl {
    file: File,
}

impl Jsonl {
    pub async fn open(path: &Path) -> Result<Jsonl, SinkError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|e| SinkError::new("jsonl", format!("{}: {e}", path.display())))?;
        Ok(Jsonl { file })
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        self.file
            .write_all(&lines(batch))
            .await
            .map_err(|e| SinkError::new("jsonl", e))?;
        match self.file.sync_data().await {
            Ok(()) => Ok(()),
            // A file that cannot be synced (/dev/null, a pipe): written is all
            // there is.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            Err(e) => Err(SinkError::new("jsonl", e)),
        }
    }
}
