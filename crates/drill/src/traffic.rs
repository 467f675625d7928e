//! The drill's client: steady order traffic for the drilled region's tenants,
//! entering through every region in turn, open loop at a fixed rate. A
//! request that gets no success is sent again with the same key and body
//! (the next region in turn, as a client behind a global load balancer
//! would) until it is acknowledged or the drill ends. Every acknowledgement
//! and every failed attempt is recorded with its instant, which is what the
//! report's timings and the loss accounting are computed from.

use crate::cluster::{Calls, TenantEntry};
use crate::limits::{INFLIGHT_MAX, RETRY_WAIT_MS};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// An order the drill's client got a success for.
#[derive(Debug, Clone)]
pub struct Acked {
    pub tenant_id: String,
    pub token: String,
    pub key: String,
    pub client_order_id: String,
    pub order_id: String,
    pub at: Instant,
    /// `Keyhold-Region` of the answer: the region that executed it.
    pub executed_in: String,
}

/// An attempt that got no success, and why: the problem's slug (docs/api.md
/// section 2), the status when the answer was no problem, or `no answer`.
#[derive(Debug, Clone)]
pub struct Failed {
    pub at: Instant,
    pub why: String,
}

/// What the traffic recorded so far.
#[derive(Debug, Default)]
pub struct Record {
    pub acked: Vec<Acked>,
    /// Failed attempts (any answer but 200/201, or none).
    pub failures: Vec<Failed>,
    /// Instants of successful attempts.
    pub successes: Vec<Instant>,
}

/// Steady traffic in the background; `stop_new` then `stop` end it.
pub struct Traffic {
    record: Arc<Mutex<Record>>,
    stop_new: Arc<AtomicBool>,
    stop_all: Arc<AtomicBool>,
    /// Orders sent for the first time, and orders still unanswered.
    pub sent: Arc<AtomicU64>,
    pub pending: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Starts `rate` orders per second in all, spread over `regions`' origins,
    /// for `tenants` in turn.
    pub fn start(calls: &Calls, tenants: Vec<TenantEntry>, rate: f64) -> Traffic {
        let origins: Vec<(String, String)> = calls
            .file
            .regions
            .iter()
            .map(|r| (r.name.clone(), r.api_url.clone()))
            .collect();
        let shared = Shared {
            calls: calls.clone(),
            origins: Arc::new(origins.clone()),
            tenants: Arc::new(tenants),
            record: Arc::default(),
            stop_all: Arc::default(),
            inflight: Arc::new(Semaphore::new(INFLIGHT_MAX)),
            sent: Arc::default(),
            pending: Arc::default(),
        };
        let stop_new = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs_f64(origins.len() as f64 / rate);
        let workers = (0..origins.len())
            .map(|entry| {
                let (shared, stop_new) = (shared.clone(), stop_new.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(period);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut n = 0usize;
                    while !stop_new.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let permit = shared.inflight.clone().acquire_owned().await;
                        let Ok(permit) = permit else { return };
                        let shared = shared.clone();
                        n += 1;
                        let tenant = n % shared.tenants.len();
                        tokio::spawn(async move {
                            shared.one_order(entry, tenant).await;
                            drop(permit);
                        });
                    }
                })
            })
            .collect();
        Traffic {
            record: shared.record,
            stop_new,
            stop_all: shared.stop_all,
            sent: shared.sent,
            pending: shared.pending,
            workers,
        }
    }

    /// A snapshot of what was recorded.
    pub fn with_record<R>(&self, f: impl FnOnce(&Record) -> R) -> R {
        f(&self.record.lock().expect("not poisoned"))
    }

    /// Stops sending new orders; unanswered ones keep being retried.
    pub async fn stop_new(&mut self) {
        self.stop_new.store(true, Ordering::Relaxed);
        for worker in self.workers.drain(..) {
            let _ = worker.await;
        }
    }

    /// Stops retrying too: orders still unanswered stay so.
    pub fn stop(&self) {
        self.stop_all.store(true, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Shared {
    calls: Calls,
    origins: Arc<Vec<(String, String)>>,
    tenants: Arc<Vec<TenantEntry>>,
    record: Arc<Mutex<Record>>,
    stop_all: Arc<AtomicBool>,
    inflight: Arc<Semaphore>,
    sent: Arc<AtomicU64>,
    pending: Arc<AtomicU64>,
}

impl Shared {
    /// One new order for tenant `tenant`, first through origin `entry`, then
    /// retried through the next origins in turn until it is acknowledged or
    /// the drill stops.
    async fn one_order(&self, entry: usize, tenant: usize) {
        let tenant = &self.tenants[tenant];
        let id = uuid::Uuid::now_v7().simple().to_string();
        let key = format!("drill-{id}");
        let client_order_id = format!("drill-co-{id}");
        let body = serde_json::json!({
            "client_order_id": client_order_id,
            "cart_id": "drill",
            "amount": 1250,
            "currency": "EUR",
        });
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.pending.fetch_add(1, Ordering::Relaxed);
        let mut attempt = 0;
        while !self.stop_all.load(Ordering::Relaxed) {
            let (_, origin) = &self.origins[(entry + attempt) % self.origins.len()];
            attempt += 1;
            let answer = self
                .calls
                .http
                .post(format!("{origin}/v1/orders"))
                .bearer_auth(&tenant.token)
                .header("idempotency-key", &key)
                .json(&body)
                .send()
                .await;
            let now = Instant::now();
            let why = match answer {
                Err(_) => "no answer".to_owned(),
                Ok(response) => {
                    let status = response.status().as_u16();
                    let executed_in = response
                        .headers()
                        .get("keyhold-region")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let json: Option<serde_json::Value> = response.json().await.ok();
                    let order_id = json
                        .as_ref()
                        .and_then(|j| j["order_id"].as_str())
                        .map(str::to_owned);
                    if let (200 | 201, Some(order_id)) = (status, order_id) {
                        let mut record = self.record.lock().expect("not poisoned");
                        record.successes.push(now);
                        record.acked.push(Acked {
                            tenant_id: tenant.tenant_id.clone(),
                            token: tenant.token.clone(),
                            key,
                            client_order_id,
                            order_id,
                            at: now,
                            executed_in,
                        });
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                    failure_reason(status, json.as_ref())
                }
            };
            self.record
                .lock()
                .expect("not poisoned")
                .failures
                .push(Failed { at: now, why });
            tokio::time::sleep(Duration::from_millis(RETRY_WAIT_MS)).await;
        }
    }
}

/// Why an answer was no success: the problem's slug (`type` ends in it), else
/// the status.
fn failure_reason(status: u16, body: Option<&serde_json::Value>) -> String {
    body.and_then(|b| b["type"].as_str())
        .and_then(|t| t.rsplit_once("/problems/"))
        .map(|(_, slug)| slug.to_owned())
        .unwrap_or_else(|| format!("status {status}"))
}

#[cfg(test)]
mod tests {
    use super::failure_reason;
    use serde_json::json;

    #[test]
    fn a_failure_is_named_by_its_problem_slug_else_its_status() {
        let problem =
            json!({"type": "https://keyhold.dev/problems/owner-unreachable", "status": 503});
        assert_eq!(failure_reason(503, Some(&problem)), "owner-unreachable");
        assert_eq!(
            failure_reason(502, Some(&json!({"error": "x"}))),
            "status 502"
        );
        assert_eq!(failure_reason(201, None), "status 201");
    }
}
