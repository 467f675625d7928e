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
//! `verify`, every request and its fate go into a `keyhold-checker` history,
//! and afterwards the checker reads the final state (every client_order_id
//! sent, every acknowledged order, one more replay of every acknowledged key,
//! and with an admin token and the provider's origin the charges and
//! reservations) and gives its verdict.

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keyhold_checker::history::{Outcome, Recorder, Request, Sender};
use keyhold_checker::{ReadOptions, Target, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
/// Requests recorded for `verify`; past this, requests are counted as
/// unverified rather than growing memory without bound.
pub const VERIFY_OPS_MAX: usize = 1_000_000;
/// How long `verify` waits for downstream work (charges, reservations) to settle.
pub const VERIFY_SETTLE_WAIT_MS: u64 = 30_000;
/// The tenant name the history uses for the run's one token.
const HISTORY_TENANT: &str = "loadgen";
/// How often the progress bar is redrawn.
const PROGRESS_TICK_MS: u64 = 200;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid load: {0}")]
    Invalid(String),
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("verify: {0}")]
    Verify(#[from] keyhold_checker::Error),
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
    /// Record every request, and afterwards check the history against the
    /// final state with `keyhold-checker`.
    pub verify: bool,
    /// With `verify`: the admin token and the payment provider's origin, so
    /// that charges and reservations are checked too.
    pub admin_token: Option<String>,
    pub psp_url: Option<String>,
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
            admin_token: None,
            psp_url: None,
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
    /// The checker's verdict on the whole run (with `verify`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verdict>,
    /// Requests not recorded for `verify` past [`VERIFY_OPS_MAX`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unverified: Option<u64>,
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
    }
}

/// One answer, read in full.
struct Answer {
    status: u16,
    replayed: bool,
    order_id: Option<String>,
}

/// Where a worker records its requests (with `verify`).
#[derive(Clone)]
struct Record {
    recorder: Recorder,
    client: u32,
}

/// Sends one order request; with a record, notes it and its fate.
async fn send(
    client: &reqwest::Client,
    load: &Load,
    record: Option<&Record>,
    key: &str,
    body: &serde_json::Value,
) -> Option<Answer> {
    let text = body.to_string();
    let pending = record.map(|r| {
        let sender = Sender {
            client: r.client,
            tenant: HISTORY_TENANT,
            region: &load.target,
        };
        let request = Request::CreateOrder {
            key: key.to_owned(),
            client_order_id: body["client_order_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            body: text.clone(),
            fingerprint: None,
        };
        (r, r.recorder.invoke(&sender, request))
    });
    let result = async {
        let response = client
            .post(format!("{}/v1/orders", load.target))
            .bearer_auth(&load.token)
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(text)
            .send()
            .await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        Ok::<_, reqwest::Error>((status, replayed, response.text().await?))
    }
    .await;
    if let Some((r, pending)) = pending {
        let outcome = match &result {
            Ok((status, replayed, body)) => Outcome::Ok {
                status: *status,
                replayed: *replayed,
                body: body.clone(),
            },
            // A refused connection carried nothing: certainly not executed.
            Err(e) if e.is_connect() => Outcome::Fail {
                reason: e.to_string(),
            },
            Err(e) => Outcome::Unknown {
                reason: e.to_string(),
            },
        };
        r.recorder.complete(pending, outcome);
    }
    let (status, replayed, text) = result.ok()?;
    let order_id = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|j| {
            j.get("order_id")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        });
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
    record: Option<Record>,
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

    fn fresh(&mut self, run_id: &str) -> (String, serde_json::Value) {
        self.seq += 1;
        let coid = format!("{run_id}-{}-{}", self.id, self.seq);
        let body = body(&coid, 1000 + self.seq);
        (format!("k-{coid}"), body)
    }

    async fn one(&mut self, run_id: &str) {
        let kind = self.pick();
        if kind == Kind::Dup {
            return self.dup_group(run_id).await;
        }
        let (key, body) = match (kind, &self.acked) {
            (Kind::Replay, Some(a)) => (a.key.clone(), a.body.clone()),
            (Kind::Conflict, Some(a)) => {
                let mut changed = a.body.clone();
                changed["amount"] = serde_json::json!(1);
                (a.key.clone(), changed)
            }
            _ => self.fresh(run_id),
        };
        let started = Instant::now();
        let answer = send(&self.client, &self.load, self.record.as_ref(), &key, &body).await;
        let latency = started.elapsed();
        self.sent.fetch_add(1, Ordering::Relaxed);
        let outcome = match answer {
            None => "transport_error",
            Some(a) => classify(
                kind,
                a.status,
                a.replayed,
                a.order_id,
                &mut self.acked,
                key,
                body,
            ),
        };
        self.tally.record(kind, outcome, latency);
    }

    /// Sends one fresh key [`DUP_GROUP_SIZE`] times at once and checks that
    /// exactly one answer created the order and every other one replayed it.
    async fn dup_group(&mut self, run_id: &str) {
        let (key, body) = self.fresh(run_id);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..DUP_GROUP_SIZE {
            let (client, load, key, body, record) = (
                self.client.clone(),
                self.load.clone(),
                key.clone(),
                body.clone(),
                self.record.clone(),
            );
            set.spawn(async move {
                let started = Instant::now();
                let answer = send(&client, &load, record.as_ref(), &key, &body).await;
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
    let recorder = load.verify.then(|| Recorder::new(VERIFY_OPS_MAX));
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
            record: recorder.as_ref().map(|recorder| Record {
                recorder: recorder.clone(),
                client: id as u32,
            }),
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
    let (verify, unverified) = match &recorder {
        Some(recorder) => (
            Some(verify(&load, recorder).await?),
            Some(recorder.dropped()),
        ),
        None => (None, None),
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
        unverified,
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

/// Checks the run's history against the final state the target shows.
async fn verify(load: &Load, recorder: &Recorder) -> Result<Verdict, Error> {
    let bar = progress_bar(
        load,
        1,
        "{spinner} verify [{elapsed_precise}] reading the final state",
    );
    bar.enable_steady_tick(Duration::from_millis(PROGRESS_TICK_MS));
    let target = Target {
        regions: vec![(load.target.clone(), load.target.clone())],
        tokens: [(HISTORY_TENANT.to_owned(), load.token.clone())].into(),
        admin_token: load.admin_token.clone(),
        psp_url: load.psp_url.clone(),
    };
    let options = ReadOptions {
        settle_wait: Duration::from_millis(VERIFY_SETTLE_WAIT_MS),
    };
    let checked = keyhold_checker::read_and_check(&target, &recorder.history(), options).await;
    bar.finish_and_clear();
    Ok(checked?.1)
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
    fn merged_tallies_add_up() {
        let mut a = Tally::default();
        a.record(Kind::New, "new", Duration::from_millis(1));
        let mut b = Tally::default();
        b.record(Kind::Dup, "dup_new", Duration::from_millis(2));
        b.dup.groups = 1;
        b.dup.exactly_one_created = 1;
        a.merge(b);
        assert_eq!(a.dup.exactly_one_created, 1);
        assert_eq!(a.kinds.len(), 2);
        assert_eq!(a.outcomes["dup_new"].len(), 1);
    }
}
