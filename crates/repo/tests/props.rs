//! Property tests: build, walk and the mutable tree agree on random key sets.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use riptide_cbor::{CidBuf, DAG_CBOR};
use riptide_repo::mst::{self, invert};
use riptide_repo::{Action, NoBlocks, ProofOp, Tree};

fn val(i: u32) -> CidBuf {
    CidBuf::sha256(DAG_CBOR, &i.to_le_bytes())
}

/// Keys from a small alphabet so that prefixes are shared and heights vary.
fn key_strategy() -> impl Strategy<Value = String> {
    (
        "(app\\.bsky\\.feed\\.(like|post)|com\\.ex\\.r)",
        "[a-c2-3]{1,6}",
    )
        .prop_map(|(c, r)| format!("{c}/{r}"))
}

fn key_set() -> impl Strategy<Value = BTreeMap<String, CidBuf>> {
    prop::collection::btree_map(key_strategy(), (0u32..1000).prop_map(val), 0..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// build → walk gives back exactly the leaves, in order.
    #[test]
    fn build_then_walk(set in key_set()) {
        let leaves: Vec<(String, CidBuf)> = set.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (root, blocks) = mst::build(&leaves).unwrap();
        let store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let mut walked = Vec::new();
        let stats = mst::walk(&store, root.as_cid(), |k, v, h| {
            assert_eq!(mst::key_height(k), h);
            walked.push((String::from_utf8(k.to_vec()).unwrap(), v.to_buf()));
        }).unwrap();
        prop_assert_eq!(stats.nodes, store.len());
        prop_assert_eq!(walked, leaves);
    }

    /// Building everything at once equals inserting one by one, in any order.
    #[test]
    fn build_equals_incremental(set in key_set(), seed in any::<u64>()) {
        let leaves: Vec<(String, CidBuf)> = set.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let root = mst::root_cid(&leaves).unwrap();
        let mut order = leaves.clone();
        // A cheap deterministic shuffle.
        let mut s = seed | 1;
        for i in (1..order.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut tree = Tree::new();
        for (k, v) in &order {
            prop_assert_eq!(tree.insert(&NoBlocks, k.as_bytes(), *v).unwrap(), None);
        }
        prop_assert_eq!(tree.root_cid().unwrap(), root);
    }

    /// On a tree loaded lazily from its blocks, inserting a new key then deleting it gives back
    /// the same root; so does deleting an existing key then re-inserting it.
    #[test]
    fn insert_delete_round_trip(set in key_set(), extra in key_strategy(), pick in any::<prop::sample::Index>()) {
        let leaves: Vec<(String, CidBuf)> = set.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (root, blocks) = mst::build(&leaves).unwrap();
        let store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();

        let mut tree = Tree::load(root);
        let had = tree.get(&store, extra.as_bytes()).unwrap();
        prop_assert_eq!(had, set.get(&extra).copied());
        let v = val(5000);
        tree.insert(&store, extra.as_bytes(), v).unwrap();
        prop_assert_eq!(tree.get(&store, extra.as_bytes()).unwrap(), Some(v));
        match had {
            None => { prop_assert_eq!(tree.delete(&store, extra.as_bytes()).unwrap(), Some(v)); }
            Some(old) => { tree.insert(&store, extra.as_bytes(), old).unwrap(); }
        }
        prop_assert_eq!(tree.root_cid().unwrap(), root);

        if !leaves.is_empty() {
            let (k, v) = &leaves[pick.index(leaves.len())];
            let mut tree = Tree::load(root);
            prop_assert_eq!(tree.delete(&store, k.as_bytes()).unwrap(), Some(*v));
            let mut rest = leaves.clone();
            rest.retain(|(x, _)| x != k);
            prop_assert_eq!(tree.root_cid().unwrap(), mst::root_cid(&rest).unwrap());
            tree.insert(&store, k.as_bytes(), *v).unwrap();
            prop_assert_eq!(tree.root_cid().unwrap(), root);
        }
    }

    /// A random commit (creates, updates, deletes) inverts to the old root from exactly the
    /// proof nodes, and from nothing less than each of them.
    #[test]
    fn commit_proofs_invert(set in key_set(), new_keys in prop::collection::btree_set(key_strategy(), 0..6), picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let leaves: Vec<(String, CidBuf)> = set.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (old_root, blocks) = mst::build(&leaves).unwrap();
        let mut store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let mut spec: BTreeMap<String, (Action, Option<CidBuf>, Option<CidBuf>)> = BTreeMap::new();
        for k in new_keys.iter().filter(|k| !set.contains_key(*k)) {
            spec.insert(k.clone(), (Action::Create, Some(val(7000 + spec.len() as u32)), None));
        }
        for (i, p) in picks.iter().enumerate() {
            if leaves.is_empty() { break; }
            let (k, v) = &leaves[p.index(leaves.len())];
            if i % 2 == 0 {
                spec.insert(k.clone(), (Action::Update, Some(val(8000 + i as u32)), Some(*v)));
            } else {
                spec.insert(k.clone(), (Action::Delete, None, Some(*v)));
            }
        }
        let mut tree = Tree::load(old_root);
        for (k, (a, c, _)) in &spec {
            match a {
                Action::Delete => { tree.delete(&store, k.as_bytes()).unwrap(); }
                _ => { tree.insert(&store, k.as_bytes(), c.unwrap()).unwrap(); }
            }
        }
        let mut new_blocks = Vec::new();
        let new_root = tree.root_cid_with_blocks(&mut new_blocks).unwrap();
        store.extend(new_blocks);
        let ops: Vec<ProofOp<'_>> = spec.iter().map(|(k, (a, c, p))| ProofOp { action: *a, path: k, cid: *c, prev: *p }).collect();
        let proof = invert::proof_nodes(new_root, &store, &ops).unwrap();
        let only: HashMap<CidBuf, Vec<u8>> = proof.iter().map(|c| (*c, store[c].clone())).collect();
        let mut t = Tree::load(new_root);
        invert::check_forward(&mut t, &only, &ops).unwrap();
        invert::invert(&mut t, &only, &ops).unwrap();
        prop_assert_eq!(t.root_cid().unwrap(), old_root);
        if ops.len() == 1 {
            for drop in &proof {
                let mut fewer = only.clone();
                fewer.remove(drop);
                let mut t = Tree::load(new_root);
                let r = invert::check_forward(&mut t, &fewer, &ops).and_then(|_| invert::invert(&mut t, &fewer, &ops));
                prop_assert_eq!(r, Err(riptide_repo::ProofError::MissingBlock(*drop)));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the node or commit decoders.
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut arena = riptide_cbor::Arena::new();
        let mut out = mst::NodeData::new();
        let cid = CidBuf::sha256(DAG_CBOR, &bytes);
        let _ = mst::decode_node(&mut arena, cid.as_cid(), &bytes, None, &mut out);
        let _ = mst::decode_node(&mut arena, cid.as_cid(), &bytes, Some(3), &mut out);
        let _ = riptide_repo::Commit::decode(&bytes);
    }

    /// Corrupted node blocks (served under their old CIDs, so no hash check stops them) make the
    /// walk and the tree operations fail cleanly or succeed, never panic or loop.
    #[test]
    fn corrupted_trees_never_panic(set in key_set(), which in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>(), extra in key_strategy()) {
        let leaves: Vec<(String, CidBuf)> = set.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (root, blocks) = mst::build(&leaves).unwrap();
        let mut store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let mut cids: Vec<CidBuf> = store.keys().copied().collect();
        cids.sort();
        let victim = cids[which.index(cids.len())];
        let block = store.get_mut(&victim).unwrap();
        let i = at.index(block.len());
        block[i] = byte;
        let _ = mst::walk(&store, root.as_cid(), |_, _, _| {});
        let mut tree = Tree::load(root);
        let _ = tree.get(&store, extra.as_bytes());
        let _ = tree.insert(&store, extra.as_bytes(), val(1));
        let _ = tree.delete(&store, extra.as_bytes());
        if let Some((k, _)) = leaves.first() {
            let _ = tree.delete(&store, k.as_bytes());
        }
        let _ = tree.root_cid();
    }
}
