//! The query-string extractor of every route, [`StrictQuery`]: like axum's
//! `Query`, but a name or value that does not percent-decode to UTF-8 is
//! 400 `invalid-request` naming the parameter. axum's `Query` decodes
//! leniently (an invalid escape is kept as text, invalid UTF-8 is replaced), so
//! `client_order_id=%ZZ` looked up an order no one has instead of being refused
//! (probe d44e5cf, M3).

use crate::problem::ApiError;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

/// The query string deserialized into `T` after [`check`] passed it.
#[derive(Debug)]
pub struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        check(parts.uri.query().unwrap_or(""))?;
        match Query::<T>::try_from_uri(&parts.uri) {
            Ok(Query(value)) => Ok(StrictQuery(value)),
            Err(rejection) => Err(ApiError::invalid("", rejection.body_text())),
        }
    }
}

/// Every `name=value` pair of `query` decodes strictly: `%` is followed by two
/// hex digits, and the decoded bytes are UTF-8.
fn check(query: &str) -> Result<(), ApiError> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded_name = decode(name);
        if decoded_name.is_some() && decode(value).is_some() {
            continue;
        }
        let shown = decoded_name.unwrap_or_else(|| name.to_owned());
        return Err(ApiError::invalid(
            &format!("/{shown}"),
            format!("the query parameter {shown:?} is not percent-encoded UTF-8"),
        ));
    }
    Ok(())
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space) that refuses
/// instead of guessing.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let digits = bytes.get(i + 1..i + 3)?;
                // Exactly two hex digits (from_str_radix would take a sign).
                if !digits.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let hex = std::str::from_utf8(digits).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(decode("a%20b+c%C3%A9").as_deref(), Some("a b cé"));
        for bad in ["%ZZ", "%FF%FE", "%", "%2", "%+1", "a%e9"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        assert!(check("client_order_id=x&&flag").is_ok());
        let refused = check("a=1&client_order_id=%ZZ").expect_err("refused");
        assert_eq!(refused.errors[0].pointer, "/client_order_id");
        assert!(check("order_id=%FF").is_err());
        assert!(check("%FF=1").is_err());
    }
}
