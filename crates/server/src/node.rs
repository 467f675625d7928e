//! A node's shared state: configuration, the region store, the tenant directory,
//! in-flight coalescing and fingerprint settings.

use crate::config::Config;
use crate::config::Start;
use crate::inflight::Inflight;
use crate::limits::REGISTRY_READ_WAIT_MS;
use crate::tenants::{self, Tenants};
use crate::Error;
use keyhold_core::{Policy, TenantId, UnixMillis};
use keyhold_fingerprint::{Fingerprint, Spec, Value};
use keyhold_registry::{
    NodeCredentials, NodeId, NodeInfo, OperationState, Registry, RegistryConfig, Request, Response,
    Survival, TenantRecord, TenantState,
};
use keyhold_store::limits::{
    HELD_RELEASE_BYTES_MAX, REGION_APPEND_BYTES_MAX, REGION_APPEND_BYTES_PER_SECOND_MIN,
    REGION_LEARNER_RPC_TIMEOUT_MS,
};
use keyhold_store::raft::{Bootstrap, GroupOptions, Leadership, Member, Purge};
use keyhold_store::{GuardOutcome, Store, TenantGuard};
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

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
    /// The copies of other regions' stores this node keeps as their standby.
    /// Behind a lock because a copy promoted for a failover is deleted and
    /// re-created while the node runs (`copies.rs`); readers take a clone of
    /// the list (each copy is a cheap handle) and never hold the lock.
    standby_copies: std::sync::RwLock<Vec<StandbyCopy>>,
    /// Contact with the registry majority: tenant requests execute only under it.
    lease: crate::lease::Lease,
    /// Every call to another node's API listener goes through it.
    peers: crate::peers::Peers,
    /// One pooled HTTP client for outgoing calls: the payment provider's here,
    /// and the same pool under `peers` and the Raft networks.
    http: reqwest::Client,
    hmac_secret: Option<Vec<u8>>,
    orders_spec: Spec,
    /// Waits for the registry on behalf of unknown tenant-form tokens that may
    /// run at once (`REGISTRY_CATCH_UP_WAITS_MAX`).
    token_waits: tokio::sync::Semaphore,
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
    /// Raft listeners are bound already; `api_addr` and `raft_addr` are where
    /// the other nodes reach them (`host:port`, an IP or a DNS name), kept in
    /// the registry.
    pub async fn open(config: Config, api_addr: String, raft_addr: String) -> Result<Node, Error> {
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
        let info = NodeInfo::new(config.region.clone(), api_addr, raft_addr);
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .local_address(config.outbound_ip)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let credentials = config.node_credentials()?;
        let store = open_store(&config, &info, &http, &credentials).await?;
        let standby_copies = open_standby_copies(&config, &info, &http, &credentials).await?;
        let registry_config = RegistryConfig::new(
            config.node_id,
            info,
            config.data_dir.join("registry"),
            credentials,
        );
        let registry = Registry::start_with_client(registry_config, Some(http.clone()))
            .await
            .map_err(|e| Error::Config(format!("registry: {e}")))?;
        let tenants = Tenants::default();
        tenants.rebuild(registry.tenants(), registry.applied_index());
        // Install the recorder before any request can record, with the
        // node's info series and its counters at 0.
        crate::metrics::register_node(config.node_id, &config.region);
        let directory = registry.clone();
        let peers = crate::peers::Peers::new(
            http.clone(),
            registry.credentials().clone(),
            move |region: &str| {
                directory
                    .nodes()
                    .into_iter()
                    .filter(|(_, info)| info.region == region)
                    .collect()
            },
        );
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
            peers,
            lease: Default::default(),
            standby_copies: std::sync::RwLock::new(standby_copies),
            http,
            hmac_secret,
            orders_spec: Spec::orders(),
            token_waits: tokio::sync::Semaphore::new(crate::limits::REGISTRY_CATCH_UP_WAITS_MAX),
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

    /// [`Node::catch_up_registry`] for a token of the tenant form that no tenant
    /// holds here, if fewer than `REGISTRY_CATCH_UP_WAITS_MAX` such waits run:
    /// otherwise false at once, so made-up tokens cannot keep many connections
    /// waiting.
    pub async fn catch_up_registry_for_token(&self) -> bool {
        let Ok(_permit) = self.token_waits.try_acquire() else {
            metrics::counter!("keyhold_token_waits_skipped_total").increment(1);
            return false;
        };
        self.catch_up_registry().await
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
            // A failover imports at the epoch its completion gives: its guard
            // gives way to that very failover, once the registry shows it done.
            Some(TenantGuard::Importing {
                operation_id,
                epoch: imported,
            }) if imported == epoch
                && crate::operations::failover_to(&self.registry, &operation_id, self.region())
                    == Some(OperationState::Done) =>
            {
                // The carried events join the outbox in pages first (they
                // are this region's to deliver now), so that no one command's
                // changes grow with them; `OwnImported` then finds none left.
                loop {
                    let page = self
                        .store
                        .release_held(
                            tenant.clone(),
                            operation_id.clone(),
                            epoch,
                            HELD_RELEASE_BYTES_MAX as u32,
                        )
                        .await?;
                    if page.entries > 0 {
                        self.outbox_notify.notify_waiters();
                    }
                    if !page.more {
                        break;
                    }
                }
                let outcome = self
                    .store
                    .own_imported(tenant.clone(), operation_id, epoch)
                    .await?;
                let owned = matches!(outcome, GuardOutcome::Accepted { .. });
                if owned {
                    // The events the failover carried are in the outbox now.
                    self.outbox_notify.notify_waiters();
                    metrics::counter!("keyhold_failover_guards_lifted_total").increment(1);
                    tracing::info!(tenant = %tenant.as_str(), epoch, "the store owns the failed-over tenant");
                }
                return Ok(owned);
            }
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
        // Every node of the home region holds a replica of its store; which of
        // them executes (the group's leader) is decided at the region's edge.
        if record.home_region == self.config.region {
            Placement::Local
        } else {
            Placement::Remote {
                region: record.home_region.clone(),
            }
        }
    }

    /// The nodes of `region` (from the registry's membership), in the order
    /// a call to the region tries them (`Peers::region_nodes`).
    pub fn region_nodes(&self, region: &str) -> Vec<(NodeId, NodeInfo)> {
        self.peers.region_nodes(region)
    }

    /// The API address of the registry's leader, as this node's replica
    /// knows it (the lease probe and the failover's lease bound ask it).
    pub fn registry_leader_api(&self) -> Option<String> {
        let leader = self.registry().leader()?;
        Some(self.registry().nodes().get(&leader)?.api_addr.clone())
    }

    /// The node's client for calls to other nodes (`peers.rs`).
    pub fn peers(&self) -> &crate::peers::Peers {
        &self.peers
    }

    /// The copies of other regions' stores this node keeps (as their standby),
    /// as they are now.
    pub fn standby_copies(&self) -> Vec<StandbyCopy> {
        self.standby_copies.read().expect("not poisoned").clone()
    }

    /// This node's copy of `region`'s store, if it keeps one now.
    pub fn standby_copy(&self, region: &str) -> Option<StandbyCopy> {
        self.standby_copies
            .read()
            .expect("not poisoned")
            .iter()
            .find(|c| c.region == region)
            .cloned()
    }

    /// Takes the copy of `region` out of the node's list (its group's Raft
    /// routes then answer 503 until a copy is put back).
    pub(crate) fn take_standby_copy(&self, region: &str) -> Option<StandbyCopy> {
        let mut copies = self.standby_copies.write().expect("not poisoned");
        let at = copies.iter().position(|c| c.region == region)?;
        Some(copies.remove(at))
    }

    /// Opens the copy of `region` afresh from its directory and puts it in the
    /// node's list.
    pub(crate) async fn reopen_standby_copy(&self, region: &str) -> Result<(), Error> {
        let copy = open_standby_copy(
            &self.config,
            region,
            self.registry.node(),
            &self.http,
            self.credentials(),
        )
        .await?;
        let mut copies = self.standby_copies.write().expect("not poisoned");
        copies.retain(|c| c.region != region);
        copies.push(copy);
        Ok(())
    }

    /// The region lease (`lease.rs`): whether this node may execute now.
    pub fn lease(&self) -> &crate::lease::Lease {
        &self.lease
    }

    /// True when this node leads its region group and has applied everything
    /// committed before its election: it may execute and read.
    pub fn leads_region(&self) -> bool {
        self.store.leadership() == Leadership::Ready
    }

    /// Waits until this node leads its region group (`leads_region`) or `stop`
    /// flips; false on stop. The background tasks that write the region store
    /// (relays, sweeper, erasure, guard upkeep) run only on the leader, so that
    /// one writer acts per region and a new leader takes over their work.
    pub async fn wait_to_lead_region(&self, stop: &mut watch::Receiver<bool>) -> bool {
        self.wait_for_region(stop, |leads| leads).await
    }

    /// Waits until this node no longer leads its region group, or `stop` flips;
    /// false on stop.
    pub async fn wait_to_leave_region(&self, stop: &mut watch::Receiver<bool>) -> bool {
        self.wait_for_region(stop, |leads| !leads).await
    }

    async fn wait_for_region(
        &self,
        stop: &mut watch::Receiver<bool>,
        done: impl Fn(bool) -> bool,
    ) -> bool {
        let mut metrics = self.store.group().raft().metrics();
        loop {
            if *stop.borrow() {
                return false;
            }
            if done(self.leads_region()) {
                return true;
            }
            tokio::select! {
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
                _ = stop.changed() => return false,
            }
        }
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

    /// The pooled HTTP client, for calls outside the cluster (the payment
    /// provider); calls to other nodes go through `peers`.
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
        survival: Survival,
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
        // The default survival keeps the entry every release decodes.
        let request = match survival {
            Survival::Zone => Request::CreateTenant { record },
            survival => Request::CreateTenantWith { record, survival },
        };
        let written = self
            .registry
            .write(request)
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

/// How long a region group's AppendEntries may run past openraft's timeout:
/// to a standby learner an inter-region round trip away, and with large
/// entries (keyhold-store's limits).
fn region_append_timeouts() -> keyhold_registry::AppendTimeouts {
    keyhold_registry::AppendTimeouts {
        learner: Duration::from_millis(REGION_LEARNER_RPC_TIMEOUT_MS),
        bytes_per_second: REGION_APPEND_BYTES_PER_SECOND_MIN,
    }
}

/// Opens this node's replica of its region store. The configured members of this
/// node's region are the region group's voters: with only this node, it is the
/// group's single voter; with several, the group replicates over the Raft
/// listeners (`/raft/region-<name>/...`, with the node credential), and an
/// answer waits for a majority of them.
async fn open_store(
    config: &Config,
    info: &NodeInfo,
    http: &reqwest::Client,
    credentials: &NodeCredentials,
) -> Result<Store, Error> {
    let group = keyhold_store::raft::group_name(&config.region);
    let member = Member {
        group: group.clone(),
        node: config.node_id,
        info: info.clone(),
    };
    let dir = config.data_dir.join("region");
    let voters: std::collections::BTreeMap<NodeId, NodeInfo> = config
        .members
        .iter()
        .filter(|m| m.region == config.region)
        .map(|m| {
            let info = NodeInfo::new(m.region.clone(), m.api_addr.clone(), m.raft_addr.clone());
            (m.id, info)
        })
        .collect();
    // Over HTTP even with one voter: a standby region's copies are learners.
    // Their heartbeats go in the background, so that an entry (a region tenant's
    // write waits for it) is not held a round trip behind one; the group's
    // voters are all of this region.
    let network = keyhold_registry::HttpNetwork::<keyhold_store::raft::RegionConfig>::new(
        http.clone(),
        &group,
        config.node_id,
        credentials.clone(),
    )
    .with_append_bytes_max(REGION_APPEND_BYTES_MAX)
    .with_append_timeouts(region_append_timeouts())
    .with_learner_heartbeats_detached(&config.region)
    // The group's election timer holds a member back once it learns its log
    // is behind (`keyhold_store::raft`'s elections).
    .with_longer_logs_noted(keyhold_registry::LongerLogs::default())
    // The leader acknowledges only while its standby's copies answer
    // (`survival.rs`, contract section 11 "Bounded loss").
    .with_contacts_noted(keyhold_registry::Contacts::default());
    // With a standby, no replica purges what the standby has not matched
    // (`standby.rs` purges as far as it may).
    let purge = if config.standbys.contains_key(&config.region) {
        Purge::Manual
    } else {
        Purge::Automatic
    };
    let options = GroupOptions {
        snapshot_entries: config.region_snapshot_entries,
        snapshot_written_percent: config.region_snapshot_written_percent,
        purge,
        tree_cache_bytes: config.store_cache_bytes,
    };
    let bootstrap = match config.start {
        // A node that was not among the first members joins as one later.
        Start::Join => Bootstrap::Joiner,
        Start::Create if voters.len() <= 1 => {
            return Ok(Store::open_with(&dir, member, network, options).await?)
        }
        Start::Create if !voters.contains_key(&config.node_id) => {
            return Err(Error::Config(format!(
                "node {} of region {} is not among its region's members; start it with \
                 start = \"join\" and add it with POST /admin/v1/nodes",
                config.node_id, config.region
            )))
        }
        Start::Create => Bootstrap::Voters(voters),
    };
    Ok(Store::open_replica(&dir, member, network, bootstrap, options).await?)
}

/// A streamed copy of another region's store: this node is a learner of that
/// region's group, because its region is that region's standby. A cheap handle.
#[derive(Clone)]
pub struct StandbyCopy {
    /// The region whose store this copies.
    pub region: String,
    pub store: Store,
    /// The region's standby lag as its leader last reported it
    /// (`copies::run`): how much a failover from this copy would lose, as far
    /// as the copy knew. `None` until a report came.
    pub lag: std::sync::Arc<std::sync::Mutex<Option<crate::standby::LagFigures>>>,
    /// When the copy last heard from the region and last grew, for the
    /// failover's bound on what it lost (`failover::lost_bound`).
    pub clock: std::sync::Arc<CopyClock>,
}

/// When a standby copy last heard from its region's leader (any Raft request
/// of its group reached this node) and when its log last grew, by this
/// node's monotonic clock; `None` since this copy opened.
#[derive(Debug, Default)]
pub struct CopyClock {
    heard: std::sync::Mutex<Option<std::time::Instant>>,
    grew: std::sync::Mutex<Option<std::time::Instant>>,
}

impl CopyClock {
    /// A Raft request of the copy's group arrived at `at`.
    pub fn heard(&self, at: std::time::Instant) {
        *self.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// How long ago the copy last heard from its region, and last grew.
    pub fn ages(&self, now: std::time::Instant) -> (Option<Duration>, Option<Duration>) {
        let age = |t: &std::sync::Mutex<Option<std::time::Instant>>| {
            t.lock()
                .unwrap_or_else(|e| e.into_inner())
                .map(|t| now.saturating_duration_since(t))
        };
        (age(&self.heard), age(&self.grew))
    }
}

/// Notes in `clock` each time the copy's log grows, until its Raft stops.
async fn watch_growth(
    mut metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, NodeInfo>>,
    clock: std::sync::Arc<CopyClock>,
) {
    let mut last = metrics.borrow_and_update().last_log_index;
    while metrics.changed().await.is_ok() {
        let now_last = metrics.borrow_and_update().last_log_index;
        if now_last > last {
            *clock.grew.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        }
        last = now_last;
    }
}

/// The directory of this node's copy of `region`'s store.
pub(crate) fn standby_copy_dir(config: &Config, region: &str) -> std::path::PathBuf {
    config.data_dir.join(format!("standby-{region}"))
}

/// Opens a copy of every region whose standby is this node's region, each a
/// learner of that region's group (`Bootstrap::Joiner`: the region's leader adds
/// it, `standby.rs`), under `standby-<region>/` in the data dir.
async fn open_standby_copies(
    config: &Config,
    info: &NodeInfo,
    http: &reqwest::Client,
    credentials: &NodeCredentials,
) -> Result<Vec<StandbyCopy>, Error> {
    let mut copies = Vec::new();
    for (region, standby) in &config.standbys {
        if standby != &config.region {
            continue;
        }
        // A reset a crash interrupted (`copies::reset`) left the old copy
        // aside: it goes now.
        crate::copies::remove_set_aside(config, region)?;
        copies.push(open_standby_copy(config, region, info, http, credentials).await?);
    }
    Ok(copies)
}

/// Opens (or creates) this node's copy of `region`'s store.
async fn open_standby_copy(
    config: &Config,
    region: &str,
    info: &NodeInfo,
    http: &reqwest::Client,
    credentials: &NodeCredentials,
) -> Result<StandbyCopy, Error> {
    let group = keyhold_store::raft::group_name(region);
    let member = Member {
        group: group.clone(),
        node: config.node_id,
        info: info.clone(),
    };
    let network = keyhold_registry::HttpNetwork::<keyhold_store::raft::RegionConfig>::new(
        http.clone(),
        &group,
        config.node_id,
        credentials.clone(),
    )
    .with_append_bytes_max(REGION_APPEND_BYTES_MAX)
    .with_append_timeouts(region_append_timeouts());
    let options = GroupOptions {
        snapshot_entries: config.region_snapshot_entries,
        snapshot_written_percent: config.region_snapshot_written_percent,
        purge: Purge::Automatic,
        tree_cache_bytes: config.store_cache_bytes,
    };
    let dir = standby_copy_dir(config, region);
    let store = Store::open_replica(&dir, member, network, Bootstrap::Joiner, options).await?;
    let clock = std::sync::Arc::new(CopyClock::default());
    tokio::spawn(watch_growth(store.group().raft().metrics(), clock.clone()));
    Ok(StandbyCopy {
        region: region.to_owned(),
        store,
        lag: Default::default(),
        clock,
    })
}
