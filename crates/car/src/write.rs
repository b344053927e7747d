//! CAR v1 writing: for repository exports, generated corpora and tests.

use riptide_cbor::{
    write_array_header, write_link, write_map_header, write_text, write_varint, Cid, CidBuf,
};

/// Streams a CAR into a `Vec`: header first, then blocks one at a time.
#[derive(Debug, Default)]
pub struct CarWriter {
    out: Vec<u8>,
}

impl CarWriter {
    /// Starts a CAR with these roots.
    pub fn new(roots: &[CidBuf]) -> CarWriter {
        let mut header = Vec::with_capacity(64);
        write_map_header(&mut header, 2);
        write_text(&mut header, "roots");
        write_array_header(&mut header, roots.len());
        for r in roots {
            write_link(&mut header, r.as_cid());
        }
        write_text(&mut header, "version");
        header.push(0x01);
        let mut out = Vec::with_capacity(header.len() + 8);
        write_varint(&mut out, header.len() as u64);
        out.extend_from_slice(&header);
        CarWriter { out }
    }

    /// Appends one block.
    pub fn block(&mut self, cid: Cid<'_>, data: &[u8]) {
        let c = cid.as_bytes();
        write_varint(&mut self.out, (c.len() + data.len()) as u64);
        self.out.extend_from_slice(c);
        self.out.extend_from_slice(data);
    }

    /// The CAR bytes.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

/// Writes a whole CAR.
pub fn write_car<'b>(
    roots: &[CidBuf],
    blocks: impl IntoIterator<Item = (Cid<'b>, &'b [u8])>,
) -> Vec<u8> {
    let mut w = CarWriter::new(roots);
    for (cid, data) in blocks {
        w.block(cid, data);
    }
    w.finish()
}
