//! did:plc operations: parsing, strict checks, and folding an account's log into its state.
//!
//! Why: a crawl of the network resolves tens of millions of `did:plc` DIDs, more than the public
//! directory serves one address (bench/README.md, "Extrapolation"). A local copy of the
//! directory (its `/export` of every operation) answers instead, and a copy is only as good as
//! the operations it applied: each one is checked here as the PLC spec
//! (<https://web.plc.directory/spec/v0.1/did-plc>) says, before it changes a DID's state.
//!
//! What is checked, per operation:
//! - its CID is the CID of its signed DAG-CBOR (the export names one; a mismatch is tampering);
//! - its signature (base64url, compact ECDSA, low-S) verifies over the DAG-CBOR of the operation
//!   without `sig`, with one of the rotation keys of the state it follows (`prev`); a genesis
//!   operation (no `prev`) with its own;
//! - a genesis operation's DID is `did:plc:` + the first 24 base32 characters of the SHA-256 of
//!   its signed DAG-CBOR ([`DidCheck`] says what happens when it is not);
//! - an operation whose `prev` is not the head is a fork (a recovery): it nullifies the
//!   operations after `prev` only if signed by a key of higher priority (earlier in
//!   `rotationKeys`) than the first nullified operation's, at most 72 hours after it;
//! - nothing follows a tombstone except such a recovery.
//!
//! An operation that fails is a [`Refusal`] (a reason, counted by the caller) and changes
//! nothing. The legacy `create` type (2022's first format) folds as the spec maps it:
//! `rotationKeys = [recoveryKey, signingKey]`, `#atproto = signingKey`, the handle and PDS.
//!
//! No I/O: the mirror (`riptide-resolver`'s `plc_mirror`) fetches and stores; this decides.

use std::collections::BTreeMap;

use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use riptide_cbor::{json_to_value, CidBuf, OwnedValue, DAG_CBOR};
use riptide_crypto::PublicKey;
use riptide_syntax::Datetime;
use serde_json::{json, Map, Value};

use crate::doc::DidDoc;

/// How long after an operation a recovery may still nullify it (the spec's 72 hours).
pub const RECOVERY_WINDOW_MS: i64 = 72 * 3600 * 1000;

/// Why an operation was not applied. [`Refusal::reason`] names it for counters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Not shaped like a PLC operation (or its `createdAt` is not a datetime).
    #[error("malformed operation: {0}")]
    Malformed(String),
    /// The CID the export names is not the operation's.
    #[error("the operation's CID is {computed}, the export says {claimed}")]
    CidMismatch {
        /// The CID of the operation's bytes.
        computed: String,
        /// The CID the export gave.
        claimed: String,
    },
    /// No rotation key of the state it follows signed it.
    #[error("no rotation key of the previous state signed the operation")]
    BadSignature,
    /// A genesis operation whose DID is not derived from it.
    #[error("the genesis operation derives {derived}, not the DID it was filed under")]
    DidMismatch {
        /// The DID the operation derives.
        derived: String,
    },
    /// A second genesis operation for a DID that has one.
    #[error("a genesis operation for a DID that already has one")]
    SecondGenesis,
    /// `prev` names no operation known for the DID.
    #[error("prev {0} is not an operation of this DID")]
    UnknownPrev(String),
    /// An operation after a tombstone that is not a recovery.
    #[error("the DID is tombstoned")]
    AfterTombstone,
    /// A fork not signed by a key of higher priority than the operation it would nullify.
    #[error("a fork not signed by a rotation key of higher priority")]
    ForkPriority,
    /// A fork more than 72 hours after the operation it would nullify.
    #[error("a fork more than 72 hours after the operation it would nullify")]
    ForkTooLate,
    /// The operation is already applied (its CID is in the log).
    #[error("the operation is already applied")]
    Duplicate,
}

impl Refusal {
    /// A stable name for counters and status (`bad_signature`, `cid_mismatch`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::CidMismatch { .. } => "cid_mismatch",
            Refusal::BadSignature => "bad_signature",
            Refusal::DidMismatch { .. } => "did_mismatch",
            Refusal::SecondGenesis => "second_genesis",
            Refusal::UnknownPrev(_) => "unknown_prev",
            Refusal::AfterTombstone => "after_tombstone",
            Refusal::ForkPriority => "fork_priority",
            Refusal::ForkTooLate => "fork_too_late",
            Refusal::Duplicate => "duplicate",
        }
    }
}

/// What to do with a genesis operation whose DID is not derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DidCheck {
    /// Refuse it ([`Refusal::DidMismatch`]): the directory's rule.
    #[default]
    Strict,
    /// Apply it, reporting [`Applied::did_underived`]: for a simulated network whose DIDs were
    /// drawn before any operation existed (`riptide sim`); never for a real directory.
    Count,
}

/// A DID's state: what its latest operation says (the spec's "data").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlcState {
    /// `did:key` rotation keys, highest priority first.
    pub rotation_keys: Vec<String>,
    /// Verification methods: name (`atproto`) → `did:key`.
    pub verification_methods: BTreeMap<String, String>,
    /// `alsoKnownAs` (`at://handle`).
    pub also_known_as: Vec<String>,
    /// Services: name (`atproto_pds`) → (type, endpoint).
    pub services: BTreeMap<String, (String, String)>,
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// A `plc_operation` or a legacy `create`: the state from now on.
    Update(PlcState),
    /// A `plc_tombstone`: the DID is deactivated.
    Tombstone,
}

/// One parsed, not yet checked operation.
#[derive(Debug, Clone)]
pub struct PlcOp {
    /// What it does.
    pub kind: OpKind,
    /// The CID of the operation it follows (`None`: genesis).
    pub prev: Option<String>,
    /// Its CID (of its signed DAG-CBOR).
    pub cid: CidBuf,
    sig: Vec<u8>,
    /// The DAG-CBOR of the operation without `sig`: what was signed.
    unsigned: Vec<u8>,
}

fn malformed(why: impl Into<String>) -> Refusal {
    Refusal::Malformed(why.into())
}

fn strings(o: &Map<String, Value>, name: &str) -> Result<Vec<String>, Refusal> {
    o.get(name)
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(format!("`{name}` is not an array")))?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| malformed(format!("`{name}` holds a non-string")))
        })
        .collect()
}

fn text<'v>(o: &'v Map<String, Value>, name: &str) -> Result<&'v str, Refusal> {
    o.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("`{name}` is not a string")))
}

/// A legacy `create`'s handle and service as the spec normalises them.
fn with_prefix(s: &str, prefix: &str) -> String {
    if s.starts_with(prefix) {
        s.to_owned()
    } else {
        format!("{prefix}{s}")
    }
}

impl PlcOp {
    /// Parses an operation as exported (`operation` of an `/export` line).
    pub fn parse(op: &Value) -> Result<PlcOp, Refusal> {
        let o = op
            .as_object()
            .ok_or_else(|| malformed("not a JSON object"))?;
        let sig = BASE64URL_NOPAD
            .decode(text(o, "sig")?.as_bytes())
            .map_err(|e| malformed(format!("`sig` is not base64url: {e}")))?;
        let prev = match o.get("prev") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(malformed("`prev` is not a string")),
        };
        let kind = match text(o, "type")? {
            "plc_operation" => {
                let vms = o
                    .get("verificationMethods")
                    .and_then(Value::as_object)
                    .ok_or_else(|| malformed("`verificationMethods` is not an object"))?;
                let mut verification_methods = BTreeMap::new();
                for (k, v) in vms {
                    let key = v
                        .as_str()
                        .ok_or_else(|| malformed("a verification method is not a string"))?;
                    verification_methods.insert(k.clone(), key.to_owned());
                }
                let svcs = o
                    .get("services")
                    .and_then(Value::as_object)
                    .ok_or_else(|| malformed("`services` is not an object"))?;
                let mut services = BTreeMap::new();
                for (k, v) in svcs {
                    let s = v
                        .as_object()
                        .ok_or_else(|| malformed("a service is not an object"))?;
                    services.insert(
                        k.clone(),
                        (text(s, "type")?.to_owned(), text(s, "endpoint")?.to_owned()),
                    );
                }
                OpKind::Update(PlcState {
                    rotation_keys: strings(o, "rotationKeys")?,
                    verification_methods,
                    also_known_as: strings(o, "alsoKnownAs")?,
                    services,
                })
            }
            "create" => {
                let signing = text(o, "signingKey")?.to_owned();
                OpKind::Update(PlcState {
                    rotation_keys: vec![text(o, "recoveryKey")?.to_owned(), signing.clone()],
                    verification_methods: BTreeMap::from([("atproto".to_owned(), signing)]),
                    also_known_as: vec![with_prefix(text(o, "handle")?, "at://")],
                    services: BTreeMap::from([(
                        "atproto_pds".to_owned(),
                        (
                            "AtprotoPersonalDataServer".to_owned(),
                            with_prefix(text(o, "service")?, "https://"),
                        ),
                    )]),
                })
            }
            "plc_tombstone" => {
                if prev.is_none() {
                    return Err(malformed("a tombstone without `prev`"));
                }
                OpKind::Tombstone
            }
            t => return Err(malformed(format!("unknown type `{t}`"))),
        };
        let model = json_to_value(op).map_err(|e| malformed(format!("not data-model: {e}")))?;
        let mut signed = Vec::new();
        model.encode(&mut signed);
        let mut unsigned = Vec::new();
        match model {
            OwnedValue::Map(mut m) => {
                m.remove("sig");
                OwnedValue::Map(m).encode(&mut unsigned);
            }
            _ => return Err(malformed("not a map")),
        }
        Ok(PlcOp {
            kind,
            prev,
            cid: CidBuf::sha256(DAG_CBOR, &signed),
            sig,
            unsigned,
        })
    }

    /// The DID this operation creates, if it is a genesis operation: `did:plc:` + base32 of
    /// the SHA-256 of its signed DAG-CBOR (the digest of its CID), first 24 characters.
    pub fn derived_did(&self) -> String {
        let b32 = BASE32_NOPAD.encode(self.cid.as_cid().digest());
        format!("did:plc:{}", b32[..24].to_ascii_lowercase())
    }

    /// The index in `keys` of the rotation key that signed this operation, if any did.
    pub fn signer(&self, keys: &[String]) -> Option<usize> {
        keys.iter().position(|k| {
            PublicKey::from_did_key(k)
                .is_ok_and(|key| key.verify(&self.unsigned, &self.sig).is_ok())
        })
    }
}

/// One applied operation of a DID's log, as much of it as later checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its CID (string form).
    pub cid: String,
    /// Its `createdAt`, milliseconds since the epoch.
    pub created_at_ms: i64,
    /// Which rotation key (index in the previous state's keys; genesis: its own) signed it.
    pub signer: usize,
    /// The state after it (`None`: tombstoned).
    pub state: Option<PlcState>,
}

/// A DID's log as far as it still matters: the head and the operations a recovery could still
/// fork from (those whose successor is less than 72 hours older than the head).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    /// Oldest first; the last is the head.
    pub entries: Vec<Entry>,
}

/// What applying an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Operations nullified by this one (a recovery).
    pub nullified: usize,
    /// A genesis operation applied whose DID is not derived from it ([`DidCheck::Count`]).
    pub did_underived: bool,
}

/// `createdAt` in milliseconds since the epoch.
pub fn created_at_ms(s: &str) -> Result<i64, Refusal> {
    Datetime::parse(s)
        .map(|d| d.timestamp_micros() / 1000)
        .map_err(|e| malformed(format!("createdAt {s:?}: {e}")))
}

impl Chain {
    /// The current state (`None`: no operation, or tombstoned).
    pub fn state(&self) -> Option<&PlcState> {
        self.entries.last().and_then(|e| e.state.as_ref())
    }

    /// Whether the DID's head is a tombstone.
    pub fn tombstoned(&self) -> bool {
        self.entries.last().is_some_and(|e| e.state.is_none())
    }

    /// Checks `op` of `did`, created at `created_at_ms`, exported under CID `claimed`, and
    /// applies it; a refused operation changes nothing.
    pub fn apply(
        &mut self,
        did: &str,
        op: &PlcOp,
        claimed: &str,
        created_at_ms: i64,
        check: DidCheck,
    ) -> Result<Applied, Refusal> {
        let cid = op.cid.to_string();
        if cid != claimed {
            return Err(Refusal::CidMismatch {
                computed: cid,
                claimed: claimed.to_owned(),
            });
        }
        if self.entries.iter().any(|e| e.cid == cid) {
            return Err(Refusal::Duplicate);
        }
        let mut applied = Applied {
            nullified: 0,
            did_underived: false,
        };
        let (keep, signer) = match &op.prev {
            None => {
                if !self.entries.is_empty() {
                    return Err(Refusal::SecondGenesis);
                }
                let OpKind::Update(state) = &op.kind else {
                    return Err(malformed("a tombstone without `prev`"));
                };
                let signer = op
                    .signer(&state.rotation_keys)
                    .ok_or(Refusal::BadSignature)?;
                let derived = op.derived_did();
                if derived != did {
                    match check {
                        DidCheck::Strict => return Err(Refusal::DidMismatch { derived }),
                        DidCheck::Count => applied.did_underived = true,
                    }
                }
                (0, signer)
            }
            Some(prev) => {
                let i = self
                    .entries
                    .iter()
                    .position(|e| &e.cid == prev)
                    .ok_or_else(|| Refusal::UnknownPrev(prev.clone()))?;
                let Some(state) = &self.entries[i].state else {
                    return Err(Refusal::AfterTombstone);
                };
                let signer = op
                    .signer(&state.rotation_keys)
                    .ok_or(Refusal::BadSignature)?;
                if let Some(first_nullified) = self.entries.get(i + 1) {
                    if signer >= first_nullified.signer {
                        return Err(Refusal::ForkPriority);
                    }
                    if created_at_ms - first_nullified.created_at_ms > RECOVERY_WINDOW_MS {
                        return Err(Refusal::ForkTooLate);
                    }
                    applied.nullified = self.entries.len() - i - 1;
                }
                (i + 1, signer)
            }
        };
        self.entries.truncate(keep);
        self.entries.push(Entry {
            cid,
            created_at_ms,
            signer,
            state: match &op.kind {
                OpKind::Update(s) => Some(s.clone()),
                OpKind::Tombstone => None,
            },
        });
        self.prune();
        Ok(applied)
    }

    /// Forgets the operations no recovery can fork from any more: an entry stays while the
    /// operation after it is within 72 hours of the head.
    fn prune(&mut self) {
        let Some(head) = self.entries.last().map(|e| e.created_at_ms) else {
            return;
        };
        let drop = (0..self.entries.len() - 1)
            .take_while(|&k| self.entries[k + 1].created_at_ms + RECOVERY_WINDOW_MS < head)
            .count();
        self.entries.drain(..drop);
    }

    /// The chain as JSON (how the mirror stores it).
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.entries
                .iter()
                .map(|e| {
                    json!({
                        "cid": e.cid,
                        "at": e.created_at_ms,
                        "signer": e.signer,
                        "state": e.state.as_ref().map(PlcState::to_json),
                    })
                })
                .collect(),
        )
    }

    /// A chain stored by [`Chain::to_json`].
    pub fn from_json(v: &Value) -> Result<Chain, Refusal> {
        let entries = v
            .as_array()
            .ok_or_else(|| malformed("a stored chain is not an array"))?
            .iter()
            .map(|e| {
                let o = e
                    .as_object()
                    .ok_or_else(|| malformed("a stored entry is not an object"))?;
                Ok(Entry {
                    cid: text(o, "cid")?.to_owned(),
                    created_at_ms: o
                        .get("at")
                        .and_then(Value::as_i64)
                        .ok_or_else(|| malformed("a stored entry has no time"))?,
                    signer: o
                        .get("signer")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| malformed("a stored entry has no signer"))?
                        as usize,
                    state: match o.get("state") {
                        None | Some(Value::Null) => None,
                        Some(s) => Some(PlcState::from_json(s)?),
                    },
                })
            })
            .collect::<Result<_, Refusal>>()?;
        Ok(Chain { entries })
    }
}

impl PlcState {
    /// The state as the directory's `/data/<did>` shows it (without the DID).
    pub fn to_json(&self) -> Value {
        let services: Map<String, Value> = self
            .services
            .iter()
            .map(|(k, (t, e))| (k.clone(), json!({"type": t, "endpoint": e})))
            .collect();
        json!({
            "rotationKeys": self.rotation_keys,
            "verificationMethods": self.verification_methods,
            "alsoKnownAs": self.also_known_as,
            "services": services,
        })
    }

    /// A state shown by [`PlcState::to_json`] (an operation's fields, without `type`/`sig`).
    pub fn from_json(v: &Value) -> Result<PlcState, Refusal> {
        let mut op = v.clone();
        if let Some(o) = op.as_object_mut() {
            o.insert("type".into(), "plc_operation".into());
            o.insert("sig".into(), "".into());
        }
        match PlcOp::parse(&op)?.kind {
            OpKind::Update(s) => Ok(s),
            OpKind::Tombstone => Err(malformed("a stored state is a tombstone")),
        }
    }

    /// The DID document the directory serves for this state: verification methods as
    /// `Multikey`s, services under `#name`.
    pub fn to_doc_json(&self, did: &str) -> Value {
        let vms: Vec<Value> = self
            .verification_methods
            .iter()
            .map(|(name, key)| {
                json!({
                    "id": format!("{did}#{name}"),
                    "type": "Multikey",
                    "controller": did,
                    "publicKeyMultibase": key.strip_prefix("did:key:").unwrap_or(key),
                })
            })
            .collect();
        let services: Vec<Value> = self
            .services
            .iter()
            .map(
                |(name, (t, e))| json!({"id": format!("#{name}"), "type": t, "serviceEndpoint": e}),
            )
            .collect();
        json!({
            "@context": [
                "https://www.w3.org/ns/did/v1",
                "https://w3id.org/security/multikey/v1",
                "https://w3id.org/security/suites/secp256k1-2019/v1"
            ],
            "id": did,
            "alsoKnownAs": self.also_known_as,
            "verificationMethod": vms,
            "service": services,
        })
    }

    /// The state as a parsed DID document.
    pub fn to_doc(&self, did: &str) -> Result<DidDoc, crate::DocError> {
        DidDoc::from_value(&self.to_doc_json(did))
    }
}

/// Signs an operation given as JSON without `sig` (a generator's or a test's): returns it with
/// `sig`, and its CID. Fails only if `unsigned` is not a data-model object.
pub fn sign_op(
    unsigned: &Value,
    key: &riptide_crypto::PrivateKey,
) -> Result<(Value, CidBuf), Refusal> {
    let model = json_to_value(unsigned).map_err(|e| malformed(format!("not data-model: {e}")))?;
    let mut bytes = Vec::new();
    model.encode(&mut bytes);
    let sig = BASE64URL_NOPAD.encode(&key.sign(&bytes));
    let mut signed = unsigned.clone();
    signed
        .as_object_mut()
        .ok_or_else(|| malformed("not a JSON object"))?
        .insert("sig".into(), sig.into());
    let op = PlcOp::parse(&signed)?;
    Ok((signed, op.cid))
}

#[cfg(test)]
mod tests;
