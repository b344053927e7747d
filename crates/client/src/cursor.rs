//! Where a consumer's position in a stream is kept between runs.
//!
//! Delivery is at-least-once: the caller acknowledges a cursor only after it has processed the
//! event ([`crate::FirehoseClient::ack`]), and a restart resumes after the last acknowledged one,
//! so an event processed but not yet acknowledged when the process died is delivered again. Make
//! processing idempotent.
//!
//! [`FileCursorStore`] writes atomically: a temporary file in the same folder, fsync, rename over
//! the old file, fsync of the folder (so the rename itself survives a power cut). After `save`
//! returns, the new value survives `kill -9` and power loss; a crash during `save` leaves the old
//! value.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A persisted cursor (a relay seq, or a Jetstream `time_us`).
pub trait CursorStore: Send + Sync + std::fmt::Debug {
    /// The stored cursor, if any.
    fn load(&self) -> std::io::Result<Option<i64>>;
    /// Stores a cursor durably.
    fn save(&self, cursor: i64) -> std::io::Result<()>;
}

/// A cursor kept in memory only (tests, or consumers that always start live).
#[derive(Debug, Default)]
pub struct MemoryCursorStore(Mutex<Option<i64>>);

impl MemoryCursorStore {
    /// A store holding `cursor`.
    pub fn new(cursor: Option<i64>) -> MemoryCursorStore {
        MemoryCursorStore(Mutex::new(cursor))
    }
}

impl CursorStore for MemoryCursorStore {
    fn load(&self) -> std::io::Result<Option<i64>> {
        Ok(*self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
    fn save(&self, cursor: i64) -> std::io::Result<()> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(cursor);
        Ok(())
    }
}

/// A cursor in a small text file (the decimal number and a newline), written atomically.
#[derive(Debug)]
pub struct FileCursorStore {
    path: PathBuf,
}

impl FileCursorStore {
    /// A store at `path` (created on the first save; its folder must exist).
    pub fn new(path: impl Into<PathBuf>) -> FileCursorStore {
        FileCursorStore { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn named(&self, e: std::io::Error, what: &str) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{what} {}: {e}", self.path.display()))
    }
}

impl CursorStore for FileCursorStore {
    fn load(&self) -> std::io::Result<Option<i64>> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) => s.trim().parse::<i64>().map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "cursor file {} does not hold a number: {e}",
                        self.path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.named(e, "reading cursor file")),
        }
    }

    fn save(&self, cursor: i64) -> std::io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            writeln!(f, "{cursor}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            // The rename is durable only once the folder's entry is.
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| self.named(e, "saving cursor to"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_round_trips_and_survives_a_new_instance() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        let a = FileCursorStore::new(&path);
        assert_eq!(a.load().unwrap(), None);
        a.save(41).unwrap();
        a.save(42).unwrap();
        // A "restarted" process: a fresh store on the same file.
        assert_eq!(FileCursorStore::new(&path).load().unwrap(), Some(42));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "42\n");
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(
            a.load().unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }
}
