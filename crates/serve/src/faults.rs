//! Fault hooks for the fault-injection suite (`tests/faults/run`) and tests: faults that need
//! privileges to cause for real (a full disk needs a tmpfs mount) can be caused here instead.
//!
//! Why in the library: the code path under test (ingest pausing on a failed store write) is the
//! real one; only the failure is simulated, at the last step before fjall. Off unless the
//! environment names a hook, and then it costs one `stat` per store batch.
//!
//! - `RIPTIDE_FAULT_STORE_FULL=PATH`: while the file `PATH` exists, every store write fails as a
//!   full disk would (ENOSPC).

use std::path::PathBuf;
use std::sync::OnceLock;

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
