//! Row kinds, the `kind` column's values.
//!
//! Why a module: the values 1–7 are on disk and on the wire (Jetstream's `segment/event.go`,
//! `docs/README.md` §3.2), and three of them index a block under a reserved marker collection
//! (`$account`, `$identity`, `$sync`; `segment/sentinel.go`) so that a collection-filtered plan
//! still selects the blocks that carry them. Both facts live here and nowhere else.

/// What a row records. The discriminants are the on-disk byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// A record created by a commit.
    Create = 1,
    /// A record updated by a commit.
    Update = 2,
    /// A record deleted by a commit.
    Delete = 3,
    /// An `#identity` event.
    Identity = 4,
    /// An `#account` event.
    Account = 5,
    /// A `#sync` event: the account's repository was replaced; earlier rows are superseded.
    Sync = 6,
    /// A record re-materialised by a resync (Sync 1.1), rendered as a create.
    CreateResync = 7,
}

/// The marker collection a collection-filtered plan selects `#account` rows with.
pub const SENTINEL_ACCOUNT: &str = "$account";
/// The marker collection for `#identity` rows.
pub const SENTINEL_IDENTITY: &str = "$identity";
/// The marker collection for `#sync` rows.
pub const SENTINEL_SYNC: &str = "$sync";

impl Kind {
    /// The kind for an on-disk byte, if it is one of 1..=7.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Create,
            2 => Kind::Update,
            3 => Kind::Delete,
            4 => Kind::Identity,
            5 => Kind::Account,
            6 => Kind::Sync,
            7 => Kind::CreateResync,
            _ => return None,
        })
    }

    /// Whether the row is rendered as a commit event (create, update, delete, create-resync).
    pub fn is_commit(self) -> bool {
        matches!(
            self,
            Kind::Create | Kind::Update | Kind::Delete | Kind::CreateResync
        )
    }

    /// Whether the row carries record bytes (create, update, create-resync).
    pub fn carries_record(self) -> bool {
        matches!(self, Kind::Create | Kind::Update | Kind::CreateResync)
    }

    /// The reserved marker collection this kind is indexed under, for the DID-level kinds.
    pub fn sentinel_collection(self) -> Option<&'static str> {
        match self {
            Kind::Account => Some(SENTINEL_ACCOUNT),
            Kind::Identity => Some(SENTINEL_IDENTITY),
            Kind::Sync => Some(SENTINEL_SYNC),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_out_of_range_is_none() {
        for b in 0u8..=255 {
            match Kind::from_u8(b) {
                Some(k) => assert_eq!(k as u8, b),
                None => assert!(b == 0 || b > 7, "{b}"),
            }
        }
        assert_eq!(Kind::Sync.sentinel_collection(), Some("$sync"));
        assert_eq!(Kind::Create.sentinel_collection(), None);
        assert!(Kind::CreateResync.is_commit() && !Kind::Sync.is_commit());
    }
}
