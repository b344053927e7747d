//! Subcommands, one module each.

pub mod bench;
pub mod bench_serve;
pub mod corpus;
pub mod decode;
pub mod demo;
pub mod dict;
pub mod gen;
pub mod jetstream;
pub mod relay;
pub mod repo;
pub mod serve;
pub mod sim;
pub mod tail;
pub mod verify;
pub mod verify_handle;

use std::path::Path;

use anyhow::Context;
use riptide_identity::DidDocs;
/// DID documents as the firehose verifier's key source.
pub use riptide_resolver::DocKeys;

/// Reads a whole input file, naming it on failure.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// A whole input file in memory; see [`read_file_large`].
pub enum FileBytes {
    /// A small file, on the heap.
    Heap(Vec<u8>),
    /// A large file, in an anonymous mapping advised for huge pages.
    Mapped(memmap2::MmapMut),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Heap(v) => v,
            FileBytes::Mapped(m) => m,
        }
    }
}

/// Files at least this large are read by [`read_file_large`] into a huge-page mapping.
const LARGE_FILE: u64 = 4 << 20;

/// Reads a whole input file that is then scanned and looked up at random (a repository CAR),
/// naming it on failure. A large file goes into an anonymous mapping the kernel is asked to back
/// with 2 MiB pages (`madvise(MADV_HUGEPAGE)`; glibc's heap gets 4 KiB pages when transparent
/// huge pages are in `madvise` mode, the common default). Why: with 4 KiB pages every pass over
/// tens of megabytes, and every lookup into them, misses the TLB again and again; under a
/// hypervisor's nested paging each miss is a long walk (see docs/gotchas.md, "huge pages"). Where
/// the advice is refused the mapping simply has small pages.
pub fn read_file_large(path: &Path) -> anyhow::Result<FileBytes> {
    use std::io::Read;
    let context = || format!("reading {}", path.display());
    let mut f = std::fs::File::open(path).with_context(context)?;
    let len = f.metadata().with_context(context)?.len();
    if len < LARGE_FILE {
        return read_file(path).map(FileBytes::Heap);
    }
    let len = usize::try_from(len).with_context(context)?;
    let mut map = memmap2::MmapMut::map_anon(len).with_context(context)?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    f.read_exact(&mut map).with_context(context)?;
    // The file must not have grown since its length was read.
    let mut probe = [0u8; 1];
    anyhow::ensure!(
        f.read(&mut probe).with_context(context)? == 0,
        "reading {}: the file changed while it was read",
        path.display()
    );
    Ok(FileBytes::Mapped(map))
}

/// Loads a `did_docs.json` file (DID → DID document).
pub fn load_did_docs(path: &Path) -> anyhow::Result<DidDocs> {
    DidDocs::load(path).with_context(|| format!("loading DID documents from {}", path.display()))
}
