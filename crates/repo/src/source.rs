//! Where blocks come from: the [`BlockSource`] trait.
//!
//! Why a trait: the same MST code walks a whole repository export (a [`Car`]), inverts a firehose
//! commit proof (the frame's small CAR) and, in tests and generators, works over blocks held in a
//! map. Lookups are by CID and return borrowed bytes; nothing is copied.
//!
//! What it does not do: check that bytes hash to their CID. A [`Car`] read with verification on
//! (the default) has already done that; a map filled by the caller is trusted as given.

use std::collections::{BTreeMap, HashMap};

use riptide_car::Car;
use riptide_cbor::{Cid, CidBuf};

/// A set of blocks addressable by CID.
pub trait BlockSource {
    /// The bytes of the block with this CID, if present.
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]>;

    /// A hint that `cid` will be looked up soon, so a source whose lookups miss the cache can
    /// start loading now. The MST walk gives it for every CID of a node it just decoded.
    #[inline]
    fn prefetch(&self, _cid: Cid<'_>) {}

    /// A hint that `block` (bytes this source returned) will be *read* soon: the walk gives it
    /// for the subtrees of a node it just decoded.
    #[inline]
    fn prefetch_block(&self, _block: &[u8]) {}
}

impl BlockSource for Car<'_> {
    #[inline]
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]> {
        self.get(cid)
    }

    #[inline]
    fn prefetch(&self, cid: Cid<'_>) {
        self.touch(cid);
    }

    #[inline]
    fn prefetch_block(&self, block: &[u8]) {
        riptide_car::touch_bytes(block);
    }
}

impl<S: BlockSource + ?Sized> BlockSource for &S {
    #[inline]
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]> {
        (**self).get_block(cid)
    }

    #[inline]
    fn prefetch(&self, cid: Cid<'_>) {
        (**self).prefetch(cid)
    }

    #[inline]
    fn prefetch_block(&self, block: &[u8]) {
        (**self).prefetch_block(block)
    }
}

impl<V: AsRef<[u8]>, H: std::hash::BuildHasher> BlockSource for HashMap<CidBuf, V, H> {
    #[inline]
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]> {
        self.get(&cid.to_buf()).map(|v| v.as_ref())
    }
}

impl<V: AsRef<[u8]>> BlockSource for BTreeMap<CidBuf, V> {
    #[inline]
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]> {
        self.get(&cid.to_buf()).map(|v| v.as_ref())
    }
}

/// No blocks at all: every lookup misses. Useful to ask what an operation would need.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBlocks;

impl BlockSource for NoBlocks {
    fn get_block(&self, _cid: Cid<'_>) -> Option<&[u8]> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::DAG_CBOR;

    #[test]
    fn maps_and_refs_are_sources() {
        let data = vec![0xf6u8];
        let cid = CidBuf::sha256(DAG_CBOR, &data);
        let mut h = HashMap::new();
        h.insert(cid, data.clone());
        assert_eq!(h.get_block(cid.as_cid()), Some(&data[..]));
        let r = &h;
        assert_eq!(r.get_block(cid.as_cid()), Some(&data[..]));
        let mut b = BTreeMap::new();
        b.insert(cid, data.clone());
        assert_eq!(b.get_block(cid.as_cid()), Some(&data[..]));
        assert_eq!(NoBlocks.get_block(cid.as_cid()), None);
    }
}
