//! Seeded chaos runs (`keyhold chaos`): for each seed, start a local cluster
//! with `keyhold up`, run the seed's [`plan::Plan`] (client traffic and faults
//! at planned offsets), wait for moves to end, and let the history checker
//! judge the history against the final state. A seed that finds a violation
//! (or a cluster that does not come back, or a move that never ends) fails,
//! and its directory keeps the plan, history, final state, verdict, fault log
//! and `up` logs; a passing seed's directory is removed unless asked to keep it.

pub mod cluster;
pub mod limits;
pub mod plan;
pub mod workload;

use cluster::{Control, UpProcess};
use keyhold_checker::history::Recorder;
use keyhold_checker::{ReadOptions, Target, Verdict};
use limits::{MOVES_POLL_MS, MOVES_SETTLE_MS, REQUEST_TIMEOUT_MS, SETTLE_WAIT_MS};
use plan::{Fault, Plan, Timed, REGIONS};
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

/// Executes the plan's faults at their offsets; returns the log and the
/// operation ids of the moves it started.
async fn run_faults(
    up: &mut UpProcess,
    admin: &Admin,
    faults: &[Timed<Fault>],
    started: Instant,
) -> Result<(Vec<FaultLog>, Vec<String>), Error> {
    let mut log = Vec::new();
    let mut moves = Vec::new();
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
        };
        log.push(FaultLog {
            planned_ms: f.at_ms,
            done_ms: started.elapsed().as_millis() as u64,
            fault: f.what.clone(),
            result,
        });
    }
    Ok((log, moves))
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
            started,
        ));
    }
    let faults = run_faults(&mut up, &admin, &plan.faults, started).await;
    while let Some(joined) = clients.join_next().await {
        joined.map_err(|e| Error::Cluster(format!("a client task failed: {e}")))?;
    }
    let (log, moves) = faults?;
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
    let checked = keyhold_checker::read_and_check(&target, &history, read).await;
    up.stop().await;
    let (state, verdict) = checked?;
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
