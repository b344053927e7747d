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
    let it = match frames(file) {
        Ok(it) => it,
        Err(e) => return (Vec::new(), Some(e)),
    };
    // Every frame needs at least its 4-byte length: bound the allocation by the file size.
    let mut out = Vec::with_capacity(it.count.min(file.len() / 4));
    for f in it {
        match f {
            Ok(f) => out.push(f),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// The frame count a corpus file declares in its first four bytes, if it has them.
pub fn declared_count(file: &[u8]) -> Option<usize> {
    be32(file, 0)
}

/// The frames of a corpus file one at a time, in constant memory (a list of millions of tiny
/// frames costs several times the file). The count is read first; each frame is checked as it
/// is reached, and after the last, that nothing follows it. Stops after the first error.
pub fn frames(file: &[u8]) -> Result<CorpusFrames<'_>, CorpusError> {
    let count = be32(file, 0).ok_or(CorpusError {
        index: 0,
        offset: 0,
        what: "no frame count",
    })?;
    Ok(CorpusFrames {
        file,
        count,
        index: 0,
        pos: 4,
        done: false,
    })
}

/// Iterator of [`frames`].
#[derive(Clone, Debug)]
pub struct CorpusFrames<'a> {
    file: &'a [u8],
    /// The declared frame count.
    pub count: usize,
    index: usize,
    pos: usize,
    done: bool,
}

impl<'a> Iterator for CorpusFrames<'a> {
    type Item = Result<CorpusFrame<'a>, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let (index, pos, file) = (self.index, self.pos, self.file);
        if index == self.count {
            self.done = true;
            return (pos != file.len()).then_some(Err(CorpusError {
                index,
                offset: pos,
                what: "bytes after the last frame",
            }));
        }
        let fail = |what| CorpusError {
            index,
            offset: pos,
            what,
        };
        let r = be32(file, pos)
            .ok_or_else(|| fail("truncated length"))
            .and_then(|len| {
                let start = pos + 4;
                file.get(start..start.saturating_add(len))
                    .map(|bytes| (start, bytes))
                    .ok_or_else(|| fail("frame runs past the end of the file"))
            });
        match r {
            Ok((start, bytes)) => {
                self.index += 1;
                self.pos = start + bytes.len();
                Some(Ok(CorpusFrame {
                    index,
                    offset: start,
                    bytes,
                }))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
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
