//! The region lease: a node executes tenant requests only while its last contact
//! with a majority of the registry is younger than `REGION_LEASE_MS`. A region cut
//! off from the registry (isolated, or holding only a minority of its voters)
//! stops acknowledging on its own within that bound, so that a failover which
//! waits out the lease never has two regions executing for one tenant.
//!
//! Contact is measured, not assumed. Every `REGISTRY_CONTACT_PROBE_MS` the
//! registry's leader confirms that it still leads (`ensure_linearizable`: a
//! heartbeat round a quorum must acknowledge) and counts its contact from the
//! moment it asked; every other node asks the leader how old the leader's own
//! contact is and counts its contact from the moment it sent that question,
//! minus that age. A leader cut off from its quorum confirms nothing, and a node
//! that cannot reach any leader learns nothing: both leases expire.
//!
//! Two more rules make a failover safe. A region being failed over is fenced:
//! the leader refuses its nodes' probes and a leader in it counts no contact
//! of its own, so it stops within one lease of the fence's commit, which is
//! what the failover waits out. And a contact counts only once this node's
//! registry replica has applied what the leader had applied when it answered:
//! a region coming back from isolation must not execute on a replica that
//! has not seen its tenants re-homed.

use crate::limits::{REGION_LEASE_MS, REGISTRY_CONTACT_PROBE_MS, REGISTRY_CONTACT_TIMEOUT_MS};
use crate::node::Node;
use keyhold_registry::NODE_CREDENTIAL_HEADER;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// When this node last had contact with a registry majority.
#[derive(Debug, Default)]
pub struct Lease {
    contact: Mutex<Option<Instant>>,
    /// Woken whenever a contact is recorded.
    renewed: tokio::sync::Notify,
}

impl Lease {
    /// True if the lease holds now or is renewed within `wait`: a node that just
    /// started (no contact yet) or whose lease lapsed a moment ago answers once
    /// its next probe succeeds, instead of refusing at once.
    pub async fn holds_within(&self, wait: Duration) -> bool {
        // The common case first, without arming a waiter on every request.
        if self.holds() {
            return true;
        }
        let renewed = self.renewed.notified();
        // A renewal between the check and arming the waiter is seen here.
        if self.holds() {
            return true;
        }
        let _ = tokio::time::timeout(wait, renewed).await;
        self.holds()
    }

    /// True while the last contact is younger than the lease.
    pub fn holds(&self) -> bool {
        self.age()
            .is_some_and(|age| age < Duration::from_millis(REGION_LEASE_MS))
    }

    /// How long ago the last contact was; `None` before the first.
    pub fn age(&self) -> Option<Duration> {
        self.contact
            .lock()
            .expect("not poisoned")
            .map(|at| at.elapsed())
    }

    /// Records a contact at `at`; an older one than known changes nothing.
    fn record(&self, at: Instant) {
        let mut contact = self.contact.lock().expect("not poisoned");
        if contact.is_none_or(|known| at > known) {
            *contact = Some(at);
        }
        drop(contact);
        self.renewed.notify_waiters();
    }
}

/// The registry leader's answer to a contact probe.
#[derive(Debug, Serialize, Deserialize)]
pub struct QuorumAge {
    /// Milliseconds since a quorum of the registry last confirmed the leader.
    pub millis_since_quorum_ack: u64,
    /// The leader's applied registry index when it answered: the asker counts
    /// the contact once its own replica has applied it. (Absent from leaders
    /// of before failover: 0, no wait.)
    #[serde(default)]
    pub registry_index: u64,
}

/// Why the registry leader gives no contact to a prober.
#[derive(Debug, PartialEq, Eq)]
pub enum NoContact {
    /// This node does not lead the registry (or has no contact itself).
    NotLeader,
    /// The prober's region is being failed over: it must stop executing.
    Fenced { operation_id: String },
}

/// On the registry leader: the age of its own contact, for a prober of
/// `region` (when the prober named it).
pub fn quorum_age(node: &Node, region: Option<&str>) -> Result<QuorumAge, NoContact> {
    if !leads_registry(node) {
        return Err(NoContact::NotLeader);
    }
    if let Some(operation_id) = region.and_then(|r| fenced(node, r)) {
        return Err(NoContact::Fenced { operation_id });
    }
    let age = node.lease().age().ok_or(NoContact::NotLeader)?;
    Ok(QuorumAge {
        millis_since_quorum_ack: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
        registry_index: node.registry().applied_index(),
    })
}

/// The running failover that fences `region`, by this node's replica.
fn fenced(node: &Node, region: &str) -> Option<String> {
    node.registry().read(|state| {
        state
            .failover_running_from(region)
            .map(|op| op.operation_id.clone())
    })
}

fn leads_registry(node: &Node) -> bool {
    node.registry().leader() == Some(node.registry().id())
}

/// Renews the lease until `stop`: every `REGISTRY_CONTACT_PROBE_MS`, from the
/// local registry replica when this node leads it, else by asking the leader.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let mut ticker = crate::Ticker::new(Duration::from_millis(REGISTRY_CONTACT_PROBE_MS), stop);
    while ticker.tick().await {
        if let Some(at) = probe(&node).await {
            node.lease().record(at);
        }
        if let Some(age) = node.lease().age() {
            metrics::gauge!("keyhold_registry_contact_age_seconds").set(age.as_secs_f64());
        }
    }
}

/// One contact probe: the instant of the last quorum acknowledgement it proves.
async fn probe(node: &Node) -> Option<Instant> {
    let sent = Instant::now();
    let wait = Duration::from_millis(REGISTRY_CONTACT_TIMEOUT_MS);
    if fenced(node, node.region()).is_some() {
        return None;
    }
    if leads_registry(node) {
        let confirmed = tokio::time::timeout(wait, node.registry().raft().ensure_linearizable());
        return matches!(confirmed.await, Ok(Ok(_))).then_some(sent);
    }
    let leader = node.registry().leader()?;
    let info = node.registry().nodes().get(&leader)?.clone();
    let answer = node
        .http()
        .get(format!(
            "http://{}/internal/v1/registry/quorum-age?region={}",
            info.api_addr,
            node.region()
        ))
        .header(NODE_CREDENTIAL_HEADER, node.credentials().current())
        .timeout(wait)
        .send()
        .await
        .ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let age: QuorumAge = answer.json().await.ok()?;
    // Counted only with a replica at least as new as the leader's answer, and
    // only if that replica does not show this region fenced by then.
    let left = wait.saturating_sub(sent.elapsed());
    node.registry()
        .wait_applied(age.registry_index, left)
        .await
        .ok()?;
    if fenced(node, node.region()).is_some() {
        return None;
    }
    sent.checked_sub(Duration::from_millis(age.millis_since_quorum_ack))
}
