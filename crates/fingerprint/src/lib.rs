//! Canonical request fingerprints: strict I-JSON parsing, RFC 8785 serialization,
//! projection by fingerprint spec, and SHA-256 / HMAC-SHA256 digests.
