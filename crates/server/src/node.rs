//! A node's shared state: configuration, the region store, the tenant directory,
//! in-flight coalescing and fingerprint settings.

use crate::config::Config;
use crate::inflight::Inflight;
use crate::limits::REGISTRY_READ_WAIT_MS;
use crate::tenants::{self, Tenants};
use crate::Error;
use keyhold_core::{Policy, TenantId, UnixMillis};
use keyhold_fingerprint::{Fingerprint, Spec, Value};
use keyhold_registry::{
    NodeCredentials, NodeId, NodeInfo, Registry, RegistryConfig, Request, Response, TenantRecord,
    TenantState,
};
use keyhold_store::raft::Member;
use keyhold_store::{GuardOutcome, Store};
use std::net::SocketAddr;
use std::time::Duration;
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
    registry: Registry,
    pub(crate) tenants: Tenants,
    pub(crate) inflight: Inflight,
    /// The tenant moves this node drives.
    pub(crate) drivers: crate::mover::Drivers,
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
    Registry(keyhold_registry::Error),
}

/// Where a tenant's requests execute, as this node's registry replica says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// This node's region is the tenant's home (the tenant is active, or
    /// moving away: its old home serves it until its store is fenced).
    Local,
    /// No region executes for the tenant (it is deleted).
    Closed,
    /// Another region is home; forward there.
    Remote { region: String },
}

impl Node {
    /// Opens the node's region store and starts its registry replica. The API and
    /// Raft listeners are bound already (their addresses go into the registry).
    pub async fn open(
        config: Config,
        api_addr: SocketAddr,
        raft_addr: SocketAddr,
    ) -> Result<Node, Error> {
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
        let info = NodeInfo::new(
            config.region.clone(),
            api_addr.to_string(),
            raft_addr.to_string(),
        );
        // The region's store is its own Raft group, of which this node is the
        // only voter so far, under the same id and addresses as in the registry.
        let member = Member {
            group: keyhold_store::raft::group_name(&config.region),
            node: config.node_id,
            info: info.clone(),
        };
        let store = Store::open(&config.data_dir.join("region"), member).await?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .local_address(config.outbound_ip)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let registry_config = RegistryConfig::new(
            config.node_id,
            info,
            config.data_dir.join("registry"),
            config.node_credentials()?,
        );
        let registry = Registry::start_with_client(registry_config, Some(http.clone()))
            .await
            .map_err(|e| Error::Config(format!("registry: {e}")))?;
        let tenants = Tenants::default();
        tenants.rebuild(registry.tenants(), registry.applied_index());
        // Install the recorder before any request can record.
        crate::metrics::handle();
        Ok(Node {
            policy: config.policy(),
            admin_token_sha256: tenants::sha256(&config.admin_token),
            config,
            store,
            registry,
            tenants,
            inflight: Inflight::default(),
            drivers: crate::mover::Drivers::default(),
            outbox_notify: tokio::sync::Notify::new(),
            http,
            hmac_secret,
            orders_spec: Spec::orders(),
        })
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The cluster's node credentials (the registry's: one secret for every
    /// inter-node call).
    pub fn credentials(&self) -> &NodeCredentials {
        self.registry.credentials()
    }

    /// Waits, bounded, for this replica to apply at least one more registry entry,
    /// then rebuilds the tenant directory; returns whether anything new was
    /// applied. A follower learns that an entry committed only with the leader's
    /// next message (at most a heartbeat later), so a tenant created through
    /// another node a moment ago is found before this node answers "unknown".
    /// It only sleeps (no work, no registry write), so unknown tokens cost an
    /// attacker time, not this node CPU.
    pub async fn catch_up_registry(&self) -> bool {
        let mut applied = self.registry.subscribe();
        let before = *applied.borrow_and_update();
        // The directory may simply not be rebuilt yet from what is applied.
        if self.tenants.built_at() < before {
            self.refresh_tenants();
            return true;
        }
        let wait = Duration::from_millis(crate::limits::REGISTRY_CATCH_UP_WAIT_MS);
        let advanced = tokio::time::timeout(wait, applied.wait_for(|&i| i > before))
            .await
            .is_ok_and(|r| r.is_ok());
        if advanced {
            self.refresh_tenants();
        }
        advanced
    }

    /// Rebuilds the tenant directory from the local registry replica.
    pub fn refresh_tenants(&self) {
        // Read the index first: the directory then holds at least that much.
        let index = self.registry.applied_index();
        self.tenants.rebuild(self.registry.tenants(), index);
    }

    /// Makes the store execute for `tenant` at `epoch`, which the local registry
    /// replica says this region owns: a store guard of an earlier epoch (the
    /// fence of an aborted move, the import of a completed one) gives way to
    /// ownership. False when the store refuses: it holds a guard of this epoch
    /// or a later one, so this replica lags and must not execute.
    pub async fn ensure_owned(
        &self,
        tenant: &TenantId,
        epoch: u64,
    ) -> Result<bool, keyhold_store::Error> {
        match self.store.guard(tenant)? {
            None => return Ok(true),
            Some(guard) if guard.executes() && guard.epoch() >= epoch => return Ok(true),
            // A move's fence (or import) at this epoch stays until the registry
            // moves the tenant on: `Own` would be refused.
            Some(guard) if guard.epoch() >= epoch => return Ok(false),
            Some(_) => {}
        }
        let owned = matches!(
            self.store.own(tenant.clone(), epoch).await?,
            GuardOutcome::Accepted { .. }
        );
        if owned {
            metrics::counter!("keyhold_move_guards_lifted_total").increment(1);
            tracing::info!(tenant = %tenant.as_str(), epoch, "the store owns the tenant again");
        }
        Ok(owned)
    }

    /// Where this tenant's requests execute, by the local replica. A moving
    /// tenant is placed at its old home like an active one: the old home's
    /// store decides, serving it during the move's copy and answering 503
    /// `tenant-moving` once the move fenced it.
    pub fn placement(&self, record: &TenantRecord) -> Placement {
        if !matches!(
            record.state,
            TenantState::Active | TenantState::Moving { .. }
        ) {
            return Placement::Closed;
        }
        // Only the region's store node executes; other nodes of the home region
        // (registry learners serving the API) forward to it like any other.
        let store_node = self.store_node_of(&record.home_region).map(|(id, _)| id);
        let is_store_node = store_node.is_none_or(|id| id == self.config.node_id);
        if record.home_region == self.config.region && is_store_node {
            Placement::Local
        } else {
            Placement::Remote {
                region: record.home_region.clone(),
            }
        }
    }

    /// The API address of the node that owns a region's store: the member of that
    /// region with the lowest id (one store-owning node per region until the region
    /// store is replicated).
    pub fn store_node_of(&self, region: &str) -> Option<(NodeId, NodeInfo)> {
        self.registry
            .nodes()
            .into_iter()
            .find(|(_, info)| info.region == region)
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

    /// Creates a tenant in the registry with a fresh token and returns the record
    /// and the token: the only time the token is ever shown. Answers once this
    /// node's replica has applied the write, so the tenant works here at once.
    pub async fn create_tenant(
        &self,
        id: TenantId,
        home_region: &str,
        requests_per_second: u32,
        new_keys_per_second: u32,
    ) -> Result<(TenantRecord, String), CreateTenantError> {
        let token = tenants::new_token();
        let record = TenantRecord {
            tenant_id: id.as_str().to_owned(),
            home_region: home_region.to_owned(),
            epoch: 1,
            token_sha256: hex::encode(tenants::sha256(&token)),
            requests_per_second,
            new_keys_per_second,
            state: TenantState::Active,
            created_at_ms: now().0,
            previous_token: None,
        };
        let written = self
            .registry
            .write(Request::CreateTenant { record })
            .await
            .map_err(CreateTenantError::Registry)?;
        let record = match written.response {
            Response::TenantCreated { record } => record,
            Response::Rejected {
                reason: keyhold_registry::Rejection::TenantExists { .. },
            } => return Err(CreateTenantError::Exists),
            Response::Rejected {
                reason: keyhold_registry::Rejection::UnknownRegion { .. },
            } => return Err(CreateTenantError::UnknownRegion),
            other => {
                return Err(CreateTenantError::Registry(
                    keyhold_registry::Error::Forward {
                        leader: 0,
                        reason: format!("unexpected answer {other:?}"),
                    },
                ))
            }
        };
        // A replayed write answers TenantCreated with the first record; only the
        // write whose token hash matches ours created it.
        if record.token_sha256 != hex::encode(tenants::sha256(&token)) {
            return Err(CreateTenantError::Exists);
        }
        self.registry
            .wait_applied(
                written.log_index,
                Duration::from_millis(REGISTRY_READ_WAIT_MS),
            )
            .await
            .map_err(CreateTenantError::Registry)?;
        self.refresh_tenants();
        Ok((record, token))
    }
}
