//! The tenant directory of a node: bearer-token authentication and each tenant's
//! rate limiters, rebuilt from the local registry replica whenever it changes.
//!
//! Tokens are never stored, only their SHA-256. A request's token is hashed and
//! looked up by hash; the final comparison is constant-time, and a lookup by hash
//! reveals nothing useful about any token through timing.
//!
//! A rotated-out token stays in the directory beside the new one until the end
//! of its grace period, checked against the clock at every request; a deleted
//! tenant is left out altogether, so none of its tokens authenticates.

use crate::limits::TOKEN_RANDOM_BYTES;
use crate::problem::ApiError;
use axum::http::{header, HeaderMap};
use base64::Engine;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use keyhold_core::{Problem, TenantId, UnixMillis};
use keyhold_registry::TenantRecord;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;

pub struct Tenant {
    id: TenantId,
    pub record: TenantRecord,
    /// Shared with the previous directory's entry for the same tenant while its
    /// limits are unchanged, so a registry change does not reset anyone's budget.
    limiters: Arc<Limiters>,
}

struct Limiters {
    requests_per_second: u32,
    new_keys_per_second: u32,
    requests: DefaultDirectRateLimiter,
    new_keys: DefaultDirectRateLimiter,
}

impl Limiters {
    fn new(requests_per_second: u32, new_keys_per_second: u32) -> Limiters {
        let quota = |per_second: u32| {
            Quota::per_second(NonZeroU32::new(per_second.max(1)).expect("at least one"))
        };
        Limiters {
            requests_per_second,
            new_keys_per_second,
            requests: RateLimiter::direct(quota(requests_per_second)),
            new_keys: RateLimiter::direct(quota(new_keys_per_second)),
        }
    }
}

impl Tenant {
    pub fn id(&self) -> &TenantId {
        &self.id
    }

    pub fn check_request_rate(&self) -> Result<(), ApiError> {
        check(&self.limiters.requests)
    }

    pub fn check_new_key_rate(&self) -> Result<(), ApiError> {
        check(&self.limiters.new_keys)
    }
}

fn check(limiter: &DefaultDirectRateLimiter) -> Result<(), ApiError> {
    limiter.check().map_err(|not_until| {
        let wait = not_until.wait_time_from(governor::clock::Clock::now(
            &governor::clock::DefaultClock::default(),
        ));
        ApiError::new(Problem::RateLimited).retry_after_ms(wait.as_millis() as u64)
    })
}

#[derive(Default)]
pub struct Tenants {
    inner: RwLock<Directory>,
    /// The registry index the directory was last rebuilt at (at least).
    built_at: std::sync::atomic::AtomicU64,
}

/// A directory entry for one token hash.
struct Credential {
    tenant: Arc<Tenant>,
    /// Set for a rotated-out token: refused from this instant on.
    valid_until: Option<UnixMillis>,
}

#[derive(Default)]
struct Directory {
    by_hash: HashMap<[u8; 32], Credential>,
    by_id: HashMap<TenantId, Arc<Tenant>>,
}

pub fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Every tenant token starts with this.
const TOKEN_PREFIX: &str = "kh_";

/// A new bearer token: `kh_` and 32 random bytes in unpadded base64url.
pub fn new_token() -> String {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The bearer token of an `Authorization` header, if well-formed. A header
/// given more than once is ambiguous (which caller is it?) and reads as none.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Whether the request's bearer token has the form of a tenant token
/// ([`new_token`]): only such a token can belong to a tenant created a moment
/// ago, so only it is worth waiting for the registry.
pub fn has_tenant_token_form(headers: &HeaderMap) -> bool {
    let encoded_len = (TOKEN_RANDOM_BYTES * 4).div_ceil(3);
    bearer(headers)
        .and_then(|t| t.strip_prefix(TOKEN_PREFIX))
        .is_some_and(|random| {
            random.len() == encoded_len
                && random
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl Tenants {
    /// Replaces the directory with the registry's tenants, keeping each tenant's
    /// limiters when its limits did not change.
    pub fn rebuild(&self, records: Vec<TenantRecord>, applied_index: u64) {
        // Readers keep authenticating against the old directory until the swap.
        let old = self
            .inner
            .read()
            .expect("tenant directory lock")
            .by_id
            .clone();
        let mut dir = Directory::default();
        for record in records.into_iter().filter(|r| !r.is_deleted()) {
            let Ok(id) = TenantId::parse(&record.tenant_id) else {
                tracing::error!(tenant = %record.tenant_id, "registry tenant id is invalid; skipped");
                continue;
            };
            let Some(hash) = decode_hash(&record.token_sha256) else {
                tracing::error!(tenant = %id, "registry token hash is malformed; tenant skipped");
                continue;
            };
            let limiters = match old.get(&id) {
                Some(t)
                    if t.limiters.requests_per_second == record.requests_per_second
                        && t.limiters.new_keys_per_second == record.new_keys_per_second =>
                {
                    t.limiters.clone()
                }
                _ => Arc::new(Limiters::new(
                    record.requests_per_second,
                    record.new_keys_per_second,
                )),
            };
            let retired = record.previous_token.as_ref().and_then(|p| {
                decode_hash(&p.token_sha256).map(|h| (h, UnixMillis(p.valid_until_ms)))
            });
            let tenant = Arc::new(Tenant {
                id: id.clone(),
                record,
                limiters,
            });
            if let Some((hash, valid_until)) = retired {
                dir.by_hash.insert(
                    hash,
                    Credential {
                        tenant: tenant.clone(),
                        valid_until: Some(valid_until),
                    },
                );
            }
            dir.by_id.insert(id, tenant.clone());
            dir.by_hash.insert(
                hash,
                Credential {
                    tenant,
                    valid_until: None,
                },
            );
        }
        *self.inner.write().expect("tenant directory lock") = dir;
        self.built_at
            .fetch_max(applied_index, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn built_at(&self) -> u64 {
        self.built_at.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn get(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        self.inner
            .read()
            .expect("tenant directory lock")
            .by_id
            .get(id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.inner
            .read()
            .expect("tenant directory lock")
            .by_id
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Contract section 2: the token is checked on every attempt, before anything
    /// else; missing or unknown gives 401 `unauthenticated`.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
        self.authenticate_at(headers, crate::node::now())
    }

    /// [`Self::authenticate`] at `now`: a rotated-out token past its grace
    /// period is unknown.
    pub fn authenticate_at(
        &self,
        headers: &HeaderMap,
        now: UnixMillis,
    ) -> Result<Arc<Tenant>, ApiError> {
        let unauthenticated = || ApiError::new(Problem::Unauthenticated);
        let token = bearer(headers).ok_or_else(unauthenticated)?;
        let hash = sha256(token);
        let dir = self.inner.read().expect("tenant directory lock");
        let (stored, credential) = dir
            .by_hash
            .get_key_value(&hash)
            .ok_or_else(unauthenticated)?;
        if !bool::from(stored.ct_eq(&hash)) {
            return Err(unauthenticated());
        }
        match credential.valid_until {
            Some(until) if now >= until => Err(unauthenticated()),
            _ => Ok(credential.tenant.clone()),
        }
    }
}

fn decode_hash(hex_text: &str) -> Option<[u8; 32]> {
    hex::decode(hex_text)
        .ok()
        .and_then(|h| <[u8; 32]>::try_from(h).ok())
}

/// Admin authentication: a constant-time comparison of token digests.
pub fn authenticate_admin(
    headers: &HeaderMap,
    admin_token_sha256: &[u8; 32],
) -> Result<(), ApiError> {
    let token = bearer(headers).ok_or_else(|| ApiError::new(Problem::Unauthenticated))?;
    if bool::from(sha256(token).ct_eq(admin_token_sha256)) {
        Ok(())
    } else {
        Err(ApiError::new(Problem::Unauthenticated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyhold_registry::{RetiredToken, TenantState};

    fn record(id: &str, token: &str) -> TenantRecord {
        TenantRecord {
            tenant_id: id.to_owned(),
            home_region: "a".to_owned(),
            epoch: 1,
            token_sha256: hex::encode(sha256(token)),
            requests_per_second: 10,
            new_keys_per_second: 10,
            state: TenantState::Active,
            created_at_ms: 0,
            previous_token: None,
        }
    }

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header"),
        );
        h
    }

    #[test]
    fn a_rotated_out_token_works_until_its_grace_ends() {
        let tenants = Tenants::default();
        let mut rotated = record("t1", "kh_new");
        rotated.previous_token = Some(RetiredToken {
            token_sha256: hex::encode(sha256("kh_old")),
            valid_until_ms: 1_000,
        });
        tenants.rebuild(vec![rotated], 1);
        let at = |token: &str, ms: u64| tenants.authenticate_at(&headers(token), UnixMillis(ms));
        assert_eq!(at("kh_old", 999).expect("in grace").id().as_str(), "t1");
        assert!(at("kh_old", 1_000).is_err(), "refused once the grace ends");
        assert!(at("kh_new", 1_000_000).is_ok());
        assert!(at("kh_other", 0).is_err());
    }

    #[test]
    fn a_deleted_tenant_has_no_token() {
        let tenants = Tenants::default();
        let mut gone = record("t1", "kh_one");
        gone.state = TenantState::Deleted {
            deleted_at_ms: 5,
            erased_in: vec![],
        };
        tenants.rebuild(vec![gone, record("t2", "kh_two")], 1);
        assert!(tenants
            .authenticate_at(&headers("kh_one"), UnixMillis(0))
            .is_err());
        assert!(tenants.get(&TenantId::parse("t1").unwrap()).is_none());
        assert_eq!(tenants.len(), 1);
    }

    use axum::http::HeaderValue;

    fn with_auth(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[test]
    fn authorization_given_twice_is_no_token() {
        let token = new_token();
        let one = format!("Bearer {token}");
        assert_eq!(bearer(&with_auth(&[&one])), Some(token.as_str()));
        assert_eq!(bearer(&with_auth(&[&one, &one])), None);
        assert_eq!(bearer(&with_auth(&[&one, "Bearer other"])), None);
        assert_eq!(bearer(&with_auth(&["Bearer other", &one])), None);
    }

    #[test]
    fn only_tenant_shaped_tokens_are_worth_a_registry_wait() {
        let token = new_token();
        assert!(has_tenant_token_form(&with_auth(&[&format!(
            "Bearer {token}"
        )])));
        for bad in [
            String::new(),
            "Bearer".to_owned(),
            format!("Basic {token}"),
            format!("Bearer {token}x"),
            format!("Bearer {}", &token[..token.len() - 1]),
            format!("Bearer kh_{}", "+".repeat(43)),
            "Bearer admin-token-of-some-length".to_owned(),
        ] {
            let headers = if bad.is_empty() {
                HeaderMap::new()
            } else {
                with_auth(&[&bad])
            };
            assert!(!has_tenant_token_form(&headers), "{bad}");
        }
    }
}
