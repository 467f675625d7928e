//! The HTTP client: intents, the retry loop every call goes through, orders,
//! and the turning of answers into values or typed errors.

use crate::journal::IntentJournal;
use crate::{Error, RetryPolicy};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// One thing the caller means to do once, with its key fixed at creation. Every
/// attempt, retry and resumption sends this exact key and body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    key: String,
    body: serde_json::Value,
}

impl Intent {
    /// An intent under a key the caller chose (e.g. one read back from its own
    /// storage). [`Client::intent`] draws a fresh UUID v4 instead.
    pub fn with_key(key: impl Into<String>, body: serde_json::Value) -> Intent {
        Intent {
            key: key.into(),
            body,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn body(&self) -> &serde_json::Value {
        &self.body
    }
}

/// An order as the API returns it (contract section 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub client_order_id: String,
    pub cart_id: String,
    pub amount: u64,
    pub currency: String,
    pub status: String,
    pub home_region: String,
    pub created_at: String,
}

/// An order together with how it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderReceipt {
    pub order: Order,
    /// 201 (created, or a replay of the creation) or 200 (an existing order with
    /// the same client_order_id and fingerprint).
    pub status: u16,
    /// `Idempotent-Replayed: true`: this key's first answer, stored and replayed.
    pub replayed: bool,
}

/// A success answer, read in full.
pub(crate) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Unexpected {
            status: self.status,
            detail: format!("body does not decode: {e}"),
        })
    }
}

struct Inner {
    http: reqwest::Client,
    base_url: String,
    token: String,
    policy: RetryPolicy,
    journal: Option<Arc<IntentJournal>>,
}

/// Cheap to clone; clones share one connection pool.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never printed.
        f.debug_struct("Client")
            .field("base_url", &self.inner.base_url)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the node at `base_url` (an origin such as
    /// `http://127.0.0.1:7400`) acting as the tenant whose bearer token is
    /// `token`, with the default [`RetryPolicy`].
    pub fn new(base_url: impl Into<String>, token: impl Into<String>) -> Result<Client, Error> {
        Client::build(base_url.into(), token.into(), RetryPolicy::default(), None)
    }

    fn build(
        base_url: String,
        token: String,
        policy: RetryPolicy,
        journal: Option<Arc<IntentJournal>>,
    ) -> Result<Client, Error> {
        policy.validate()?;
        let base_url = base_url.trim_end_matches('/').to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(Error::Invalid(format!(
                "base_url {base_url:?} must start with http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(policy.request_timeout_ms))
            .tcp_nodelay(true)
            .build()
            .map_err(Error::Transport)?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base_url,
                token,
                policy,
                journal,
            }),
        })
    }

    /// The same client with another retry policy.
    pub fn with_policy(self, policy: RetryPolicy) -> Result<Client, Error> {
        let i = &self.inner;
        Client::build(
            i.base_url.clone(),
            i.token.clone(),
            policy,
            i.journal.clone(),
        )
    }

    /// The same client, recording intents in `journal` before their first send
    /// and forgetting them after a final answer.
    pub fn with_journal(self, journal: Arc<IntentJournal>) -> Result<Client, Error> {
        let i = &self.inner;
        Client::build(
            i.base_url.clone(),
            i.token.clone(),
            i.policy.clone(),
            Some(journal),
        )
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }

    pub fn journal(&self) -> Option<&Arc<IntentJournal>> {
        self.inner.journal.as_ref()
    }

    /// Fixes one fresh `Idempotency-Key` (UUID v4) for what `body` describes.
    pub fn intent(&self, body: serde_json::Value) -> Intent {
        Intent::with_key(uuid::Uuid::new_v4().to_string(), body)
    }

    /// `POST /v1/orders` under the intent's key, retried per the policy.
    pub async fn create_order(&self, intent: &Intent) -> Result<Order, Error> {
        self.create_order_receipt(intent).await.map(|r| r.order)
    }

    /// Like [`Client::create_order`], also saying whether the answer was a replay.
    pub async fn create_order_receipt(&self, intent: &Intent) -> Result<OrderReceipt, Error> {
        if let Some(journal) = &self.inner.journal {
            journal.record(intent)?;
        }
        let url = format!("{}/v1/orders", self.inner.base_url);
        let result = self
            .execute(|| {
                self.inner
                    .http
                    .post(&url)
                    .header("Idempotency-Key", intent.key())
                    .json(intent.body())
            })
            .await;
        // A final answer is any answer but "gave up": after giving up nobody knows
        // whether the order exists, so the intent stays for a later resumption.
        let is_final = !matches!(result, Err(Error::GaveUp { .. }));
        let receipt = result.and_then(|answer| {
            let order: Order = answer.json()?;
            Ok(OrderReceipt {
                order,
                status: answer.status,
                replayed: answer
                    .headers
                    .get("idempotent-replayed")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")),
            })
        });
        if is_final {
            if let Some(journal) = &self.inner.journal {
                journal.remove(intent.key())?;
            }
        }
        receipt
    }

    /// Sends every intent the journal still holds (e.g. after a restart), in
    /// order, each with its own key; answers are returned beside their intents.
    pub async fn resume(&self) -> Vec<(Intent, Result<OrderReceipt, Error>)> {
        let pending = self
            .inner
            .journal
            .as_ref()
            .map(|j| j.pending())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(pending.len());
        for intent in pending {
            let result = self.create_order_receipt(&intent).await;
            out.push((intent, result));
        }
        out
    }

    /// `GET /v1/orders/{order_id}`; an unknown id is `Error::Problem` 404
    /// `not-found`.
    pub async fn get_order(&self, order_id: &str) -> Result<Order, Error> {
        let url = format!("{}/v1/orders/{order_id}", self.inner.base_url);
        self.execute(|| self.inner.http.get(&url)).await?.json()
    }

    /// `GET /v1/orders?client_order_id=`; `None` when no order has that business
    /// key.
    pub async fn find_by_client_order_id(
        &self,
        client_order_id: &str,
    ) -> Result<Option<Order>, Error> {
        let url = format!("{}/v1/orders", self.inner.base_url);
        match self
            .execute(|| {
                self.inner
                    .http
                    .get(&url)
                    .query(&[("client_order_id", client_order_id)])
            })
            .await
        {
            Ok(answer) => answer.json().map(Some),
            Err(Error::Problem { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base_url)
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// The retry loop every call goes through. `request` builds a fresh request
    /// per attempt (same key, same body); authentication is added here, on every
    /// attempt.
    pub(crate) async fn execute(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Answer, Error> {
        let policy = &self.inner.policy;
        let mut attempt = 1;
        loop {
            let error = match self.once(request()).await {
                Ok(answer) => return Ok(answer),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            if attempt >= policy.attempts_max {
                return Err(Error::GaveUp {
                    attempts: attempt,
                    last: Box::new(error),
                });
            }
            let delay = policy.delay(attempt - 1, error.retry_after());
            tracing::debug!(attempt, ?delay, %error, "retrying under the same key");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// One attempt, without retries: 2xx is an answer, anything else an error.
    pub(crate) async fn once(&self, request: reqwest::RequestBuilder) -> Result<Answer, Error> {
        let response = request
            .bearer_auth(&self.inner.token)
            .send()
            .await
            .map_err(Error::Transport)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(Error::Transport)?.to_vec();
        if (200..300).contains(&status) {
            return Ok(Answer {
                status,
                headers,
                body,
            });
        }
        Err(problem(status, &headers, &body))
    }
}

#[derive(Deserialize)]
struct ProblemBody {
    #[serde(rename = "type", default)]
    type_uri: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: Option<String>,
}

/// An error answer as `Error::Problem`; a body that is not problem+json (a
/// proxy's HTML page) keeps the status with an empty slug.
fn problem(status: u16, headers: &HeaderMap, body: &[u8]) -> Error {
    let parsed: Option<ProblemBody> = serde_json::from_slice(body).ok();
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    match parsed {
        Some(p) => Error::Problem {
            status,
            slug: p.type_uri.rsplit('/').next().unwrap_or_default().to_owned(),
            title: p.title,
            detail: p.detail,
            retry_after,
        },
        None => Error::Problem {
            status,
            slug: String::new(),
            title: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            detail: None,
            retry_after,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_bodies_become_typed_errors() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "2".parse().unwrap());
        let body = br#"{"type":"https://keyhold.dev/problems/store-unavailable","title":"Store unavailable","status":503,"detail":"flush failed"}"#;
        match problem(503, &headers, body) {
            Error::Problem {
                status,
                slug,
                title,
                detail,
                retry_after,
            } => {
                assert_eq!(status, 503);
                assert_eq!(slug, "store-unavailable");
                assert_eq!(title, "Store unavailable");
                assert_eq!(detail.as_deref(), Some("flush failed"));
                assert_eq!(retry_after, Some(Duration::from_secs(2)));
            }
            other => panic!("{other:?}"),
        }
        let html = problem(503, &HeaderMap::new(), b"<html>bad gateway</html>");
        assert_eq!(html.slug(), Some(""));
        assert!(html.is_retryable());
    }

    #[test]
    fn intents_keep_their_key() {
        let client = Client::new("http://127.0.0.1:1", "t").unwrap();
        let a = client.intent(serde_json::json!({"x": 1}));
        let b = client.intent(serde_json::json!({"x": 1}));
        assert_ne!(a.key(), b.key());
        assert_eq!(uuid::Uuid::parse_str(a.key()).unwrap().get_version_num(), 4);
        assert!(Client::new("127.0.0.1:1", "t").is_err());
    }
}
