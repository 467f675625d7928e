//! The client side of a run: each client executes its planned steps at their
//! offsets, sends every request to the planned region's node, and records each
//! request and its fate in the shared history (a refused connection is `fail`,
//! any other transport error or a client timeout is `unknown`). After a step
//! the plan may have it read back one of the orders it saw acknowledged, by id
//! or by client_order_id, through a planned region: the checker judges those
//! reads (a 404 or another order is a stale read).

use crate::limits::{
    RECONNECT_PAUSE_MS, REQUEST_TIMEOUT_MS, TAKEOVER_ATTEMPTS_MAX, TAKEOVER_RETRY_MS,
};
use crate::plan::{OrderSpec, ReadBack, Step, Timed, REGIONS};
use keyhold_checker::history::{Outcome, Recorder, Request, Sender};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The claims operation chaos jobs use.
pub const CLAIM_OPERATION: &str = "POST:/v1/chaos-jobs";

/// What every client shares.
pub struct Env {
    pub http: reqwest::Client,
    /// API origin per region index.
    pub api_urls: Vec<String>,
    /// Bearer token per tenant index (`demo-<region>`).
    pub tokens: Vec<String>,
    pub recorder: Recorder,
}

pub fn tenant_name(tenant: usize) -> String {
    format!("demo-{}", REGIONS[tenant])
}

/// One request to send and record.
struct Call<'a> {
    client: u32,
    tenant: usize,
    region: usize,
    path: &'a str,
    key: Option<&'a str>,
    /// `Some`: a POST of this JSON; `None`: a GET.
    body: Option<String>,
    timeout_ms: Option<u64>,
    request: Request,
}

impl Env {
    async fn call(&self, call: Call<'_>) -> Outcome {
        let tenant = tenant_name(call.tenant);
        let sender = Sender {
            client: call.client,
            tenant: &tenant,
            region: REGIONS[call.region],
        };
        let pending = self.recorder.invoke(&sender, call.request);
        let url = format!("{}{}", self.api_urls[call.region], call.path);
        let mut builder = match call.body {
            Some(body) => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body),
            None => self.http.get(url),
        }
        .bearer_auth(&self.tokens[call.tenant])
        .timeout(Duration::from_millis(
            call.timeout_ms.unwrap_or(REQUEST_TIMEOUT_MS),
        ));
        if let Some(key) = call.key {
            builder = builder.header("idempotency-key", key);
        }
        let result = async {
            let response = builder.send().await?;
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("idempotent-replayed");
            Ok::<_, reqwest::Error>((status, replayed, response.text().await?))
        }
        .await;
        let outcome = match result {
            Ok((status, replayed, body)) => Outcome::Ok {
                status,
                replayed,
                body,
            },
            // Nothing reached a server: certainly not executed.
            Err(e) if e.is_connect() => Outcome::Fail {
                reason: e.to_string(),
            },
            Err(e) => Outcome::Unknown {
                reason: e.to_string(),
            },
        };
        self.recorder.complete(pending, outcome.clone());
        if matches!(outcome, Outcome::Fail { .. }) {
            // The cluster is down (a kill): do not burn the plan in a tight loop.
            tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await;
        }
        outcome
    }

    async fn order(
        &self,
        client: u32,
        order: &OrderSpec,
        region: usize,
        timeout_ms: Option<u64>,
    ) -> Outcome {
        let body = order.body();
        self.call(Call {
            client,
            tenant: order.tenant,
            region,
            path: "/v1/orders",
            key: Some(&order.key),
            body: Some(body.clone()),
            timeout_ms,
            request: Request::CreateOrder {
                key: order.key.clone(),
                client_order_id: order.client_order_id.clone(),
                body,
                fingerprint: None,
            },
        })
        .await
    }

    async fn claim(
        &self,
        client: u32,
        tenant: usize,
        region: usize,
        key: &str,
        lease_ms: u64,
    ) -> Outcome {
        let fingerprint = keyhold_fingerprint::sha256_fingerprint(key.as_bytes())
            .as_str()
            .to_owned();
        let body = serde_json::json!({
            "operation": CLAIM_OPERATION, "key": key, "fingerprint": fingerprint,
            "lease_ms": lease_ms,
        })
        .to_string();
        self.call(Call {
            client,
            tenant,
            region,
            path: "/v1/claims",
            key: None,
            body: Some(body),
            timeout_ms: None,
            request: Request::Claim {
                operation: CLAIM_OPERATION.to_owned(),
                key: key.to_owned(),
                fingerprint,
                lease_ms,
            },
        })
        .await
    }

    async fn complete(
        &self,
        client: u32,
        tenant: usize,
        region: usize,
        key: &str,
        owner_token: &str,
        worker: &str,
    ) -> Outcome {
        let response_body = serde_json::json!({"job": key, "worker": worker}).to_string();
        let body = serde_json::json!({
            "operation": CLAIM_OPERATION, "key": key, "owner_token": owner_token,
            "outcome": "SUCCEEDED",
            "response": {"status": 200, "headers": {},
                "body": serde_json::from_str::<serde_json::Value>(&response_body)
                    .expect("just written")},
            "resource_id": format!("res-{key}"),
        })
        .to_string();
        self.call(Call {
            client,
            tenant,
            region,
            path: "/v1/claims/complete",
            key: None,
            body: Some(body),
            timeout_ms: None,
            request: Request::CompleteClaim {
                operation: CLAIM_OPERATION.to_owned(),
                key: key.to_owned(),
                owner_token: owner_token.to_owned(),
                outcome: "SUCCEEDED".to_owned(),
                response_body,
            },
        })
        .await
    }
}

/// An order a client saw acknowledged: tenant, order id, client_order_id.
#[derive(Debug, Clone)]
struct Acked {
    tenant: usize,
    order_id: String,
    client_order_id: String,
}

/// The order an answer acknowledges (200 or 201 naming an order id).
fn acked(tenant: usize, outcome: &Outcome) -> Option<Acked> {
    if !matches!(
        outcome,
        Outcome::Ok {
            status: 200 | 201,
            ..
        }
    ) {
        return None;
    }
    let json = outcome.json()?;
    Some(Acked {
        tenant,
        order_id: json["order_id"].as_str()?.to_owned(),
        client_order_id: json["client_order_id"].as_str()?.to_owned(),
    })
}

impl Env {
    /// Reads an acknowledged order back through region `region`.
    async fn read(&self, client: u32, order: &Acked, region: usize, by_id: bool) -> Outcome {
        // Order ids are `ord_` and hex; client_order_ids are the plan's
        // `s<seed>-c<client>-o<n>`: neither needs escaping.
        let path = if by_id {
            format!("/v1/orders/{}", order.order_id)
        } else {
            format!("/v1/orders?client_order_id={}", order.client_order_id)
        };
        self.call(Call {
            client,
            tenant: order.tenant,
            region,
            path: &path,
            key: None,
            body: None,
            timeout_ms: None,
            request: Request::ReadOrder {
                order_id: by_id.then(|| order.order_id.clone()),
                client_order_id: (!by_id).then(|| order.client_order_id.clone()),
            },
        })
        .await
    }
}

/// The owner token of a 201 claim answer.
fn owner_token(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Ok { status: 201, .. } => outcome
            .json()
            .and_then(|j| j["owner_token"].as_str().map(str::to_owned)),
        _ => None,
    }
}

/// The claim job of one step: claim, and either complete, or crash, be taken
/// over after the lease, and wake up to a fenced completion.
#[derive(Debug, Clone, Copy)]
struct Job<'a> {
    client: u32,
    tenant: usize,
    region: usize,
    key: &'a str,
    lease_ms: u64,
    holder_crashes: bool,
}

async fn claim_job(env: &Env, job: Job<'_>) {
    let Job {
        client,
        tenant,
        region,
        key,
        lease_ms,
        holder_crashes,
    } = job;
    let Some(first) = owner_token(&env.claim(client, tenant, region, key, lease_ms).await) else {
        return;
    };
    if !holder_crashes {
        env.complete(client, tenant, region, key, &first, "holder")
            .await;
        // A replay of the completed claim.
        env.claim(client, tenant, (region + 1) % REGIONS.len(), key, lease_ms)
            .await;
        return;
    }
    // The holder crashed: after its lease a second worker takes over.
    tokio::time::sleep(Duration::from_millis(lease_ms)).await;
    let mut second = None;
    for _ in 0..TAKEOVER_ATTEMPTS_MAX {
        let answer = env
            .claim(client, tenant, (region + 1) % REGIONS.len(), key, lease_ms)
            .await;
        second = owner_token(&answer);
        let in_progress = matches!(answer, Outcome::Ok { status: 409, .. });
        if second.is_some() || !in_progress {
            break;
        }
        tokio::time::sleep(Duration::from_millis(TAKEOVER_RETRY_MS)).await;
    }
    let Some(second) = second else { return };
    env.complete(client, tenant, region, key, &second, "successor")
        .await;
    // The old holder wakes up and tries to finish: it must be fenced (409).
    env.complete(client, tenant, region, key, &first, "stale-holder")
        .await;
}

/// Runs one client's steps at their offsets from `started`, each followed by
/// its planned read-back (`reads[i]`), if any.
pub async fn run_client(
    env: Arc<Env>,
    client: u32,
    steps: Vec<Timed<Step>>,
    reads: Vec<Option<ReadBack>>,
    started: Instant,
) {
    let mut orders: BTreeMap<usize, OrderSpec> = BTreeMap::new();
    let mut seen: Vec<Acked> = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        tokio::time::sleep_until((started + Duration::from_millis(step.at_ms)).into()).await;
        // What the step's order requests answered: (tenant, outcome).
        let mut answers: Vec<(usize, Outcome)> = Vec::new();
        match step.what {
            Step::New {
                order,
                region,
                timeout_ms,
            } => {
                answers.push((
                    order.tenant,
                    env.order(client, &order, region, timeout_ms).await,
                ));
                orders.insert(i, order);
            }
            Step::Retry { of, region } => {
                let order = &orders[&of];
                answers.push((order.tenant, env.order(client, order, region, None).await));
            }
            Step::Conflict { of, region } => {
                let mut changed = orders[&of].clone();
                changed.amount += 1;
                env.order(client, &changed, region, None).await;
            }
            Step::NewKeySameOrder { of, key, region } => {
                let mut again = orders[&of].clone();
                again.key = key;
                answers.push((again.tenant, env.order(client, &again, region, None).await));
            }
            Step::NewKeyChangedOrder { of, key, region } => {
                let mut changed = orders[&of].clone();
                changed.key = key;
                changed.amount += 2;
                env.order(client, &changed, region, None).await;
            }
            Step::Duplicates { order, regions } => {
                let mut set = tokio::task::JoinSet::new();
                for region in regions {
                    let (env, order) = (env.clone(), order.clone());
                    set.spawn(async move { env.order(client, &order, region, None).await });
                }
                while let Some(joined) = set.join_next().await {
                    if let Ok(outcome) = joined {
                        answers.push((order.tenant, outcome));
                    }
                }
                orders.insert(i, order);
            }
            Step::ClaimJob {
                tenant,
                key,
                region,
                lease_ms,
                holder_crashes,
            } => {
                let job = Job {
                    client,
                    tenant,
                    region,
                    key: &key,
                    lease_ms,
                    holder_crashes,
                };
                claim_job(&env, job).await;
            }
        }
        for (tenant, outcome) in &answers {
            if let Some(order) = acked(*tenant, outcome) {
                if !seen.iter().any(|s| s.order_id == order.order_id) {
                    seen.push(order);
                }
            }
        }
        if let (Some(Some(read)), false) = (reads.get(i), seen.is_empty()) {
            let order = &seen[read.pick as usize % seen.len()];
            env.read(client, order, read.region, read.by_id).await;
        }
    }
}
