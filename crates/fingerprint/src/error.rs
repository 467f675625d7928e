//! The one error type of the crate. Every variant names the rule that was
//! broken and where: a byte offset into the parsed text, or a JSON pointer
//! into a spec or value. [`Error::rule`] gives a stable slug for APIs and CLIs.

use crate::limits;

/// Longest member name quoted in a [`Error::DuplicateName`] message; names can
/// be up to a megabyte long and error messages end up in logs and responses.
pub(crate) const QUOTED_NAME_CHARS_MAX: usize = 64;

/// Everything that can go wrong in parsing, pointers, specs and canonicalization.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The input is longer than [`limits::INPUT_BYTES_MAX`] (or the spec limit).
    #[error("input exceeds the limit of {max} bytes")]
    TooLarge { max: usize },
    /// The input is not UTF-8; `offset` is the first byte of the bad sequence.
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 { offset: usize },
    /// The input is not JSON; `reason` says what was expected.
    #[error("{reason} at byte {offset}")]
    Syntax { offset: usize, reason: &'static str },
    /// An array or object opens deeper than [`limits::DEPTH_MAX`].
    #[error("nesting deeper than {max} levels at byte {offset}")]
    TooDeep { offset: usize, max: usize },
    /// An object repeats a member name (I-JSON); `offset` is the later name.
    #[error("duplicate member name {name:?} at byte {offset}")]
    DuplicateName { name: String, offset: usize },
    /// A `\uXXXX` escape names a surrogate that is not part of a pair (I-JSON).
    #[error("lone surrogate \\u{unit:04x} at byte {offset}")]
    LoneSurrogate { unit: u16, offset: usize },
    /// A number too large for an IEEE-754 double (I-JSON).
    #[error("number out of range of a finite double at byte {offset}")]
    NonFiniteNumber { offset: usize },
    /// A hand-built [`crate::Value`] holds NaN or an infinity, which JSON and
    /// RFC 8785 cannot express; `at` is the JSON pointer of the number.
    #[error("non-finite number {value} at pointer \"{at}\"")]
    NonFiniteValue { value: String, at: String },
    /// A malformed RFC 6901 pointer; `offset` is into the pointer text.
    #[error("invalid JSON pointer {pointer:?}: {reason} at byte {offset}")]
    InvalidPointer {
        pointer: String,
        offset: usize,
        reason: &'static str,
    },
    /// A fingerprint spec that breaks a rule; `at` is the JSON pointer of the
    /// offending part of the spec document.
    #[error("invalid fingerprint spec at \"{at}\": {reason}")]
    Spec { at: String, reason: String },
}

impl Error {
    /// Byte offset into the text being parsed (the document, or the pointer
    /// text for [`Error::InvalidPointer`]). `TooLarge` reports the limit: the
    /// first byte that did not fit.
    pub fn offset(&self) -> Option<usize> {
        match self {
            Error::TooLarge { max } => Some(*max),
            Error::InvalidUtf8 { offset }
            | Error::Syntax { offset, .. }
            | Error::TooDeep { offset, .. }
            | Error::DuplicateName { offset, .. }
            | Error::LoneSurrogate { offset, .. }
            | Error::NonFiniteNumber { offset }
            | Error::InvalidPointer { offset, .. } => Some(*offset),
            Error::NonFiniteValue { .. } | Error::Spec { .. } => None,
        }
    }

    /// Short stable slug of the broken rule, for problem details and CLI output.
    pub fn rule(&self) -> &'static str {
        match self {
            Error::TooLarge { .. } => "too-large",
            Error::InvalidUtf8 { .. } => "invalid-utf8",
            Error::Syntax { .. } => "syntax",
            Error::TooDeep { .. } => "too-deep",
            Error::DuplicateName { .. } => "duplicate-name",
            Error::LoneSurrogate { .. } => "lone-surrogate",
            Error::NonFiniteNumber { .. } | Error::NonFiniteValue { .. } => "non-finite-number",
            Error::InvalidPointer { .. } => "invalid-pointer",
            Error::Spec { .. } => "spec",
        }
    }

    pub(crate) fn too_deep(offset: usize) -> Error {
        Error::TooDeep {
            offset,
            max: limits::DEPTH_MAX,
        }
    }

    pub(crate) fn duplicate(name: &str, offset: usize) -> Error {
        let name = match name.char_indices().nth(QUOTED_NAME_CHARS_MAX) {
            Some((cut, _)) => format!("{}…", &name[..cut]),
            None => name.to_owned(),
        };
        Error::DuplicateName { name, offset }
    }

    pub(crate) fn spec(at: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Spec {
            at: at.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_duplicate_names_are_shortened_in_messages() {
        let long = "é".repeat(1000);
        let e = Error::duplicate(&long, 3);
        let Error::DuplicateName { name, .. } = &e else {
            panic!("wrong variant {e:?}");
        };
        assert_eq!(name.chars().count(), QUOTED_NAME_CHARS_MAX + 1);
        assert_eq!(e.rule(), "duplicate-name");
        assert_eq!(e.offset(), Some(3));
    }

    #[test]
    fn messages_name_the_place() {
        let e = Error::duplicate("a", 17);
        assert_eq!(e.to_string(), "duplicate member name \"a\" at byte 17");
        let e = Error::LoneSurrogate {
            unit: 0xd800,
            offset: 4,
        };
        assert_eq!(e.to_string(), "lone surrogate \\ud800 at byte 4");
    }
}
