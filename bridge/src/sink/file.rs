//! The human-facing sinks: one JSON object a line, to stdout or appended to a file.
//!
//! A batch counts as delivered only once the file durably holds all of it:
//! written with blocking calls whose every error is seen (tokio's `File` hands a
//! write to a background task and reports its error, if at all, at a later
//! call — an ENOSPC was once acknowledged that way), synced with `fdatasync`, and
//! the file's length checked against what was written. When anything fails (a
//! full disk, a quota, EIO, EFBIG) the file is cut back to the length it had
//! before the batch, so no partial line is left for a reader to take for a row,
//! and the whole batch is reported unavailable: egress keeps it, logs it, and
//! tries again with backoff until the disk takes it (the stall shows in
//! `/readyz`, `sink_stalled` and `errors_total`). A file created by the sink
//! has its directory synced too, so the file itself survives a power loss; a
//! file moved away (rotated) is noticed before the next batch and a new one is
//! created at the path. A torn last line left by a crash of an earlier run is
//! cut off when the file is opened.
//!
//! Files that are not regular (`/dev/stdout`, a pipe, a character device) cannot
//! be synced, cut back or measured: for them a write that returned is all there is.

use super::error::SinkError;
use crate::message::Message;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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

/// The JSONL file sink.
pub struct Jsonl {
    path: PathBuf,
    /// Shared with the blocking task that writes a batch.
    file: Arc<File>,
    /// Whether the file is a regular file (synced, cut back and measured).
    regular: bool,
}

impl Jsonl {
    pub async fn open(path: &Path) -> Result<Jsonl, SinkError> {
        let owned = path.to_owned();
        blocking(move || open_file(&owned))
            .await
            .map_err(|e| error(path, "opening", &e))
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        if self.regular && self.rotated() {
            tracing::info!(path = %self.path.display(),
                           "the JSONL file was moved away or replaced; writing to a new file \
                            at its path");
            *self = Jsonl::open(&self.path).await?;
        }
        let bytes = lines(batch);
        let file = self.file.clone();
        let regular = self.regular;
        blocking(move || append(&file, regular, &bytes))
            .await
            .map_err(|e| error(&self.path, "writing", &e))
    }

    /// Whether the path no longer names the open file (it was renamed or
    /// removed, e.g. by a log rotation).
    fn rotated(&self) -> bool {
        let Ok(open) = self.file.metadata() else {
            return false;
        };
        match std::fs::metadata(&self.path) {
            Ok(now) => now.dev() != open.dev() || now.ino() != open.ino(),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }
}

/// A failed file operation as a sink error: the batch is unavailable (nothing
/// of it counts) and goes again; a full disk says so and what to do.
fn error(path: &Path, doing: &str, e: &io::Error) -> SinkError {
    let hint = match e.raw_os_error() {
        Some(28) => "; nothing of the batch counts: delivery waits until space is freed",
        Some(122) => "; nothing of the batch counts: delivery waits until the quota allows it",
        _ => "; nothing of the batch counts: it is written again",
    };
    SinkError::new("jsonl", format!("{doing} {}: {e}{hint}", path.display()))
}

/// Runs blocking file work off the async threads; a task that panicked is an
/// error like any other.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| io::Error::other(format!("the file task failed: {e}")))?
}

/// Opens (creating) the file for appending. A new file's directory is synced;
/// a regular file's torn last line (a crash mid-write) is cut off.
fn open_file(path: &Path) -> io::Result<Jsonl> {
    let existed = path.exists();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(path)?;
    let regular = file.metadata()?.is_file();
    if regular {
        let len = file.metadata()?.len();
        let whole = complete_lines(&mut file, len)?;
        if whole < len {
            file.set_len(whole)?;
            file.sync_data()?;
            tracing::warn!(path = %path.display(), bytes = len - whole,
                           "the JSONL file ended in a torn line (a write cut short by a crash); \
                            cut it off: its rows are written again");
        }
        if !existed {
            sync_directory(path)?;
        }
    }
    Ok(Jsonl {
        path: path.to_owned(),
        file: Arc::new(file),
        regular,
    })
}

/// The length of the file up to and including its last newline (0 if it has none).
fn complete_lines(file: &mut File, len: u64) -> io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let part = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(part)?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Syncs the directory holding `path`, so that a file just created in it
/// survives a power loss.
fn sync_directory(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Appends `bytes` and makes them durable; on any failure a regular file is cut
/// back to its length before, so that nothing of the batch (no torn line) stays.
fn append(file: &File, regular: bool, bytes: &[u8]) -> io::Result<()> {
    let mut writer = file;
    if !regular {
        writer.write_all(bytes)?;
        return match file.sync_data() {
            // A file that cannot be synced (/dev/null, a pipe): written is all
            // there is.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
            other => other,
        };
    }
    let before = file.metadata()?.len();
    let written = writer
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .and_then(|()| {
            let after = file.metadata()?.len();
            let expected = before + bytes.len() as u64;
            if after == expected {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "the file is {after} bytes long after the write, {expected} expected \
                     (does another process write to it?)"
                )))
            }
        });
    if let Err(e) = written {
        // Cut back what part of the batch did reach the file. If even that
        // fails, the sink is opened again before the next attempt, which cuts
        // off a torn last line.
        if let Err(cut) = file.set_len(before).and_then(|()| file.sync_data()) {
            tracing::warn!(error = %cut, "could not cut the JSONL file back after a failed write");
        }
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "jsonl-unit-{}-{}-{name}",
            std::process::id(),
            fastrand::u64(..)
        ))
    }

    #[test]
    fn a_torn_last_line_is_cut_off_on_open() {
        let path = temp("torn");
        std::fs::write(&path, b"{\"id\":\"1:1\"}\n{\"id\":\"1:2\"}\n{\"id\":\"1:").unwrap();
        let sink = open_file(&path).unwrap();
        assert!(sink.regular);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"id\":\"1:1\"}\n{\"id\":\"1:2\"}\n"
        );
        drop(sink);
        std::fs::write(&path, b"no newline at all").unwrap();
        open_file(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_failed_write_is_an_error_and_the_next_one_appends_whole_lines() {
        // A write error without a full filesystem (bridge/tests/disk_full.rs
        // has that): a file opened read-only fails with EBADF.
        let path = temp("failed");
        std::fs::write(&path, b"{\"id\":\"1:1\"}\n").unwrap();
        let read_only = File::open(&path).unwrap();
        assert!(append(&read_only, true, b"{\"id\":\"1:2\"}\n").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"id\":\"1:1\"}\n");
        let sink = open_file(&path).unwrap();
        append(&sink.file, true, b"{\"id\":\"1:2\"}\n").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"id\":\"1:1\"}\n{\"id\":\"1:2\"}\n"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn a_rotated_file_is_replaced_by_a_new_one() {
        let path = temp("rotated");
        let mut sink = Jsonl::open(&path).await.unwrap();
        sink.publish(&[]).await.unwrap();
        let moved = path.with_extension("1");
        std::fs::rename(&path, &moved).unwrap();
        assert!(sink.rotated());
        sink.publish(&[]).await.unwrap();
        assert!(path.exists());
        assert!(!sink.rotated());
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&moved).unwrap();
    }
}
