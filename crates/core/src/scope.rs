//! Scopes: the `(tenant, operation, idempotency key)` triple a record lives under.
//!
//! Each part is a validated newtype, so a `Scope` that exists is a scope that obeys
//! the contract's character and length rules; code past the HTTP edge never checks
//! them again.

use crate::limits::{KEY_LENGTH_MAX, OPERATION_LENGTH_MAX, TENANT_ID_LENGTH_MAX};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("idempotency key must be 1 to {KEY_LENGTH_MAX} characters, got {0}")]
    KeyLength(usize),
    #[error("idempotency key may only contain visible ASCII (0x21-0x7E); byte {0} is not")]
    KeyCharacter(usize),
    #[error(
        "operation must be METHOD:/path with 1 to {OPERATION_LENGTH_MAX} visible ASCII characters"
    )]
    Operation,
    #[error("tenant id must be 1 to {TENANT_ID_LENGTH_MAX} of [A-Za-z0-9_.-]")]
    TenantId,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TenantId(String);

impl TenantId {
    pub fn parse(text: &str) -> Result<TenantId, ScopeError> {
        let ok = !text.is_empty()
            && text.len() <= TENANT_ID_LENGTH_MAX
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(ScopeError::TenantId);
        }
        Ok(TenantId(text.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Operation(String);

impl Operation {
    pub const ORDERS_CREATE: &'static str = "POST:/v1/orders";

    /// `METHOD:/path-template`: an upper-case method, a colon, then a path starting
    /// with `/`; visible ASCII only.
    pub fn parse(text: &str) -> Result<Operation, ScopeError> {
        let Some((method, path)) = text.split_once(':') else {
            return Err(ScopeError::Operation);
        };
        let ok = text.len() <= OPERATION_LENGTH_MAX
            && !method.is_empty()
            && method.bytes().all(|b| b.is_ascii_uppercase())
            && path.starts_with('/')
            && path.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !ok {
            return Err(ScopeError::Operation);
        }
        Ok(Operation(text.to_owned()))
    }

    pub fn orders_create() -> Operation {
        Operation(Self::ORDERS_CREATE.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(text: &str) -> Result<IdempotencyKey, ScopeError> {
        if text.is_empty() || text.len() > KEY_LENGTH_MAX {
            return Err(ScopeError::KeyLength(text.len()));
        }
        if let Some(at) = text.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(ScopeError::KeyCharacter(at));
        }
        Ok(IdempotencyKey(text.to_owned()))
    }

    /// Parses the `Idempotency-Key` header value: an RFC 8941 sf-string (`"abc"`,
    /// with `\"` and `\\` escapes) or a bare token (`abc`).
    pub fn from_header(value: &str) -> Result<IdempotencyKey, ScopeError> {
        let Some(quoted) = value.strip_prefix('"') else {
            return IdempotencyKey::parse(value);
        };
        let mut out = String::with_capacity(quoted.len());
        let mut chars = quoted.char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '"' => {
                    // The closing quote must end the value.
                    if at + 1 != quoted.len() {
                        return Err(ScopeError::KeyCharacter(at + 1));
                    }
                    return IdempotencyKey::parse(&out);
                }
                '\\' => match chars.next() {
                    Some((_, e @ ('"' | '\\'))) => out.push(e),
                    _ => return Err(ScopeError::KeyCharacter(at + 1)),
                },
                c => out.push(c),
            }
        }
        // No closing quote.
        Err(ScopeError::KeyCharacter(value.len()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What kind of work a scope belongs to. Claims name operations of the tenant's own
/// services, so they live in a namespace of their own and can never collide with
/// the records keyhold keeps for its built-in orders operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Namespace {
    Orders,
    Claims,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Scope {
    pub namespace: Namespace,
    pub tenant: TenantId,
    pub operation: Operation,
    pub key: IdempotencyKey,
}

impl Scope {
    /// The record's storage key: namespace byte, then the three parts separated by
    /// NUL, which none of them may contain.
    pub fn storage_key(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(4 + self.tenant.0.len() + self.operation.0.len() + self.key.0.len());
        out.push(match self.namespace {
            Namespace::Orders => b'o',
            Namespace::Claims => b'c',
        });
        out.extend_from_slice(self.tenant.0.as_bytes());
        out.push(0);
        out.extend_from_slice(self.operation.0.as_bytes());
        out.push(0);
        out.extend_from_slice(self.key.0.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        assert!(IdempotencyKey::parse("abc-123").is_ok());
        assert_eq!(IdempotencyKey::parse(""), Err(ScopeError::KeyLength(0)));
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(ScopeError::KeyLength(256))
        );
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse("a b"),
            Err(ScopeError::KeyCharacter(1))
        );
        assert_eq!(IdempotencyKey::parse("é"), Err(ScopeError::KeyCharacter(0)));
    }

    #[test]
    fn header_forms() {
        let k = |s| IdempotencyKey::from_header(s).map(|k| k.0);
        assert_eq!(k("abc"), Ok("abc".into()));
        assert_eq!(k("\"abc\""), Ok("abc".into()));
        assert_eq!(k(r#""a\"b""#), Ok("a\"b".into()));
        assert_eq!(k("\"\""), Err(ScopeError::KeyLength(0)));
        assert!(k("\"abc").is_err());
        assert!(k("\"ab\"c").is_err());
        assert!(k(r#""a\b""#).is_err());
    }

    #[test]
    fn operations() {
        assert!(Operation::parse("POST:/v1/orders").is_ok());
        assert!(Operation::parse("PUT:/v1/things/{id}").is_ok());
        assert!(Operation::parse("post:/x").is_err());
        assert!(Operation::parse("POST/x").is_err());
        assert!(Operation::parse("POST:x").is_err());
    }

    #[test]
    fn namespaces_do_not_collide() {
        let scope = |namespace| Scope {
            namespace,
            tenant: TenantId::parse("t1").unwrap(),
            operation: Operation::orders_create(),
            key: IdempotencyKey::parse("k").unwrap(),
        };
        assert_ne!(
            scope(Namespace::Orders).storage_key(),
            scope(Namespace::Claims).storage_key()
        );
    }
}
