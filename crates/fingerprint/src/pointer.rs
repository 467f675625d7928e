//! RFC 6901 JSON pointers: parsing with `~0`/`~1` escapes and the string form.
//! Evaluation against a document lives in [`crate::Value::pointer`].

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::limits;

/// A parsed JSON pointer. `""` is the whole document; `"/a~1b/0"` is member
/// `a/b`, then element or member `0`. The string form is kept as given, which
/// is unique for a token list, so equal pointers have equal strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pointer {
    text: String,
    tokens: Vec<String>,
}

impl Pointer {
    /// Parses the RFC 6901 string form. Rejects text not starting with `/`
    /// (other than `""`), `~` not followed by `0` or `1`, and pointers longer
    /// than [`limits::POINTER_BYTES_MAX`].
    pub fn parse(text: &str) -> Result<Pointer, Error> {
        let fail = |offset, reason| Error::InvalidPointer {
            pointer: text.to_owned(),
            offset,
            reason,
        };
        if text.len() > limits::POINTER_BYTES_MAX {
            return Err(fail(limits::POINTER_BYTES_MAX, "pointer too long"));
        }
        if text.is_empty() {
            return Ok(Pointer::root());
        }
        if !text.starts_with('/') {
            return Err(fail(0, "pointer must be empty or start with '/'"));
        }
        let mut tokens = Vec::new();
        let mut start = 1;
        for raw in text[1..].split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut rest = raw;
            while let Some(tilde) = rest.find('~') {
                token.push_str(&rest[..tilde]);
                match rest.as_bytes().get(tilde + 1) {
                    Some(b'0') => token.push('~'),
                    Some(b'1') => token.push('/'),
                    _ => {
                        return Err(fail(
                            start + (raw.len() - rest.len()) + tilde,
                            "'~' must be followed by '0' or '1'",
                        ))
                    }
                }
                rest = &rest[tilde + 2..];
            }
            token.push_str(rest);
            tokens.push(token);
            start += raw.len() + 1;
        }
        Ok(Pointer {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer to the whole document, `""`.
    pub fn root() -> Pointer {
        Pointer {
            text: String::new(),
            tokens: Vec::new(),
        }
    }

    /// Builds a pointer from unescaped reference tokens.
    pub fn from_tokens<I, S>(tokens: I) -> Pointer
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let tokens: Vec<String> = tokens.into_iter().map(Into::into).collect();
        let mut text = String::new();
        for token in &tokens {
            text.push('/');
            text.push_str(&token.replace('~', "~0").replace('/', "~1"));
        }
        Pointer { text, tokens }
    }

    /// The RFC 6901 string form.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The unescaped reference tokens, outermost first.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    pub fn is_root(&self) -> bool {
        self.tokens.is_empty()
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Pointer {
    type Err = Error;

    fn from_str(text: &str) -> Result<Pointer, Error> {
        Pointer::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_in_order() {
        let p = Pointer::parse("/a~1b/m~0n/~01/").unwrap();
        assert_eq!(p.tokens(), ["a/b", "m~n", "~1", ""]);
        assert_eq!(p.to_string(), "/a~1b/m~0n/~01/");
        assert_eq!(Pointer::from_tokens(["a/b", "m~n", "~1", ""]), p);
    }

    #[test]
    fn root_and_empty_token_differ() {
        assert!(Pointer::parse("").unwrap().is_root());
        assert_eq!(Pointer::parse("/").unwrap().tokens(), [""]);
    }

    #[test]
    fn malformed_pointers_name_the_offset() {
        let e = Pointer::parse("amount").unwrap_err();
        assert_eq!((e.rule(), e.offset()), ("invalid-pointer", Some(0)));
        let e = Pointer::parse("/ab/c~2").unwrap_err();
        assert_eq!(e.offset(), Some(5));
        let e = Pointer::parse("/x~").unwrap_err();
        assert_eq!(e.offset(), Some(2));
        let e = Pointer::parse(&"/a".repeat(limits::POINTER_BYTES_MAX)).unwrap_err();
        assert_eq!(e.rule(), "invalid-pointer");
    }
}
