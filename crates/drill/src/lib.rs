//! `keyhold drill`: a region failover drill on a cluster started by `keyhold
//! up` (contract section 10, "Drill"). Steady order traffic for the drilled
//! region's tenants enters through every region (`traffic.rs`); then the
//! fault (every node of the region killed, or the region isolated, through
//! `up`'s control API), the failover to the region's standby through the
//! admin API (or, with `--auto`, by the cluster itself), the return (nodes started again, or the isolation healed), and
//! the region's reconciliation. The report (`report.rs`) measures what a
//! person running the drill needs: time to detect, the window of failed
//! requests, the estimated loss against what the drill's own client saw
//! acknowledged and then missing, duplicates, orphans, charges per order, the
//! lag before the fault. It passes only if every acknowledged order is either
//! present in its new home or listed as an orphan, and every duplicate is
//! listed.
//!
//! The drill judges from its own client's record and the cluster's final
//! state; it never trusts the failover's estimate for the verdict.

pub mod cluster;
pub mod limits;
pub mod report;
pub mod traffic;

use cluster::{Calls, ClusterFile};
use limits::*;
use report::{Charges, Instants, Report, Timings, WallClock};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use traffic::Traffic;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid drill: {0}")]
    Invalid(String),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("cluster: {0}")]
    Cluster(String),
    #[error(transparent)]
    ClusterFile(#[from] keyhold_clusterfile::Error),
    #[error("timed out: {0}")]
    Timeout(String),
}

/// The fault a drill injects into the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// SIGKILL every node of the region; the return starts them again.
    Kill,
    /// Cut the region off from every other (the registry included); the
    /// return heals it.
    Isolate,
}

impl Fault {
    pub fn parse(name: &str) -> Result<Fault, Error> {
        match name {
            "kill" => Ok(Fault::Kill),
            "isolate" => Ok(Fault::Isolate),
            other => Err(Error::Invalid(format!(
                "--fault must be kill or isolate, not {other:?}"
            ))),
        }
    }
}

/// Who starts the failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The drill asks for it (`POST /admin/v1/regions/{r}/failover`).
    Request,
    /// The cluster does (`keyhold up --auto-failover-after`); the drill only
    /// waits for it (`--auto`).
    Automatic,
}

/// One drill.
#[derive(Debug, Clone)]
pub struct Drill {
    pub cluster_file: PathBuf,
    pub region: String,
    pub fault: Fault,
    pub trigger: Trigger,
    /// Orders per second over all regions.
    pub rate: f64,
    /// Steady traffic before the fault.
    pub duration: Duration,
    /// Print a progress line on stderr.
    pub progress: bool,
}

/// Runs the drill; the report says whether it passed.
pub async fn run(drill: Drill) -> Result<Report, Error> {
    if !(drill.rate > 0.0 && drill.rate <= RATE_MAX) {
        return Err(Error::Invalid(format!(
            "--rate must be above 0 and at most {RATE_MAX}"
        )));
    }
    if drill.duration.as_millis() > u128::from(DURATION_MS_MAX) {
        return Err(Error::Invalid(format!(
            "--duration must be at most {} s",
            DURATION_MS_MAX / 1000
        )));
    }
    let file = ClusterFile::read(&drill.cluster_file)?;
    let region = drill.region.clone();
    if file.region_url(&region).is_none() {
        return Err(Error::Invalid(format!(
            "the cluster has no region {region}"
        )));
    }
    let calls = Calls::new(file)?;
    // A node of another region to talk to while the drilled one is down.
    let other = calls
        .file
        .regions
        .iter()
        .find(|r| r.name != region)
        .ok_or_else(|| Error::Invalid("a drill needs at least two regions".into()))?
        .api_url
        .clone();
    let tenants = homed_tenants(&calls, &other, &region).await?;
    let progress = Progress::new(drill.progress);
    let lag_before = standby_lag(&calls, &other, &region).await;

    let drilled: Vec<String> = tenants.iter().map(|t| t.tenant_id.clone()).collect();
    let clock = WallClock::now();
    let leaders = LeaderWatch::start(&calls, &other);
    let mut traffic = Traffic::start(&calls, tenants, drill.rate);
    progress.phase("steady traffic", &traffic);
    sleep_with(&progress, &traffic, drill.duration).await;

    let lag_at_fault = standby_lag(&calls, &other, &region).await.or(lag_before);
    let earlier_failovers = failovers_of(&calls, &other, &region).await?;
    progress.phase(&format!("fault: {:?}", drill.fault), &traffic);
    let fault_at = Instant::now();
    inject(&calls, &region, drill.fault).await?;
    // The fault is in effect by now: what the region acknowledges is judged
    // against `max_standby_lag` from here.
    let fault_in_effect_at = Instant::now();

    progress.phase("failover", &traffic);
    let operation_id = match drill.trigger {
        Trigger::Request => request_failover(&calls, &other, &region).await?,
        Trigger::Automatic => {
            automatic_failover(&calls, &other, &region, &earlier_failovers).await?
        }
    };
    let failover_requested_at = Instant::now();
    let (done, lease_waited_at) =
        wait_done(&calls, &other, &operation_id, &progress, &traffic).await?;
    let done_at = Instant::now();
    sleep_with(&progress, &traffic, Duration::from_millis(AFTER_DONE_MS)).await;

    progress.phase("return", &traffic);
    heal(&calls, &region, drill.fault).await?;
    let returned_at = Instant::now();
    progress.phase("reconciliation", &traffic);
    let reconciliation =
        wait_reconciled(&calls, &other, &region, &operation_id, &progress, &traffic).await?;
    let reconciled_at = Instant::now();
    let leader_changes = leaders.stop();

    progress.phase("draining", &traffic);
    traffic.stop_new().await;
    let drain_until = Instant::now() + Duration::from_millis(DRAIN_WAIT_MS);
    while traffic.pending.load(std::sync::atomic::Ordering::Relaxed) > 0
        && Instant::now() < drain_until
    {
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    traffic.stop();

    progress.phase("verifying", &traffic);
    let acked = traffic.with_record(|r| r.acked.clone());
    let orphans = reconciliation["orphans"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let to = done["result"]["to"].as_str().unwrap_or("").to_owned();
    let marks = report::PhaseMarks {
        fault_at,
        begun_at: failover_requested_at,
        lease_waited_at,
        done_at,
    };
    let timings = traffic.with_record(|r| Timings::measure(r, marks, &to));
    let instants = Instants {
        clock,
        fault: drill.fault,
        trigger: drill.trigger,
        fault_at,
        failover_requested_at,
        lease_waited_at,
        done_at,
        returned_at,
        reconciled_at,
        leader_changes,
    };
    let rehomed = done["result"]["tenants"].as_u64().unwrap_or(0);
    let (timeline, failures_by_reason) = traffic.with_record(|r| {
        (
            report::timeline(r, &instants, &to, rehomed, orphans.len()),
            report::failures_by_reason(r, fault_at),
        )
    });
    let verdicts = verify(&calls, &other, &acked, &orphans).await?;
    let lost_acks_after_fault_s = lost_ack_times(&acked, &verdicts, fault_in_effect_at);
    let charges = settle_charges(&calls, &verdicts.present).await?;
    let tenants_now = tenant_homes(&calls, &other, &drilled).await?;
    progress.finish();
    Ok(Report::new(report::Inputs {
        region,
        to,
        fault: drill.fault,
        trigger: drill.trigger,
        operation_id,
        failover: done,
        lag_before_fault: lag_at_fault,
        timings,
        timeline,
        failures_by_reason,
        sent: traffic.sent.load(std::sync::atomic::Ordering::Relaxed),
        unanswered: traffic.pending.load(std::sync::atomic::Ordering::Relaxed),
        acked: acked.len() as u64,
        acked_after_done_in_region: acked
            .iter()
            .filter(|a| a.at > done_at && a.executed_in == drill.region)
            .count() as u64,
        verdicts,
        orphans,
        charges,
        max_standby_lag_s: Duration::from_millis(calls.file.max_standby_lag_ms).as_secs_f64(),
        lost_acks_after_fault_s,
        tenants_now,
        admin_url: other,
    }))
}

/// The tenants the registry homes in `region` now (read through `via`, a node
/// of another region) that cluster.json holds a token for, with their current
/// home. cluster.json's own homes are those of `up`'s start and go stale after
/// moves and failovers, so they are never used. Refused, with the reason and
/// the way out, when there are none: a drill of an empty region tests nothing.
async fn homed_tenants(
    calls: &Calls,
    via: &str,
    region: &str,
) -> Result<Vec<cluster::TenantEntry>, Error> {
    let registry = registry_tenants(calls, via).await?;
    let live = |t: &&Value| t["state"] == "active" && t["home_region"] == region;
    let homed: Vec<&str> = registry
        .iter()
        .filter(live)
        .filter_map(|t| t["tenant_id"].as_str())
        .collect();
    let tenants: Vec<cluster::TenantEntry> = calls
        .file
        .tenants
        .iter()
        .filter(|t| homed.contains(&t.tenant_id.as_str()))
        .map(|t| cluster::TenantEntry {
            home_region: region.to_owned(),
            ..t.clone()
        })
        .collect();
    if !tenants.is_empty() {
        return Ok(tenants);
    }
    let known: Vec<String> = calls
        .file
        .tenants
        .iter()
        .filter_map(|t| {
            let record = registry
                .iter()
                .find(|r| r["tenant_id"] == t.tenant_id.as_str())?;
            let home = record["home_region"].as_str()?;
            (record["state"] == "active").then(|| format!("{} in {home}", t.tenant_id))
        })
        .collect();
    let reason = if homed.is_empty() {
        format!("the registry homes no active tenant in region {region}")
    } else {
        format!(
            "the registry homes {} in region {region}, but cluster.json holds none of their tokens",
            homed.join(", ")
        )
    };
    let way_out = match calls.file.tenants.first() {
        Some(t) => format!(
            "; move one there first, e.g. keyhold tenant move --url {via} --id {} --to {region}",
            t.tenant_id
        ),
        None => String::new(),
    };
    Err(Error::Invalid(format!(
        "{reason}, so a drill of it would test nothing (cluster.json's tenants live in: {}){way_out}",
        if known.is_empty() {
            "none of them is active".to_owned()
        } else {
            known.join(", ")
        }
    )))
}

/// `GET /admin/v1/tenants` through `via`: the registry's tenants.
async fn registry_tenants(calls: &Calls, via: &str) -> Result<Vec<Value>, Error> {
    let answer = calls.admin_get(via, "/admin/v1/tenants").await?;
    match answer.body["data"].as_array() {
        Some(data) if answer.status == 200 => Ok(data.clone()),
        _ => Err(Error::Cluster(format!(
            "listing the registry's tenants answered {}: {}",
            answer.status, answer.body
        ))),
    }
}

/// Where each of `ids` lives now, as the registry says.
async fn tenant_homes(
    calls: &Calls,
    via: &str,
    ids: &[String],
) -> Result<Vec<report::TenantHome>, Error> {
    let registry = registry_tenants(calls, via).await?;
    Ok(ids
        .iter()
        .map(|id| report::TenantHome {
            tenant_id: id.clone(),
            home_region: registry
                .iter()
                .find(|r| r["tenant_id"] == id.as_str())
                .and_then(|r| r["home_region"].as_str())
                .unwrap_or("unknown")
                .to_owned(),
        })
        .collect())
}

/// The drilled region's standby lag from the cluster view, as
/// `{"commands", "seconds"}`.
async fn standby_lag(calls: &Calls, via: &str, region: &str) -> Option<Value> {
    let view = calls.admin_get(via, "/admin/v1/cluster").await.ok()?.body;
    let entry = view["regions"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == region)?
        .clone();
    Some(entry["replication_lag"].clone())
}

async fn inject(calls: &Calls, region: &str, fault: Fault) -> Result<(), Error> {
    match fault {
        Fault::Isolate => {
            calls
                .control(&format!("/v1/regions/{region}/isolate"))
                .await
        }
        Fault::Kill => {
            for node in calls.file.nodes.iter().filter(|n| n.region == region) {
                calls
                    .control(&format!("/v1/nodes/{}/kill", node.node_id))
                    .await?;
            }
            Ok(())
        }
    }
}

async fn heal(calls: &Calls, region: &str, fault: Fault) -> Result<(), Error> {
    match fault {
        Fault::Isolate => calls.control(&format!("/v1/regions/{region}/heal")).await,
        Fault::Kill => {
            for node in calls.file.nodes.iter().filter(|n| n.region == region) {
                calls
                    .control(&format!("/v1/nodes/{}/start", node.node_id))
                    .await?;
            }
            Ok(())
        }
    }
}

/// Asks for the failover until it is accepted: right after the fault, the
/// region may still look healthy (409) for a moment, and when the lost region
/// held the registry's leader the others elect a new one first (503).
async fn request_failover(calls: &Calls, via: &str, region: &str) -> Result<String, Error> {
    let until = Instant::now() + Duration::from_millis(FAILOVER_REQUEST_WAIT_MS);
    loop {
        let path = format!("/admin/v1/regions/{region}/failover");
        let answer = calls.admin_post(via, &path, &json!({})).await;
        match answer {
            Ok(a) if a.status == 202 => {
                return a.body["operation_id"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Error::Cluster(format!("202 without an operation: {}", a.body)))
            }
            Ok(a) if (a.status == 409 || a.status == 503) && Instant::now() < until => {}
            Ok(a) => {
                return Err(Error::Cluster(format!(
                    "failover answered {}: {}",
                    a.status, a.body
                )))
            }
            Err(_) if Instant::now() < until => {}
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// The ids of the failovers of `region` the registry lists now.
async fn failovers_of(calls: &Calls, via: &str, region: &str) -> Result<Vec<String>, Error> {
    let answer = calls.admin_get(via, "/admin/v1/operations").await?;
    let Some(ops) = answer.body["data"]
        .as_array()
        .filter(|_| answer.status == 200)
    else {
        return Err(Error::Cluster(format!(
            "listing the operations answered {}: {}",
            answer.status, answer.body
        )));
    };
    Ok(ops
        .iter()
        .filter(|op| op["kind"] == "failover" && op["from"] == region)
        .filter_map(|op| op["operation_id"].as_str().map(str::to_owned))
        .collect())
}

/// With `--auto`: waits for the cluster to begin a failover of `region` that
/// is not among `earlier`, and answers its id.
async fn automatic_failover(
    calls: &Calls,
    via: &str,
    region: &str,
    earlier: &[String],
) -> Result<String, Error> {
    let until = Instant::now() + Duration::from_millis(AUTO_FAILOVER_BEGIN_WAIT_MS);
    while Instant::now() < until {
        if let Ok(ids) = failovers_of(calls, via, region).await {
            if let Some(id) = ids.into_iter().find(|id| !earlier.contains(id)) {
                return Ok(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
    }
    Err(Error::Timeout(format!(
        "the cluster began no failover of region {region} within {} s: was it started with \
         keyhold up --auto-failover-after? (without --auto the drill asks for the failover)",
        AUTO_FAILOVER_BEGIN_WAIT_MS / 1000
    )))
}

/// Polls the failover until `done`; answers its operation and when the drill
/// first saw its driver's lease wait over (`LEASE_WAITED_PROGRESS`), if it did.
async fn wait_done(
    calls: &Calls,
    via: &str,
    operation_id: &str,
    progress: &Progress,
    traffic: &Traffic,
) -> Result<(Value, Option<Instant>), Error> {
    let until = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
    let path = format!("/admin/v1/operations/{operation_id}");
    let mut lease_waited_at = None;
    while Instant::now() < until {
        if let Ok(a) = calls.admin_get(via, &path).await {
            match a.body["state"].as_str() {
                Some("done") => return Ok((a.body, lease_waited_at)),
                Some("failed") => {
                    return Err(Error::Cluster(format!("the failover failed: {}", a.body)))
                }
                _ => {}
            }
            let waited = a.body["progress"]
                .as_f64()
                .is_some_and(|p| p >= LEASE_WAITED_PROGRESS - 1e-9);
            if waited && lease_waited_at.is_none() {
                lease_waited_at = Some(Instant::now());
            }
        }
        progress.tick(traffic);
        tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
    }
    Err(Error::Timeout(format!("failover {operation_id} not done")))
}

/// Polls the region's reconciliation until it is done for this failover.
async fn wait_reconciled(
    calls: &Calls,
    via: &str,
    region: &str,
    operation_id: &str,
    progress: &Progress,
    traffic: &Traffic,
) -> Result<Value, Error> {
    let until = Instant::now() + Duration::from_millis(RECONCILIATION_WAIT_MS);
    let path = format!("/admin/v1/regions/{region}/reconciliation");
    while Instant::now() < until {
        if let Ok(a) = calls.admin_get(via, &path).await {
            if a.status == 200
                && a.body["state"] == "done"
                && a.body["failover_operation_id"] == operation_id
            {
                return Ok(a.body);
            }
        }
        progress.tick(traffic);
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    Err(Error::Timeout(format!("region {region} not reconciled")))
}

/// How the drill's acknowledged orders ended up.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Verdicts {
    /// Acknowledged and served by the new home with the acknowledged id.
    pub present: Vec<String>,
    /// Acknowledged, missing from the new home, and listed as an orphan.
    pub lost_listed: Vec<String>,
    /// Acknowledged, missing from the new home, and not listed: a failure.
    pub lost_unlisted: Vec<String>,
    /// Acknowledged, but the new home holds another order for its client
    /// order id, and the orphan says so (`duplicate_of`).
    pub duplicate_listed: Vec<String>,
    /// The same without the orphan saying so: a failure.
    pub duplicate_unlisted: Vec<String>,
}

/// Looks every acknowledged order up in its tenant's current home (through
/// `via`) by its client order id, and judges it against the orphans.
async fn verify(
    calls: &Calls,
    via: &str,
    acked: &[traffic::Acked],
    orphans: &[Value],
) -> Result<Verdicts, Error> {
    let orphan_of: HashMap<&str, &Value> = orphans
        .iter()
        .filter_map(|o| Some((o["order_id"].as_str()?, o)))
        .collect();
    let mut v = Verdicts::default();
    for a in acked {
        let found = calls.find_order(via, &a.token, &a.client_order_id).await?;
        let current = match found.status {
            200 => found.body["order_id"].as_str().map(str::to_owned),
            404 => None,
            other => {
                return Err(Error::Cluster(format!(
                    "looking up {} answered {other}: {}",
                    a.client_order_id, found.body
                )))
            }
        };
        let orphan = orphan_of.get(a.order_id.as_str());
        match current {
            Some(id) if id == a.order_id => v.present.push(a.order_id.clone()),
            Some(id) => {
                let listed =
                    orphan.is_some_and(|o| o["duplicate_of"].as_str() == Some(id.as_str()));
                let into = if listed {
                    &mut v.duplicate_listed
                } else {
                    &mut v.duplicate_unlisted
                };
                into.push(a.order_id.clone());
            }
            None if orphan.is_some() => v.lost_listed.push(a.order_id.clone()),
            None => v.lost_unlisted.push(a.order_id.clone()),
        }
    }
    Ok(v)
}

/// When each lost acknowledged order (listed or not) was acknowledged,
/// in seconds after `fault` (negative: before it).
fn lost_ack_times(acked: &[traffic::Acked], v: &Verdicts, fault: Instant) -> Vec<f64> {
    let lost: std::collections::HashSet<&str> = v
        .lost_listed
        .iter()
        .chain(&v.lost_unlisted)
        .map(String::as_str)
        .collect();
    acked
        .iter()
        .filter(|a| lost.contains(a.order_id.as_str()))
        .map(|a| match a.at.checked_duration_since(fault) {
            Some(after) => after.as_secs_f64(),
            None => -(fault - a.at).as_secs_f64(),
        })
        .collect()
}

/// Waits until every surviving order was charged (or the settle wait ends),
/// then counts charges per order.
async fn settle_charges(calls: &Calls, present: &[String]) -> Result<Charges, Error> {
    let until = Instant::now() + Duration::from_millis(CHARGES_SETTLE_WAIT_MS);
    loop {
        let mut per_order: HashMap<String, u64> = HashMap::new();
        for (order_id, _) in calls.charges().await? {
            *per_order.entry(order_id).or_default() += 1;
        }
        let charges = Charges::count(present, &per_order);
        if charges.not_charged == 0 || Instant::now() >= until {
            return Ok(charges);
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS * 4)).await;
    }
}

async fn sleep_with(progress: &Progress, traffic: &Traffic, wait: Duration) {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        progress.tick(traffic);
        tokio::time::sleep(Duration::from_millis(POLL_MS).min(until - Instant::now())).await;
    }
}

/// Watches the registry's leader through a node of another region, every
/// `LEADER_POLL_MS`, and records each change it sees.
struct LeaderWatch {
    changes: std::sync::Arc<std::sync::Mutex<LeaderChanges>>,
    task: tokio::task::JoinHandle<()>,
}

type LeaderChanges = Vec<(Instant, Option<u64>, Option<u64>)>;

impl LeaderWatch {
    fn start(calls: &Calls, via: &str) -> LeaderWatch {
        let changes: std::sync::Arc<std::sync::Mutex<LeaderChanges>> = Default::default();
        let (calls, via, record) = (calls.clone(), via.to_owned(), changes.clone());
        let task = tokio::spawn(async move {
            let mut last: Option<Option<u64>> = None;
            loop {
                // An unanswered view says nothing about the leader: skip it.
                if let Ok(view) = calls.admin_get(&via, "/admin/v1/cluster").await {
                    let leader = view.body["registry"]["leader"].as_u64();
                    if view.status == 200 && last != Some(leader) {
                        if let Some(before) = last {
                            let change = (Instant::now(), before, leader);
                            record.lock().expect("not poisoned").push(change);
                        }
                        last = Some(leader);
                    }
                }
                tokio::time::sleep(Duration::from_millis(LEADER_POLL_MS)).await;
            }
        });
        LeaderWatch { changes, task }
    }

    fn stop(self) -> LeaderChanges {
        self.task.abort();
        std::mem::take(&mut *self.changes.lock().expect("not poisoned"))
    }
}

/// The progress line: phase, orders sent, acknowledged, failed attempts.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        let bar = enabled.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
                    .expect("valid template"),
            );
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    fn phase(&self, name: &str, traffic: &Traffic) {
        let line = format!(
            "drill {:>6.1}s  {name}",
            self.started.elapsed().as_secs_f64()
        );
        match &self.bar {
            Some(bar) => {
                bar.set_prefix(name.to_owned());
                bar.println(line);
            }
            // Phases go to stderr as lines without a progress bar too, so a
            // CI log shows where a drill stood.
            None => eprintln!("{line}"),
        }
        self.tick(traffic);
    }

    fn tick(&self, traffic: &Traffic) {
        let Some(bar) = &self.bar else { return };
        let (acked, failed) = traffic.with_record(|r| (r.acked.len(), r.failures.len()));
        let sent = traffic.sent.load(std::sync::atomic::Ordering::Relaxed);
        bar.set_message(format!(
            "{:<16} sent {sent}, acknowledged {acked}, failed attempts {failed}",
            bar.prefix()
        ));
        bar.tick();
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
