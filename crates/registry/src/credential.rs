//! The cluster's node credential: the shared secret that every inter-node call
//! carries (Raft RPCs and forwarded registry writes here; forwarding, move copy and
//! internal admin in the server) in the `Keyhold-Node-Credential` header.
//!
//! It is never a tenant's or the admin's token. A node accepts a list of secrets
//! and sends the first: during a rotation every node accepts the old and the new
//! one, then every node sends the new one, then the old one is dropped, with no
//! call refused at any step. Comparison is constant-time (`subtle`), and every
//! accepted secret is compared, so timing reveals neither which one matched nor
//! how much of a guess was right.

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::limits::NODE_CREDENTIAL_BYTES_MIN;
use crate::Error;

/// Header carrying the node credential on every inter-node request.
pub const NODE_CREDENTIAL_HEADER: &str = "keyhold-node-credential";

/// The secrets a node accepts from other nodes; the first is the one it sends.
#[derive(Clone)]
pub struct NodeCredentials {
    accepted: Vec<String>,
}

impl std::fmt::Debug for NodeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.debug_struct("NodeCredentials")
            .field("accepted", &self.accepted.len())
            .finish()
    }
}

impl NodeCredentials {
    /// Parses a list of secrets separated by newlines, commas or spaces (the form of a
    /// credential file or environment variable); the first is sent, all are accepted.
    /// Each must be at least `NODE_CREDENTIAL_BYTES_MIN` bytes of visible ASCII (it
    /// travels in an HTTP header).
    pub fn parse(text: &str) -> Result<Self, Error> {
        let accepted: Vec<String> = text
            .split(|c: char| c == ',' || c.is_ascii_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if accepted.is_empty() {
            return Err(Error::Config("the node credential list is empty".into()));
        }
        for secret in &accepted {
            let visible = secret.bytes().all(|b| (0x21..=0x7e).contains(&b));
            if secret.len() < NODE_CREDENTIAL_BYTES_MIN || !visible {
                return Err(Error::Config(format!(
                    "every node credential must be at least {NODE_CREDENTIAL_BYTES_MIN} \
                     characters of visible ASCII"
                )));
            }
        }
        Ok(Self { accepted })
    }

    /// The secret this node sends.
    pub fn current(&self) -> &str {
        &self.accepted[0]
    }

    /// True when `presented` is one of the accepted secrets.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let mut matched = subtle::Choice::from(0u8);
        for secret in &self.accepted {
            // Lengths are public (every secret has a configured length); contents are not.
            matched |= secret.as_bytes().ct_eq(presented);
        }
        matched.into()
    }

    /// True when the request carries exactly one `Keyhold-Node-Credential` header
    /// and it is accepted.
    pub fn check(&self, headers: &HeaderMap) -> bool {
        let mut values = headers.get_all(NODE_CREDENTIAL_HEADER).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => self.accepts(value.as_bytes()),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-secret-0123456789abcdef0123456789";
    const NEW: &str = "new-secret-0123456789abcdef0123456789";

    #[test]
    fn the_first_is_sent_and_all_are_accepted() {
        let creds = NodeCredentials::parse(&format!("{NEW}\n{OLD}\n")).expect("valid");
        assert_eq!(creds.current(), NEW);
        assert!(creds.accepts(NEW.as_bytes()));
        assert!(creds.accepts(OLD.as_bytes()));
        assert!(!creds.accepts(b"new-secret-0123456789abcdef012345678"));
        assert!(!creds.accepts(b""));
        let commas = NodeCredentials::parse(&format!("{OLD},{NEW}")).expect("valid");
        assert_eq!(commas.current(), OLD);
    }

    #[test]
    fn short_empty_or_invisible_secrets_are_refused() {
        assert!(NodeCredentials::parse("").is_err());
        assert!(NodeCredentials::parse("short").is_err());
        assert!(NodeCredentials::parse(&format!("{OLD}\u{e9}")).is_err());
    }

    #[test]
    fn a_header_given_twice_is_refused() {
        let creds = NodeCredentials::parse(OLD).expect("valid");
        let mut headers = HeaderMap::new();
        assert!(!creds.check(&headers));
        headers.append(NODE_CREDENTIAL_HEADER, OLD.parse().expect("header"));
        assert!(creds.check(&headers));
        headers.append(NODE_CREDENTIAL_HEADER, OLD.parse().expect("header"));
        assert!(!creds.check(&headers));
    }
}
