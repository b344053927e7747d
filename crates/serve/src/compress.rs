//! zstd with the Jetstream dictionary (protocol §5): each event's JSON compressed once, on its
//! own, into one complete frame — level 3, 128 KiB window, content checksum, dictionary id and
//! content size in the header, as Jetstream's encoder writes them.

use std::path::Path;

use zstd::bulk::Compressor;
use zstd::zstd_safe::CParameter;

/// A dictionary that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DictError {
    /// The file cannot be read.
    #[error("reading zstd dictionary {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a structured zstd dictionary (magic `37 A4 30 EC`).
    #[error("{0} is not a zstd dictionary (no 37 A4 30 EC magic)")]
    NotADictionary(String),
    /// zstd refused it.
    #[error("zstd: {0}")]
    Zstd(std::io::Error),
}

/// A loaded dictionary.
#[derive(Clone, Debug)]
pub struct Dictionary {
    bytes: Vec<u8>,
    id: u32,
}

impl Dictionary {
    /// Reads a dictionary file.
    pub fn load(path: &Path) -> Result<Dictionary, DictError> {
        let bytes = std::fs::read(path).map_err(|source| DictError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Dictionary::from_bytes(bytes).map_err(|e| match e {
            DictError::NotADictionary(_) => DictError::NotADictionary(path.display().to_string()),
            e => e,
        })
    }

    /// A dictionary from its bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Dictionary, DictError> {
        if bytes.len() < 8 || bytes[..4] != [0x37, 0xA4, 0x30, 0xEC] {
            return Err(DictError::NotADictionary("the dictionary".into()));
        }
        let id = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        Ok(Dictionary { bytes, id })
    }

    /// The dictionary id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The dictionary bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A compressor with Jetstream's settings. One per thread.
    pub fn compressor(&self) -> Result<Compressor<'static>, DictError> {
        let mut c = Compressor::with_dictionary(3, &self.bytes).map_err(DictError::Zstd)?;
        c.set_parameter(CParameter::ChecksumFlag(true))
            .map_err(DictError::Zstd)?;
        c.set_parameter(CParameter::WindowLog(17))
            .map_err(DictError::Zstd)?;
        c.set_parameter(CParameter::ContentSizeFlag(true))
            .map_err(DictError::Zstd)?;
        c.set_parameter(CParameter::DictIdFlag(true))
            .map_err(DictError::Zstd)?;
        Ok(c)
    }
}

/// One complete zstd frame of `data` by `c`, written into `buf` (cleared, then grown to zstd's
/// bound: a buffer reused across events allocates only while it grows). For the writers that
/// store an event's compressed form beside its JSON: ingest, and a Kafka follower.
pub fn compress_into<'b>(
    c: &mut Compressor<'static>,
    data: &[u8],
    buf: &'b mut Vec<u8>,
) -> std::io::Result<&'b [u8]> {
    buf.clear();
    buf.reserve(zstd::zstd_safe::compress_bound(data.len()));
    c.compress_to_buffer(data, buf)?;
    Ok(buf)
}

/// Trains a dictionary of at most `size` bytes from samples (`riptide dict train`).
pub fn train(samples: &[impl AsRef<[u8]>], size: usize) -> Result<Vec<u8>, DictError> {
    zstd::dict::from_samples(samples, size).map_err(DictError::Zstd)
}

/// Compressors with a dictionary's settings, shared by the tasks that compress at send time (a
/// zstd context costs ~1 MB: a few are kept, not one per subscriber).
pub struct CompressorPool {
    dictionary: Dictionary,
    pool: std::sync::Mutex<Vec<Compressor<'static>>>,
}

impl std::fmt::Debug for CompressorPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressorPool")
            .field("dictionary", &self.dictionary.id())
            .finish()
    }
}

impl CompressorPool {
    /// Most idle compressors kept.
    const KEEP: usize = 8;

    /// A pool for `dictionary`.
    pub fn new(dictionary: Dictionary) -> CompressorPool {
        CompressorPool {
            dictionary,
            pool: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The dictionary.
    pub fn dictionary(&self) -> &Dictionary {
        &self.dictionary
    }

    /// One complete zstd frame of `data`, with Jetstream's settings.
    pub fn compress(&self, data: &[u8]) -> Result<Vec<u8>, DictError> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut c = match pooled {
            Some(c) => c,
            None => self.dictionary.compressor()?,
        };
        let out = c.compress(data).map_err(DictError::Zstd);
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < Self::KEEP {
            pool.push(c);
        }
        out
    }
}
