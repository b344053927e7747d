//! Fault hooks for the fault-injection suite (`tests/faults/run`) and tests: faults that need
//! privileges to cause for real (a full disk needs a tmpfs mount) can be caused here instead.
//!
//! Why in the library: the code path under test (ingest pausing on a failed store write) is the
//! real one; only the failure is simulated, at the last step before fjall. Off unless the
//! environment names a hook, and then it costs one `stat` per store batch.
//!
//! - `RIPTIDE_FAULT_STORE_FULL=PATH`: while the file `PATH` exists, every store write fails as a
//!   full disk would (ENOSPC).
//! - `RIPTIDE_FAULT_INGEST_PANIC=PATH`: while the file `PATH` exists, ingest's writer thread
//!   panics at its next batch, as a bug on the ingest path would (`crate::ingest`, "When a
//!   thread fails").

use std::path::PathBuf;
use std::sync::OnceLock;

/// Panics when the ingest-panic hook's file exists (module docs).
pub(crate) fn ingest_panic() {
    static FLAG: OnceLock<Option<PathBuf>> = OnceLock::new();
    let path =
        FLAG.get_or_init(|| std::env::var_os("RIPTIDE_FAULT_INGEST_PANIC").map(PathBuf::from));
    if path.as_ref().is_some_and(|p| p.exists()) {
        panic!("RIPTIDE_FAULT_INGEST_PANIC: injected panic in ingest's writer");
    }
}

/// `Some(error)` when a store write is to fail now.
pub(crate) fn store_write() -> Option<crate::StoreError> {
    static FLAG: OnceLock<Option<PathBuf>> = OnceLock::new();
    let path = FLAG
        .get_or_init(|| std::env::var_os("RIPTIDE_FAULT_STORE_FULL").map(PathBuf::from))
        .as_ref()?;
    path.exists().then(|| crate::StoreError::Injected {
        source: std::io::Error::from_raw_os_error(28), // ENOSPC
    })
}
