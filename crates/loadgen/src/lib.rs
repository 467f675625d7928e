//! A load generator for `POST /v1/orders`: a fixed number of clients, each sending
//! its next request when the previous one answered (closed loop) or on a fixed
//! schedule (open loop, `rate`), for a fixed duration. Requests are drawn from a
//! mix of new orders, replays of an acknowledged request, and conflicts (an
//! acknowledged key with a changed amount). Latencies go into one HdrHistogram per
//! outcome, so a replay's speed is never averaged with a new order's.
//!
//! It checks what it measures: a replay must come back with
//! `Idempotent-Replayed: true` and the first answer's order id, and a conflict must
//! be 422; anything else counts as `unexpected`.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid load: {0}")]
    Invalid(String),
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Relative weights of the request kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    pub new: u32,
    pub replay: u32,
    pub conflict: u32,
}

impl Mix {
    /// Parses `new=90,replay=5,conflict=5` (missing kinds weigh zero).
    pub fn parse(text: &str) -> Result<Mix, Error> {
        let mut mix = Mix {
            new: 0,
            replay: 0,
            conflict: 0,
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
                other => return Err(Error::Invalid(format!("unknown mix kind {other:?}"))),
            }
        }
        if mix.new + mix.replay + mix.conflict == 0 {
            return Err(Error::Invalid("the mix has no weight".into()));
        }
        Ok(mix)
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    New,
    Replay,
    Conflict,
}

/// Latency summary of one outcome.
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

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: String,
    pub concurrency: usize,
    pub elapsed_s: f64,
    pub requests: u64,
    pub per_second: f64,
    /// Keyed by outcome: `new`, `replay`, `marker_hit`, `key_reused`, `in_progress`,
    /// `rate_limited`, `server_error`, `transport_error`, `unexpected`.
    pub outcomes: BTreeMap<String, Summary>,
    /// Orders this run created (201, not replayed).
    pub created: u64,
}

struct Acked {
    key: String,
    body: serde_json::Value,
    order_id: String,
}

struct Worker {
    client: reqwest::Client,
    load: Arc<Load>,
    id: usize,
    seq: u64,
    acked: Option<Acked>,
    hist: BTreeMap<&'static str, Histogram<u64>>,
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
        let total = m.new + m.replay + m.conflict;
        let roll = rand::random::<u32>() % total;
        let kind = if roll < m.new {
            Kind::New
        } else if roll < m.new + m.replay {
            Kind::Replay
        } else {
            Kind::Conflict
        };
        // Nothing acknowledged yet: there is nothing to replay or conflict with.
        if self.acked.is_none() {
            Kind::New
        } else {
            kind
        }
    }

    async fn one(&mut self, run_id: &str) {
        let kind = self.pick();
        let (key, body) = match (kind, &self.acked) {
            (Kind::New, _) | (_, None) => {
                self.seq += 1;
                let coid = format!("{run_id}-{}-{}", self.id, self.seq);
                (format!("k-{coid}"), body(&coid, 1000 + self.seq))
            }
            (Kind::Replay, Some(a)) => (a.key.clone(), a.body.clone()),
            (Kind::Conflict, Some(a)) => {
                let mut changed = a.body.clone();
                changed["amount"] = serde_json::json!(1);
                (a.key.clone(), changed)
            }
        };
        let started = Instant::now();
        let result = self
            .client
            .post(format!("{}/v1/orders", self.load.target))
            .bearer_auth(&self.load.token)
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await;
        let outcome = match result {
            Err(_) => "transport_error",
            Ok(response) => {
                let status = response.status().as_u16();
                let replayed = response.headers().contains_key("idempotent-replayed");
                let json: Option<serde_json::Value> = response.json().await.ok();
                let order_id = json
                    .as_ref()
                    .and_then(|j| j.get("order_id"))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
                classify(kind, status, replayed, order_id, &mut self.acked, key, body)
            }
        };
        let us = (started.elapsed().as_micros() as u64).clamp(1, LATENCY_US_MAX);
        self.hist
            .entry(outcome)
            .or_insert_with(|| Histogram::new_with_max(LATENCY_US_MAX, 3).expect("valid bounds"))
            .saturating_record(us);
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

/// Runs the load and returns the report.
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
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(load.concurrency)
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
        .tcp_nodelay(true)
        .build()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let load = Arc::new(load);
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
            hist: BTreeMap::new(),
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
            worker.hist
        }));
    }
    let mut merged: BTreeMap<&'static str, Histogram<u64>> = BTreeMap::new();
    for task in tasks {
        let hist = task.await.expect("worker does not panic");
        for (name, h) in hist {
            merged
                .entry(name)
                .or_insert_with(|| Histogram::new_with_max(LATENCY_US_MAX, 3).expect("bounds"))
                .add(&h)
                .expect("same bounds");
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let outcomes: BTreeMap<String, Summary> = merged
        .iter()
        .map(|(name, h)| {
            (
                (*name).to_owned(),
                Summary {
                    count: h.len(),
                    per_second: h.len() as f64 / elapsed,
                    p50_us: h.value_at_quantile(0.50),
                    p90_us: h.value_at_quantile(0.90),
                    p99_us: h.value_at_quantile(0.99),
                    p999_us: h.value_at_quantile(0.999),
                    max_us: h.max(),
                },
            )
        })
        .collect();
    let requests: u64 = outcomes.values().map(|s| s.count).sum();
    Ok(Report {
        target: load.target.clone(),
        concurrency: load.concurrency,
        elapsed_s: elapsed,
        requests,
        per_second: requests as f64 / elapsed,
        created: outcomes.get("new").map_or(0, |s| s.count),
        outcomes,
    })
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
                conflict: 5
            }
        );
        assert_eq!(Mix::parse("replay=1").unwrap().new, 0);
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
}
