//! Writing frames: the header a message or error frame starts with, and the relay's own
//! `#info` and error frames.
//!
//! Why here: this crate is the one place that knows the firehose's message shapes, and the
//! generator, the local relay and tests all write frames; each used to spell the header out
//! by hand. Payloads other than the notices are the writer's business (encode them with
//! `riptide-cbor` after the header).

use riptide_cbor::{write_int, write_map_header, write_text};

/// Appends a message frame's header `{t, op: 1}` (canonical key order: `t` before `op`).
pub fn write_message_header(out: &mut Vec<u8>, t: &str) {
    write_map_header(out, 2);
    write_text(out, "t");
    write_text(out, t);
    write_text(out, "op");
    write_int(out, 1);
}

/// Appends an error frame's header `{op: -1}`.
pub fn write_error_header(out: &mut Vec<u8>) {
    write_map_header(out, 1);
    write_text(out, "op");
    write_int(out, -1);
}

/// An `#info` frame: header `{t: "#info", op: 1}`, payload `{name, message}`.
pub fn info_frame(name: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + name.len() + message.len());
    write_message_header(&mut out, "#info");
    write_notice(&mut out, "name", name, message);
    out
}

/// An error frame: header `{op: -1}`, payload `{error, message}`.
pub fn error_frame(error: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + error.len() + message.len());
    write_error_header(&mut out);
    write_notice(&mut out, "error", error, message);
    out
}

/// The payload `{<key>: value, message}` (canonical order: `key` is shorter than `message`).
fn write_notice(out: &mut Vec<u8>, key: &str, value: &str, message: &str) {
    write_map_header(out, 2);
    write_text(out, key);
    write_text(out, value);
    write_text(out, "message");
    write_text(out, message);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Body, FrameDecoder};

    #[test]
    fn notices_decode_as_what_they_claim() {
        let mut d = FrameDecoder::new();
        match d
            .decode(&info_frame("OutdatedCursor", "too old"))
            .unwrap()
            .body()
        {
            Body::Info(i) => assert_eq!((i.name, i.message), ("OutdatedCursor", Some("too old"))),
            other => panic!("{other:?}"),
        }
        match d
            .decode(&error_frame("FutureCursor", "ahead"))
            .unwrap()
            .body()
        {
            Body::Error(e) => assert_eq!((e.error, e.message), ("FutureCursor", Some("ahead"))),
            other => panic!("{other:?}"),
        }
    }
}
