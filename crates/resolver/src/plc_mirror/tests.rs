//! The mirror's pages, counters and durability, on a real directory log.

use super::*;

/// did-method-plc/go-didplc `testdata/log_nullification_nontrivial.json` (the identity crate's
/// copy, with its one malformed `createdAt` as written there), as export lines with `seq`s.
fn export_lines() -> Vec<String> {
    let log: Vec<Value> = serde_json::from_str(include_str!(
        "../../../identity/src/plc/log_nullification_nontrivial.json"
    ))
    .unwrap();
    log.into_iter()
        .enumerate()
        .map(|(i, mut l)| {
            l["seq"] = (i as u64 + 1).into();
            if i == 1 {
                // Repaired as the identity crate's test does (not covered by the signature).
                l["createdAt"] = "2025-07-01T00:00:01.000Z".into();
            }
            l.to_string()
        })
        .collect()
}

fn body(lines: &[String]) -> Vec<u8> {
    lines
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect()
}

#[test]
fn pages_fold_a_real_log_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let lines = export_lines();
    let did = "did:plc:ana7n2ppeqk57pay7azhjs24";
    {
        let m = PlcMirror::open(dir.path()).unwrap();
        assert_eq!(m.cursor().unwrap(), None);
        assert_eq!(m.lookup(did).unwrap(), None);
        let out = m.apply_page(&body(&lines[..3]), DidCheck::Strict).unwrap();
        assert_eq!((out.lines, out.cursor.as_deref()), (3, Some("3")));
        m.apply_page(&body(&lines[3..]), DidCheck::Strict).unwrap();
        let c = m.counts().unwrap();
        assert_eq!(
            (c.operations, c.applied, c.dids, c.nullified, c.pages),
            (8, 8, 1, 5, 2)
        );
        assert!(c.refused.is_empty(), "{c:?}");
    }
    let m = PlcMirror::open(dir.path()).unwrap();
    assert_eq!(m.cursor().unwrap().as_deref(), Some("8"));
    let Some(MirrorDoc::Doc(doc)) = m.lookup(did).unwrap() else {
        panic!("not found")
    };
    assert_eq!(doc["id"], did);
    assert_eq!(doc["alsoKnownAs"], serde_json::json!(["at://op7"]));
    assert_eq!(m.lookups(), (1, 0));
}

#[test]
fn refused_lines_are_counted_by_reason_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let lines = export_lines();
    let m = PlcMirror::open(dir.path()).unwrap();
    m.apply_page(&body(&lines[..2]), DidCheck::Strict).unwrap();
    let before = m.chain("did:plc:ana7n2ppeqk57pay7azhjs24").unwrap();
    // The third operation with its handle changed (CID kept), a replay of the first, a line
    // that is not an entry, and a genesis under a DID it does not derive.
    let mut tampered: Value = serde_json::from_str(&lines[2]).unwrap();
    tampered["operation"]["alsoKnownAs"][0] = "at://mallory".into();
    let mut moved: Value = serde_json::from_str(&lines[0]).unwrap();
    moved["did"] = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa".into();
    let page = [
        tampered.to_string(),
        lines[0].clone(),
        "{\"not\":\"an entry\"}".to_owned(),
        moved.to_string(),
    ];
    let out = m.apply_page(&body(&page), DidCheck::Strict).unwrap();
    assert_eq!(out.lines, 4);
    let c = m.counts().unwrap();
    let want: BTreeMap<String, u64> = [
        ("cid_mismatch", 1),
        ("duplicate", 1),
        ("bad_line", 1),
        ("did_mismatch", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(c.refused, want);
    assert_eq!((c.operations, c.applied), (6, 2));
    assert_eq!(m.chain("did:plc:ana7n2ppeqk57pay7azhjs24").unwrap(), before);
    assert_eq!(m.chain("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa").unwrap(), None);
    // The same genesis, applied under DidCheck::Count, is applied and counted.
    m.apply_page(&body(&[moved.to_string()]), DidCheck::Count)
        .unwrap();
    assert_eq!(m.counts().unwrap().did_underived, 1);
    assert!(m
        .chain("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
        .unwrap()
        .is_some());
}
