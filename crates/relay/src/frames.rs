//! The frames a relay sends: corpus frames with their `seq` rewritten, and the relay's own `#info`
//! and error frames.
//!
//! Why splicing: a relay assigns its own sequence numbers, and `seq` lives in the payload, outside
//! the signed commit block, so rewriting it keeps every signature and proof valid. A frame is
//! decoded once ([`SeqSlot::find`]) to learn where its `seq` integer lies; each later rewrite copies
//! the bytes around a freshly encoded integer ([`SeqSlot::splice`]) without decoding again. The
//! payload is a definite-length map, so no length prefix changes when the integer's width does.

use bytes::Bytes;
use riptide_cbor::{write_int, Kind};
use riptide_firehose::{encode, DecodeOptions, FrameDecoder};

use crate::RelayError;

/// Where a frame's payload `seq` integer lies, or that the frame has none (`#info`, errors,
/// unknown types), in which case the relay serves it without a seq of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSlot {
    /// Byte range of the encoded integer (head and argument) in the frame, if the frame has a seq.
    range: Option<std::ops::Range<usize>>,
}

impl SeqSlot {
    /// Finds the payload's `seq` in a frame. Its header and payload must be DAG-CBOR and the
    /// payload a map; nothing else is checked (not the CAR, not the fields: a relay passes on
    /// what it is given, and a test relay must be able to serve frames its consumers will
    /// refuse, such as one whose `did` is not a DID). `_decoder` is unused since then.
    pub fn find(
        _decoder: &mut FrameDecoder,
        index: usize,
        frame: &[u8],
    ) -> Result<SeqSlot, RelayError> {
        let bad = |reason: String| RelayError::Frame { index, reason };
        let opts = riptide_cbor::Options::strict();
        let mut arena = riptide_cbor::Arena::new();
        let mut tape = arena.tape(frame);
        let (_, end) = tape
            .decode_prefix(0..frame.len(), &opts)
            .map_err(|e| bad(format!("header is not DAG-CBOR: {e}")))?;
        let payload = tape
            .decode(end..frame.len(), &opts)
            .map_err(|e| bad(format!("payload is not DAG-CBOR: {e}")))?;
        let doc = tape.finish();
        let payload = doc.value(payload);
        let Some(pairs) = payload.map() else {
            return Err(RelayError::Frame {
                index,
                reason: "payload is not a map".into(),
            });
        };
        for (k, v) in pairs {
            if k.as_str() != Some("seq") {
                continue;
            }
            if v.kind() != Kind::UInt {
                return Err(RelayError::Frame {
                    index,
                    reason: "seq is not a non-negative integer".into(),
                });
            }
            // The value's encoding starts right after its key's text.
            let start = k
                .byte_range()
                .map(|r| r.end)
                .ok_or_else(|| RelayError::Frame {
                    index,
                    reason: "seq key has no position".into(),
                })?;
            let len = match frame.get(start) {
                Some(&b) if b & 0xe0 == 0 => match b & 0x1f {
                    0..=23 => 1,
                    24 => 2,
                    25 => 3,
                    26 => 5,
                    27 => 9,
                    _ => 0,
                },
                _ => 0,
            };
            if len == 0 || start + len > frame.len() {
                return Err(RelayError::Frame {
                    index,
                    reason: "seq is not a non-negative integer".into(),
                });
            }
            return Ok(SeqSlot {
                range: Some(start..start + len),
            });
        }
        Ok(SeqSlot { range: None })
    }

    /// A frame served as it is, its seq (if any) left alone.
    pub fn verbatim() -> SeqSlot {
        SeqSlot { range: None }
    }

    /// Whether the frame carries a seq.
    pub fn has_seq(&self) -> bool {
        self.range.is_some()
    }

    /// The frame with its seq set to `seq` (the same bytes, shared, when it has none).
    pub fn splice(&self, frame: &Bytes, seq: u64) -> Bytes {
        let Some(r) = &self.range else {
            return frame.clone();
        };
        let mut out = Vec::with_capacity(frame.len() + 8);
        out.extend_from_slice(&frame[..r.start]);
        write_int(&mut out, seq.min(i64::MAX as u64) as i64);
        out.extend_from_slice(&frame[r.end..]);
        Bytes::from(out)
    }
}

/// Decoder options for [`SeqSlot::find`]: block CIDs are not the relay's business.
pub(crate) fn scan_decoder() -> FrameDecoder {
    FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::unverified()
    })
}

/// An `#info` frame ([`riptide_firehose::encode::info_frame`]), shareable.
pub fn info_frame(name: &str, message: &str) -> Bytes {
    Bytes::from(encode::info_frame(name, message))
}

/// An error frame ([`riptide_firehose::encode::error_frame`]), shareable.
pub fn error_frame(error: &str, message: &str) -> Bytes {
    Bytes::from(encode::error_frame(error, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_firehose::Body;

    #[test]
    fn info_and_error_frames_decode_as_such() {
        let mut d = FrameDecoder::new();
        let info = info_frame("OutdatedCursor", "too old");
        match d.decode(&info).unwrap().body() {
            Body::Info(i) => assert_eq!((i.name, i.message), ("OutdatedCursor", Some("too old"))),
            other => panic!("{other:?}"),
        }
        let err = error_frame("FutureCursor", "ahead");
        match d.decode(&err).unwrap().body() {
            Body::Error(e) => assert_eq!((e.error, e.message), ("FutureCursor", Some("ahead"))),
            other => panic!("{other:?}"),
        }
        assert!(!SeqSlot::find(&mut scan_decoder(), 0, &info)
            .unwrap()
            .has_seq());
    }
}
