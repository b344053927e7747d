//! Parse-don't-validate types for the atproto identifier syntaxes.
//!
//! Everything riptide reads off the network (DIDs, handles, collection NSIDs,
//! record keys, commit revisions, AT URIs, datetimes, language tags) is
//! attacker-controlled text. This crate checks it once, at the edge, against
//! the atproto specs (<https://atproto.com/specs>), and hands back a type that
//! carries the proof, so the rest of the code never re-validates.
//!
//! Each format comes in two layers:
//!
//! * `is_valid_*(&str) -> bool`: a borrowed, allocation-free byte loop for hot
//!   paths (every firehose op's collection, record key and revision).
//! * an owned type (`Did`, `Nsid`, ...) with `parse`, `FromStr`,
//!   `TryFrom<&str>`, `TryFrom<String>`, `as_str`, `Display` and
//!   `AsRef<str>`. Errors are a typed [`SyntaxError`].
//!
//! The `is_valid_*` functions implement the Lexicon *syntax* rules. Two types
//! are deliberately stricter than their syntax check, because they promise
//! something the syntax alone does not: [`Datetime`] must denote an instant in
//! years 0000..=9999 once its offset is applied, and [`Language`] must not
//! repeat a variant or extension singleton (RFC 5646 "valid", not merely
//! "well-formed").

mod at_identifier;
mod at_uri;
mod datetime;
mod did;
mod error;
mod handle;
mod language;
mod nsid;
mod record_key;
mod tid;

pub use at_identifier::{is_valid_at_identifier, AtIdentifier};
pub use at_uri::{is_valid_at_uri, AtUri};
pub use datetime::{
    civil_from_days, days_from_civil, format_utc, is_valid_datetime, Datetime, Precision,
};
pub use did::{check_did, is_valid_did, Did};
pub use error::{Format, SyntaxError, SyntaxErrorKind};
pub use handle::{is_valid_handle, Handle};
pub use language::{is_valid_language, Language};
pub use nsid::{is_valid_nsid, Nsid};
pub use record_key::{is_valid_record_key, RecordKey};
pub use tid::{is_valid_tid, tid_value, Tid};

/// The shared surface of the `String` newtypes. The invoking module supplies
/// `fn check(&str) -> Result<(), SyntaxError>` (all validation) and
/// `fn from_checked(String) -> Self` (normalisation, if any).
macro_rules! string_type {
    ($ty:ident) => {
        impl $ty {
            /// Validates `s` and copies it into an owned value.
            pub fn parse(s: &str) -> Result<Self, $crate::SyntaxError> {
                Self::check(s)?;
                Ok(Self::from_checked(s.to_owned()))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Unwraps the inner `String`.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::SyntaxError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = $crate::SyntaxError;
            fn try_from(s: &str) -> Result<Self, Self::Error> {
                Self::parse(s)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = $crate::SyntaxError;
            /// Validates without copying.
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::check(&s)?;
                Ok(Self::from_checked(s))
            }
        }

        impl From<$ty> for String {
            fn from(v: $ty) -> String {
                v.0
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}
pub(crate) use string_type;
