//! One process per data directory: an exclusive lock on `DIR/riptide.lock`, held for as long as
//! the store is open.
//!
//! Why: fjall does not lock its directory, so a second `riptide serve --data D` (or `riptide dict
//! train --data D` beside a server) opened a store a running server held, and both ingested into
//! it (issue 39). Every way into the store ([`crate::Store::open`] and its siblings, the
//! migration, the checks) takes this lock first, so the second process is refused with a message
//! that names the holder.
//!
//! The lock is the operating system's (`flock` on Linux, through [`std::fs::File::try_lock`]): it
//! goes with the process, whatever way it ends, so a lock is never stale after a crash or a
//! `kill -9`. The file also holds the holder's pid and command line, written after the lock is
//! taken, only to say who holds it; a file left by a dead process is simply locked again.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "riptide.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another process holds the directory.
    #[error("the data directory {} is in use by another riptide process ({holder}); stop it first, or use another --data directory", dir.display())]
    Held {
        /// The data directory.
        dir: PathBuf,
        /// What the lock file says of the holder (`pid N: COMMAND`), or that it says nothing.
        holder: String,
    },
    /// The lock file could not be created or locked.
    #[error("locking the data directory {}: {source}", dir.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock of `dir` (created if missing), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut said = String::new();
                let _ = file.read_to_string(&mut said);
                let said = said.trim();
                return Err(LockError::Held {
                    dir: dir.to_owned(),
                    holder: if said.is_empty() {
                        "it has not said which".to_owned()
                    } else {
                        said.to_owned()
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        let command: Vec<String> = std::env::args().collect();
        let who = format!("pid {}: {}", std::process::id(), command.join(" "));
        // Only informative (module docs): a failure to write it leaves the lock held.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(who.as_bytes()))
            .and_then(|()| file.flush());
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DirLock::acquire(dir.path()).expect("first");
        match DirLock::acquire(dir.path()) {
            Err(e @ LockError::Held { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("pid {}", std::process::id())),
                    "{msg}"
                );
                assert!(msg.contains("in use by another riptide process"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        // The file stays, with the old holder's words in it: it is the lock that counts.
        assert!(dir.path().join(LOCK_FILE).exists());
        DirLock::acquire(dir.path()).expect("free again");
    }
}
