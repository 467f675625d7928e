//! A node's shared state: configuration, the region store, the tenant directory,
//! in-flight coalescing and fingerprint settings.

use crate::config::Config;
use crate::inflight::Inflight;
use crate::tenants::{self, Tenants};
use crate::Error;
use keyhold_core::{Policy, TenantId, UnixMillis};
use keyhold_fingerprint::{Fingerprint, Spec, Value};
use keyhold_store::{Applied, Command, Store, TenantEntry};
use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock, read once per request at the edge and passed down as a value.
pub fn now() -> UnixMillis {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    UnixMillis(d.as_millis() as u64)
}

pub struct Node {
    config: Config,
    policy: Policy,
    store: Store,
    pub(crate) tenants: Tenants,
    pub(crate) inflight: Inflight,
    admin_token_sha256: [u8; 32],
    /// Woken when an order is created, so idle relays deliver at once.
    pub(crate) outbox_notify: tokio::sync::Notify,
    /// One pooled HTTP client for outgoing calls (the payment provider).
    http: reqwest::Client,
    hmac_secret: Option<Vec<u8>>,
    orders_spec: Spec,
}

/// A fingerprint in both forms: the plain digest sent back to clients, and the
/// form records store and compare (the same, or its keyed HMAC).
pub struct Fingerprints {
    pub plain: Fingerprint,
    pub stored: String,
}

/// Why a tenant could not be created.
#[derive(Debug)]
pub enum CreateTenantError {
    Exists,
    UnknownRegion,
    /// Until the cross-region registry exists a node can only home tenants in its
    /// own region; elsewhere it could not keep "never executed outside home".
    NotThisRegion,
    Store(keyhold_store::Error),
}

impl Node {
    pub fn open(config: Config) -> Result<Node, Error> {
        config.validate()?;
        let hmac_secret = match &config.fingerprint_hmac_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(v) if !v.is_empty() => Some(v.into_bytes()),
                _ => {
                    return Err(Error::Config(format!(
                        "fingerprint_hmac_key_env names {var}, which is unset or empty"
                    )))
                }
            },
        };
        std::fs::create_dir_all(&config.data_dir)?;
        let store = Store::open(&config.data_dir.join("region"))?;
        let tenants = Tenants::default();
        for entry in store.tenants()? {
            tenants.insert(entry);
        }
        // Install the recorder before any request can record.
        crate::metrics::handle();
        Ok(Node {
            policy: config.policy(),
            admin_token_sha256: tenants::sha256(&config.admin_token),
            config,
            store,
            tenants,
            inflight: Inflight::default(),
            outbox_notify: tokio::sync::Notify::new(),
            http: reqwest::Client::builder()
                .build()
                .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?,
            hmac_secret,
            orders_spec: Spec::orders(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn region(&self) -> &str {
        &self.config.region
    }

    pub fn admin_token_sha256(&self) -> &[u8; 32] {
        &self.admin_token_sha256
    }

    pub fn orders_spec(&self) -> &Spec {
        &self.orders_spec
    }

    /// Every fingerprint spec the server uses.
    pub fn specs(&self) -> Vec<&Spec> {
        vec![&self.orders_spec]
    }

    pub fn fingerprints(&self, spec: &Spec, body: &Value) -> Fingerprints {
        let canonical = spec.canonical_preimage(body);
        let plain = keyhold_fingerprint::sha256_fingerprint(canonical.as_bytes());
        let stored = match &self.hmac_secret {
            None => plain.as_str().to_owned(),
            Some(secret) => keyhold_fingerprint::hmac_fingerprint(secret, canonical.as_bytes())
                .as_str()
                .to_owned(),
        };
        Fingerprints { plain, stored }
    }

    /// Creates a tenant with a fresh token and returns the token: the only time
    /// it is ever shown.
    pub async fn create_tenant(
        &self,
        id: TenantId,
        home_region: &str,
        requests_per_second: u32,
        new_keys_per_second: u32,
    ) -> Result<(TenantEntry, String), CreateTenantError> {
        if !self.config.regions.iter().any(|r| r == home_region) {
            return Err(CreateTenantError::UnknownRegion);
        }
        if home_region != self.config.region {
            return Err(CreateTenantError::NotThisRegion);
        }
        if self.tenants.get(&id).is_some() {
            return Err(CreateTenantError::Exists);
        }
        let token = tenants::new_token();
        let entry = TenantEntry {
            id,
            home_region: home_region.to_owned(),
            token_sha256: hex::encode(tenants::sha256(&token)),
            created_at: now(),
            requests_per_second,
            new_keys_per_second,
        };
        match self
            .store
            .execute(Command::CreateTenant {
                tenant: entry.clone(),
            })
            .await
        {
            Ok(Applied::TenantCreated(true)) => {}
            Ok(Applied::TenantCreated(false)) => return Err(CreateTenantError::Exists),
            Ok(other) => unreachable!("put tenant answered {other:?}"),
            Err(e) => return Err(CreateTenantError::Store(e)),
        }
        self.tenants.insert(entry.clone());
        Ok((entry, token))
    }
}
