//! Node configuration: the TOML file of `keyhold serve --config FILE`, and the
//! same struct built in code by tests and written to a file by `keyhold up`
//! (so it serializes back to the TOML it reads).

use crate::limits;
use crate::Error;
use keyhold_core::{Horizon, Policy, Retention};
use keyhold_registry::NodeCredentials;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's region.
    pub region: String,
    /// Every region of the cluster (this one included); tenants may only be homed
    /// in one of these.
    #[serde(default)]
    pub regions: Vec<String>,
    pub data_dir: PathBuf,
    /// Address `keyhold serve` listens on.
    #[serde(default = "d_listen")]
    pub listen: String,
    /// This node's id in the registry group; unique in the cluster, never reused.
    #[serde(default = "d_node_id")]
    pub node_id: u64,
    /// Take the node id from the host name instead of `node_id`: the number
    /// that ends it (a StatefulSet pod `keyhold-a-2` has ordinal 2) times
    /// `stride`, plus `offset`. So one config serves every pod of a region,
    /// and the image needs no shell to fill it in (`Config::take_from_host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id_from_hostname: Option<NodeIdFromHostname>,
    /// Address of this node's Raft listener (registry replication).
    #[serde(default = "d_raft_listen")]
    pub raft_listen: String,
    /// The registry's first voters, this node included. The member with the lowest
    /// id creates the group. Empty: this node alone (a one-node cluster).
    #[serde(default)]
    pub members: Vec<Member>,
    /// Bearer token of the admin API (at least 16 characters).
    #[serde(default)]
    pub admin_token: String,
    /// Name of an environment variable holding the admin token instead (a
    /// Kubernetes Secret, say), so the config file carries no secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_env: Option<String>,
    /// File holding the cluster's node credential(s): the secret every inter-node
    /// call carries (Raft, forwarding, move copy). One per line; the first is sent,
    /// all are accepted, so a rotation lists the new and the old one for a while.
    #[serde(default)]
    pub node_credential_file: Option<PathBuf>,
    /// Name of an environment variable holding the node credential(s) instead
    /// (same form, commas allowed as separators).
    #[serde(default)]
    pub node_credential_env: Option<String>,
    #[serde(default = "d_response_ttl", with = "humantime_serde_compat")]
    pub response_ttl: Duration,
    #[serde(default = "d_marker_ttl", with = "humantime_serde_compat")]
    pub marker_ttl: Duration,
    #[serde(default = "d_processed_ttl", with = "humantime_serde_compat")]
    pub processed_ttl: Duration,
    /// How long the payment provider remembers an `Idempotency-Key`; the last
    /// stage of the dedupe horizon. Unset: it never forgets (the bundled fake
    /// provider keeps every key).
    #[serde(default, with = "humantime_serde_option")]
    pub psp_key_retention: Option<Duration>,
    #[serde(default = "d_inflight_wait", with = "humantime_serde_compat")]
    pub inflight_wait: Duration,
    #[serde(default = "d_sweep_interval", with = "humantime_serde_compat")]
    pub sweep_interval: Duration,
    /// Lease of a move's driver in the registry: a successor takes a move over
    /// only after its driver stayed silent this long.
    #[serde(default = "d_move_driver_lease", with = "humantime_serde_compat")]
    pub move_driver_lease: Duration,
    #[serde(default = "d_body_bytes_max")]
    pub body_bytes_max: usize,
    #[serde(default = "d_requests_per_second")]
    pub tenant_requests_per_second: u32,
    #[serde(default = "d_new_keys_per_second")]
    pub tenant_new_keys_per_second: u32,
    /// Open connections of the API listener; past this a new connection is
    /// accepted and closed at once.
    #[serde(default = "d_connections_max")]
    pub connections_max: usize,
    /// Open connections of the API listener from one client address; past this
    /// a new connection from that address is accepted and closed at once.
    #[serde(default = "d_connections_per_address_max")]
    pub connections_per_address_max: usize,
    /// New connections of the API listener one client address may open a
    /// second (and as many at once); past this a new connection from that
    /// address is accepted and closed at once.
    #[serde(default = "d_new_connections_per_address_per_second")]
    pub new_connections_per_address_per_second: u32,
    /// A connection must send a whole request head within this long of opening
    /// or of its previous answer, else it is closed (also the keep-alive idle limit).
    #[serde(default = "d_header_read_timeout", with = "humantime_serde_compat")]
    pub header_read_timeout: Duration,
    /// Origin of the payment provider the payments consumer charges; without it
    /// the payments consumer does not run.
    #[serde(default)]
    pub psp_url: Option<String>,
    /// Whether this node runs its region's outbox relays (`on`), or takes
    /// orders only (`off`): each order still writes its `order.created` event
    /// in the same atomic batch, but nothing delivers it.
    #[serde(default)]
    pub downstream: Downstream,
    /// Name of an environment variable holding a secret; when set, records store
    /// `hmac-sha256:` fingerprints instead of plain ones.
    #[serde(default)]
    pub fingerprint_hmac_key_env: Option<String>,
    /// Folder of the browser demo (wasm/site, built by wasm/build.sh), served
    /// at `/demo` instead of the demo compiled into the binary.
    #[serde(default)]
    pub demo_dir: Option<PathBuf>,
    /// Source address of this node's outgoing connections (other nodes, the
    /// payment provider). Unset: the system chooses. `keyhold up` gives each
    /// region its own loopback address so that its proxies can tell regions apart.
    #[serde(default)]
    pub outbound_ip: Option<IpAddr>,
    /// How this node enters its groups when its data dir is empty: `create` (the
    /// configured members form the registry and the region group) or `join` (a
    /// replacement or new node: it waits to be added with `POST /admin/v1/nodes`
    /// and catches up from the leaders; it never creates a group).
    #[serde(default)]
    pub start: Start,
    /// The region group builds a snapshot after this many applied log entries and
    /// keeps as many behind it; a node that lags more catches up by the snapshot.
    #[serde(default = "d_region_snapshot_entries")]
    pub region_snapshot_entries: u64,
    /// ... once those entries wrote at least this percent of the last
    /// snapshot's size to the region's store (0: after the entries alone), so
    /// that a large region is not streamed whole every few minutes.
    #[serde(default = "d_region_snapshot_written_percent")]
    pub region_snapshot_written_percent: u64,
    /// Each region's standby region (`{ a = "b", b = "c", c = "a" }`): every node
    /// of the standby region keeps a streamed copy of the region's store (a
    /// learner of its group). The same table on every node; a region without
    /// an entry has no standby.
    #[serde(default)]
    pub standbys: std::collections::BTreeMap<String, String>,
    /// sled's cache of the region store's tree, in bytes as sled counts them
    /// (pages' serialized size; the process holds a few times this). The node's
    /// memory stays near this bound however much the store holds.
    #[serde(default = "d_store_cache_bytes")]
    pub store_cache_bytes: u64,
    /// Fail a region over to its standby on its own once no node of it has
    /// been ready for this long (unset: never; a failover is an operator's
    /// decision). At least `AUTO_FAILOVER_AFTER_MS_MIN` (2 s): a registry
    /// leader change does not make a region unready (its lease outlasts an
    /// election), so a short value risks only failovers of regions that were
    /// slow to answer, not of healthy ones during an election.
    #[serde(default, with = "humantime_serde_option")]
    pub auto_failover_after: Option<Duration>,
    /// The region acknowledges a write only while its standby has confirmed
    /// every command of the region older than this (contract section 11,
    /// "Bounded loss"); past it writes wait, then answer 503
    /// `standby-unreachable`, until the standby confirms again or the registry
    /// records it lost. What a failover can lose is bounded by it.
    #[serde(default = "d_max_standby_lag", with = "humantime_serde_compat")]
    pub max_standby_lag: Duration,
}

/// `node_id = ordinal * stride + offset`, the ordinal ending the host name.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeIdFromHostname {
    pub stride: u64,
    pub offset: u64,
}

/// What a node's config may take from where it runs: environment variables
/// and the host name. An input, so tests give their own.
pub struct Host<'a> {
    pub name: String,
    pub var: &'a dyn Fn(&str) -> Option<String>,
}

impl Host<'static> {
    /// This process's host: `HOSTNAME` (set by container runtimes to the pod's
    /// name), else the kernel's host name.
    pub fn current() -> Result<Host<'static>, Error> {
        let name = match std::env::var("HOSTNAME") {
            Ok(name) if !name.is_empty() => name,
            _ => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|n| n.trim().to_owned())
                .map_err(|e| Error::Config(format!("cannot read the host name: {e}")))?,
        };
        Ok(Host {
            name,
            var: &|name| std::env::var(name).ok(),
        })
    }
}

/// How a node with an empty data dir enters its groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// The configured members create the groups (a no-op once they exist).
    #[default]
    Create,
    /// It waits to be added by the groups' leaders.
    Join,
}

/// Whether a node delivers its region's outbox events to the consumers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Downstream {
    /// The relays run on the region store's leader (inventory, and payments
    /// with a `psp_url`).
    #[default]
    On,
    /// Ingest only: no relay runs, so events accumulate in the outbox and,
    /// undelivered, are never swept. For benchmarks of the write path alone
    /// and for a cluster whose downstream is paused; turning it back on
    /// delivers every event kept since.
    Off,
}

/// One registry voter of the cluster's first membership.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub id: u64,
    pub region: String,
    pub api_addr: String,
    pub raft_addr: String,
}

fn d_region_snapshot_entries() -> u64 {
    keyhold_store::raft::GroupOptions::default().snapshot_entries
}

fn d_region_snapshot_written_percent() -> u64 {
    keyhold_store::raft::GroupOptions::default().snapshot_written_percent
}
fn d_store_cache_bytes() -> u64 {
    keyhold_store::raft::GroupOptions::default().tree_cache_bytes
}
fn d_max_standby_lag() -> Duration {
    Duration::from_millis(limits::MAX_STANDBY_LAG_MS_DEFAULT)
}
fn d_node_id() -> u64 {
    1
}
fn d_raft_listen() -> String {
    "127.0.0.1:0".to_owned()
}
fn d_listen() -> String {
    "127.0.0.1:8080".to_owned()
}
fn d_response_ttl() -> Duration {
    Duration::from_millis(Policy::default().response_ttl_ms)
}
fn d_marker_ttl() -> Duration {
    Duration::from_millis(Policy::default().marker_ttl_ms)
}
fn d_processed_ttl() -> Duration {
    Duration::from_millis(Policy::default().processed_ttl_ms)
}
fn d_inflight_wait() -> Duration {
    Duration::from_millis(limits::INFLIGHT_WAIT_MS_DEFAULT)
}
fn d_sweep_interval() -> Duration {
    Duration::from_millis(limits::SWEEP_INTERVAL_MS_DEFAULT)
}
fn d_move_driver_lease() -> Duration {
    Duration::from_millis(limits::MOVE_DRIVER_LEASE_MS_DEFAULT)
}
fn d_body_bytes_max() -> usize {
    limits::BODY_BYTES_MAX_DEFAULT
}
fn d_requests_per_second() -> u32 {
    limits::TENANT_REQUESTS_PER_SECOND_DEFAULT
}
fn d_new_keys_per_second() -> u32 {
    limits::TENANT_NEW_KEYS_PER_SECOND_DEFAULT
}
fn d_connections_max() -> usize {
    limits::CONNECTIONS_MAX_DEFAULT
}
fn d_connections_per_address_max() -> usize {
    limits::CONNECTIONS_PER_ADDRESS_MAX_DEFAULT
}
fn d_new_connections_per_address_per_second() -> u32 {
    limits::NEW_CONNECTIONS_PER_ADDRESS_PER_SECOND_DEFAULT
}
fn d_header_read_timeout() -> Duration {
    Duration::from_millis(limits::HEADER_READ_TIMEOUT_MS_DEFAULT)
}

/// Durations are written like `3s`, `500ms`, `48h`, `30d` (contract section 9).
mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

mod humantime_serde_option {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::humantime_serde_compat::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}

/// Checks a node's advertised address (`members`' `api_addr` and `raft_addr`,
/// a node added with `POST /admin/v1/nodes`): `host:port`, the host an IP
/// address (IPv6 in brackets) or a DNS name, such as a Kubernetes pod's
/// `keyhold-a-0.keyhold-a`. Other nodes dial it as written.
pub fn check_node_address(addr: &str) -> Result<(), String> {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("{addr:?} is not an address (host:port)"));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("{addr:?} is not an address (host:port): no port"));
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!(
            "{addr:?} is not an address (host:port): {host:?} is neither an IP address nor a DNS name"
        ));
    }
    Ok(())
}

/// Parses `3s`, `500ms`, `48h`, `30d` and combinations like `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration {text:?} ({e}); write it like 3s, 500ms, 48h or 30d")
    })
}

impl Config {
    /// A config with every default, for `keyhold up` and tests.
    pub fn new(region: &str, data_dir: PathBuf, admin_token: String) -> Config {
        Config {
            region: region.to_owned(),
            regions: vec![region.to_owned()],
            data_dir,
            listen: d_listen(),
            node_id: d_node_id(),
            node_id_from_hostname: None,
            raft_listen: d_raft_listen(),
            members: Vec::new(),
            admin_token,
            admin_token_env: None,
            node_credential_file: None,
            node_credential_env: None,
            response_ttl: d_response_ttl(),
            marker_ttl: d_marker_ttl(),
            processed_ttl: d_processed_ttl(),
            psp_key_retention: None,
            auto_failover_after: None,
            max_standby_lag: d_max_standby_lag(),
            inflight_wait: d_inflight_wait(),
            sweep_interval: d_sweep_interval(),
            move_driver_lease: d_move_driver_lease(),
            body_bytes_max: d_body_bytes_max(),
            tenant_requests_per_second: d_requests_per_second(),
            tenant_new_keys_per_second: d_new_keys_per_second(),
            connections_max: d_connections_max(),
            connections_per_address_max: d_connections_per_address_max(),
            new_connections_per_address_per_second: d_new_connections_per_address_per_second(),
            header_read_timeout: d_header_read_timeout(),
            fingerprint_hmac_key_env: None,
            psp_url: None,
            downstream: Downstream::On,
            demo_dir: None,
            outbound_ip: None,
            start: Start::Create,
            region_snapshot_entries: d_region_snapshot_entries(),
            region_snapshot_written_percent: d_region_snapshot_written_percent(),
            standbys: Default::default(),
            store_cache_bytes: d_store_cache_bytes(),
        }
    }

    /// The TOML text `from_toml` reads back as this config.
    pub fn to_toml(&self) -> Result<String, Error> {
        toml::to_string(self).map_err(|e| Error::Config(format!("config as TOML: {e}")))
    }

    pub fn from_toml(text: &str) -> Result<Config, Error> {
        let mut config: Config = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        if config.regions.is_empty() {
            config.regions = vec![config.region.clone()];
        }
        if config.node_id_from_hostname.is_some() {
            // Two sources of one id: refuse rather than pick one silently.
            let table: toml::Table =
                toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
            if table.contains_key("node_id") {
                return Err(Error::Config(
                    "set node_id or node_id_from_hostname, not both".into(),
                ));
            }
        }
        Ok(config)
    }

    /// Fills in what the config takes from where the node runs: the node id
    /// from the host name (`node_id_from_hostname`) and the admin token from
    /// the environment (`admin_token_env`). Idempotent; `keyhold serve` calls
    /// it before `validate`.
    pub fn take_from_host(&mut self, host: &Host) -> Result<(), Error> {
        if let Some(rule) = self.node_id_from_hostname {
            let digits: String = host
                .name
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let ordinal: u64 = digits.parse().map_err(|_| {
                Error::Config(format!(
                    "node_id_from_hostname: the host name {:?} does not end in a number \
                     (a StatefulSet pod's ordinal)",
                    host.name
                ))
            })?;
            self.node_id = ordinal
                .checked_mul(rule.stride)
                .and_then(|id| id.checked_add(rule.offset))
                .filter(|id| *id > 0)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "node_id_from_hostname: ordinal {ordinal} * {} + {} is no node id",
                        rule.stride, rule.offset
                    ))
                })?;
        }
        if let Some(var) = &self.admin_token_env {
            if !self.admin_token.is_empty() {
                return Err(Error::Config(
                    "set admin_token or admin_token_env, not both".into(),
                ));
            }
            self.admin_token = (host.var)(var).ok_or_else(|| {
                Error::Config(format!(
                    "admin_token_env names {var}, which is unset or not UTF-8"
                ))
            })?;
            // Taken: the config now reads like one with the token written in.
            self.admin_token_env = None;
        }
        Ok(())
    }

    /// The node credentials: read from `node_credential_file` or
    /// `node_credential_env`; a node configured with neither (only allowed alone,
    /// see `validate`) makes up a random one, since nobody else calls it.
    pub fn node_credentials(&self) -> Result<NodeCredentials, Error> {
        let text = match (&self.node_credential_file, &self.node_credential_env) {
            (Some(path), _) => std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!(
                    "node_credential_file {} is not readable: {e}",
                    path.display()
                ))
            })?,
            (None, Some(var)) => std::env::var(var).map_err(|_| {
                Error::Config(format!(
                    "node_credential_env names {var}, which is unset or not UTF-8"
                ))
            })?,
            (None, None) => crate::tenants::new_token(),
        };
        NodeCredentials::parse(&text).map_err(|e| Error::Config(e.to_string()))
    }

    pub fn policy(&self) -> Policy {
        Policy {
            response_ttl_ms: self.response_ttl.as_millis() as u64,
            marker_ttl_ms: self.marker_ttl.as_millis() as u64,
            processed_ttl_ms: self.processed_ttl.as_millis() as u64,
            inflight_wait_ms: self.inflight_wait.as_millis() as u64,
        }
    }

    /// Every stage of duplicate protection, the provider's included.
    pub fn horizon(&self) -> Horizon {
        let provider = self.psp_key_retention.map_or(Retention::Unbounded, |d| {
            Retention::Ms(d.as_millis() as u64)
        });
        self.policy().horizon(provider)
    }

    /// Refuses a configuration the node must not run with, naming the rule.
    pub fn validate(&self) -> Result<(), Error> {
        self.horizon()
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        if !self.regions.contains(&self.region) {
            return Err(Error::Config(format!(
                "region {:?} is not among regions {:?}",
                self.region, self.regions
            )));
        }
        if self.admin_token.len() < 16 {
            return Err(Error::Config(
                "admin_token (or the variable admin_token_env names) must be at least 16 \
                 characters"
                    .into(),
            ));
        }
        if self.node_credential_file.is_some() && self.node_credential_env.is_some() {
            return Err(Error::Config(
                "set node_credential_file or node_credential_env, not both".into(),
            ));
        }
        // Contract section 8: whoever holds the admin token must not be able to
        // speak as a node (forge Raft calls, epochs, forwarded hops). A source
        // that cannot be read is refused where the node reads it
        // (`node_credentials`), with its own message.
        let configured = self.node_credential_file.is_some() || self.node_credential_env.is_some();
        if let (true, Ok(credentials)) = (configured, self.node_credentials()) {
            if credentials.accepts(self.admin_token.as_bytes()) {
                return Err(Error::Config(
                    "the node credential must not be the admin_token (contract section 8: \
                     the node credential is never the admin's token nor a tenant's)"
                        .into(),
                ));
            }
        }
        if let Some(after) = self.auto_failover_after {
            if after < Duration::from_millis(limits::AUTO_FAILOVER_AFTER_MS_MIN) {
                return Err(Error::Config(format!(
                    "auto_failover_after must be at least {} ms",
                    limits::AUTO_FAILOVER_AFTER_MS_MIN
                )));
            }
        }
        let lag_ms = self.max_standby_lag.as_millis();
        if !(u128::from(limits::MAX_STANDBY_LAG_MS_MIN)
            ..=u128::from(limits::MAX_STANDBY_LAG_MS_MAX))
            .contains(&lag_ms)
        {
            return Err(Error::Config(format!(
                "max_standby_lag must be from {} ms to {} s",
                limits::MAX_STANDBY_LAG_MS_MIN,
                limits::MAX_STANDBY_LAG_MS_MAX / 1000
            )));
        }
        for (region, standby) in &self.standbys {
            if !self.regions.contains(region) || !self.regions.contains(standby) {
                return Err(Error::Config(format!(
                    "standbys: {region} = {standby:?} names a region not among regions {:?}",
                    self.regions
                )));
            }
            if region == standby {
                return Err(Error::Config(format!(
                    "standbys: region {region} cannot be its own standby"
                )));
            }
        }
        if self.region_snapshot_entries == 0 {
            return Err(Error::Config(
                "region_snapshot_entries must be at least 1".into(),
            ));
        }
        let cache_bytes = keyhold_store::limits::REGION_TREE_CACHE_BYTES_MIN
            ..=keyhold_store::limits::REGION_TREE_CACHE_BYTES_MAX;
        if !cache_bytes.contains(&self.store_cache_bytes) {
            return Err(Error::Config(format!(
                "store_cache_bytes must be from {} (1 MiB) to {} (256 GiB), not {}",
                cache_bytes.start(),
                cache_bytes.end(),
                self.store_cache_bytes
            )));
        }
        let several_nodes = self.members.len() > 1;
        if several_nodes
            && self.node_credential_file.is_none()
            && self.node_credential_env.is_none()
        {
            return Err(Error::Config(
                "a cluster of several nodes needs node_credential_file or node_credential_env \
                 (the secret inter-node calls carry)"
                    .into(),
            ));
        }
        self.validate_members()?;
        if self.body_bytes_max == 0 || self.body_bytes_max > limits::MOVE_PAGE_BYTES_MAX {
            return Err(Error::Config(format!(
                "body_bytes_max must be from 1 to {} (a stored entry must fit a move's page)",
                limits::MOVE_PAGE_BYTES_MAX
            )));
        }
        if self.move_driver_lease < Duration::from_millis(limits::MOVE_DRIVER_LEASE_MS_MIN) {
            return Err(Error::Config(format!(
                "move_driver_lease must be at least {} ms",
                limits::MOVE_DRIVER_LEASE_MS_MIN
            )));
        }
        if self.connections_max == 0
            || self.connections_per_address_max == 0
            || self.new_connections_per_address_per_second == 0
        {
            return Err(Error::Config(
                "connections_max, connections_per_address_max and \
                 new_connections_per_address_per_second must be greater than zero"
                    .into(),
            ));
        }
        if self.header_read_timeout.is_zero() {
            return Err(Error::Config(
                "header_read_timeout must be greater than zero".into(),
            ));
        }
        if self.tenant_requests_per_second == 0 || self.tenant_new_keys_per_second == 0 {
            return Err(Error::Config(
                "tenant rate limits must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Every member's addresses and region (a node that is not among the
    /// first members joins later as a registry learner, added by the leader,
    /// and serves the API by forwarding to its region's store node).
    fn validate_members(&self) -> Result<(), Error> {
        for m in &self.members {
            for addr in [&m.api_addr, &m.raft_addr] {
                check_node_address(addr)
                    .map_err(|e| Error::Config(format!("member {}: {e}", m.id)))?;
            }
            if !self.regions.contains(&m.region) {
                return Err(Error::Config(format!(
                    "member {} names region {:?}, which is not among regions",
                    m.id, m.region
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_durations() {
        let c = Config::from_toml(
            r#"
            region = "eu"
            data_dir = "/tmp/x"
            admin_token = "0123456789abcdef0123"
            response_ttl = "2s"
            marker_ttl = "30d"
            inflight_wait = "500ms"
            "#,
        )
        .unwrap();
        assert_eq!(c.response_ttl, Duration::from_secs(2));
        assert_eq!(c.marker_ttl, Duration::from_secs(30 * 86_400));
        assert_eq!(c.inflight_wait, Duration::from_millis(500));
        assert_eq!(c.regions, vec!["eu".to_string()]);
        c.validate().unwrap();
    }

    #[test]
    fn writes_the_toml_it_reads() {
        let mut c = Config::new("a", "/tmp/x".into(), "0123456789abcdef0123".into());
        c.regions = vec!["a".into(), "b".into()];
        c.response_ttl = Duration::from_millis(1500);
        c.psp_key_retention = Some(Duration::from_secs(40 * 86_400));
        c.outbound_ip = Some("127.0.1.2".parse().unwrap());
        c.members = vec![Member {
            id: 1,
            region: "a".into(),
            api_addr: "127.0.0.1:7420".into(),
            raft_addr: "127.0.0.1:7430".into(),
        }];
        let back = Config::from_toml(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back.to_toml().unwrap(), c.to_toml().unwrap());
        assert_eq!(back.response_ttl, c.response_ttl);
        assert_eq!(back.psp_key_retention, c.psp_key_retention);
        assert_eq!(back.outbound_ip, c.outbound_ip);
        assert_eq!(back.members, c.members);
    }

    fn host<'a>(name: &str, var: &'a dyn Fn(&str) -> Option<String>) -> Host<'a> {
        Host {
            name: name.to_owned(),
            var,
        }
    }

    const POD_CONFIG: &str = r#"
        region = "b"
        regions = ["a", "b", "c"]
        data_dir = "/var/lib/keyhold"
        admin_token_env = "ADMIN"
        node_id_from_hostname = { stride = 3, offset = 2 }
    "#;

    #[test]
    fn a_pod_takes_its_node_id_from_its_ordinal_and_the_admin_token_from_the_environment() {
        let env = |name: &str| (name == "ADMIN").then(|| "a-secret-of-twenty-chars".to_owned());
        let mut c = Config::from_toml(POD_CONFIG).unwrap();
        c.take_from_host(&host("keyhold-b-2", &env)).unwrap();
        assert_eq!(c.node_id, 2 * 3 + 2);
        assert_eq!(c.admin_token, "a-secret-of-twenty-chars");
        c.validate().unwrap();
        // Taking twice changes nothing (the token is no longer "from env").
        c.take_from_host(&host("keyhold-b-2", &env)).unwrap();
        assert_eq!(
            (c.node_id, c.admin_token.as_str()),
            (8, "a-secret-of-twenty-chars")
        );
    }

    #[test]
    fn what_a_pod_cannot_take_from_its_host_is_refused_by_name() {
        let env = |_: &str| None;
        let mut c = Config::from_toml(POD_CONFIG).unwrap();
        let e = c
            .take_from_host(&host("keyhold-b", &env))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not end in a number"), "{e}");
        let e = c
            .take_from_host(&host("keyhold-b-0", &env))
            .unwrap_err()
            .to_string();
        assert!(e.contains("admin_token_env names ADMIN"), "{e}");
        // Without taking from the host, the token is missing.
        let e = Config::from_toml(POD_CONFIG)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("admin_token"), "{e}");
        // Two sources of one value.
        let e = Config::from_toml(&format!("node_id = 4\n{POD_CONFIG}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("node_id or node_id_from_hostname"), "{e}");
        let env = |_: &str| Some("another-secret-of-20".to_owned());
        let mut c = Config::from_toml(&format!("admin_token = \"x\"\n{POD_CONFIG}")).unwrap();
        let e = c
            .take_from_host(&host("keyhold-b-0", &env))
            .unwrap_err()
            .to_string();
        assert!(e.contains("admin_token or admin_token_env"), "{e}");
        // An id of 0 is no node id.
        let mut c = Config::from_toml(&POD_CONFIG.replace("offset = 2", "offset = 0")).unwrap();
        let e = c
            .take_from_host(&host("keyhold-b-0", &env))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is no node id"), "{e}");
    }

    #[test]
    fn node_addresses_are_host_and_port_by_ip_or_dns_name() {
        for good in [
            "127.0.0.1:7400",
            "[::1]:7410",
            "keyhold-a-0.keyhold-a:7400",
            "keyhold-a-0.keyhold-a.default.svc.cluster.local:7410",
            "localhost:1",
        ] {
            check_node_address(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "keyhold-a-0",
            "keyhold-a-0:",
            "keyhold-a-0:http",
            ":7400",
            "a..b:7400",
            "-a:7400",
            "a_b:7400",
            "http://a:7400",
            "a:70000",
        ] {
            let e = check_node_address(bad).unwrap_err();
            assert!(e.contains("is not an address (host:port)"), "{bad}: {e}");
        }
        let mut c = Config::new("a", "/tmp/x".into(), "0123456789abcdef0123".into());
        c.node_credential_env = Some("KEYHOLD_TEST_UNUSED".into());
        c.members = vec![Member {
            id: 1,
            region: "a".into(),
            api_addr: "keyhold-a-0.keyhold-a:7400".into(),
            raft_addr: "keyhold-a-0.keyhold-a".into(),
        }];
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("member 1: \"keyhold-a-0.keyhold-a\" is not an address"),
            "{e}"
        );
    }

    #[test]
    fn automatic_failover_is_off_by_default_and_never_shorter_than_its_minimum() {
        let mut c = Config::new("eu", "/tmp/x".into(), "0123456789abcdef0123".into());
        assert_eq!(c.auto_failover_after, None);
        c.auto_failover_after = Some(Duration::from_millis(1_999));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("auto_failover_after"), "{e}");
        // The contract's shortest value (section 11, "Fast automatic failover").
        c.auto_failover_after = Some(Duration::from_secs(2));
        c.validate().unwrap();
        c.auto_failover_after = Some(Duration::from_secs(30));
        c.validate().unwrap();
        let back = Config::from_toml(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back.auto_failover_after, Some(Duration::from_secs(30)));
    }

    #[test]
    fn downstream_is_on_unless_turned_off() {
        let base = "region='a'\ndata_dir='x'\nadmin_token='0123456789abcdef0123'\n";
        assert_eq!(Config::from_toml(base).unwrap().downstream, Downstream::On);
        let off = Config::from_toml(&format!("{base}downstream = 'off'")).unwrap();
        assert_eq!(off.downstream, Downstream::Off);
        let back = Config::from_toml(&off.to_toml().unwrap()).unwrap();
        assert_eq!(back.downstream, Downstream::Off);
        assert!(Config::from_toml(&format!("{base}downstream = 'paused'")).is_err());
    }

    #[test]
    fn refuses_marker_shorter_than_response() {
        let mut c = Config::new("eu", "/tmp/x".into(), "0123456789abcdef0123".into());
        c.marker_ttl = Duration::from_secs(60);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("marker_ttl"), "{e}");
    }

    #[test]
    fn several_nodes_need_a_node_credential() {
        let mut c = Config::new("a", "/tmp/x".into(), "0123456789abcdef0123".into());
        c.regions = vec!["a".into(), "b".into()];
        c.members = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, r)| Member {
                id: i as u64 + 1,
                region: (*r).into(),
                api_addr: format!("127.0.0.1:{}", 7400 + i),
                raft_addr: format!("127.0.0.1:{}", 7410 + i),
            })
            .collect();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("node_credential"), "{e}");
        c.node_credential_env = Some("KEYHOLD_TEST_NODE_CREDENTIAL_UNSET".into());
        c.validate().unwrap();
        let e = c.node_credentials().unwrap_err().to_string();
        assert!(e.contains("KEYHOLD_TEST_NODE_CREDENTIAL_UNSET"), "{e}");
        // Alone, a node makes up its own.
        let alone = Config::new("a", "/tmp/x".into(), "0123456789abcdef0123".into());
        assert!(alone.node_credentials().is_ok());
    }

    /// Contract section 8: the node credential is never the admin's token, in
    /// any place of a rotation list.
    #[test]
    fn refuses_a_node_credential_equal_to_the_admin_token() {
        let admin = "admin-and-node-secret-0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node-credential");
        let mut c = Config::new("a", "/tmp/x".into(), admin.into());
        c.node_credential_file = Some(file.clone());
        for listed in [
            admin.to_string(),
            format!("other-node-secret-0123456789abcdef\n{admin}"),
        ] {
            std::fs::write(&file, listed).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("admin_token") && e.contains("section 8"), "{e}");
        }
        std::fs::write(&file, "other-node-secret-0123456789abcdef\n").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn refuses_a_provider_that_forgets_keys_too_early() {
        let c = Config::from_toml(
            "region='a'\ndata_dir='x'\nadmin_token='0123456789abcdef0123'\npsp_key_retention='24h'",
        )
        .unwrap();
        assert_eq!(c.psp_key_retention, Some(Duration::from_secs(86_400)));
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("psp_key_retention (1day) must be at least processed_ttl (35days)"),
            "{e}"
        );
    }

    #[test]
    fn store_cache_bytes_parses_and_is_bounded() {
        let base = "region='a'\ndata_dir='x'\nadmin_token='0123456789abcdef0123'\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(
            c.store_cache_bytes,
            keyhold_store::limits::REGION_TREE_CACHE_BYTES_DEFAULT
        );
        let c = Config::from_toml(&format!("{base}store_cache_bytes = 67108864")).unwrap();
        assert_eq!(c.store_cache_bytes, 64 * 1024 * 1024);
        c.validate().unwrap();
        for bad in ["0", "1048575", "1099511627776"] {
            let c = Config::from_toml(&format!("{base}store_cache_bytes = {bad}")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("store_cache_bytes must be from 1048576 (1 MiB)"),
                "{bad}: {e}"
            );
        }
        let e = Config::from_toml(&format!("{base}store_cache_bytes = -1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("store_cache_bytes"), "{e}");
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_errors() {
        assert!(Config::from_toml("region='a'\ndata_dir='x'\nadmin_token='y'\nbogus=1").is_err());
        let e = Config::from_toml("region='a'\ndata_dir='x'\nadmin_token='y'\nresponse_ttl='soon'")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid duration"), "{e}");
    }
}
