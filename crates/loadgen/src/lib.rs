//! A load generator for `POST /v1/orders`: a fixed number of clients, each sending
//! its next request when the previous one answered (closed loop) or on a fixed
//! schedule (open loop, `rate`), for a fixed duration. Requests are drawn from a
//! mix of new orders, replays of an acknowledged request, conflicts (an
//! acknowledged key with a changed amount) and concurrent duplicates (a fresh key
//! sent [`DUP_GROUP_SIZE`] times at once). Latencies go into one HdrHistogram per
//! outcome and one per kind, so a replay's speed is never averaged with a new
//! order's.
//!
//! It checks what it measures: a replay must come back with
//! `Idempotent-Replayed: true` and the first answer's order id, a conflict must
//! be 422, and a duplicate group must get exactly one non-replayed 201 with every
//! other member replaying it; anything else counts as `unexpected`. With
//! `verify`, every order the run created is read back afterwards by its
//! client_order_id and compared with the acknowledged order id.

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Limits of one run, units last.
pub const CONCURRENCY_MAX: usize = 4096;
pub const DURATION_MS_MAX: u64 = 3_600_000;
/// Per-request timeout: longer than the server's in-flight wait plus a slow fsync.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Histograms record from 1 µs up to this.
const LATENCY_US_MAX: u64 = 60_000_000;
const _: () = assert!(REQUEST_TIMEOUT_MS * 1000 <= LATENCY_US_MAX);
/// Requests of one concurrent-duplicate group: they share a fresh key and are
/// sent at once, so one `dup` pick puts this many requests in flight.
pub const DUP_GROUP_SIZE: usize = 4;
/// Orders remembered for `verify`; past this, orders are counted as unverified
/// rather than growing memory without bound.
pub const VERIFY_ORDERS_MAX: usize = 1_000_000;
/// Concurrent reads of the verify pass (at most the run's own concurrency).
pub const VERIFY_CONCURRENCY_MAX: usize = 64;
/// How often the progress bar is redrawn.
const PROGRESS_TICK_MS: u64 = 200;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid load: {0}")]
    Invalid(String),
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("verify client: {0}")]
    Verify(#[from] keyhold_client::Error),
}

/// Relative weights of the request kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    pub new: u32,
    pub replay: u32,
    pub conflict: u32,
    /// Concurrent duplicates: groups of [`DUP_GROUP_SIZE`] under one fresh key.
    pub dup: u32,
}

impl Mix {
    /// Parses `new=90,replay=5,conflict=5,dup=1` (missing kinds weigh zero).
    pub fn parse(text: &str) -> Result<Mix, Error> {
        let mut mix = Mix {
            new: 0,
            replay: 0,
            conflict: 0,
            dup: 0,
        };
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| Error::Invalid(format!("mix part {part:?} is not name=weight")))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| Error::Invalid(format!("weight of {name:?} is not a number")))?;
            match name.trim() {
                "new" => mix.new = weight,
                "replay" => mix.replay = weight,
                "conflict" => mix.conflict = weight,
                "dup" => mix.dup = weight,
                other => return Err(Error::Invalid(format!("unknown mix kind {other:?}"))),
            }
        }
        if mix.total() == 0 {
            return Err(Error::Invalid("the mix has no weight".into()));
        }
        Ok(mix)
    }

    fn total(&self) -> u64 {
        [self.new, self.replay, self.conflict, self.dup]
            .iter()
            .map(|w| u64::from(*w))
            .sum()
    }
}

#[derive(Debug, Clone)]
pub struct Load {
    /// Origin of the node, e.g. `http://127.0.0.1:7400`.
    pub target: String,
    pub token: String,
    pub mix: Mix,
    pub concurrency: usize,
    pub duration: Duration,
    /// Open loop: total requests per second across all clients. `None`: closed loop.
    pub rate: Option<f64>,
    /// Draw a live progress bar on stderr.
    pub progress: bool,
    /// Afterwards, read back every order this run created by its client_order_id
    /// and compare it with the acknowledged one (the target must serve
    /// `GET /v1/orders?client_order_id=`).
    pub verify: bool,
}

impl Load {
    /// A closed-loop load with no progress bar and no verify pass.
    pub fn new(
        target: &str,
        token: &str,
        mix: Mix,
        concurrency: usize,
        duration: Duration,
    ) -> Load {
        Load {
            target: target.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            mix,
            concurrency,
            duration,
            rate: None,
            progress: false,
            verify: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    New,
    Replay,
    Conflict,
    Dup,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::New => "new",
            Kind::Replay => "replay",
            Kind::Conflict => "conflict",
            Kind::Dup => "dup",
        }
    }
}

/// Latency summary of one outcome or kind.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub count: u64,
    pub per_second: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// Concurrent-duplicate groups and how they were answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DupSummary {
    pub groups: u64,
    /// Exactly one non-replayed 201, every other member a replay of it.
    pub exactly_one_created: u64,
    /// More than one non-replayed 201: the same key executed twice.
    pub created_more_than_once: u64,
    /// Anything else (errors, 409s, no creation at all).
    pub other: u64,
}

/// The verify pass: every order this run created, read back.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifySummary {
    pub checked: u64,
    pub matched: u64,
    /// Found, but with another order id than the acknowledged one.
    pub mismatched: u64,
    /// No order for the client_order_id.
    pub missing: u64,
    /// The read failed even after retries.
    pub errors: u64,
    /// Created past [`VERIFY_ORDERS_MAX`], not checked.
    pub unverified: u64,
}

impl VerifySummary {
    /// Whether every checked order was found with its acknowledged id.
    pub fn is_clean(&self) -> bool {
        self.mismatched == 0 && self.missing == 0 && self.errors == 0
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: String,
    pub concurrency: usize,
    pub elapsed_s: f64,
    pub requests: u64,
    pub per_second: f64,
    /// Keyed by outcome: `new`, `replay`, `dup_new`, `dup_replay`, `marker_hit`,
    /// `key_reused`, `in_progress`, `rate_limited`, `server_error`,
    /// `transport_error`, `unexpected`.
    pub outcomes: BTreeMap<String, Summary>,
    /// Keyed by what was sent (`new`, `replay`, `conflict`, `dup`), whatever the
    /// answer: the latency a caller of that kind saw.
    pub kinds: BTreeMap<String, Summary>,
    /// Orders this run created (201, not replayed).
    pub created: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dup: Option<DupSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySummary>,
}

struct Acked {
    key: String,
    body: serde_json::Value,
    order_id: String,
}

type Histograms = BTreeMap<&'static str, Histogram<u64>>;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_max(LATENCY_US_MAX, 3).expect("valid bounds")
}

/// What one worker measured.
#[derive(Default)]
struct Tally {
    outcomes: Histograms,
    kinds: Histograms,
    dup: DupSummary,
    /// (client_order_id, order_id) of every order created, for `verify`.
    created: Vec<(String, String)>,
    unverified: u64,
}

impl Tally {
    fn record(&mut self, kind: Kind, outcome: &'static str, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, LATENCY_US_MAX);
        for (map, name) in [
            (&mut self.outcomes, outcome),
            (&mut self.kinds, kind.name()),
        ] {
            map.entry(name)
                .or_insert_with(histogram)
                .saturating_record(us);
        }
    }

    fn created(&mut self, verify: bool, client_order_id: &str, order_id: &str) {
        if !verify {
            return;
        }
        if self.created.len() < VERIFY_ORDERS_MAX {
            self.created
                .push((client_order_id.to_owned(), order_id.to_owned()));
        } else {
            self.unverified += 1;
        }
    }

    fn merge(&mut self, other: Tally) {
        for (mine, theirs) in [
            (&mut self.outcomes, other.outcomes),
            (&mut self.kinds, other.kinds),
        ] {
            for (name, h) in theirs {
                mine.entry(name)
                    .or_insert_with(histogram)
                    .add(&h)
                    .expect("same bounds");
            }
        }
        self.dup.groups += other.dup.groups;
        self.dup.exactly_one_created += other.dup.exactly_one_created;
        self.dup.created_more_than_once += other.dup.created_more_than_once;
        self.dup.other += other.dup.other;
        let room = VERIFY_ORDERS_MAX.saturating_sub(self.created.len());
        let overflow = other.created.len().saturating_sub(room) as u64;
        self.created.extend(other.created.into_iter().take(room));
        self.unverified += other.unverified + overflow;
    }
}

/// One answer, read in full.
struct Answer {
    status: u16,
    replayed: bool,
    order_id: Option<String>,
}

async fn send(
    client: &reqwest::Client,
    load: &Load,
    key: &str,
    body: &serde_json::Value,
) -> Option<Answer> {
    let response = client
        .post(format!("{}/v1/orders", load.target))
        .bearer_auth(&load.token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let json: Option<serde_json::Value> = response.json().await.ok();
    let order_id = json
        .as_ref()
        .and_then(|j| j.get("order_id"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    Some(Answer {
        status,
        replayed,
        order_id,
    })
}

struct Worker {
    client: reqwest::Client,
    load: Arc<Load>,
    id: usize,
    seq: u64,
    acked: Option<Acked>,
    tally: Tally,
    sent: Arc<AtomicU64>,
}

fn body(client_order_id: &str, amount: u64) -> serde_json::Value {
    serde_json::json!({
        "client_order_id": client_order_id,
        "cart_id": "cart-load",
        "amount": amount,
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1}, {"sku": "sku-2", "quantity": 3}],
        "metadata": {"source": "loadgen"},
    })
}

impl Worker {
    fn pick(&mut self) -> Kind {
        let m = self.load.mix;
        let roll = rand::random::<u64>() % m.total();
        let (new, replay, conflict) =
            (u64::from(m.new), u64::from(m.replay), u64::from(m.conflict));
        let kind = if roll < new {
            Kind::New
        } else if roll < new + replay {
            Kind::Replay
        } else if roll < new + replay + conflict {
            Kind::Conflict
        } else {
            Kind::Dup
        };
        // Nothing acknowledged yet: there is nothing to replay or conflict with.
        match (kind, &self.acked) {
            (Kind::Replay | Kind::Conflict, None) => Kind::New,
            _ => kind,
        }
    }

    fn fresh(&mut self, run_id: &str) -> (String, String, serde_json::Value) {
        self.seq += 1;
        let coid = format!("{run_id}-{}-{}", self.id, self.seq);
        let body = body(&coid, 1000 + self.seq);
        (format!("k-{coid}"), coid, body)
    }

    async fn one(&mut self, run_id: &str) {
        let kind = self.pick();
        if kind == Kind::Dup {
            return self.dup_group(run_id).await;
        }
        let (key, coid, body) = match (kind, &self.acked) {
            (Kind::Replay, Some(a)) => (a.key.clone(), String::new(), a.body.clone()),
            (Kind::Conflict, Some(a)) => {
                let mut changed = a.body.clone();
                changed["amount"] = serde_json::json!(1);
                (a.key.clone(), String::new(), changed)
            }
            _ => self.fresh(run_id),
        };
        let started = Instant::now();
        let answer = send(&self.client, &self.load, &key, &body).await;
        let latency = started.elapsed();
        self.sent.fetch_add(1, Ordering::Relaxed);
        let outcome = match answer {
            None => "transport_error",
            Some(a) => {
                if kind == Kind::New && a.status == 201 && !a.replayed {
                    if let Some(order_id) = &a.order_id {
                        self.tally.created(self.load.verify, &coid, order_id);
                    }
                }
                classify(
                    kind,
                    a.status,
                    a.replayed,
                    a.order_id,
                    &mut self.acked,
                    key,
                    body,
                )
            }
        };
        self.tally.record(kind, outcome, latency);
    }

    /// Sends one fresh key [`DUP_GROUP_SIZE`] times at once and checks that
    /// exactly one answer created the order and every other one replayed it.
    async fn dup_group(&mut self, run_id: &str) {
        let (key, coid, body) = self.fresh(run_id);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..DUP_GROUP_SIZE {
            let (client, load, key, body) = (
                self.client.clone(),
                self.load.clone(),
                key.clone(),
                body.clone(),
            );
            set.spawn(async move {
                let started = Instant::now();
                let answer = send(&client, &load, &key, &body).await;
                (answer, started.elapsed())
            });
        }
        let mut answers = Vec::with_capacity(DUP_GROUP_SIZE);
        while let Some(joined) = set.join_next().await {
            answers.push(joined.expect("a send does not panic"));
        }
        self.sent
            .fetch_add(DUP_GROUP_SIZE as u64, Ordering::Relaxed);
        let firsts: Vec<&String> = answers
            .iter()
            .filter_map(|(a, _)| a.as_ref())
            .filter(|a| a.status == 201 && !a.replayed)
            .filter_map(|a| a.order_id.as_ref())
            .collect();
        let first = (firsts.len() == 1).then(|| firsts[0].clone());
        let mut all_replay_first = true;
        for (answer, latency) in &answers {
            let outcome = match answer {
                None => "transport_error",
                Some(a) => match (a.status, a.replayed) {
                    (201, false) if firsts.len() == 1 => "dup_new",
                    (201, true) if first.is_some() && a.order_id == first => "dup_replay",
                    (409, _) => "in_progress",
                    (429, _) => "rate_limited",
                    (s, _) if s >= 500 => "server_error",
                    _ => "unexpected",
                },
            };
            all_replay_first &= matches!(outcome, "dup_new" | "dup_replay");
            self.tally.record(Kind::Dup, outcome, *latency);
        }
        self.tally.dup.groups += 1;
        match (&first, firsts.len()) {
            (Some(order_id), _) if all_replay_first => {
                self.tally.dup.exactly_one_created += 1;
                self.tally.created(self.load.verify, &coid, order_id);
                self.acked = Some(Acked {
                    key,
                    body,
                    order_id: order_id.clone(),
                });
            }
            (_, n) if n > 1 => self.tally.dup.created_more_than_once += 1,
            _ => self.tally.dup.other += 1,
        }
    }
}

fn classify(
    kind: Kind,
    status: u16,
    replayed: bool,
    order_id: Option<String>,
    acked: &mut Option<Acked>,
    key: String,
    body: serde_json::Value,
) -> &'static str {
    match (kind, status, replayed) {
        (Kind::New, 201, false) => {
            if let Some(order_id) = order_id {
                *acked = Some(Acked {
                    key,
                    body,
                    order_id,
                });
            }
            "new"
        }
        (Kind::Replay, 201, true) => {
            let same = acked.as_ref().map(|a| Some(&a.order_id)) == Some(order_id.as_ref());
            if same {
                "replay"
            } else {
                "unexpected"
            }
        }
        (Kind::Conflict, 422, _) => "key_reused",
        (_, 200, _) => "marker_hit",
        (_, 409, _) => "in_progress",
        (_, 429, _) => "rate_limited",
        (_, s, _) if s >= 500 => "server_error",
        _ => "unexpected",
    }
}

fn progress_bar(load: &Load, len: u64, template: &str) -> ProgressBar {
    if !load.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Runs the load (and, with `verify`, the verify pass) and returns the report.
pub async fn run(load: Load) -> Result<Report, Error> {
    if load.concurrency == 0 || load.concurrency > CONCURRENCY_MAX {
        return Err(Error::Invalid(format!(
            "concurrency must be 1 to {CONCURRENCY_MAX}"
        )));
    }
    if load.duration.is_zero() || load.duration.as_millis() as u64 > DURATION_MS_MAX {
        return Err(Error::Invalid(format!(
            "duration must be more than zero and at most {DURATION_MS_MAX} ms"
        )));
    }
    if load.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(Error::Invalid("rate must be a positive number".into()));
    }
    // A dup group holds DUP_GROUP_SIZE connections at once.
    let connections = load.concurrency * if load.mix.dup > 0 { DUP_GROUP_SIZE } else { 1 };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
        .tcp_nodelay(true)
        .build()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let load = Arc::new(load);
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + load.duration;
    let mut tasks = Vec::with_capacity(load.concurrency);
    for id in 0..load.concurrency {
        let mut worker = Worker {
            client: client.clone(),
            load: load.clone(),
            id,
            seq: 0,
            acked: None,
            tally: Tally::default(),
            sent: sent.clone(),
        };
        let run_id = run_id.clone();
        tasks.push(tokio::spawn(async move {
            // Open loop: each client sends on its own share of the schedule,
            // whether or not earlier answers came back late.
            let interval = worker
                .load
                .rate
                .map(|r| Duration::from_secs_f64(worker.load.concurrency as f64 / r));
            let mut next = Instant::now();
            while Instant::now() < deadline {
                if let Some(interval) = interval {
                    next += interval;
                    tokio::time::sleep_until(next.into()).await;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                worker.one(&run_id).await;
            }
            worker.tally
        }));
    }
    let bar = progress_bar(
        &load,
        load.duration.as_millis() as u64,
        "{spinner} load   [{elapsed_precise}] [{bar:40}] {msg}",
    );
    let ticker = {
        let (bar, sent) = (bar.clone(), sent.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(PROGRESS_TICK_MS)).await;
                let elapsed = started.elapsed();
                let n = sent.load(Ordering::Relaxed);
                bar.set_position(elapsed.as_millis() as u64);
                bar.set_message(format!(
                    "{n} requests, {:.0}/s",
                    n as f64 / elapsed.as_secs_f64().max(1e-3)
                ));
            }
        })
    };
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("worker does not panic"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    ticker.abort();
    bar.finish_and_clear();
    let summarize = |map: &Histograms| -> BTreeMap<String, Summary> {
        map.iter()
            .map(|(name, h)| ((*name).to_owned(), summary(h, elapsed)))
            .collect()
    };
    let outcomes = summarize(&tally.outcomes);
    let kinds = summarize(&tally.kinds);
    let requests: u64 = outcomes.values().map(|s| s.count).sum();
    let created = ["new", "dup_new"]
        .iter()
        .filter_map(|o| outcomes.get(*o))
        .map(|s| s.count)
        .sum();
    let verify = if load.verify {
        Some(verify(&load, tally.created, tally.unverified).await?)
    } else {
        None
    };
    Ok(Report {
        target: load.target.clone(),
        concurrency: load.concurrency,
        elapsed_s: elapsed,
        requests,
        per_second: requests as f64 / elapsed,
        created,
        dup: (load.mix.dup > 0).then_some(tally.dup),
        verify,
        outcomes,
        kinds,
    })
}

fn summary(h: &Histogram<u64>, elapsed_s: f64) -> Summary {
    Summary {
        count: h.len(),
        per_second: h.len() as f64 / elapsed_s,
        p50_us: h.value_at_quantile(0.50),
        p90_us: h.value_at_quantile(0.90),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

/// Reads every created order back by its client_order_id (through the SDK, so
/// 429/503 are retried) and compares order ids.
async fn verify(
    load: &Load,
    created: Vec<(String, String)>,
    unverified: u64,
) -> Result<VerifySummary, Error> {
    let client = keyhold_client::Client::new(&load.target, &load.token)?;
    let bar = progress_bar(
        load,
        created.len() as u64,
        "{spinner} verify [{elapsed_precise}] [{bar:40}] {pos}/{len}",
    );
    let created = Arc::new(created);
    let next = Arc::new(AtomicUsize::new(0));
    let summary = Arc::new(Mutex::new(VerifySummary {
        unverified,
        ..VerifySummary::default()
    }));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..load.concurrency.min(VERIFY_CONCURRENCY_MAX) {
        let (client, created, next, summary, bar) = (
            client.clone(),
            created.clone(),
            next.clone(),
            summary.clone(),
            bar.clone(),
        );
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((coid, order_id)) = created.get(i) else {
                    return;
                };
                let found = client.find_by_client_order_id(coid).await;
                let mut s = summary.lock().unwrap_or_else(|p| p.into_inner());
                s.checked += 1;
                match found {
                    Ok(Some(order)) if &order.order_id == order_id => s.matched += 1,
                    Ok(Some(_)) => s.mismatched += 1,
                    Ok(None) => s.missing += 1,
                    Err(_) => s.errors += 1,
                }
                bar.inc(1);
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("a verify task does not panic");
    }
    bar.finish_and_clear();
    let summary = summary.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parsing() {
        assert_eq!(
            Mix::parse("new=90,replay=5,conflict=5").unwrap(),
            Mix {
                new: 90,
                replay: 5,
                conflict: 5,
                dup: 0,
            }
        );
        assert_eq!(Mix::parse("replay=1").unwrap().new, 0);
        assert_eq!(Mix::parse("dup=4").unwrap().dup, 4);
        assert!(Mix::parse("new=0").is_err());
        assert!(Mix::parse("fresh=1").is_err());
        assert!(Mix::parse("new").is_err());
    }

    #[test]
    fn a_replay_with_another_order_id_is_unexpected() {
        let mut acked = Some(Acked {
            key: "k".into(),
            body: serde_json::json!({}),
            order_id: "ord_1".into(),
        });
        let body = serde_json::json!({});
        assert_eq!(
            classify(
                Kind::Replay,
                201,
                true,
                Some("ord_1".into()),
                &mut acked,
                "k".into(),
                body.clone()
            ),
            "replay"
        );
        assert_eq!(
            classify(
                Kind::Replay,
                201,
                true,
                Some("ord_2".into()),
                &mut acked,
                "k".into(),
                body.clone()
            ),
            "unexpected"
        );
        assert_eq!(
            classify(
                Kind::Conflict,
                201,
                false,
                None,
                &mut acked,
                "k".into(),
                body
            ),
            "unexpected"
        );
    }

    #[test]
    fn merged_tallies_keep_the_verify_bound() {
        let mut a = Tally::default();
        a.created(true, "c1", "o1");
        a.record(Kind::New, "new", Duration::from_millis(1));
        let mut b = Tally::default();
        b.created(true, "c2", "o2");
        b.created(false, "c3", "o3");
        b.record(Kind::Dup, "dup_new", Duration::from_millis(2));
        b.dup.groups = 1;
        b.dup.exactly_one_created = 1;
        a.merge(b);
        assert_eq!(a.created.len(), 2);
        assert_eq!(a.dup.exactly_one_created, 1);
        assert_eq!(a.kinds.len(), 2);
        assert_eq!(a.outcomes["dup_new"].len(), 1);
    }
}
