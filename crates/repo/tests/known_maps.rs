//! The cross-implementation MST vectors that the reference implementations (TypeScript
//! `@atproto/repo`, Go indigo) share: known roots of small maps, and the edge cases of trimming
//! the top on delete, splitting two layers down and adding layers two above the root.
#![allow(clippy::unwrap_used)]

use riptide_cbor::CidBuf;
use riptide_repo::mst;
use riptide_repo::{NoBlocks, Tree};

const CID1: &str = "bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454";

fn root_of(keys: &[&str]) -> String {
    let v = CidBuf::parse(CID1).unwrap();
    let mut leaves: Vec<(String, CidBuf)> = keys.iter().map(|k| (k.to_string(), v)).collect();
    leaves.sort();
    let built = mst::root_cid(&leaves).unwrap();
    let mut tree = Tree::new();
    for k in keys {
        tree.insert(&NoBlocks, k.as_bytes(), v).unwrap();
    }
    assert_eq!(tree.root_cid().unwrap(), built);
    built.to_string()
}

fn rec(s: &str) -> String {
    format!("com.example.record/{s}")
}

#[test]
fn known_maps() {
    assert_eq!(
        root_of(&[]),
        "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
    );
    assert_eq!(
        root_of(&[&rec("3jqfcqzm3fo2j")]),
        "bafyreibj4lsc3aqnrvphp5xmrnfoorvru4wynt6lwidqbm2623a6tatzdu"
    );
    assert_eq!(
        root_of(&[&rec("3jqfcqzm3fx2j")]),
        "bafyreih7wfei65pxzhauoibu3ls7jgmkju4bspy4t2ha2qdjnzqvoy33ai"
    );
    let simple: Vec<String> = [
        "3jqfcqzm3fp2j",
        "3jqfcqzm3fr2j",
        "3jqfcqzm3fs2j",
        "3jqfcqzm3ft2j",
        "3jqfcqzm4fc2j",
    ]
    .iter()
    .map(|s| rec(s))
    .collect();
    let simple: Vec<&str> = simple.iter().map(String::as_str).collect();
    assert_eq!(
        root_of(&simple),
        "bafyreicmahysq4n6wfuxo522m6dpiy7z7qzym3dzs756t5n7nfdgccwq7m"
    );
}

fn tree_of(keys: &[&str]) -> Tree {
    let v = CidBuf::parse(CID1).unwrap();
    let mut t = Tree::new();
    for k in keys {
        t.insert(&NoBlocks, rec(k).as_bytes(), v).unwrap();
    }
    t
}

#[test]
fn trims_top_on_delete() {
    let mut t = tree_of(&[
        "3jqfcqzm3fn2j",
        "3jqfcqzm3fo2j",
        "3jqfcqzm3fp2j",
        "3jqfcqzm3fs2j",
        "3jqfcqzm3ft2j",
        "3jqfcqzm3fu2j",
    ]);
    assert_eq!(
        t.root_cid().unwrap().to_string(),
        "bafyreifnqrwbk6ffmyaz5qtujqrzf5qmxf7cbxvgzktl4e3gabuxbtatv4"
    );
    t.delete(&NoBlocks, rec("3jqfcqzm3fs2j").as_bytes())
        .unwrap();
    assert_eq!(
        t.root_cid().unwrap().to_string(),
        "bafyreie4kjuxbwkhzg2i5dljaswcroeih4dgiqq6pazcmunwt2byd725vi"
    );
}

#[test]
fn insertion_that_splits_two_layers_down() {
    let v = CidBuf::parse(CID1).unwrap();
    let mut t = tree_of(&[
        "3jqfcqzm3fo2j",
        "3jqfcqzm3fp2j",
        "3jqfcqzm3fr2j",
        "3jqfcqzm3fs2j",
        "3jqfcqzm3ft2j",
        "3jqfcqzm3fz2j",
        "3jqfcqzm4fc2j",
        "3jqfcqzm4fd2j",
        "3jqfcqzm4ff2j",
        "3jqfcqzm4fg2j",
        "3jqfcqzm4fh2j",
    ]);
    let l1 = "bafyreiettyludka6fpgp33stwxfuwhkzlur6chs4d2v4nkmq2j3ogpdjem";
    assert_eq!(t.root_cid().unwrap().to_string(), l1);
    t.insert(&NoBlocks, rec("3jqfcqzm3fx2j").as_bytes(), v)
        .unwrap();
    assert_eq!(
        t.root_cid().unwrap().to_string(),
        "bafyreid2x5eqs4w4qxvc5jiwda4cien3gw2q6cshofxwnvv7iucrmfohpm"
    );
    t.delete(&NoBlocks, rec("3jqfcqzm3fx2j").as_bytes())
        .unwrap();
    assert_eq!(t.root_cid().unwrap().to_string(), l1);
}

#[test]
fn new_layers_two_above_the_root() {
    let v = CidBuf::parse(CID1).unwrap();
    let mut t = tree_of(&["3jqfcqzm3ft2j", "3jqfcqzm3fz2j"]);
    let l0 = "bafyreidfcktqnfmykz2ps3dbul35pepleq7kvv526g47xahuz3rqtptmky";
    let l2 = "bafyreiavxaxdz7o7rbvr3zg2liox2yww46t7g6hkehx4i4h3lwudly7dhy";
    assert_eq!(t.root_cid().unwrap().to_string(), l0);
    t.insert(&NoBlocks, rec("3jqfcqzm3fx2j").as_bytes(), v)
        .unwrap();
    assert_eq!(t.root_cid().unwrap().to_string(), l2);
    t.delete(&NoBlocks, rec("3jqfcqzm3fx2j").as_bytes())
        .unwrap();
    assert_eq!(t.root_cid().unwrap().to_string(), l0);
    t.insert(&NoBlocks, rec("3jqfcqzm3fx2j").as_bytes(), v)
        .unwrap();
    t.insert(&NoBlocks, rec("3jqfcqzm4fd2j").as_bytes(), v)
        .unwrap();
    assert_eq!(
        t.root_cid().unwrap().to_string(),
        "bafyreig4jv3vuajbsybhyvb7gggvpwh2zszwfyttjrj6qwvcsp24h6popu"
    );
    t.delete(&NoBlocks, rec("3jqfcqzm4fd2j").as_bytes())
        .unwrap();
    assert_eq!(t.root_cid().unwrap().to_string(), l2);
}
