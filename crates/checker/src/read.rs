//! Reads the final state a history needs through the cluster's APIs: every
//! client_order_id the history sent (by `GET /v1/orders?client_order_id=`),
//! every acknowledged order by id, one more replay of every acknowledged key
//! and completed claim, the fake provider's `GET /v1/charges` and the admin
//! reservations endpoint. Downstream work is asynchronous, so the reader polls
//! until every order found has settled, bounded by `settle_wait`.
//!
//! Reads go to the regions in turn (so forwarding is exercised too) and are
//! retried on what a healthy cluster answers while it recovers: transport
//! errors, 409, 421, 429 and 5xx.

use crate::analysis::downstream_pending;
use crate::history::{History, Outcome, Request};
use crate::limits::{
    READ_ATTEMPTS_MAX, READ_CONCURRENCY_MAX, READ_RETRY_MS, READ_TIMEOUT_MS, SETTLE_POLL_MS,
};
use crate::state::{
    ByClientOrderId, ByOrderId, Charge, ClaimReplay, Downstream, FinalState, OrderReplay, Read,
    Reservation,
};
use crate::Error;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where and as whom to read.
#[derive(Debug, Clone)]
pub struct Target {
    /// `(region name, API origin)`; reads rotate over them.
    pub regions: Vec<(String, String)>,
    /// Tenant name in the history → its bearer token.
    pub tokens: BTreeMap<String, String>,
    /// With both of these, charges and reservations are read and checked.
    pub admin_token: Option<String>,
    pub psp_url: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// How long to wait for downstream work to settle.
    pub settle_wait: Duration,
}

/// One HTTP answer, read in full.
struct Answer {
    status: u16,
    replayed: bool,
    body: String,
}

struct Reader {
    http: reqwest::Client,
    target: Target,
}

/// Order ids are the server's own (`ord_` and hex); anything else would need
/// escaping in a path, and is refused rather than sent.
fn path_safe(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether an answer says "not now" rather than anything about the data. A
/// 409 is "not now" only as `request-in-progress`: `client-order-id-conflict`
/// is an answer (chaos seed 2498: a failover lost the key's order, a new key
/// then created the client order id's order in the new home, and the final
/// replay of the lost key is refused for good; retrying it failed the read).
fn transient(status: u16, body: &str) -> bool {
    match status {
        409 => problem_slug(body).is_none_or(|slug| slug == "request-in-progress"),
        421 | 429 => true,
        status => status >= 500,
    }
}

/// The last path segment of a problem+json body's `type`.
fn problem_slug(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let kind = value.get("type")?.as_str()?;
    kind.rsplit('/').next().map(str::to_owned)
}

impl Reader {
    fn origin(&self, turn: usize) -> &str {
        &self.target.regions[turn % self.target.regions.len()].1
    }

    fn token(&self, tenant: &str) -> Result<&str, Error> {
        self.target
            .tokens
            .get(tenant)
            .map(String::as_str)
            .ok_or_else(|| Error::Target(format!("no token for tenant {tenant:?}")))
    }

    /// Sends (and re-sends while transient) one request; `None` if every
    /// attempt failed, with the last reason.
    async fn send(
        &self,
        build: impl Fn(usize) -> reqwest::RequestBuilder,
    ) -> Result<Answer, String> {
        let mut last = String::new();
        for attempt in 0..READ_ATTEMPTS_MAX {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(READ_RETRY_MS)).await;
            }
            let response = match build(attempt as usize).send().await {
                Ok(r) => r,
                Err(e) => {
                    last = format!("transport: {e}");
                    continue;
                }
            };
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let body = match response.text().await {
                Ok(b) => b,
                Err(e) => {
                    last = format!("body: {e}");
                    continue;
                }
            };
            if transient(status, &body) {
                last = format!("{status}: {body}");
                continue;
            }
            return Ok(Answer {
                status,
                replayed,
                body,
            });
        }
        Err(format!("{READ_ATTEMPTS_MAX} attempts, last {last}"))
    }

    /// A GET whose 404 means absent.
    async fn get(&self, turn: usize, path: &str, query: &[(&str, &str)], token: &str) -> Read {
        let answer = self
            .send(|attempt| {
                self.http
                    .get(format!("{}{path}", self.origin(turn + attempt)))
                    .query(query)
                    .bearer_auth(token)
            })
            .await;
        match answer {
            Err(reason) => Read::Unreadable { reason },
            Ok(a) if a.status == 404 => Read::Absent,
            Ok(a) if a.status == 200 => match serde_json::from_str(&a.body) {
                Ok(body) => Read::Found { body },
                Err(e) => Read::Unreadable {
                    reason: format!("not JSON ({e}): {}", a.body),
                },
            },
            Ok(a) => Read::Unreadable {
                reason: format!("{}: {}", a.status, a.body),
            },
        }
    }
}

/// Runs `f` over `items` with at most [`READ_CONCURRENCY_MAX`] at once, results
/// in the items' order.
async fn concurrently<T, R, F, Fut>(reader: &Arc<Reader>, items: Vec<T>, f: F) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Arc<Reader>, usize, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let semaphore = Arc::new(tokio::sync::Semaphore::new(READ_CONCURRENCY_MAX));
    let f = Arc::new(f);
    let mut set = tokio::task::JoinSet::new();
    for (i, item) in items.into_iter().enumerate() {
        let (semaphore, f, reader) = (semaphore.clone(), f.clone(), reader.clone());
        set.spawn(async move {
            let _permit = semaphore.acquire_owned().await.expect("never closed");
            (i, f(reader, i, item).await)
        });
    }
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        out.push(joined.expect("a read does not panic"));
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

async fn by_client_order_id(
    reader: &Arc<Reader>,
    coids: &[(String, String)],
) -> Result<Vec<ByClientOrderId>, Error> {
    let mut items = Vec::new();
    for (tenant, coid) in coids {
        items.push((
            tenant.clone(),
            coid.clone(),
            reader.token(tenant)?.to_owned(),
        ));
    }
    Ok(concurrently(
        reader,
        items,
        |reader, i, (tenant, coid, token)| async move {
            let query = [("client_order_id", coid.as_str())];
            let read = reader.get(i, "/v1/orders", &query, &token).await;
            ByClientOrderId {
                tenant,
                client_order_id: coid,
                read,
            }
        },
    )
    .await)
}

#[derive(Deserialize)]
struct Listing<T> {
    data: Vec<T>,
}

async fn downstream(
    reader: &Arc<Reader>,
    found: &[ByClientOrderId],
) -> Result<Option<Downstream>, Error> {
    let (Some(admin), Some(psp)) = (
        reader.target.admin_token.clone(),
        reader.target.psp_url.clone(),
    ) else {
        return Ok(None);
    };
    let charges = reader
        .send(|_| reader.http.get(format!("{psp}/v1/charges")))
        .await
        .map_err(|e| Error::Read(format!("charges: {e}")))?;
    let charges: Listing<Charge> = serde_json::from_str(&charges.body)
        .map_err(|e| Error::Read(format!("charges are not a listing: {e}")))?;
    let ids: Vec<String> = found
        .iter()
        .filter_map(|l| match &l.read {
            Read::Found { body } => body["order_id"].as_str().map(str::to_owned),
            _ => None,
        })
        .collect();
    let reads = concurrently(reader, ids, move |reader, i, id| {
        let admin = admin.clone();
        async move {
            let path = "/admin/v1/inventory/reservations";
            let read = reader
                .get(i, path, &[("order_id", id.as_str())], &admin)
                .await;
            (id, read)
        }
    })
    .await;
    let mut reservations = Vec::new();
    for (id, read) in reads {
        let Read::Found { body } = read else {
            return Err(Error::Read(format!("reservations of {id}: {read:?}")));
        };
        let listing: Listing<Reservation> = serde_json::from_value(body)
            .map_err(|e| Error::Read(format!("reservations of {id}: {e}")))?;
        reservations.extend(listing.data);
    }
    Ok(Some(Downstream {
        charges: charges.data,
        reservations,
    }))
}

/// What the history sent that the final state is read for.
#[derive(Default)]
struct Sent {
    /// Every (tenant, client_order_id) an order was created with.
    coids: BTreeSet<(String, String)>,
    /// Every (tenant, order id) an answer named.
    acked_ids: BTreeSet<(String, String)>,
    /// (tenant, key) → the body of its first acknowledged request.
    acked_keys: BTreeMap<(String, String), String>,
    /// (tenant, operation, key) → (fingerprint, lease) of a claim with an
    /// acknowledged final completion.
    claims: BTreeMap<(String, String, String), (String, u64)>,
    /// The (tenant, operation, key) of the claims acknowledged as finally
    /// completed.
    completed: BTreeSet<(String, String, String)>,
}

/// Reads the final state for `history`.
pub async fn read(
    target: &Target,
    history: &History,
    options: ReadOptions,
) -> Result<FinalState, Error> {
    if target.regions.is_empty() {
        return Err(Error::Target("no region to read from".into()));
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(READ_TIMEOUT_MS))
        .build()?;
    let reader = Arc::new(Reader {
        http,
        target: target.clone(),
    });
    let sent = sent(history);
    let coids: Vec<(String, String)> = sent.coids.into_iter().collect();
    // Downstream work settles in the background: read until it has, or time is up.
    let deadline = Instant::now() + options.settle_wait;
    let mut state = FinalState::default();
    loop {
        state.by_client_order_id = by_client_order_id(&reader, &coids).await?;
        state.downstream = downstream(&reader, &state.by_client_order_id).await?;
        if downstream_pending(history, &state) == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    }
    state.by_order_id = by_order_id(&reader, sent.acked_ids).await?;
    state.order_replays = order_replays(&reader, sent.acked_keys).await?;
    state.claim_replays = claim_replays(&reader, sent.claims, &sent.completed).await?;
    Ok(state)
}

/// What `history` sent and had acknowledged, to read back.
fn sent(history: &History) -> Sent {
    let mut sent = Sent::default();
    for op in &history.ops {
        match &op.request {
            Request::CreateOrder {
                key,
                client_order_id,
                body,
                ..
            } => {
                sent.coids
                    .insert((op.tenant.clone(), client_order_id.clone()));
                if let Outcome::Ok { status: 201, .. } = op.outcome {
                    sent.acked_keys
                        .entry((op.tenant.clone(), key.clone()))
                        .or_insert_with(|| body.clone());
                }
                if let Some(id) = op.outcome.json().and_then(|j| {
                    j.get("order_id")
                        .and_then(|v| v.as_str())
                        .map(str::to_owned)
                }) {
                    sent.acked_ids.insert((op.tenant.clone(), id));
                }
            }
            Request::Claim {
                operation,
                key,
                fingerprint,
                lease_ms,
            } => {
                sent.claims
                    .entry((op.tenant.clone(), operation.clone(), key.clone()))
                    .or_insert_with(|| (fingerprint.clone(), *lease_ms));
            }
            Request::CompleteClaim {
                operation,
                key,
                outcome,
                ..
            } => {
                let is_final = outcome == "SUCCEEDED" || outcome == "FAILED_FINAL";
                if is_final && matches!(op.outcome, Outcome::Ok { status: 200, .. }) {
                    sent.completed
                        .insert((op.tenant.clone(), operation.clone(), key.clone()));
                }
            }
            // Reads name orders the history acknowledged elsewhere.
            Request::ReadOrder { .. } => {}
        }
    }
    sent
}

/// Reads every acknowledged order by its id.
async fn by_order_id(
    reader: &Arc<Reader>,
    acked_ids: BTreeSet<(String, String)>,
) -> Result<Vec<ByOrderId>, Error> {
    let mut items = Vec::new();
    for (tenant, id) in acked_ids {
        let token = reader.token(&tenant)?.to_owned();
        items.push((tenant, id, token));
    }
    Ok(
        concurrently(reader, items, |reader, i, (tenant, id, token)| async move {
            let read = if path_safe(&id) {
                reader
                    .get(i, &format!("/v1/orders/{id}"), &[], &token)
                    .await
            } else {
                Read::Unreadable {
                    reason: format!("order id {id:?} is not one the server makes"),
                }
            };
            ByOrderId {
                tenant,
                order_id: id,
                read,
            }
        })
        .await,
    )
}

/// Sends every acknowledged key's first body once more.
async fn order_replays(
    reader: &Arc<Reader>,
    acked_keys: BTreeMap<(String, String), String>,
) -> Result<Vec<OrderReplay>, Error> {
    let mut items = Vec::new();
    for ((tenant, key), body) in acked_keys {
        let token = reader.token(&tenant)?.to_owned();
        items.push((tenant, key, body, token));
    }
    let replays = concurrently(
        reader,
        items,
        |reader, i, (tenant, key, body, token)| async move {
            let answer = reader
                .send(|attempt| {
                    reader
                        .http
                        .post(format!("{}/v1/orders", reader.origin(i + attempt)))
                        .bearer_auth(&token)
                        .header("idempotency-key", &key)
                        .header("content-type", "application/json")
                        .body(body.clone())
                })
                .await;
            (tenant, key, answer)
        },
    )
    .await;
    let mut order_replays = Vec::new();
    for (tenant, key, answer) in replays {
        let answer = answer.map_err(|e| Error::Read(format!("replay of key {key:?}: {e}")))?;
        order_replays.push(OrderReplay {
            tenant,
            key,
            status: answer.status,
            replayed: answer.replayed,
            body: answer.body,
        });
    }
    Ok(order_replays)
}

/// Claims every finally completed claim once more, as first claimed.
async fn claim_replays(
    reader: &Arc<Reader>,
    claims: BTreeMap<(String, String, String), (String, u64)>,
    completed: &BTreeSet<(String, String, String)>,
) -> Result<Vec<ClaimReplay>, Error> {
    let mut items = Vec::new();
    for (scope, (fingerprint, lease_ms)) in claims {
        if completed.contains(&scope) {
            let token = reader.token(&scope.0)?.to_owned();
            items.push((scope, fingerprint, lease_ms, token));
        }
    }
    let claim_replays = concurrently(
        reader,
        items,
        |reader, i, ((tenant, operation, key), fingerprint, lease_ms, token)| async move {
            let body = serde_json::json!({
                "operation": operation, "key": key, "fingerprint": fingerprint,
                "lease_ms": lease_ms,
            })
            .to_string();
            let answer = reader
                .send(|attempt| {
                    reader
                        .http
                        .post(format!("{}/v1/claims", reader.origin(i + attempt)))
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(body.clone())
                })
                .await;
            (tenant, operation, key, answer)
        },
    )
    .await;
    let mut replays = Vec::new();
    for (tenant, operation, key, answer) in claim_replays {
        let answer = answer.map_err(|e| Error::Read(format!("claim {key:?}: {e}")))?;
        replays.push(ClaimReplay {
            tenant,
            operation,
            key,
            status: answer.status,
            body: serde_json::from_str(&answer.body).unwrap_or(serde_json::Value::Null),
        });
    }
    Ok(replays)
}

#[cfg(test)]
mod tests {
    use super::transient;

    #[test]
    fn a_409_is_retried_only_while_the_request_is_in_progress() {
        let problem = |slug: &str| {
            format!(r#"{{"type":"https://keyhold.dev/problems/{slug}","status":409}}"#)
        };
        assert!(transient(409, &problem("request-in-progress")));
        assert!(!transient(409, &problem("client-order-id-conflict")));
        // A 409 without a problem body says nothing final: retried.
        assert!(transient(409, "not json"));
        assert!(transient(503, &problem("owner-unreachable")));
        assert!(transient(421, ""));
        assert!(!transient(422, &problem("idempotency-key-reused")));
        assert!(!transient(404, ""));
    }
}
