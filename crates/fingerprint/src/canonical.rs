//! RFC 8785 (JCS) serialization: member names sorted by UTF-16 code units,
//! ECMAScript Number-to-String for numbers (via `ryu-js`), and the minimal JCS
//! string escaping. Everything is written into one `String`.

use std::cmp::Ordering;

use crate::error::Error;
use crate::parse::parse;
use crate::value::Value;

/// The RFC 8785 canonical form of `value`.
///
/// # Panics
///
/// If `value` holds a NaN or infinite number. [`crate::parse`] never produces
/// one; for hand-built values use [`try_canonicalize`].
pub fn canonicalize(value: &Value) -> String {
    match try_canonicalize(value) {
        Ok(text) => text,
        Err(e) => panic!("canonicalize: {e}"),
    }
}

/// Like [`canonicalize`], but reports a non-finite number instead of panicking.
pub fn try_canonicalize(value: &Value) -> Result<String, Error> {
    let mut out = String::with_capacity(256);
    write_value(&mut out, value).map_err(|NonFinite| non_finite_error(value))?;
    Ok(out)
}

/// Parses `input` as I-JSON and returns its canonical form as UTF-8 bytes.
pub fn canonicalize_bytes(input: &[u8]) -> Result<Vec<u8>, Error> {
    let value = parse(input)?;
    // Parsed numbers are always finite, so this cannot fail; keep the `?`
    // anyway rather than assert it.
    Ok(try_canonicalize(&value)?.into_bytes())
}

/// Marker that a non-finite number was met; the location is recomputed only
/// on this rare path so the hot path carries no pointer bookkeeping.
#[derive(Debug)]
pub(crate) struct NonFinite;

pub(crate) fn write_value(out: &mut String, value: &Value) -> Result<(), NonFinite> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, *n)?,
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            // Bodies are often already in order (canonical clients, re-parsed
            // canonical text): then no index needs to be built.
            let sorted = members
                .windows(2)
                .all(|w| cmp_utf16(&w[0].0, &w[1].0) != Ordering::Greater);
            if sorted {
                write_members(out, members.iter().map(|(k, v)| (k.as_str(), v)))?;
            } else {
                let mut order: Vec<&(String, Value)> = members.iter().collect();
                order.sort_by(|a, b| cmp_utf16(&a.0, &b.0));
                write_members(out, order.into_iter().map(|(k, v)| (k.as_str(), v)))?;
            }
        }
    }
    Ok(())
}

/// Writes `{"k":v,...}` for members already in canonical order.
pub(crate) fn write_members<'v>(
    out: &mut String,
    members: impl Iterator<Item = (&'v str, &'v Value)>,
) -> Result<(), NonFinite> {
    out.push('{');
    for (i, (name, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, name);
        out.push(':');
        write_value(out, value)?;
    }
    out.push('}');
    Ok(())
}

/// ECMAScript Number-to-String, as RFC 8785 section 3.2.2.3 requires.
pub(crate) fn write_number(out: &mut String, n: f64) -> Result<(), NonFinite> {
    if !n.is_finite() {
        return Err(NonFinite);
    }
    if n == 0.0 {
        // Covers -0, which ECMAScript prints as "0".
        out.push('0');
    } else {
        out.push_str(ryu_js::Buffer::new().format_finite(n));
    }
    Ok(())
}

/// A JSON string literal with JCS escaping: only `"`, `\` and controls below
/// U+0020 are escaped, the latter with the short forms where JSON has them and
/// lowercase `\u00xx` otherwise. Everything else is copied as UTF-8.
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0A => "\\n",
            0x0C => "\\f",
            0x0D => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        // Escaped bytes are ASCII, so `run..i` and `i + 1` are char boundaries.
        out.push_str(&s[run..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        } else {
            out.push_str(escape);
        }
        run = i + 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Orders strings by their UTF-16 code units, as RFC 8785 sorts member names.
///
/// UTF-8 byte order equals code point order, which differs from UTF-16 order
/// only between supplementary characters (surrogate pairs, D800-DFFF) and
/// U+E000-U+FFFF. So compare bytes, and only at the first difference decode the
/// two characters and compare their UTF-16 keys.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let Some(diff) = ab.iter().zip(bb).position(|(x, y)| x != y) else {
        return ab.len().cmp(&bb.len());
    };
    // Back up to the start of the character holding the first difference;
    // both strings share every byte before `diff`, hence the boundary.
    let mut start = diff;
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    let ca = a[start..].chars().next().map_or(0, utf16_key);
    let cb = b[start..].chars().next().map_or(0, utf16_key);
    ca.cmp(&cb)
}

/// A key whose order is the UTF-16 code unit order of single characters:
/// supplementary characters (high surrogate first) sort between U+D7FF and
/// U+E000.
fn utf16_key(c: char) -> u32 {
    let c = u32::from(c);
    match c {
        0..=0xD7FF => c,
        0xE000..=0xFFFF => c + 0x10_0000,
        _ => 0xD800 + (c - 0x1_0000),
    }
}

/// Pointer (RFC 6901 string form) of the first non-finite number in `value`.
fn non_finite_error(value: &Value) -> Error {
    fn find(value: &Value, path: &mut Vec<String>) -> Option<f64> {
        match value {
            Value::Number(n) if !n.is_finite() => Some(*n),
            Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                path.push(i.to_string());
                let found = find(item, path);
                if found.is_none() {
                    path.pop();
                }
                found
            }),
            Value::Object(members) => members.iter().find_map(|(k, v)| {
                path.push(k.clone());
                let found = find(v, path);
                if found.is_none() {
                    path.pop();
                }
                found
            }),
            _ => None,
        }
    }
    let mut path = Vec::new();
    let n = find(value, &mut path).unwrap_or(f64::NAN);
    Error::NonFiniteValue {
        value: n.to_string(),
        at: crate::pointer::Pointer::from_tokens(path).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(n: f64) -> String {
        let mut s = String::new();
        write_number(&mut s, n).unwrap();
        s
    }

    #[test]
    fn numbers_follow_ecmascript() {
        assert_eq!(number(-0.0), "0");
        assert_eq!(number(1e21), "1e+21");
        assert_eq!(number(1e-7), "1e-7");
        assert_eq!(number(123456789.0), "123456789");
        assert_eq!(number(0.000001), "0.000001");
        assert_eq!(number(-1.5), "-1.5");
    }

    #[test]
    fn strings_escape_only_what_jcs_requires() {
        let mut s = String::new();
        write_string(&mut s, "a\"\\\u{8}\t\n\u{c}\r\u{1}\u{1f}\u{7f}/é\u{2028}😂");
        assert_eq!(
            s,
            "\"a\\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\u{7f}/é\u{2028}😂\""
        );
    }

    #[test]
    fn utf16_order_puts_astral_before_private_use() {
        assert_eq!(cmp_utf16("\u{1f602}", "\u{fb33}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{d7ff}", "\u{10000}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{e000}", "\u{10ffff}"), Ordering::Greater);
        assert_eq!(cmp_utf16("a", "ab"), Ordering::Less);
        assert_eq!(cmp_utf16("ab", "ab"), Ordering::Equal);
        assert_eq!(cmp_utf16("é", "ê"), Ordering::Less);
        for (a, b) in [
            ("x\u{1f600}", "x\u{ffff}"),
            ("\u{10400}", "\u{10401}"),
            ("z", "\u{80}"),
        ] {
            let want = a.encode_utf16().cmp(b.encode_utf16());
            assert_eq!(cmp_utf16(a, b), want, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn non_finite_numbers_are_located() {
        let v = Value::Object(vec![(
            "a/b".into(),
            Value::Array(vec![Value::Null, Value::Number(f64::INFINITY)]),
        )]);
        let e = try_canonicalize(&v).unwrap_err();
        assert_eq!(e.rule(), "non-finite-number");
        assert_eq!(
            e.to_string(),
            "non-finite number inf at pointer \"/a~1b/1\""
        );
    }
}
