//! Steady order traffic for end-to-end tests that judge a whole run with the
//! history checker: clients send through a list of nodes in turn, for a list
//! of tenants in turn, creating orders and replaying acknowledged ones (and,
//! if asked, sending some new orders twice at once through two nodes), and
//! record every request and its fate. `send_order` is the one recorded request,
//! for probes a test sends beside the load; `judge` has the checker read the
//! final state and asserts a clean verdict.

use super::{order_body, unique, NodeInfo};
use keyhold_checker::{History, Outcome, Recorder, Request, Sender, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

/// How long one load request may take before it counts as `unknown`.
pub const LOAD_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the checker waits for downstream work to settle.
const SETTLE_WAIT: Duration = Duration::from_secs(30);
/// Pause after an answer that acknowledges nothing (a node down, 503), so a
/// client does not spin while the cluster recovers.
const LOAD_BACKOFF: Duration = Duration::from_millis(20);

/// Where one recorded request goes and as whom.
#[derive(Debug, Clone)]
pub struct Endpoint<'a> {
    pub client: u32,
    /// The tenant's name in the history (the checker's `Target::tokens` key).
    pub tenant: &'a str,
    pub token: &'a str,
    /// The region of the node it is sent to, and that node's API origin.
    pub region: &'a str,
    pub url: &'a str,
}

/// One order sent and recorded: a refused connection is `fail` (certainly not
/// executed), any other transport error or a timeout `unknown`.
pub async fn send_order(
    http: &reqwest::Client,
    recorder: &Recorder,
    to: &Endpoint<'_>,
    (key, coid, body): (&str, &str, &str),
    timeout: Duration,
) -> Outcome {
    let sender = Sender {
        client: to.client,
        tenant: to.tenant,
        region: to.region,
    };
    let request = Request::CreateOrder {
        key: key.to_owned(),
        client_order_id: coid.to_owned(),
        body: body.to_owned(),
        fingerprint: None,
    };
    let pending = recorder.invoke(&sender, request);
    let sent = http
        .post(format!("{}/v1/orders", to.url))
        .bearer_auth(to.token)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .timeout(timeout)
        .body(body.to_owned())
        .send()
        .await;
    let outcome = match sent {
        Ok(r) => {
            let status = r.status().as_u16();
            let replayed = r.headers().contains_key("idempotent-replayed");
            match r.text().await {
                Ok(body) => Outcome::Ok {
                    status,
                    replayed,
                    body,
                },
                Err(e) => Outcome::Unknown {
                    reason: e.to_string(),
                },
            }
        }
        Err(e) if e.is_connect() => Outcome::Fail {
            reason: e.to_string(),
        },
        Err(e) => Outcome::Unknown {
            reason: e.to_string(),
        },
    };
    recorder.complete(pending, outcome.clone());
    outcome
}

/// One load client.
#[derive(Clone)]
pub struct LoadClient {
    pub client: u32,
    /// `(region, API origin)` of every node to send through, in turn.
    pub apis: Vec<(String, String)>,
    /// `(name in the history, token)` of every tenant, in turn.
    pub tenants: Vec<(String, String)>,
    /// Every this many requests, a new order is sent twice at once, through
    /// this node and the next (concurrent duplicates); `None`: never.
    pub twice_every: Option<usize>,
    pub recorder: Recorder,
    pub stop: Arc<AtomicBool>,
}

impl LoadClient {
    /// Runs until `stop`: every third request replays an acknowledged one of
    /// the same tenant (same key and body), the others are new orders.
    pub async fn run(self) {
        let http = reqwest::Client::new();
        let mut acked: Vec<Vec<(String, String, String)>> = vec![Vec::new(); self.tenants.len()];
        let mut n = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            let node = (self.client as usize + n) % self.apis.len();
            // The tenant changes once per pass over the nodes, so that every
            // tenant goes through every node.
            let t = (self.client as usize + n / self.apis.len()) % self.tenants.len();
            let (tenant, token) = &self.tenants[t];
            let target = |node: usize| Endpoint {
                client: self.client,
                tenant,
                token,
                region: &self.apis[node].0,
                url: &self.apis[node].1,
            };
            let twice = self.twice_every.is_some_and(|k| n.is_multiple_of(k));
            let (key, coid, body) = match acked[t].get((n * 7) % acked[t].len().max(1)) {
                Some(old) if n.is_multiple_of(3) && !twice => old.clone(),
                _ => {
                    let coid = unique("co");
                    (unique("k"), coid.clone(), order_body(&coid, 1 + n as u64))
                }
            };
            let order = (key.as_str(), coid.as_str(), body.as_str());
            let here = target(node);
            let statuses: Vec<Option<u16>> = if twice {
                let there = target((node + 1) % self.apis.len());
                let (first, second) = tokio::join!(
                    send_order(&http, &self.recorder, &here, order, LOAD_REQUEST_TIMEOUT),
                    send_order(&http, &self.recorder, &there, order, LOAD_REQUEST_TIMEOUT),
                );
                vec![status(&first), status(&second)]
            } else {
                let outcome =
                    send_order(&http, &self.recorder, &here, order, LOAD_REQUEST_TIMEOUT).await;
                vec![status(&outcome)]
            };
            if statuses.contains(&Some(201)) {
                acked[t].push((key, coid, body));
            } else if !statuses.iter().any(|s| s.is_some_and(|s| s < 300)) {
                tokio::time::sleep(LOAD_BACKOFF).await;
            }
        }
    }
}

fn status(outcome: &Outcome) -> Option<u16> {
    outcome.answer().map(|(s, _)| s)
}

/// Reads the final state of `target`, judges the recorded history, and asserts
/// a clean verdict with at least `acked_min` acknowledged orders, some replays
/// checked and no op dropped by the recorder.
pub fn judge(
    runtime: &tokio::runtime::Runtime,
    target: &keyhold_checker::Target,
    recorder: &Recorder,
    acked_min: u64,
) -> (History, Verdict) {
    let history = recorder.history();
    let options = keyhold_checker::ReadOptions {
        settle_wait: SETTLE_WAIT,
    };
    let (_, verdict) = runtime
        .block_on(keyhold_checker::read_and_check(target, &history, options))
        .expect("the checker reads the final state");
    assert!(verdict.ok, "{}", verdict.summary());
    assert!(
        verdict.stats.orders_acked >= acked_min,
        "{}",
        verdict.summary()
    );
    assert!(
        verdict.stats.order_replays_checked > 0,
        "{}",
        verdict.summary()
    );
    assert_eq!(recorder.dropped(), 0);
    (history, verdict)
}

/// A write probe stops waiting here, well past any bound a test checks, so a
/// slow recovery is measured (and reported) rather than cut off at the bound.
const RECOVERY_GIVE_UP: Duration = Duration::from_secs(30);
/// One probe request's own timeout: a probe to a node that lost its leader
/// must not hide the next attempt for long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const PROBE_PAUSE: Duration = Duration::from_millis(50);

/// Sends new orders of `tenant` (name in the history, token), recorded as
/// `client`, through `nodes` of `region` in turn until one is created; the time
/// since `fault_at`.
pub async fn until_writes_answer(
    recorder: &Recorder,
    client: u32,
    (region, nodes): (&str, &[NodeInfo]),
    (tenant, token): &(String, String),
    fault_at: Instant,
) -> Duration {
    let http = reqwest::Client::new();
    for turn in 0.. {
        let node = &nodes[turn % nodes.len()];
        let to = Endpoint {
            client,
            tenant,
            token,
            region,
            url: &node.api_url,
        };
        let (key, coid) = (unique("probe"), unique("co"));
        let body = order_body(&coid, 1);
        let outcome = send_order(&http, recorder, &to, (&key, &coid, &body), PROBE_TIMEOUT).await;
        if outcome.answer().is_some_and(|(s, _)| s == 201) || fault_at.elapsed() > RECOVERY_GIVE_UP
        {
            break;
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    fault_at.elapsed()
}

/// Steady load through every node of a cluster, for every region's demo
/// tenant: `clients` load clients recorded in one history.
pub struct ClusterLoad {
    /// `(region, API origin)` of every node.
    pub apis: Vec<(String, String)>,
    /// `(name in the history, token)` of every region's demo tenant.
    pub tenants: Vec<(String, String)>,
    pub recorder: Recorder,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl ClusterLoad {
    pub fn start(
        cluster: &super::Cluster,
        regions: &[&str],
        runtime: &tokio::runtime::Runtime,
        clients: u32,
        twice_every: Option<usize>,
    ) -> ClusterLoad {
        let apis: Vec<(String, String)> = cluster
            .info
            .nodes
            .iter()
            .map(|n| (n.region.clone(), n.api_url.clone()))
            .collect();
        let tenants: Vec<(String, String)> = regions
            .iter()
            .map(|r| {
                let t = cluster.tenant(r);
                (t.tenant_id, t.token)
            })
            .collect();
        let recorder = Recorder::new(1_000_000);
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|client| {
                let load = LoadClient {
                    client,
                    apis: apis.clone(),
                    tenants: tenants.clone(),
                    twice_every,
                    recorder: recorder.clone(),
                    stop: stop.clone(),
                };
                runtime.spawn(load.run())
            })
            .collect();
        ClusterLoad {
            apis,
            tenants,
            recorder,
            stop,
            clients,
        }
    }

    /// Orders created so far (answered 201).
    pub fn created(&self) -> usize {
        self.recorder
            .history()
            .ops
            .iter()
            .filter(|op| op.outcome.answer().is_some_and(|(s, _)| s == 201))
            .count()
    }

    /// The flag that stops the load, for other tasks that run beside it.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Stops every client and waits for them; what the checker reads from.
    pub fn stop(
        self,
        cluster: &super::Cluster,
        runtime: &tokio::runtime::Runtime,
    ) -> (Recorder, keyhold_checker::Target) {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            runtime.block_on(client).expect("a load client");
        }
        let target = keyhold_checker::Target {
            regions: self.apis,
            tokens: self.tenants.into_iter().collect(),
            admin_token: Some(cluster.info.admin_token.clone()),
            psp_url: Some(
                cluster.info.raw["psp_url"]
                    .as_str()
                    .expect("psp_url")
                    .to_owned(),
            ),
        };
        (self.recorder, target)
    }
}
