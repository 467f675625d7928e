//! The browser and Node face of `keyhold-fingerprint`: wasm-bindgen exports
//! (`canonicalize`, `preimage`, `fingerprint`, `fingerprintHmac`, `specs`,
//! `version`) that the package `@keyhold/fingerprint` ships, and the plain Rust
//! functions behind them. The Rust functions hold all the logic and compile on
//! every target, so native tests and the parity corpus exercise the same code
//! the browser runs; the exports only move strings across the boundary and turn
//! [`Error`] into a JS `Error` whose message is the CLI's `rule: message` and
//! which carries `rule`, `offset` (a byte offset into the UTF-8 form of the
//! input, or `undefined`) and `input` (`"body"` or `"spec"`) properties.
//!
//! JS strings may hold lone surrogates, which UTF-8 cannot: wasm-bindgen would
//! silently turn them into U+FFFD. The exports check the JS string first and
//! throw `lone-surrogate` at the byte where the surrogate stands, as the
//! native parser does for an escaped `\uD800`.

use keyhold_fingerprint::{self as fp, Error, Spec};
use std::borrow::Cow;
use std::sync::OnceLock;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Which argument an error is about, as the `input` property of the JS error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Body,
    Spec,
}

impl Input {
    pub fn as_str(self) -> &'static str {
        match self {
            Input::Body => "body",
            Input::Spec => "spec",
        }
    }
}

/// An [`Error`] and the argument it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: Error,
    pub input: Input,
}

impl Failure {
    fn body(error: Error) -> Failure {
        Failure {
            error,
            input: Input::Body,
        }
    }

    /// `rule: message`, the same line the CLI prints before the input's name.
    pub fn message(&self) -> String {
        error_message(&self.error)
    }
}

/// `rule: message`, as the CLI prints it (without the trailing input name).
pub fn error_message(e: &Error) -> String {
    format!("{}: {e}", e.rule())
}

/// The built-in orders spec, built once (it is asked for on every call).
fn orders_spec() -> &'static Spec {
    static ORDERS: OnceLock<Spec> = OnceLock::new();
    ORDERS.get_or_init(Spec::orders)
}

/// `None` and `"orders"` name the built-in orders spec; anything else is read
/// as a spec document.
pub fn resolve_spec(spec: Option<&str>) -> Result<Cow<'static, Spec>, Failure> {
    match spec {
        None | Some("orders") => Ok(Cow::Borrowed(orders_spec())),
        Some(text) => Spec::from_json(text.as_bytes())
            .map(Cow::Owned)
            .map_err(|error| Failure {
                error,
                input: Input::Spec,
            }),
    }
}

/// The RFC 8785 canonical form of a JSON text.
pub fn canonical_text(json: &str) -> Result<String, Failure> {
    let value = fp::parse(json.as_bytes()).map_err(Failure::body)?;
    fp::try_canonicalize(&value).map_err(Failure::body)
}

/// The canonical preimage `{"fields":…,"op":…,"v":…}` of a body under a spec.
pub fn preimage_text(json: &str, spec: Option<&str>) -> Result<String, Failure> {
    let spec = resolve_spec(spec)?;
    let body = fp::parse(json.as_bytes()).map_err(Failure::body)?;
    Ok(spec.canonical_preimage(&body))
}

/// `sha256:<hex>` of a body under a spec, as sent in `Idempotency-Fingerprint`.
pub fn fingerprint_text(json: &str, spec: Option<&str>) -> Result<String, Failure> {
    let spec = resolve_spec(spec)?;
    let body = fp::parse(json.as_bytes()).map_err(Failure::body)?;
    Ok(spec.fingerprint(&body).into_string())
}

/// `hmac-sha256:<hex>` of a body under a spec and secret.
pub fn fingerprint_hmac_text(
    json: &str,
    secret: &[u8],
    spec: Option<&str>,
) -> Result<String, Failure> {
    let spec = resolve_spec(spec)?;
    let body = fp::parse(json.as_bytes()).map_err(Failure::body)?;
    Ok(spec.fingerprint_hmac(secret, &body).into_string())
}

/// The built-in specs in the shape of `GET /v1/fingerprint-specs`:
/// `{"data":[spec, ...]}`, each spec in its canonical JSON form.
pub fn specs_json() -> String {
    format!("{{\"data\":[{}]}}", orders_spec().to_json())
}

/// Byte offset in `text` (UTF-8) of the character at UTF-16 index `units`.
pub fn utf8_offset_of_utf16_index(text: &str, units: usize) -> usize {
    let mut seen = 0;
    for (offset, c) in text.char_indices() {
        if seen >= units {
            return offset;
        }
        seen += c.len_utf16();
    }
    text.len()
}

// ---------------------------------------------------------------- JS exports

#[wasm_bindgen]
extern "C" {
    /// A JS `Error`, with the properties this module adds.
    #[wasm_bindgen(js_name = Error)]
    type JsError;
    #[wasm_bindgen(constructor, js_class = "Error")]
    fn new(message: &str) -> JsError;
    #[wasm_bindgen(method, setter = name)]
    fn set_name(this: &JsError, name: &str);
    #[wasm_bindgen(method, setter = rule)]
    fn set_rule(this: &JsError, rule: &str);
    #[wasm_bindgen(method, setter = offset)]
    fn set_offset(this: &JsError, offset: Option<u32>);
    #[wasm_bindgen(method, setter = input)]
    fn set_input(this: &JsError, input: &str);

    /// A JS string seen as UTF-16 code units.
    #[wasm_bindgen(js_name = String)]
    type JsText;
    /// `String.prototype.isWellFormed`; throws where the engine lacks it.
    #[wasm_bindgen(method, catch, js_name = isWellFormed)]
    fn is_well_formed(this: &JsText) -> Result<bool, JsValue>;
    #[wasm_bindgen(method, getter)]
    fn length(this: &JsText) -> u32;
    #[wasm_bindgen(method, js_name = charCodeAt)]
    fn char_code_at(this: &JsText, index: u32) -> u16;
}

fn js_error(message: &str, rule: &str, offset: Option<usize>, input: Input) -> JsValue {
    let e = JsError::new(message);
    e.set_name("FingerprintError");
    e.set_rule(rule);
    e.set_offset(offset.map(|o| u32::try_from(o).unwrap_or(u32::MAX)));
    e.set_input(input.as_str());
    e.into()
}

fn to_js(failure: &Failure) -> JsValue {
    js_error(
        &failure.message(),
        failure.error.rule(),
        failure.error.offset(),
        failure.input,
    )
}

/// UTF-16 index and value of the first lone surrogate of a JS string.
fn lone_surrogate(text: &JsText) -> Option<(u32, u16)> {
    if let Ok(true) = text.is_well_formed() {
        return None;
    }
    let len = text.length();
    let mut i = 0;
    while i < len {
        let unit = text.char_code_at(i);
        match unit {
            0xd800..=0xdbff
                if i + 1 < len && (0xdc00..=0xdfff).contains(&text.char_code_at(i + 1)) =>
            {
                i += 2;
                continue;
            }
            0xd800..=0xdfff => return Some((i, unit)),
            _ => i += 1,
        }
    }
    None
}

/// The Rust string of a JS string argument, refusing non-strings and lone
/// surrogates (which the UTF-8 conversion would otherwise hide).
fn js_text(value: &JsValue, input: Input) -> Result<String, JsValue> {
    let Some(text) = value.as_string() else {
        let message = format!("type: the {} must be a string", input.as_str());
        return Err(js_error(&message, "type", None, input));
    };
    if let Some((index, unit)) = lone_surrogate(value.unchecked_ref::<JsText>()) {
        let offset = utf8_offset_of_utf16_index(&text, index as usize);
        let error = Error::LoneSurrogate { unit, offset };
        return Err(to_js(&Failure { error, input }));
    }
    Ok(text)
}

fn js_spec(spec: &JsValue) -> Result<Option<String>, JsValue> {
    if spec.is_undefined() || spec.is_null() {
        Ok(None)
    } else {
        js_text(spec, Input::Spec).map(Some)
    }
}

/// RFC 8785 canonical form of a JSON text; throws on I-JSON violations.
#[wasm_bindgen(js_name = canonicalize)]
pub fn js_canonicalize(
    #[wasm_bindgen(unchecked_param_type = "string")] json: JsValue,
) -> Result<String, JsValue> {
    canonical_text(&js_text(&json, Input::Body)?).map_err(|f| to_js(&f))
}

/// The canonical preimage of a body under a spec (`"orders"`, a spec JSON
/// text, or nothing for the orders spec).
#[wasm_bindgen(js_name = preimage)]
pub fn js_preimage(
    #[wasm_bindgen(unchecked_param_type = "string")] json: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "string | null")] spec: JsValue,
) -> Result<String, JsValue> {
    let body = js_text(&json, Input::Body)?;
    preimage_text(&body, js_spec(&spec)?.as_deref()).map_err(|f| to_js(&f))
}

/// `sha256:<hex>` of a body under a spec (`"orders"` by default).
#[wasm_bindgen(js_name = fingerprint)]
pub fn js_fingerprint(
    #[wasm_bindgen(unchecked_param_type = "string")] json: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "string | null")] spec: JsValue,
) -> Result<String, JsValue> {
    let body = js_text(&json, Input::Body)?;
    fingerprint_text(&body, js_spec(&spec)?.as_deref()).map_err(|f| to_js(&f))
}

/// `hmac-sha256:<hex>` of a body under a secret (bytes) and spec.
#[wasm_bindgen(js_name = fingerprintHmac)]
pub fn js_fingerprint_hmac(
    #[wasm_bindgen(unchecked_param_type = "string")] json: JsValue,
    secret: &[u8],
    #[wasm_bindgen(unchecked_optional_param_type = "string | null")] spec: JsValue,
) -> Result<String, JsValue> {
    let body = js_text(&json, Input::Body)?;
    fingerprint_hmac_text(&body, secret, js_spec(&spec)?.as_deref()).map_err(|f| to_js(&f))
}

/// The built-in specs as JSON, shaped like `GET /v1/fingerprint-specs`.
#[wasm_bindgen(js_name = specs)]
pub fn js_specs() -> String {
    specs_json()
}

/// The version of the fingerprint code in this module.
#[wasm_bindgen(js_name = version)]
pub fn js_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_like_the_cli() {
        let f = canonical_text(r#"{"a":1,"b":2,"a":3}"#).unwrap_err();
        assert_eq!(f.input, Input::Body);
        assert_eq!(f.error.rule(), "duplicate-name");
        assert_eq!(f.error.offset(), Some(13));
        assert_eq!(
            f.message(),
            "duplicate-name: duplicate member name \"a\" at byte 13"
        );
        let f = canonical_text(r#"["\ud800"]"#).unwrap_err();
        assert_eq!(
            f.message(),
            "lone-surrogate: lone surrogate \\ud800 at byte 2"
        );
    }

    #[test]
    fn specs_by_name_or_document() {
        let body = r#"{"amount":5,"currency":"EUR","metadata":{"x":1}}"#;
        let orders = fingerprint_text(body, None).unwrap();
        assert_eq!(fingerprint_text(body, Some("orders")).unwrap(), orders);
        let spec = Spec::orders().to_json();
        assert_eq!(fingerprint_text(body, Some(&spec)).unwrap(), orders);
        assert_eq!(
            preimage_text(body, None).unwrap(),
            r#"{"fields":{"/amount":5,"/currency":"EUR"},"op":"POST:/v1/orders","v":1}"#
        );
        let bad = fingerprint_text(body, Some("{")).unwrap_err();
        assert_eq!(bad.input, Input::Spec);
        let bad = fingerprint_text(body, Some(r#"{"operation":"x","version":1}"#)).unwrap_err();
        assert_eq!(bad.error.rule(), "spec");
    }

    #[test]
    fn hmac_and_specs_document() {
        let body = r#"{"amount":5}"#;
        let keyed = fingerprint_hmac_text(body, b"secret", None).unwrap();
        assert!(keyed.starts_with("hmac-sha256:") && keyed.len() == 12 + 64);
        let specs = specs_json();
        assert!(specs.starts_with(r#"{"data":[{"include":["/client_order_id""#));
        assert_eq!(canonical_text(&specs).unwrap(), specs);
    }

    #[test]
    fn utf16_indices_map_to_utf8_offsets() {
        let text = "a\u{e9}\u{1f600}\u{fffd}b";
        assert_eq!(utf8_offset_of_utf16_index(text, 0), 0);
        assert_eq!(utf8_offset_of_utf16_index(text, 1), 1);
        assert_eq!(utf8_offset_of_utf16_index(text, 2), 3);
        assert_eq!(utf8_offset_of_utf16_index(text, 4), 7);
        assert_eq!(utf8_offset_of_utf16_index(text, 5), 10);
        assert_eq!(utf8_offset_of_utf16_index(text, 9), text.len());
    }
}
