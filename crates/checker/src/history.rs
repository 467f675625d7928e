//! The history format: every request a client made and what became of it, one
//! [`Op`] per request, with the time it was sent and the time its fate was known.
//!
//! An op's [`Outcome`] is one of three, as in Jepsen: an answer came back (`ok`,
//! with status and the exact body), the request certainly never reached a server
//! (`fail`: the connection was refused before anything was sent), or nobody knows
//! (`unknown`: a timeout or a connection lost after sending; the server may have
//! executed it). The checker treats `unknown` as "may or may not have happened".
//! Bodies are kept as the exact text sent and received, because replays must be
//! byte-identical.
//!
//! A [`Recorder`] is shared by concurrent clients; times are milliseconds since
//! the recorder was made, so a history is independent of the wall clock.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One client request and its fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique within the history, in order of invocation per recorder.
    pub id: u64,
    /// The logical client (process) that sent it.
    pub client: u32,
    pub tenant: String,
    /// The region whose node the request was sent to.
    pub region: String,
    /// Milliseconds since the history began.
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub request: Request,
    pub outcome: Outcome,
}

/// What was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// `POST /v1/orders`.
    CreateOrder {
        key: String,
        client_order_id: String,
        /// The exact body text sent.
        body: String,
        /// The `Idempotency-Fingerprint` header sent, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<String>,
    },
    /// `POST /v1/claims`.
    Claim {
        operation: String,
        key: String,
        fingerprint: String,
        lease_ms: u64,
    },
    /// `POST /v1/claims/complete`.
    CompleteClaim {
        operation: String,
        key: String,
        owner_token: String,
        /// `SUCCEEDED`, `FAILED_RETRYABLE` or `FAILED_FINAL`.
        outcome: String,
        /// The `response.body` JSON text sent.
        response_body: String,
    },
    /// `GET /v1/orders/{order_id}` (with `order_id`) or `GET
    /// /v1/orders?client_order_id=X`: a client reading back an order it saw
    /// acknowledged, while faults run. A 404 or another order is a stale read
    /// unless the order is an allowed loss of a failover.
    ReadOrder {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_order_id: Option<String>,
    },
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    /// An answer arrived.
    Ok {
        status: u16,
        /// `Idempotent-Replayed: true` was present.
        #[serde(default)]
        replayed: bool,
        /// The exact body text.
        body: String,
    },
    /// Certainly not executed: nothing reached a server.
    Fail { reason: String },
    /// May or may not have been executed.
    Unknown { reason: String },
}

impl Outcome {
    /// A 503 that may have executed all the same, so it settles nothing:
    /// `owner-unreachable` (the node that received the request could not get the
    /// home region's answer; its connection may have been cut after sending) and
    /// `standby-unreachable` (executed at the home, but its standby did not
    /// confirm it in time). docs/api.md tells clients to retry both with the
    /// same key.
    pub fn may_have_executed(&self) -> bool {
        let Some((503, body)) = self.answer() else {
            return false;
        };
        serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|j| {
                j["type"].as_str().map(|t| {
                    t.ends_with("/owner-unreachable") || t.ends_with("/standby-unreachable")
                })
            })
            .unwrap_or(false)
    }

    /// The status and body of an answer, if one arrived.
    pub fn answer(&self) -> Option<(u16, &str)> {
        match self {
            Outcome::Ok { status, body, .. } => Some((*status, body.as_str())),
            Outcome::Fail { .. } | Outcome::Unknown { .. } => None,
        }
    }

    /// The parsed JSON body of an answer (`None` without an answer or JSON).
    pub fn json(&self) -> Option<serde_json::Value> {
        self.answer()
            .and_then(|(_, body)| serde_json::from_str(body).ok())
    }
}

/// A whole run: the ops of every client.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
}

/// A request sent but not yet resolved; hand it back to [`Recorder::complete`].
#[derive(Debug)]
pub struct Pending {
    id: u64,
    client: u32,
    tenant: String,
    region: String,
    invoked_ms: u64,
    request: Request,
}

impl Pending {
    pub fn request(&self) -> &Request {
        &self.request
    }
}

/// Collects ops from concurrent clients, bounded by `ops_max`: past it, ops are
/// counted as dropped rather than growing memory without bound.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Inner>>,
    started: Instant,
    ops_max: usize,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    ops: Vec<Op>,
    dropped: u64,
}

/// Who sends a request and where.
#[derive(Debug, Clone)]
pub struct Sender<'a> {
    pub client: u32,
    pub tenant: &'a str,
    pub region: &'a str,
}

impl Recorder {
    pub fn new(ops_max: usize) -> Recorder {
        Recorder {
            inner: Arc::new(Mutex::new(Inner::default())),
            started: Instant::now(),
            ops_max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Milliseconds since the history began: faults are timed on this clock
    /// too, so the analysis can compare an acknowledgement with a cut.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Marks a request as sent now.
    pub fn invoke(&self, sender: &Sender<'_>, request: Request) -> Pending {
        let id = {
            let mut inner = self.lock();
            inner.next_id += 1;
            inner.next_id
        };
        Pending {
            id,
            client: sender.client,
            tenant: sender.tenant.to_owned(),
            region: sender.region.to_owned(),
            invoked_ms: self.now_ms(),
            request,
        }
    }

    /// Records the fate of a sent request; returns the op (as recorded).
    pub fn complete(&self, pending: Pending, outcome: Outcome) -> Op {
        let op = Op {
            id: pending.id,
            client: pending.client,
            tenant: pending.tenant,
            region: pending.region,
            invoked_ms: pending.invoked_ms,
            completed_ms: self.now_ms(),
            request: pending.request,
            outcome,
        };
        let mut inner = self.lock();
        if inner.ops.len() < self.ops_max {
            inner.ops.push(op.clone());
        } else {
            inner.dropped += 1;
        }
        op
    }

    /// Ops not kept because the bound was reached.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// The history so far, ops in order of id.
    pub fn history(&self) -> History {
        let mut ops = self.lock().ops.clone();
        ops.sort_by_key(|op| op.id);
        History { ops }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_through_json() {
        let recorder = Recorder::new(10);
        let sender = Sender {
            client: 1,
            tenant: "t",
            region: "a",
        };
        let pending = recorder.invoke(
            &sender,
            Request::CreateOrder {
                key: "k".into(),
                client_order_id: "c".into(),
                body: "{}".into(),
                fingerprint: None,
            },
        );
        recorder.complete(
            pending,
            Outcome::Unknown {
                reason: "timeout".into(),
            },
        );
        let history = recorder.history();
        let text = serde_json::to_string(&history).unwrap();
        assert!(text.contains(r#""type":"unknown""#), "{text}");
        assert_eq!(serde_json::from_str::<History>(&text).unwrap(), history);
    }

    #[test]
    fn the_recorder_keeps_its_bound() {
        let recorder = Recorder::new(1);
        let sender = Sender {
            client: 0,
            tenant: "t",
            region: "a",
        };
        for _ in 0..3 {
            let p = recorder.invoke(
                &sender,
                Request::Claim {
                    operation: "POST:/x".into(),
                    key: "k".into(),
                    fingerprint: "f".into(),
                    lease_ms: 100,
                },
            );
            recorder.complete(
                p,
                Outcome::Fail {
                    reason: "refused".into(),
                },
            );
        }
        assert_eq!(recorder.history().ops.len(), 1);
        assert_eq!(recorder.dropped(), 2);
    }
}
