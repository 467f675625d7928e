//! Seeded chaos runs (`keyhold chaos`): for each seed, start a local cluster
//! with `keyhold up`, run the seed's [`plan::Plan`] (client traffic and faults
//! at planned offsets), wait for moves to end, and let the history checker
//! judge the history against the final state. Failovers are faults too: the
//! runner cuts the region off, fails it over (or lets the cluster do it),
//! brings the region back, waits for its reconciliation, and hands the cut
//! time, `estimated_lost` and the orphans to the checker, which allows a lost
//! acknowledged order only as such an orphan within `max_standby_lag` of the
//! cut. A seed that finds a violation (or a cluster that does not come back,
//! a move that never ends, a failover that never completes) fails,
//! and its directory keeps the plan, history, final state, verdict, fault log
//! and `up` logs; a passing seed's directory is removed unless asked to keep it.

pub mod cluster;
pub mod limits;
pub mod plan;
pub mod workload;

use cluster::{Control, UpProcess};
use keyhold_checker::history::Recorder;
use keyhold_checker::state::{Failover, Orphan};
use keyhold_checker::verdict::LossReport;
use keyhold_checker::{ReadOptions, Target, Verdict};
use limits::{
    AUTO_FAILOVER_AFTER_MS, FAILOVER_POLL_MS, FAILOVER_REQUEST_ATTEMPTS_MAX,
    FAILOVER_REQUEST_RETRY_MS, FAILOVER_WAIT_MS, MOVES_POLL_MS, MOVES_SETTLE_MS, RECONCILE_WAIT_MS,
    REQUEST_TIMEOUT_MS, SETTLE_WAIT_MS,
};
use plan::{
    standby_of, ClusterOptions, Cut, FailoverMode, Fault, KillTarget, Plan, Timed, REGIONS,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{tenant_name, Env};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("checker: {0}")]
    Check(#[from] keyhold_checker::Error),
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The `keyhold` binary that runs `up`.
    pub keyhold: PathBuf,
    /// Seeds' directories go here (`seed-<n>`).
    pub out_dir: PathBuf,
    /// Keep the directories of passing seeds too.
    pub keep_passing: bool,
}

/// What one seed did and found.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    pub ok: bool,
    pub elapsed_ms: u64,
    pub cluster: plan::ClusterOptions,
    pub requests: u64,
    pub ops_ok: u64,
    pub ops_fail: u64,
    pub ops_unknown: u64,
    /// Faults executed, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Violations by kind (from the checker).
    pub violations: BTreeMap<String, u64>,
    /// What the checker checked (orders acknowledged, replays, charges, ...).
    pub checked: Option<keyhold_checker::verdict::Stats>,
    /// Per failover: acknowledged orders lost against the bounds.
    pub losses: Vec<LossReport>,
    /// Move operations that did not end in time.
    pub stuck_moves: Vec<String>,
    /// How long after the traffic every move had ended.
    pub moves_wait_ms: u64,
    /// Why the run itself failed (a cluster that did not come back, ...).
    pub error: Option<String>,
    /// Where the run's files are (kept when it failed).
    pub dir: Option<PathBuf>,
}

impl SeedReport {
    /// One line for people.
    pub fn line(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let mut line = format!(
            "seed {}: {} in {:.1} s — {} requests ({} answered, {} failed, {} unknown); faults: {}; \
             psp drop {} decline {}, inter-region rtt {}",
            self.seed,
            if self.ok { "ok" } else { "FAILED" },
            self.elapsed_ms as f64 / 1000.0,
            self.requests,
            self.ops_ok,
            self.ops_fail,
            self.ops_unknown,
            if faults.is_empty() { "none".to_owned() } else { faults.join(", ") },
            self.cluster.psp_drop_response_rate,
            self.cluster.psp_decline_rate,
            self.cluster
                .inter_region_rtt_ms
                .map_or("0".to_owned(), |ms| format!("{ms}ms")),
        );
        if self.cluster.nodes_per_region != 1 {
            line.push_str(&format!(
                ", {} nodes per region",
                self.cluster.nodes_per_region
            ));
        }
        for l in &self.losses {
            line.push_str(&format!("; {}", l.line()));
        }
        if !self.violations.is_empty() {
            line.push_str(&format!("; violations {:?}", self.violations));
        }
        if self.moves_wait_ms > 0 {
            line.push_str(&format!(
                "; moves ended {:.1} s after the traffic",
                self.moves_wait_ms as f64 / 1000.0
            ));
        }
        if !self.stuck_moves.is_empty() {
            line.push_str(&format!("; stuck moves {:?}", self.stuck_moves));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!("; error: {e}"));
        }
        if let Some(dir) = &self.dir {
            line.push_str(&format!("; kept in {}", dir.display()));
        }
        line
    }
}

fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<(), Error> {
    let text = serde_json::to_vec_pretty(value).expect("serializable");
    std::fs::write(dir.join(name), text)?;
    Ok(())
}

/// One executed fault, for faults.json.
#[derive(Debug, Serialize)]
struct FaultLog {
    planned_ms: u64,
    done_ms: u64,
    #[serde(flatten)]
    fault: Fault,
    result: String,
}

/// The admin side of a run: fault calls and move polling.
struct Admin {
    http: reqwest::Client,
    api_urls: Vec<String>,
    token: String,
}

impl Admin {
    async fn post(&self, turn: usize, path: &str, body: String) -> Result<(u16, String), Error> {
        let url = format!("{}{path}", self.api_urls[turn % self.api_urls.len()]);
        let mut request = self.http.post(url).bearer_auth(&self.token);
        if !body.is_empty() {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.text().await?))
    }

    /// `GET` through region `region`'s node: status and JSON body (`Null` if
    /// it is not JSON).
    async fn get(&self, region: usize, path: &str) -> Result<(u16, serde_json::Value), Error> {
        let url = format!("{}{path}", self.api_urls[region]);
        let response = self.http.get(url).bearer_auth(&self.token).send().await?;
        let status = response.status().as_u16();
        let body = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// Requests the failover of `region` through its standby's node, retrying
    /// while it answers 409 (the region still looks healthy) or 5xx; the
    /// operation id, or why not.
    async fn request_failover(&self, region: usize) -> Result<String, String> {
        let path = format!("/admin/v1/regions/{}/failover", REGIONS[region]);
        let mut last = String::new();
        for _ in 0..FAILOVER_REQUEST_ATTEMPTS_MAX {
            match self.post(standby_of(region), &path, "{}".to_owned()).await {
                Ok((202, body)) => {
                    return serde_json::from_str::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|j| j["operation_id"].as_str().map(str::to_owned))
                        .ok_or_else(|| format!("202 without an operation id: {body}"));
                }
                Ok((status, body)) if status == 409 || status >= 500 => {
                    last = format!("{status} {body}");
                }
                Ok((status, body)) => return Err(format!("{status} {body}")),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(FAILOVER_REQUEST_RETRY_MS)).await;
        }
        Err(format!(
            "{FAILOVER_REQUEST_ATTEMPTS_MAX} attempts, last {last}"
        ))
    }

    /// Whether `region` homes a tenant, as its standby's node sees the
    /// registry (`GET /admin/v1/cluster`); true when it cannot tell, so a
    /// failover is still awaited.
    async fn homes_tenants(&self, region: usize) -> bool {
        let Ok((200, cluster)) = self.get(standby_of(region), "/admin/v1/cluster").await else {
            return true;
        };
        cluster["regions"]
            .as_array()
            .and_then(|regions| regions.iter().find(|r| r["name"] == REGIONS[region]))
            .and_then(|r| r["tenants"].as_u64())
            .is_none_or(|n| n > 0)
    }

    /// The automatic failover of `region`: polls the operations its standby's
    /// node lists until one of kind `failover` from `region` shows up.
    async fn find_failover(&self, region: usize, deadline: Instant) -> Result<String, String> {
        while Instant::now() < deadline {
            if let Ok((200, list)) = self.get(standby_of(region), "/admin/v1/operations").await {
                let found = list["data"].as_array().and_then(|ops| {
                    ops.iter()
                        .find(|op| op["kind"] == "failover" && op["from"] == REGIONS[region])
                });
                if let Some(id) = found.and_then(|op| op["operation_id"].as_str()) {
                    return Ok(id.to_owned());
                }
            }
            tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
        }
        Err("the cluster began no failover in time".to_owned())
    }

    /// Polls a failover operation until `done` (its result) or `failed`.
    async fn wait_failover(&self, region: usize, id: &str) -> Result<serde_json::Value, String> {
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        let path = format!("/admin/v1/operations/{id}");
        let mut last = serde_json::Value::Null;
        while Instant::now() < deadline {
            if let Ok((200, op)) = self.get(standby_of(region), &path).await {
                match op["state"].as_str() {
                    Some("done") => return Ok(op["result"].clone()),
                    Some("failed") => return Err(format!("failover {id} failed: {op}")),
                    _ => last = op,
                }
            }
            tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
        }
        Err(format!(
            "failover {id} not done within {FAILOVER_WAIT_MS} ms: {last}"
        ))
    }

    /// Polls the reconciliation of `region` (back by now) until it reports
    /// `done` for failover `id`; its orphans, or `None` if it never did.
    async fn wait_reconciliation(&self, region: usize, id: &str) -> Option<Vec<Orphan>> {
        let deadline = Instant::now() + Duration::from_millis(RECONCILE_WAIT_MS);
        let path = format!("/admin/v1/regions/{}/reconciliation", REGIONS[region]);
        let mut turn = region;
        while Instant::now() < deadline {
            if let Ok((200, report)) = self.get(turn % REGIONS.len(), &path).await {
                if report["state"] == "done" && report["failover_operation_id"] == id {
                    return serde_json::from_value(report["orphans"].clone()).ok();
                }
            }
            turn += 1;
            tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
        }
        None
    }

    /// Polls every move until it ends; returns those that did not in time.
    async fn wait_moves(&self, operations: &[String]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_millis(MOVES_SETTLE_MS);
        let mut pending: Vec<String> = operations.to_vec();
        let mut turn = 0;
        while !pending.is_empty() && Instant::now() < deadline {
            let mut still = Vec::new();
            for id in pending {
                turn += 1;
                let url = format!(
                    "{}/admin/v1/operations/{id}",
                    self.api_urls[turn % self.api_urls.len()]
                );
                let state = match self.http.get(url).bearer_auth(&self.token).send().await {
                    Ok(r) => r
                        .json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|j| j["state"].as_str().map(str::to_owned)),
                    Err(_) => None,
                };
                if !matches!(state.as_deref(), Some("done" | "failed")) {
                    still.push(id);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(MOVES_POLL_MS)).await;
            }
        }
        pending
    }
}

/// Cuts region `region` off: isolates it, or SIGKILLs every node of it.
async fn cut_off(
    up: &mut UpProcess,
    options: &ClusterOptions,
    region: usize,
    cut: Cut,
) -> Result<(), Error> {
    match cut {
        Cut::Isolate => up.isolate(region, cluster::Link::Cut).await,
        Cut::Kill => {
            for node in options.nodes_of(region) {
                up.kill(KillTarget::Node(node)).await?;
            }
            Ok(())
        }
    }
}

/// Brings region `region` back: heals it, or starts its nodes.
async fn bring_back(
    up: &mut UpProcess,
    options: &ClusterOptions,
    region: usize,
    cut: Cut,
) -> Result<(), Error> {
    match cut {
        Cut::Isolate => up.isolate(region, cluster::Link::Healed).await,
        Cut::Kill => {
            for node in options.nodes_of(region) {
                up.start(KillTarget::Node(node)).await?;
            }
            Ok(())
        }
    }
}

/// What the fault runner shares with every fault.
struct Faulting<'a> {
    admin: &'a Admin,
    options: &'a ClusterOptions,
    recorder: &'a Recorder,
    max_standby_lag_ms: u64,
}

/// A failover fault: cut, failover (by hand or by the cluster), `done`, the
/// region back, its reconciliation. The line for faults.json and the record
/// for the checker (none when no failover was due); an error when the
/// failover never completed.
async fn run_failover(
    up: &mut UpProcess,
    ctx: &Faulting<'_>,
    region: usize,
    mode: FailoverMode,
    cut: Cut,
    request_after_ms: u64,
) -> Result<(String, Option<Failover>), Error> {
    cut_off(up, ctx.options, region, cut).await?;
    let cut_ms = ctx.recorder.now_ms();
    let operation = match mode {
        FailoverMode::Manual => {
            tokio::time::sleep(Duration::from_millis(request_after_ms)).await;
            ctx.admin.request_failover(region).await
        }
        FailoverMode::Auto if !ctx.admin.homes_tenants(region).await => {
            // The cluster fails over only a region that homes tenants (a
            // planned move may have taken its demo tenant away): none to wait for.
            bring_back(up, ctx.options, region, cut).await?;
            return Ok(("no failover: the region homes no tenant".to_owned(), None));
        }
        FailoverMode::Auto => {
            let deadline =
                Instant::now() + Duration::from_millis(AUTO_FAILOVER_AFTER_MS + FAILOVER_WAIT_MS);
            ctx.admin.find_failover(region, deadline).await
        }
    };
    let done = match operation {
        Ok(id) => ctx
            .admin
            .wait_failover(region, &id)
            .await
            .map(|result| (id, result)),
        Err(e) => Err(e),
    };
    bring_back(up, ctx.options, region, cut).await?;
    let (id, result) = match done {
        Ok(done) => done,
        Err(e) => {
            return Err(Error::Cluster(format!(
                "the failover of {} did not complete: {e}",
                REGIONS[region]
            )))
        }
    };
    let orphans = ctx.admin.wait_reconciliation(region, &id).await;
    let lost = &result["estimated_lost"];
    let record = Failover {
        region: REGIONS[region].to_owned(),
        to: result["to"]
            .as_str()
            .unwrap_or(REGIONS[standby_of(region)])
            .to_owned(),
        cut_ms,
        max_standby_lag_ms: ctx.max_standby_lag_ms,
        estimated_lost_ms: lost["seconds"].as_f64().map(|s| (s * 1000.0).ceil() as u64),
        estimated_lost_commands: lost["commands"].as_u64(),
        orphans,
    };
    let line =
        format!(
        "failover {id} done at {} ms ({} after the cut), estimated_lost {lost}; reconciliation {}",
        ctx.recorder.now_ms(),
        ctx.recorder.now_ms() - cut_ms,
        record
            .orphans
            .as_ref()
            .map_or("not done in time".to_owned(), |o| format!("{} orphans", o.len())),
    );
    Ok((line, Some(record)))
}

/// What the faults left: the log, the moves started, the failovers made.
struct FaultsDone {
    log: Vec<FaultLog>,
    moves: Vec<String>,
    failovers: Vec<Failover>,
}

/// Executes the plan's faults at their offsets; returns the log and the
/// operation ids of the moves it started.
async fn run_faults(
    up: &mut UpProcess,
    ctx: &Faulting<'_>,
    faults: &[Timed<Fault>],
    started: Instant,
) -> Result<FaultsDone, Error> {
    let admin = ctx.admin;
    let mut log = Vec::new();
    let mut moves = Vec::new();
    let mut failovers = Vec::new();
    for (turn, f) in faults.iter().enumerate() {
        tokio::time::sleep_until((started + Duration::from_millis(f.at_ms)).into()).await;
        let result = match &f.what {
            Fault::Kill { target, down_ms } => {
                up.kill(*target).await?;
                tokio::time::sleep(Duration::from_millis(*down_ms)).await;
                up.start(*target).await?;
                "restarted".to_owned()
            }
            Fault::OutboxReplay => match admin
                .post(turn, "/admin/v1/outbox/replay", String::new())
                .await
            {
                Ok((status, body)) => format!("{status} {body}"),
                Err(e) => format!("error: {e}"),
            },
            Fault::Move { tenant, to } => {
                let path = format!("/admin/v1/tenants/{}/move", tenant_name(*tenant));
                let body = serde_json::json!({ "to": REGIONS[*to] }).to_string();
                match admin.post(turn, &path, body).await {
                    Ok((status, body)) => {
                        let id = serde_json::from_str::<serde_json::Value>(&body)
                            .ok()
                            .and_then(|j| j["operation_id"].as_str().map(str::to_owned));
                        moves.extend(id.filter(|_| status == 202));
                        format!("{status} {body}")
                    }
                    Err(e) => format!("error: {e}"),
                }
            }
            Fault::Isolate { region, for_ms } => {
                up.isolate(*region, cluster::Link::Cut).await?;
                tokio::time::sleep(Duration::from_millis(*for_ms)).await;
                up.isolate(*region, cluster::Link::Healed).await?;
                "healed".to_owned()
            }
            Fault::IsolateNode { node, for_ms } => {
                up.isolate_node(*node, cluster::Link::Cut).await?;
                tokio::time::sleep(Duration::from_millis(*for_ms)).await;
                up.isolate_node(*node, cluster::Link::Healed).await?;
                "healed".to_owned()
            }
            Fault::StandbyLoss {
                standby_of: of,
                cut,
                for_ms,
            } => {
                let lost = standby_of(*of);
                cut_off(up, ctx.options, lost, *cut).await?;
                tokio::time::sleep(Duration::from_millis(*for_ms)).await;
                bring_back(up, ctx.options, lost, *cut).await?;
                format!("standby {} back", REGIONS[lost])
            }
            Fault::Failover {
                region,
                mode,
                cut,
                request_after_ms,
            } => {
                let (line, record) =
                    run_failover(up, ctx, *region, *mode, *cut, *request_after_ms).await?;
                failovers.extend(record);
                line
            }
        };
        log.push(FaultLog {
            planned_ms: f.at_ms,
            done_ms: started.elapsed().as_millis() as u64,
            fault: f.what.clone(),
            result,
        });
    }
    Ok(FaultsDone {
        log,
        moves,
        failovers,
    })
}

/// Everything a finished run hands to the report.
struct Outcome {
    verdict: Verdict,
    stuck_moves: Vec<String>,
    moves_wait_ms: u64,
}

async fn run_plan(
    plan: &Plan,
    options: &Options,
    dir: &Path,
    recorder: &Recorder,
    faults_done: &mut BTreeMap<String, u64>,
) -> Result<Outcome, Error> {
    let mut up = UpProcess::new(&options.keyhold, dir, plan.cluster.clone(), plan.seed)?;
    up.start(plan::KillTarget::Cluster).await?;
    let info = up.info()?.clone();
    let api_urls: Vec<String> = REGIONS
        .iter()
        .map(|r| {
            info.regions
                .iter()
                .find(|e| e.name == *r)
                .map(|e| e.api_url.clone())
                .ok_or_else(|| Error::Cluster(format!("cluster.json has no region {r}")))
        })
        .collect::<Result<_, _>>()?;
    let tokens: Vec<String> = (0..REGIONS.len())
        .map(|t| {
            info.tenants
                .iter()
                .find(|e| e.tenant_id == tenant_name(t))
                .map(|e| e.token.clone())
                .ok_or_else(|| Error::Cluster(format!("cluster.json has no {}", tenant_name(t))))
        })
        .collect::<Result<_, _>>()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
        .build()?;
    let env = Arc::new(Env {
        http: http.clone(),
        api_urls: api_urls.clone(),
        tokens: tokens.clone(),
        recorder: recorder.clone(),
    });
    let admin = Admin {
        http,
        api_urls: api_urls.clone(),
        token: info.admin_token.clone(),
    };
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (c, steps) in plan.clients.iter().enumerate() {
        clients.spawn(workload::run_client(
            env.clone(),
            c as u32,
            steps.clone(),
            plan.reads.get(c).cloned().unwrap_or_default(),
            started,
        ));
    }
    let ctx = Faulting {
        admin: &admin,
        options: &plan.cluster,
        recorder,
        max_standby_lag_ms: info.max_standby_lag_ms,
    };
    let faults = run_faults(&mut up, &ctx, &plan.faults, started).await;
    while let Some(joined) = clients.join_next().await {
        joined.map_err(|e| Error::Cluster(format!("a client task failed: {e}")))?;
    }
    let FaultsDone {
        log,
        moves,
        failovers,
    } = faults?;
    for entry in &log {
        *faults_done
            .entry(entry.fault.kind().to_owned())
            .or_insert(0) += 1;
    }
    write_json(dir, "faults.json", &log)?;
    let waited = Instant::now();
    let stuck_moves = admin.wait_moves(&moves).await;
    let moves_wait_ms = waited.elapsed().as_millis() as u64;
    let target = Target {
        regions: REGIONS
            .iter()
            .map(|r| r.to_string())
            .zip(api_urls)
            .collect(),
        tokens: (0..REGIONS.len()).map(tenant_name).zip(tokens).collect(),
        admin_token: Some(info.admin_token.clone()),
        psp_url: Some(info.psp_url.clone()),
    };
    let read = ReadOptions {
        settle_wait: Duration::from_millis(SETTLE_WAIT_MS),
    };
    let history = recorder.history();
    write_json(dir, "history.json", &history)?;
    let state = keyhold_checker::read::read(&target, &history, read).await;
    up.stop().await;
    let mut state = state?;
    state.failovers = failovers;
    let verdict = keyhold_checker::check(&history, &state);
    write_json(dir, "state.json", &state)?;
    write_json(dir, "verdict.json", &verdict)?;
    std::fs::write(dir.join("verdict.txt"), verdict.summary())?;
    Ok(Outcome {
        verdict,
        stuck_moves,
        moves_wait_ms,
    })
}

/// Runs one seed and reports it; its directory is `out_dir/seed-<seed>`.
pub async fn run_seed(seed: u64, options: &Options) -> SeedReport {
    let started = Instant::now();
    let dir = options.out_dir.join(format!("seed-{seed}"));
    let plan = Plan::new(seed);
    let recorder = Recorder::new(limits::HISTORY_OPS_MAX);
    let mut faults = BTreeMap::new();
    let prepared = (|| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        write_json(&dir, "plan.json", &plan)
    })();
    let outcome = match prepared {
        Ok(()) => run_plan(&plan, options, &dir, &recorder, &mut faults).await,
        Err(e) => Err(e),
    };
    let history = recorder.history();
    let count = |f: fn(&keyhold_checker::Outcome) -> bool| {
        history.ops.iter().filter(|o| f(&o.outcome)).count() as u64
    };
    let mut report = SeedReport {
        seed,
        ok: false,
        elapsed_ms: 0,
        cluster: plan.cluster.clone(),
        requests: history.ops.len() as u64,
        ops_ok: count(|o| matches!(o, keyhold_checker::Outcome::Ok { .. })),
        ops_fail: count(|o| matches!(o, keyhold_checker::Outcome::Fail { .. })),
        ops_unknown: count(|o| matches!(o, keyhold_checker::Outcome::Unknown { .. })),
        faults,
        violations: BTreeMap::new(),
        checked: None,
        losses: Vec::new(),
        stuck_moves: Vec::new(),
        moves_wait_ms: 0,
        error: None,
        dir: Some(dir.clone()),
    };
    match outcome {
        Ok(o) => {
            report.ok = o.verdict.ok && o.stuck_moves.is_empty();
            report.violations = o.verdict.counts;
            report.checked = Some(o.verdict.stats);
            report.losses = o.verdict.losses;
            report.stuck_moves = o.stuck_moves;
            report.moves_wait_ms = o.moves_wait_ms;
        }
        Err(e) => {
            // Keep what there is: the history shows what happened up to here.
            let _ = write_json(&dir, "history.json", &history);
            report.error = Some(e.to_string());
        }
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    let _ = write_json(&dir, "report.json", &report);
    if report.ok && !options.keep_passing {
        let _ = std::fs::remove_dir_all(&dir);
        report.dir = None;
    }
    report
}
