//! The corpus file format of `shared/docs/formats.md`: `[u32 count]` then `[u32 len][frame]`…,
//! big-endian. Shared by atproto-bench-style benchmark suites, so corpora can be exchanged.

use std::fmt;

/// A corpus file that does not follow the format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusError {
    /// Which frame (0-based) was being read.
    pub index: usize,
    /// Byte offset in the file.
    pub offset: usize,
    /// What is wrong.
    pub what: &'static str,
}

impl fmt::Display for CorpusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "corpus frame {} at byte {}: {}",
            self.index, self.offset, self.what
        )
    }
}

impl std::error::Error for CorpusError {}

/// One frame of a corpus file: its index, byte offset in the file, and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorpusFrame<'a> {
    /// 0-based index.
    pub index: usize,
    /// Offset of the frame bytes in the file.
    pub offset: usize,
    /// The frame.
    pub bytes: &'a [u8],
}

fn be32(b: &[u8], at: usize) -> Option<usize> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
}

/// Splits a corpus file into frames. The declared count must match the frames present.
pub fn split_frames(file: &[u8]) -> Result<Vec<CorpusFrame<'_>>, CorpusError> {
    match split_frames_prefix(file) {
        (frames, None) => Ok(frames),
        (_, Some(e)) => Err(e),
    }
}

/// Splits a corpus file into the frames that can be read, in order, up to the first place the
/// file departs from the format (a truncated or over-long file), and returns that departure, if
/// any. For tools that report what is readable and count what is not (`riptide decode`).
pub fn split_frames_prefix(file: &[u8]) -> (Vec<CorpusFrame<'_>>, Option<CorpusError>) {
    let Some(count) = be32(file, 0) else {
        let e = CorpusError {
            index: 0,
            offset: 0,
            what: "no frame count",
        };
        return (Vec::new(), Some(e));
    };
    // Every frame needs at least its 4-byte length: bound the allocation by the file size.
    let mut frames = Vec::with_capacity(count.min(file.len() / 4));
    let mut pos = 4;
    for index in 0..count {
        let Some(len) = be32(file, pos) else {
            let e = CorpusError {
                index,
                offset: pos,
                what: "truncated length",
            };
            return (frames, Some(e));
        };
        let start = pos + 4;
        let Some(bytes) = file.get(start..start.saturating_add(len)) else {
            let e = CorpusError {
                index,
                offset: pos,
                what: "frame runs past the end of the file",
            };
            return (frames, Some(e));
        };
        frames.push(CorpusFrame {
            index,
            offset: start,
            bytes,
        });
        pos = start + len;
    }
    if pos != file.len() {
        let e = CorpusError {
            index: count,
            offset: pos,
            what: "bytes after the last frame",
        };
        return (frames, Some(e));
    }
    (frames, None)
}

/// The frame count a corpus file declares in its first four bytes, if it has them.
pub fn declared_count(file: &[u8]) -> Option<usize> {
    be32(file, 0)
}

/// Writes frames in the corpus format.
pub fn write_frames<'b>(frames: impl ExactSizeIterator<Item = &'b [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(frames.len() as u32).to_be_bytes());
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let file = write_frames([&b"ab"[..], b"", b"xyz"].into_iter());
        let frames = split_frames(&file).unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[2].bytes, b"xyz");
        assert!(split_frames(&file[..file.len() - 1]).is_err());
        let mut extra = file.clone();
        extra.push(0);
        assert!(split_frames(&extra).is_err());
        assert!(split_frames(&[0, 0]).is_err());
        // A huge declared count does not allocate before failing.
        assert!(split_frames(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn a_truncated_file_keeps_its_readable_frames() {
        let file = write_frames([&b"ab"[..], b"", b"xyz"].into_iter());
        let (frames, e) = split_frames_prefix(&file[..file.len() - 1]);
        assert_eq!(frames.len(), 2);
        let e = e.unwrap();
        assert_eq!(
            (e.index, e.what),
            (2, "frame runs past the end of the file")
        );
        let (frames, e) = split_frames_prefix(&file);
        assert_eq!((frames.len(), e), (3, None));
        assert_eq!(declared_count(&file), Some(3));
    }
}
