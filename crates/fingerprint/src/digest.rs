//! Step 5 of the fingerprint contract: the digest of canonical bytes, as the
//! `sha256:<hex>` form sent in `Idempotency-Fingerprint` or the keyed
//! `hmac-sha256:<hex>` form a server may store instead.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// A fingerprint in its textual form: `sha256:` or `hmac-sha256:` followed by
/// 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Fingerprint {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `sha256:` + lowercase hex of SHA-256(`canonical`).
pub fn sha256_fingerprint(canonical: &[u8]) -> Fingerprint {
    with_prefix("sha256:", &Sha256::digest(canonical))
}

/// `hmac-sha256:` + lowercase hex of HMAC-SHA256(`secret`, `canonical`).
pub fn hmac_fingerprint(secret: &[u8], canonical: &[u8]) -> Fingerprint {
    // HMAC hashes long keys and pads short ones, so every key length is valid.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .expect("HMAC-SHA256 accepts keys of any length");
    mac.update(canonical);
    with_prefix("hmac-sha256:", &mac.finalize().into_bytes())
}

fn with_prefix(prefix: &str, digest: &[u8]) -> Fingerprint {
    let mut text = String::with_capacity(prefix.len() + 2 * digest.len());
    text.push_str(prefix);
    text.push_str(&hex::encode(digest));
    Fingerprint(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // FIPS 180-2 "abc" and RFC 4231 test case 2.
        assert_eq!(
            sha256_fingerprint(b"abc").as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hmac_fingerprint(b"Jefe", b"what do ya want for nothing?").to_string(),
            "hmac-sha256:5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
