//! The JSON value model: what [`crate::parse`] produces and what
//! canonicalization and projection consume. Objects keep their members in input
//! order (RFC 8785 sorts at output time), and parsed objects never hold two
//! members with the same name.

use crate::pointer::Pointer;

/// A JSON value. Numbers are IEEE-754 doubles, as in I-JSON and RFC 8785.
///
/// Values built by hand should keep numbers finite and object member names
/// unique: [`crate::canonicalize`] panics on NaN/infinity (use
/// [`crate::try_canonicalize`] for untrusted hand-built values), and duplicate
/// names would appear twice in the output.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Value>),
    /// Members in input order.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The member `name` of an object; `None` for other values or when absent.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.as_object()?
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(members) => Some(members),
            _ => None,
        }
    }

    /// The value `p` points to (RFC 6901), or `None` when absent.
    pub fn pointer(&self, p: &Pointer) -> Option<&Value> {
        p.tokens()
            .iter()
            .try_fold(self, |value, token| step(value, token))
    }
}

/// One RFC 6901 reference step: a member name for objects, a canonical decimal
/// index for arrays (no leading zeros, no `-`, which names the slot past the end).
pub(crate) fn step<'v>(value: &'v Value, token: &str) -> Option<&'v Value> {
    match value {
        Value::Object(_) => value.get(token),
        Value::Array(items) => items.get(array_index(token)?),
        _ => None,
    }
}

pub(crate) fn array_index(token: &str) -> Option<usize> {
    let bytes = token.as_bytes();
    let canonical = match bytes {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if canonical {
        token.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_indices_are_canonical_decimals() {
        assert_eq!(array_index("0"), Some(0));
        assert_eq!(array_index("12"), Some(12));
        assert_eq!(array_index("01"), None);
        assert_eq!(array_index("-"), None);
        assert_eq!(array_index("+1"), None);
        assert_eq!(array_index(""), None);
        assert_eq!(array_index("99999999999999999999999"), None);
    }

    #[test]
    fn accessors() {
        let v = Value::Object(vec![
            ("a".into(), Value::Array(vec![Value::Number(1.0)])),
            ("s".into(), Value::String("x".into())),
        ]);
        assert_eq!(v.get("s").and_then(Value::as_str), Some("x"));
        assert_eq!(
            v.get("a").and_then(Value::as_array).map(<[_]>::len),
            Some(1)
        );
        assert_eq!(v.get("zz"), None);
        assert_eq!(Value::Null.get("a"), None);
        assert_eq!(Value::Number(2.5).as_f64(), Some(2.5));
        assert!(v.as_object().is_some());
    }
}
