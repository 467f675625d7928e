//! Strict I-JSON (RFC 7493) parser. It owns the acceptance rules of step 1 of
//! the fingerprint contract: UTF-8 only, no duplicate member names, no lone
//! surrogates, only finite numbers, bounded size and depth, nothing after the
//! document but whitespace. It never recurses, so no input can overflow the
//! stack: open containers live on an explicit, depth-bounded stack.
//!
//! Deliberately accepted: noncharacters such as U+FFFF (the contract rejects
//! only the three I-JSON rules above), `\u0000`, and numbers that underflow to
//! zero. A leading byte order mark is a syntax error.

use std::collections::BTreeSet;

use crate::error::Error;
use crate::limits;
use crate::value::Value;

/// Parses `input` as one I-JSON document.
///
/// Checks run in this order, so an input breaking several rules reports the
/// first: size, UTF-8 (the whole input), then the grammar and the I-JSON rules
/// in document order.
pub fn parse(input: &[u8]) -> Result<Value, Error> {
    parse_limited(input, limits::INPUT_BYTES_MAX)
}

pub(crate) fn parse_limited(input: &[u8], bytes_max: usize) -> Result<Value, Error> {
    if input.len() > bytes_max {
        return Err(Error::TooLarge { max: bytes_max });
    }
    let text = std::str::from_utf8(input).map_err(|e| Error::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    Parser {
        text,
        bytes: input,
        pos: 0,
    }
    .document()
}

/// An array or object whose closing bracket has not been seen yet.
enum Frame {
    Array(Vec<Value>),
    Object(ObjectFrame),
}

struct ObjectFrame {
    members: Vec<(String, Value)>,
    /// Name of the member whose value is being parsed.
    key: String,
    /// Names seen so far, once the object outgrows a linear scan.
    names: Option<BTreeSet<String>>,
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn document(mut self) -> Result<Value, Error> {
        let mut stack: Vec<Frame> = Vec::new();
        'value: loop {
            self.skip_whitespace();
            let mut value = match self.peek() {
                Some(b'{') => {
                    self.open(stack.len())?;
                    self.skip_whitespace();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        Value::Object(Vec::new())
                    } else {
                        let mut frame = ObjectFrame {
                            members: Vec::new(),
                            key: String::new(),
                            names: None,
                        };
                        self.member_name(&mut frame)?;
                        stack.push(Frame::Object(frame));
                        continue 'value;
                    }
                }
                Some(b'[') => {
                    self.open(stack.len())?;
                    self.skip_whitespace();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        Value::Array(Vec::new())
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        continue 'value;
                    }
                }
                Some(b'"') => Value::String(self.string()?),
                Some(b't') => self.literal("true", Value::Bool(true))?,
                Some(b'f') => self.literal("false", Value::Bool(false))?,
                Some(b'n') => self.literal("null", Value::Null)?,
                Some(b'-' | b'0'..=b'9') => Value::Number(self.number()?),
                Some(_) => return Err(self.syntax("expected a JSON value")),
                None => return Err(self.syntax("unexpected end of input, expected a JSON value")),
            };
            // Attach the finished value to its container; closing a container
            // finishes another value, hence the loop.
            loop {
                self.skip_whitespace();
                match stack.last_mut() {
                    None => {
                        if self.pos != self.bytes.len() {
                            return Err(self.syntax("unexpected characters after the document"));
                        }
                        return Ok(value);
                    }
                    Some(Frame::Array(items)) => {
                        items.push(value);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                continue 'value;
                            }
                            Some(b']') => self.pos += 1,
                            _ => return Err(self.syntax("expected ',' or ']'")),
                        }
                    }
                    Some(Frame::Object(frame)) => {
                        let key = std::mem::take(&mut frame.key);
                        frame.members.push((key, value));
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_whitespace();
                                self.member_name(frame)?;
                                continue 'value;
                            }
                            Some(b'}') => self.pos += 1,
                            _ => return Err(self.syntax("expected ',' or '}'")),
                        }
                    }
                }
                value = match stack.pop() {
                    Some(Frame::Array(items)) => Value::Array(items),
                    Some(Frame::Object(frame)) => Value::Object(frame.members),
                    None => unreachable!("a container was just closed"),
                };
            }
        }
    }

    /// Consumes an opening bracket at nesting level `open + 1`.
    fn open(&mut self, open: usize) -> Result<(), Error> {
        if open >= limits::DEPTH_MAX {
            return Err(Error::too_deep(self.pos));
        }
        self.pos += 1;
        Ok(())
    }

    /// Parses `"name"` `:` into `frame.key`, rejecting names already seen.
    fn member_name(&mut self, frame: &mut ObjectFrame) -> Result<(), Error> {
        if self.peek() != Some(b'"') {
            return Err(self.syntax("expected a member name string"));
        }
        let offset = self.pos;
        let name = self.string()?;
        let seen = &frame.members;
        let duplicate = match &mut frame.names {
            Some(names) => !names.insert(name.clone()),
            None if seen.len() < limits::DUPLICATE_SCAN_MEMBERS_MAX => {
                seen.iter().any(|(key, _)| *key == name)
            }
            None => {
                let mut names: BTreeSet<String> = seen.iter().map(|(k, _)| k.clone()).collect();
                let duplicate = !names.insert(name.clone());
                frame.names = Some(names);
                duplicate
            }
        };
        if duplicate {
            return Err(Error::duplicate(&name, offset));
        }
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.syntax("expected ':' after member name"));
        }
        self.pos += 1;
        frame.key = name;
        Ok(())
    }

    fn string(&mut self) -> Result<String, Error> {
        debug_assert_eq!(self.peek(), Some(b'"'));
        self.pos += 1;
        let start = self.pos;
        // Fast path: no escapes, one copy.
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    let s = self.text[start..self.pos].to_owned();
                    self.pos += 1;
                    return Ok(s);
                }
                Some(b'\\') => break,
                Some(&b) if b < 0x20 => {
                    return Err(self.syntax("unescaped control character in string"))
                }
                Some(_) => self.pos += 1,
                None => return Err(self.syntax("unterminated string")),
            }
        }
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(&self.text[start..self.pos]);
        loop {
            let run = self.pos;
            loop {
                match self.bytes.get(self.pos) {
                    Some(b'"' | b'\\') => break,
                    Some(&b) if b < 0x20 => {
                        return Err(self.syntax("unescaped control character in string"))
                    }
                    Some(_) => self.pos += 1,
                    None => return Err(self.syntax("unterminated string")),
                }
            }
            out.push_str(&self.text[run..self.pos]);
            if self.bytes[self.pos] == b'"' {
                self.pos += 1;
                return Ok(out);
            }
            self.escape(&mut out)?;
        }
    }

    /// Decodes one escape starting at the backslash.
    fn escape(&mut self, out: &mut String) -> Result<(), Error> {
        let at = self.pos;
        let decoded = match self.bytes.get(at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let unit = self.hex4(at)?;
                self.pos = at + 6;
                let c = match unit {
                    0xD800..=0xDBFF => {
                        let low = if self.bytes.get(at + 6..at + 8) == Some(b"\\u") {
                            Some(self.hex4(at + 6)?)
                        } else {
                            None
                        };
                        match low {
                            Some(low @ 0xDC00..=0xDFFF) => {
                                self.pos = at + 12;
                                let c = 0x10000
                                    + ((u32::from(unit) - 0xD800) << 10)
                                    + (u32::from(low) - 0xDC00);
                                char::from_u32(c)
                            }
                            _ => None,
                        }
                    }
                    0xDC00..=0xDFFF => None,
                    _ => char::from_u32(u32::from(unit)),
                };
                out.push(c.ok_or(Error::LoneSurrogate { unit, offset: at })?);
                return Ok(());
            }
            Some(_) => return Err(self.syntax("invalid escape sequence")),
            None => return Err(self.syntax("unterminated string")),
        };
        out.push(decoded);
        self.pos = at + 2;
        Ok(())
    }

    /// The four hex digits of the `\u` escape whose backslash is at `at`.
    fn hex4(&self, at: usize) -> Result<u16, Error> {
        let digits = self.bytes.get(at + 2..at + 6).ok_or(Error::Syntax {
            offset: at,
            reason: "\\u escape needs four hex digits",
        })?;
        digits.iter().try_fold(0u16, |acc, &d| {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => {
                    return Err(Error::Syntax {
                        offset: at,
                        reason: "\\u escape needs four hex digits",
                    })
                }
            };
            Ok(acc << 4 | u16::from(v))
        })
    }

    fn number(&mut self) -> Result<f64, Error> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(Error::Syntax {
                        offset: start,
                        reason: "leading zero in number",
                    });
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.syntax("expected a digit")),
        }
        let int_end = self.pos;
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.syntax("expected a digit after the decimal point"));
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            integer = false;
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.syntax("expected a digit in the exponent"));
            }
            self.digits();
        }
        let digits_start = start + usize::from(negative);
        // Integers of up to 15 digits are exact in a double: skip the general
        // decimal-to-binary conversion for the common case of amounts and counts.
        if integer && int_end - digits_start <= 15 {
            let magnitude = self.bytes[digits_start..int_end]
                .iter()
                .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
            #[allow(clippy::cast_precision_loss)] // at most 15 digits: exact
            let magnitude = magnitude as f64;
            return Ok(if negative { -magnitude } else { magnitude });
        }
        // The grammar checked above is a subset of what `f64::from_str`
        // accepts, and that conversion is correctly rounded.
        let n: f64 = self.text[start..self.pos]
            .parse()
            .map_err(|_| Error::Syntax {
                offset: start,
                reason: "malformed number",
            })?;
        if n.is_finite() {
            Ok(n)
        } else {
            Err(Error::NonFiniteNumber { offset: start })
        }
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &'static str, value: Value) -> Result<Value, Error> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn syntax(&self, reason: &'static str) -> Error {
        Error::Syntax {
            offset: self.pos,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(input: &str) -> (&'static str, Option<usize>) {
        let e = parse(input.as_bytes()).unwrap_err();
        (e.rule(), e.offset())
    }

    #[test]
    fn scalars_and_whitespace() {
        assert_eq!(parse(b" \t\r\ntrue\n").unwrap(), Value::Bool(true));
        assert_eq!(
            parse(b"-0").unwrap().as_f64().map(f64::to_bits),
            Some((-0.0f64).to_bits())
        );
        assert_eq!(
            parse(b"123456789012345").unwrap(),
            Value::Number(123456789012345.0)
        );
        assert_eq!(parse(b"1.5e3").unwrap(), Value::Number(1500.0));
        assert_eq!(parse(b"1e-400").unwrap(), Value::Number(0.0));
        assert_eq!(
            parse(br#""a\u00e9\n\ud83d\ude02""#).unwrap(),
            Value::String("a\u{e9}\n\u{1f602}".into())
        );
    }

    #[test]
    fn objects_keep_input_order() {
        let v = parse(br#"{"b":1,"a":[null,{}],"c":{"d":[]}}"#).unwrap();
        let names: Vec<&str> = v
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(names, ["b", "a", "c"]);
    }

    #[test]
    fn grammar_errors_point_at_the_byte() {
        assert_eq!(err(""), ("syntax", Some(0)));
        assert_eq!(err("[1,]"), ("syntax", Some(3)));
        assert_eq!(err("{\"a\" 1}"), ("syntax", Some(5)));
        assert_eq!(err("{\"a\":1,}"), ("syntax", Some(7)));
        assert_eq!(err("tru"), ("syntax", Some(0)));
        assert_eq!(err("\"\\x\""), ("syntax", Some(1)));
        assert_eq!(err("\"\\u12\""), ("syntax", Some(1)));
        assert_eq!(err("1."), ("syntax", Some(2)));
        assert_eq!(err("-"), ("syntax", Some(1)));
        assert_eq!(err("1e+"), ("syntax", Some(3)));
        assert_eq!(err("\u{feff}1"), ("syntax", Some(0)));
    }

    #[test]
    fn large_objects_still_find_duplicates() {
        let mut doc = String::from("{");
        for i in 0..100 {
            doc.push_str(&format!("\"k{i}\":{i},"));
        }
        let offset = doc.len();
        doc.push_str("\"k42\":0}");
        assert_eq!(err(&doc), ("duplicate-name", Some(offset)));
        doc.truncate(offset);
        doc.push_str("\"k100\":0}");
        assert_eq!(
            parse(doc.as_bytes()).unwrap().as_object().unwrap().len(),
            101
        );
    }

    #[test]
    fn depth_limit_is_exact() {
        let ok = format!(
            "{}{}",
            "[".repeat(limits::DEPTH_MAX),
            "]".repeat(limits::DEPTH_MAX)
        );
        assert!(parse(ok.as_bytes()).is_ok());
        let deep = limits::DEPTH_MAX + 1;
        let bad = format!("{}{}", "[".repeat(deep), "]".repeat(deep));
        assert_eq!(err(&bad), ("too-deep", Some(limits::DEPTH_MAX)));
    }
}
