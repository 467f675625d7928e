//! Canonical request fingerprints: strict I-JSON parsing, RFC 8785 serialization,
//! projection by fingerprint spec, and SHA-256 / HMAC-SHA256 digests. This is
//! section 3 of the keyhold contract, shared by the server, the native CLI and
//! the WASM module, so it depends on nothing that cannot build for
//! `wasm32-unknown-unknown`.
//!
//! ```
//! use keyhold_fingerprint::{parse, Spec};
//! let body = parse(br#"{"amount": 1999, "currency": "EUR", "client_order_id": "c-1",
//!                      "cart_id": "k", "metadata": {"note": "not fingerprinted"}}"#)?;
//! let spec = Spec::orders();
//! assert_eq!(
//!     spec.canonical_preimage(&body),
//!     r#"{"fields":{"/amount":1999,"/cart_id":"k","/client_order_id":"c-1","/currency":"EUR"},"op":"POST:/v1/orders","v":1}"#
//! );
//! assert!(spec.fingerprint(&body).as_str().starts_with("sha256:"));
//! # Ok::<(), keyhold_fingerprint::Error>(())
//! ```
//!
//! # Choices the contract leaves open
//!
//! - **Exclusion removes object members only.** An excluded pointer may pass
//!   through array elements (`/items/0/note` drops `note` from the first item),
//!   but a pointer whose last step names an array element (`/items/0`) or the
//!   whole document (`""`) removes nothing: deleting elements would shift the
//!   indices that other pointers and the array's meaning rely on.
//!   [`Spec::from_json`] rejects `""` in `exclude`.
//! - **Include keys are the pointers' string form** (`"/amount"`); a pointer
//!   listed twice counts once ([`Spec::from_json`] rejects repeats).
//! - **Accepted I-JSON edge cases:** noncharacters (U+FFFF), `\u0000`, numbers
//!   that underflow to zero. A leading byte order mark is a syntax error.
//! - **Limits** are in [`limits`]; nesting is bounded by [`limits::DEPTH_MAX`]
//!   and parsing never recurses, so no input can overflow the stack.
//! - **Hand-built values** must hold finite numbers: [`canonicalize`] and the
//!   [`Spec`] digest methods panic on NaN/infinity (parsed values never hold
//!   them); [`try_canonicalize`] reports them instead.

mod canonical;
mod digest;
mod error;
pub mod limits;
mod parse;
mod pointer;
mod spec;
mod value;

pub use canonical::{canonicalize, canonicalize_bytes, cmp_utf16, try_canonicalize};
pub use digest::{hmac_fingerprint, sha256_fingerprint, Fingerprint};
pub use error::Error;
pub use parse::parse;
pub use pointer::Pointer;
pub use spec::{Selection, Spec};
pub use value::Value;
