//! Fingerprint specs: which fields of a body are fingerprinted (steps 2-5 of
//! the contract), the built-in orders spec, and the spec's JSON form.
//!
//! Exclusion removes object members only: an excluded pointer may pass through
//! array elements (`/items/0/note` removes `note` from the first item), but a
//! pointer whose last step lands on an array element (`/items/0`) or on the
//! whole document (`""`) removes nothing, because deleting array elements would
//! shift the indices other pointers and the business meaning depend on.
//! [`Spec::from_json`] rejects `""` in `exclude` for that reason.

use std::fmt::Write as _;

use crate::canonical::{self, cmp_utf16};
use crate::digest::{hmac_fingerprint, sha256_fingerprint, Fingerprint};
use crate::error::Error;
use crate::limits;
use crate::parse::parse_limited;
use crate::pointer::Pointer;
use crate::value::{array_index, Value};

/// Which pointers make up the projection `P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// `P[pointer] = value` for every pointer present in the body.
    Include(Vec<Pointer>),
    /// `P` is the body without the object members these pointers name;
    /// pointers ending at an array element or at `""` remove nothing.
    Exclude(Vec<Pointer>),
}

/// A fingerprint spec for one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub operation: String,
    pub version: u32,
    pub selection: Selection,
}

/// Member names of `POST /v1/orders` that decide whether two requests are the
/// same order; `metadata` is deliberately absent (contract section 4).
const ORDERS_INCLUDE: [&str; 7] = [
    "/client_order_id",
    "/cart_id",
    "/amount",
    "/currency",
    "/items",
    "/shipping_address_id",
    "/quote_id",
];

impl Spec {
    /// The built-in spec of `POST /v1/orders`, version 1.
    pub fn orders() -> Spec {
        Spec {
            operation: "POST:/v1/orders".to_owned(),
            version: 1,
            selection: Selection::Include(
                ORDERS_INCLUDE
                    .iter()
                    .map(|p| Pointer::from_tokens([&p[1..]]))
                    .collect(),
            ),
        }
    }

    /// Reads `{"operation": string, "version": u32, "include" | "exclude":
    /// [pointer, ...]}`. Exactly one of `include`/`exclude`; unknown members,
    /// malformed or repeated pointers, an empty operation, a non-integer
    /// version and `""` in `exclude` are errors naming the offending place.
    pub fn from_json(input: &[u8]) -> Result<Spec, Error> {
        let doc = parse_limited(input, limits::SPEC_BYTES_MAX)?;
        let members = doc
            .as_object()
            .ok_or_else(|| Error::spec("", "a spec must be a JSON object"))?;
        let mut operation = None;
        let mut version = None;
        let mut selection = None;
        for (name, value) in members {
            let at = Pointer::from_tokens([name.as_str()]).to_string();
            match name.as_str() {
                "operation" => operation = Some(read_operation(&at, value)?),
                "version" => version = Some(read_version(&at, value)?),
                "include" | "exclude" => {
                    if selection.is_some() {
                        return Err(Error::spec(
                            at,
                            "give either \"include\" or \"exclude\", not both",
                        ));
                    }
                    let pointers = read_pointers(&at, value, name == "exclude")?;
                    selection = Some(if name == "include" {
                        Selection::Include(pointers)
                    } else {
                        Selection::Exclude(pointers)
                    });
                }
                _ => return Err(Error::spec(at, format!("unknown member {name:?}"))),
            }
        }
        Ok(Spec {
            operation: operation.ok_or_else(|| Error::spec("", "missing member \"operation\""))?,
            version: version.ok_or_else(|| Error::spec("", "missing member \"version\""))?,
            selection: selection
                .ok_or_else(|| Error::spec("", "missing member \"include\" or \"exclude\""))?,
        })
    }

    /// The canonical JSON form of the spec, as published by
    /// `GET /v1/fingerprint-specs`; [`Spec::from_json`] reads it back.
    pub fn to_json(&self) -> String {
        let (name, pointers) = match &self.selection {
            Selection::Include(p) => ("include", p),
            Selection::Exclude(p) => ("exclude", p),
        };
        let list = pointers
            .iter()
            .map(|p| Value::String(p.to_string()))
            .collect();
        canonical::canonicalize(&Value::Object(vec![
            (name.to_owned(), Value::Array(list)),
            (
                "operation".to_owned(),
                Value::String(self.operation.clone()),
            ),
            ("version".to_owned(), Value::Number(f64::from(self.version))),
        ]))
    }

    /// The projection `P` of contract step 2. For `include`, members are named
    /// by the pointers' string form, in spec order (a repeated pointer counts
    /// once); absent pointers are left out and `null` is kept. For `exclude`,
    /// the body without the excluded object members (see the module docs).
    pub fn project(&self, body: &Value) -> Value {
        match &self.selection {
            Selection::Include(pointers) => Value::Object(
                included(pointers, body)
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value.clone()))
                    .collect(),
            ),
            Selection::Exclude(pointers) => excluded(pointers, body),
        }
    }

    /// The preimage `{"fields": P, "op": operation, "v": version}` (step 3).
    pub fn preimage(&self, body: &Value) -> Value {
        Value::Object(vec![
            ("fields".to_owned(), self.project(body)),
            ("op".to_owned(), Value::String(self.operation.clone())),
            ("v".to_owned(), Value::Number(f64::from(self.version))),
        ])
    }

    /// The RFC 8785 form of the preimage (step 4), written directly from the
    /// body for `include` specs so no projected copy is built.
    ///
    /// # Panics
    ///
    /// If a selected part of a hand-built body holds a non-finite number
    /// (parsed bodies never do).
    pub fn canonical_preimage(&self, body: &Value) -> String {
        let mut out = String::with_capacity(256);
        out.push_str("{\"fields\":");
        let written = match &self.selection {
            Selection::Include(pointers) => {
                let mut fields = included(pointers, body);
                fields.sort_by(|a, b| cmp_utf16(a.0, b.0));
                canonical::write_members(&mut out, fields.into_iter())
            }
            Selection::Exclude(pointers) => {
                canonical::write_value(&mut out, &excluded(pointers, body))
            }
        };
        if written.is_err() {
            // Same message and rule as canonicalizing the projection by hand.
            panic!(
                "canonical_preimage: {}",
                canonical::try_canonicalize(&self.project(body))
                    .err()
                    .map_or_else(String::new, |e| e.to_string())
            );
        }
        out.push_str(",\"op\":");
        canonical::write_string(&mut out, &self.operation);
        // `write!` into a String cannot fail.
        let _ = write!(out, ",\"v\":{}}}", self.version);
        out
    }

    /// `sha256:<hex>` of the canonical preimage (step 5).
    pub fn fingerprint(&self, body: &Value) -> Fingerprint {
        sha256_fingerprint(self.canonical_preimage(body).as_bytes())
    }

    /// `hmac-sha256:<hex>` of the canonical preimage under `secret`.
    pub fn fingerprint_hmac(&self, secret: &[u8], body: &Value) -> Fingerprint {
        hmac_fingerprint(secret, self.canonical_preimage(body).as_bytes())
    }
}

/// `(pointer string, value)` for each included pointer present in `body`, in
/// spec order, each pointer once.
fn included<'a>(pointers: &'a [Pointer], body: &'a Value) -> Vec<(&'a str, &'a Value)> {
    let mut fields: Vec<(&str, &Value)> = Vec::with_capacity(pointers.len());
    for (i, pointer) in pointers.iter().enumerate() {
        if pointers[..i].contains(pointer) {
            continue;
        }
        if let Some(value) = body.pointer(pointer) {
            fields.push((pointer.as_str(), value));
        }
    }
    fields
}

/// `body` without the object members the pointers name.
fn excluded(pointers: &[Pointer], body: &Value) -> Value {
    let mut projection = body.clone();
    for pointer in pointers {
        remove_member(&mut projection, pointer.tokens());
    }
    projection
}

fn remove_member(value: &mut Value, tokens: &[String]) {
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    let mut current = value;
    for token in parents {
        let next = match current {
            Value::Object(members) => members
                .iter_mut()
                .find(|(name, _)| name == token)
                .map(|(_, v)| v),
            Value::Array(items) => array_index(token).and_then(|i| items.get_mut(i)),
            _ => None,
        };
        match next {
            Some(next) => current = next,
            None => return,
        }
    }
    if let Value::Object(members) = current {
        members.retain(|(name, _)| name != last);
    }
}

fn read_operation(at: &str, value: &Value) -> Result<String, Error> {
    let operation = value
        .as_str()
        .ok_or_else(|| Error::spec(at, "\"operation\" must be a string"))?;
    if operation.is_empty() || operation.len() > limits::OPERATION_BYTES_MAX {
        return Err(Error::spec(
            at,
            format!(
                "\"operation\" must be 1 to {} bytes",
                limits::OPERATION_BYTES_MAX
            ),
        ));
    }
    Ok(operation.to_owned())
}

fn read_version(at: &str, value: &Value) -> Result<u32, Error> {
    match value.as_f64() {
        Some(n) if n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // range checked
            Ok(n as u32)
        }
        _ => Err(Error::spec(
            at,
            "\"version\" must be an integer from 0 to 4294967295",
        )),
    }
}

fn read_pointers(at: &str, value: &Value, exclude: bool) -> Result<Vec<Pointer>, Error> {
    let items = value
        .as_array()
        .ok_or_else(|| Error::spec(at, "must be an array of JSON pointer strings"))?;
    if items.len() > limits::POINTERS_MAX {
        return Err(Error::spec(
            at,
            format!("at most {} pointers are allowed", limits::POINTERS_MAX),
        ));
    }
    let mut pointers: Vec<Pointer> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{at}/{i}");
        let text = item
            .as_str()
            .ok_or_else(|| Error::spec(&at, "must be a JSON pointer string"))?;
        let pointer = Pointer::parse(text).map_err(|e| Error::spec(&at, e.to_string()))?;
        if exclude && pointer.is_root() {
            return Err(Error::spec(
                &at,
                "excluding \"\" (the whole document) would leave nothing to fingerprint",
            ));
        }
        if let Some(first) = pointers.iter().position(|p| *p == pointer) {
            return Err(Error::spec(
                &at,
                format!("pointer {text:?} repeats entry {first}"),
            ));
        }
        pointers.push(pointer);
    }
    Ok(pointers)
}
