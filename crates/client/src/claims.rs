//! The claims API (contract section 5) and [`ClaimGuard`], which keeps the
//! lease alive from a background task while the caller works, and stops doing so
//! when the work is completed or the guard is dropped.

use crate::limits::{HEARTBEATS_PER_LEASE, LEASE_MS_MAX, LEASE_MS_MIN};
use crate::{Client, Error};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `POST /v1/claims`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRequest {
    /// `METHOD:/path-template` of the caller's own operation.
    pub operation: String,
    pub key: String,
    /// The caller's digest of the request's meaningful fields.
    pub fingerprint: String,
    pub lease_ms: u64,
}

/// A response stored at completion and replayed to later claims.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: serde_json::Value,
}

/// A completed scope, replayed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Completed {
    /// `SUCCEEDED` or `FAILED_FINAL`.
    pub state: String,
    pub response: Response,
    pub resource_id: Option<String>,
}

/// What a claim got.
#[derive(Debug)]
pub enum Claim {
    /// The caller owns the work until it completes or the lease runs out.
    Acquired(ClaimGuard),
    /// Someone completed it already: use their answer.
    Completed(Completed),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Succeeded,
    /// Lets the next claim of the scope acquire again.
    FailedRetryable,
    /// Replayed like success.
    FailedFinal,
}

/// `POST /v1/claims/complete`'s payload besides the scope and token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<Response>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<String>,
}

/// A lease as the server last confirmed it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Lease {
    pub lease_expires_at: String,
}

#[derive(Deserialize)]
struct Acquired {
    owner_token: String,
    lease_expires_at: String,
    #[serde(default)]
    recovery: bool,
}

#[derive(Deserialize)]
struct CompleteAnswer {
    state: String,
}

fn check_lease(lease_ms: u64) -> Result<(), Error> {
    if (LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "lease_ms must be from {LEASE_MS_MIN} to {LEASE_MS_MAX}"
        )))
    }
}

impl Client {
    /// Claims a scope, retrying per the policy while another owner holds it
    /// (409 `request-in-progress`) or the service is busy. On acquisition the
    /// returned guard heartbeats until [`ClaimGuard::complete`] or drop.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Claim, Error> {
        check_lease(request.lease_ms)?;
        let url = self.url("/v1/claims");
        let answer = self
            .execute(|| self.http().post(&url).json(request))
            .await?;
        if answer.status == 201 {
            let acquired: Acquired = answer.json()?;
            Ok(Claim::Acquired(ClaimGuard::start(
                self.clone(),
                request,
                acquired,
            )))
        } else {
            Ok(Claim::Completed(answer.json()?))
        }
    }

    /// Extends a lease once (no retries: a guard heartbeats again soon anyway).
    /// 409 `stale-owner-token` means the lease was taken over.
    pub async fn heartbeat(
        &self,
        operation: &str,
        key: &str,
        owner_token: &str,
        lease_ms: u64,
    ) -> Result<Lease, Error> {
        check_lease(lease_ms)?;
        let body = serde_json::json!({
            "operation": operation, "key": key, "owner_token": owner_token, "lease_ms": lease_ms,
        });
        let request = self
            .http()
            .post(self.url("/v1/claims/heartbeat"))
            .json(&body);
        self.once(request).await?.json()
    }

    /// Completes owned work, retried per the policy (completing twice with the
    /// same token is answered like the first time). Returns the stored state.
    pub async fn complete(
        &self,
        operation: &str,
        key: &str,
        owner_token: &str,
        completion: &Completion,
    ) -> Result<String, Error> {
        let mut body =
            serde_json::to_value(completion).map_err(|e| Error::Invalid(e.to_string()))?;
        body["operation"] = operation.into();
        body["key"] = key.into();
        body["owner_token"] = owner_token.into();
        let url = self.url("/v1/claims/complete");
        let answer: CompleteAnswer = self
            .execute(|| self.http().post(&url).json(&body))
            .await?
            .json()?;
        Ok(answer.state)
    }
}

/// Ownership of a claimed scope. While it lives, a background task renews the
/// lease every `lease_ms / HEARTBEATS_PER_LEASE`; completing or dropping the
/// guard stops that task, so an abandoned claim expires and can be recovered.
#[derive(Debug)]
pub struct ClaimGuard {
    client: Client,
    operation: String,
    key: String,
    owner_token: String,
    recovery: bool,
    lease: Arc<Mutex<String>>,
    lost: Arc<AtomicBool>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl ClaimGuard {
    fn start(client: Client, request: &ClaimRequest, acquired: Acquired) -> ClaimGuard {
        let lease = Arc::new(Mutex::new(acquired.lease_expires_at));
        let lost = Arc::new(AtomicBool::new(false));
        let every = Duration::from_millis(request.lease_ms / HEARTBEATS_PER_LEASE);
        let task = {
            let (client, lease, lost) = (client.clone(), lease.clone(), lost.clone());
            let (operation, key, token) = (
                request.operation.clone(),
                request.key.clone(),
                acquired.owner_token.clone(),
            );
            let lease_ms = request.lease_ms;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match client.heartbeat(&operation, &key, &token, lease_ms).await {
                        Ok(l) => {
                            *lease.lock().unwrap_or_else(|p| p.into_inner()) = l.lease_expires_at
                        }
                        Err(Error::Problem { status: 409, .. }) => {
                            // Taken over: renewing is pointless, and the caller
                            // must learn that its completion will be refused.
                            lost.store(true, Ordering::SeqCst);
                            tracing::warn!(%key, "claim lost to another owner");
                            return;
                        }
                        Err(e) => {
                            tracing::debug!(%key, error = %e, "heartbeat failed; trying again")
                        }
                    }
                }
            })
        };
        ClaimGuard {
            client,
            operation: request.operation.clone(),
            key: request.key.clone(),
            owner_token: acquired.owner_token,
            recovery: acquired.recovery,
            lease,
            lost,
            heartbeat: Some(task),
        }
    }

    pub fn owner_token(&self) -> &str {
        &self.owner_token
    }

    /// The previous owner's lease ran out: check what it may already have done
    /// before redoing it.
    pub fn recovery(&self) -> bool {
        self.recovery
    }

    /// The lease's end as last confirmed by the server (RFC 3339).
    pub fn lease_expires_at(&self) -> String {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A heartbeat was refused with `stale-owner-token`: someone else owns the
    /// scope now.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Stops heartbeating, then completes the work. Returns the stored state.
    pub async fn complete(mut self, completion: &Completion) -> Result<String, Error> {
        self.stop().await;
        self.client
            .complete(&self.operation, &self.key, &self.owner_token, completion)
            .await
    }

    async fn stop(&mut self) {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
            // Wait for the abort so no heartbeat is in flight after completion.
            let _ = task.await;
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
        }
    }
}
