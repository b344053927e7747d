//! Subcommands, one module each.

pub mod account;
pub mod backfill;
pub mod bench;
pub mod bench_archive;
pub mod bench_backfill;
pub mod bench_resync;
pub mod bench_rows;
pub mod bench_serve;
pub mod config;
pub mod corpus;
pub mod decode;
pub mod demo;
pub mod dict;
pub mod docs;
pub mod doctor;
pub mod gen;
pub mod get;
pub mod jetstream;
pub mod mutate;
pub mod plc;
pub mod relay;
pub mod repo;
pub mod repo_export;
pub mod resolve;
pub mod serve;
pub mod serve_backfill;
pub mod serve_kafka;
pub mod sim;
pub mod store;
pub mod tail;
pub mod verify;
pub mod verify_handle;

use std::path::Path;

use anyhow::Context;
use riptide_identity::DidDocs;
/// DID documents as the firehose verifier's key source.
pub use riptide_resolver::DocKeys;

/// Whether a file argument is `-`: standard input.
pub fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A file argument as a message names it (`-` is `stdin`).
pub fn name(path: &Path) -> String {
    if is_stdin(path) {
        "stdin".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Reads a whole input file (`-`: standard input), naming it on failure.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    if is_stdin(path) {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut buf)
            .context("reading stdin")?;
        return Ok(buf);
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// What a file looks like from its first bytes, to tell a user who gave the wrong kind of input
/// what they gave ([`Sniffed::hint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Nothing at all.
    Empty,
    /// A CAR v1 file (a repository export): a varint-prefixed header naming `roots` and `version`.
    Car,
    /// A frame corpus: a count, a length, then a frame header `{op, t}`.
    Corpus,
    /// JSON (an object or an array).
    Json,
    /// A zstd dictionary or a zstd-compressed file.
    Zstd,
    /// UTF-8 text.
    Text,
    /// None of these.
    Unknown,
}

/// Looks at the start of `bytes`.
pub fn sniff(bytes: &[u8]) -> Sniffed {
    let head = &bytes[..bytes.len().min(512)];
    let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    if bytes.is_empty() {
        return Sniffed::Empty;
    }
    // CAR: a one- or two-byte varint length, then a CBOR map holding "roots" and "version".
    let car_at = if head[0] & 0x80 == 0 { 1 } else { 2 };
    if matches!(head.get(car_at), Some(0xa1 | 0xa2))
        && has(&head[..head.len().min(car_at + 40)], b"roots")
    {
        return Sniffed::Car;
    }
    // Corpus: frame 0's header map right after the count and the length.
    if matches!(head.get(8), Some(0xa1 | 0xa2)) && has(&head[8..head.len().min(24)], b"op") {
        return Sniffed::Corpus;
    }
    if head.starts_with(&[0x37, 0xa4, 0x30, 0xec]) || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Sniffed::Zstd;
    }
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        // A multi-byte character cut at 512 bytes.
        Err(e) if e.valid_up_to() + 4 > head.len() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    match text {
        Some(t) if !t.contains('\0') => match t.trim_start().chars().next() {
            Some('{' | '[') => Sniffed::Json,
            _ => Sniffed::Text,
        },
        _ => Sniffed::Unknown,
    }
}

impl Sniffed {
    /// What to tell someone who gave this where a `wanted` file was expected (`None` when it
    /// looks like the right kind or like nothing in particular).
    pub fn hint(self, wanted: Sniffed) -> Option<&'static str> {
        if self == wanted {
            return None;
        }
        Some(match (self, wanted) {
            (Sniffed::Empty, _) => "the file is empty",
            (Sniffed::Car, Sniffed::Corpus) => {
                "this looks like a CAR file (a repository export), not a frame corpus: try `riptide repo verify FILE`"
            }
            (Sniffed::Corpus, Sniffed::Car) => {
                "this looks like a frame corpus, not a CAR file: try `riptide decode FILE` or `riptide verify FILE`"
            }
            (Sniffed::Json, Sniffed::Corpus) => {
                "this looks like JSON, not a frame corpus (a corpus is binary: a count, then length-prefixed frames)"
            }
            (Sniffed::Json, Sniffed::Car) => "this looks like JSON, not a CAR file",
            (Sniffed::Zstd, _) => "this looks like zstd data or a zstd dictionary",
            (Sniffed::Text, Sniffed::Corpus) => "this looks like a text file, not a frame corpus",
            (Sniffed::Text, Sniffed::Car) => "this looks like a text file, not a CAR file",
            (Sniffed::Text, _) => "this looks like a text file",
            (Sniffed::Json, _) => "this looks like JSON",
            (Sniffed::Car, _) => "this looks like a CAR file (a repository export)",
            (Sniffed::Corpus, _) => "this looks like a frame corpus",
            _ => return None,
        })
    }
}

/// Splits a corpus file into frames; when it is not one, the error says what it looks like.
pub fn corpus_frames<'a>(
    path: &Path,
    file: &'a [u8],
) -> anyhow::Result<Vec<riptide_firehose::corpus::CorpusFrame<'a>>> {
    riptide_firehose::corpus::split_frames(file).map_err(|e| not_a_corpus(path, file, e))
}

/// A corpus error, with what the file looks like when it does not look like a corpus.
pub fn not_a_corpus(
    path: &Path,
    file: &[u8],
    e: riptide_firehose::corpus::CorpusError,
) -> anyhow::Error {
    match sniff(file).hint(Sniffed::Corpus) {
        Some(hint) => anyhow::anyhow!("{}: {hint} ({e})", name(path)),
        None => anyhow::anyhow!("{}: {e}", name(path)),
    }
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
    if is_stdin(path) {
        return read_file(path).map(FileBytes::Heap);
    }
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

/// A `--listen` address: `IP:PORT` or `HOST:PORT` (`localhost:0`), resolved once, at start; the
/// first address the name resolves to is used. `:PORT` (Jetstream's and Go's spelling) is every
/// IPv4 interface, `0.0.0.0:PORT`.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    if let Some(port) = s.strip_prefix(':') {
        return port
            .parse::<u16>()
            .map(|p| std::net::SocketAddr::from(([0, 0, 0, 0], p)))
            .map_err(|_| format!("{s:?}: {port:?} is not a port"));
    }
    if !s.contains(':') {
        return Err(format!(
            "{s:?} has no port (use HOST:PORT, e.g. localhost:6008 or 0.0.0.0:6008)"
        ));
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{s:?} resolves to no address")),
        Err(e) => Err(format!("cannot resolve {s:?}: {e}")),
    }
}

/// Loads a zstd dictionary file (`-`: standard input); when it is not one, the error says what
/// it looks like.
pub fn load_dictionary(path: &Path) -> anyhow::Result<riptide_serve::Dictionary> {
    let bytes = read_file(path)?;
    let kind = sniff(&bytes);
    riptide_serve::Dictionary::from_bytes(bytes).map_err(|_| {
        let hint = kind
            .hint(Sniffed::Zstd)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        anyhow::anyhow!(
            "{}: not a zstd dictionary (it starts with the bytes 37 a4 30 ec){hint}",
            name(path)
        )
    })
}

/// Loads a `did_docs.json` file (DID → DID document; `-`: standard input).
pub fn load_did_docs(path: &Path) -> anyhow::Result<DidDocs> {
    let bytes = read_file(path)?;
    DidDocs::from_slice(&bytes).map_err(|e| {
        let hint = sniff(&bytes)
            .hint(Sniffed::Json)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        anyhow::anyhow!("{}: not a DID documents file: {e}{hint}", name(path))
    })
}
