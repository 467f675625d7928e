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
//! of its own (it still answers the other regions), so it stops within one
//! lease of the fence's commit, which is what the failover waits out. And a contact counts only once this node's
//! registry replica has applied what the leader had applied when it answered:
//! a region coming back from isolation must not execute on a replica that
//! has not seen its tenants re-homed.
//!
//! A leader answers probers only with a contact it proved itself in its
//! current term, and reads the fence only after that proof. A newly elected
//! leader applies its predecessor's committed entries (a `BeginFailover`
//! among them) only once its own first entry commits; before that its
//! replica may not show a fence the failover driver already waits on, and
//! the contact it holds may be one it recorded as a follower. The proof
//! (`ensure_linearizable`) returns only after the leader applied everything
//! committed before its term, so a fence committed by any earlier leader is
//! seen by then.

use crate::limits::{REGION_LEASE_MS, REGISTRY_CONTACT_PROBE_MS, REGISTRY_CONTACT_TIMEOUT_MS};
use crate::node::Node;
use crate::peers::{Call, CallKind, To};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// When this node last had contact with a registry majority.
#[derive(Debug, Default)]
pub struct Lease {
    contact: Mutex<Option<Instant>>,
    /// The last contact this node proved as the registry's leader, with the
    /// term it led in: the only contact it passes on to probers.
    proven: Mutex<Option<Proven>>,
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

    /// Records a contact at `at` that this node proved as the registry's leader
    /// of `term`, after applying everything committed before that term: what
    /// it answers probers with. Its own lease is `record`ed apart.
    fn record_proven(&self, term: u64, at: Instant) {
        let mut proven = self.proven.lock().expect("not poisoned");
        if proven.is_none_or(|known| (term, at) > (known.term, known.at)) {
            *proven = Some(Proven { term, at });
        }
    }

    /// How long ago this node proved a contact as the registry's leader of
    /// `term`; `None` if it proved none in that term.
    fn proven_age(&self, term: u64) -> Option<Duration> {
        let proven = *self.proven.lock().expect("not poisoned");
        proven
            .filter(|proven| proven.term == term)
            .map(|proven| proven.at.elapsed())
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

/// A contact proved by this node's own leadership check.
#[derive(Debug, Clone, Copy)]
struct Proven {
    term: u64,
    at: Instant,
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
    /// This node does not lead the registry, or has proved no contact in its
    /// current term yet (a new leader, before it applied its predecessor's
    /// entries).
    NotLeader,
    /// The prober's region is being failed over: it must stop executing.
    Fenced { operation_id: String },
}

/// On the registry leader: the age of the contact it proved in its current
/// term, for a prober of `region` (when the prober named it). The fence is
/// read after that proof, which applied every entry committed before the term.
pub fn quorum_age(node: &Node, region: Option<&str>) -> Result<QuorumAge, NoContact> {
    let metrics = node.registry().metrics();
    if metrics.current_leader != Some(node.registry().id()) {
        return Err(NoContact::NotLeader);
    }
    let age = node
        .lease()
        .proven_age(metrics.current_term)
        .ok_or(NoContact::NotLeader)?;
    if let Some(operation_id) = region.and_then(|r| fenced(node, r)) {
        return Err(NoContact::Fenced { operation_id });
    }
    Ok(QuorumAge {
        millis_since_quorum_ack: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
        registry_index: node.registry().applied_index(),
    })
}

/// The running failover that fences `region`, by this node's replica.
fn fenced(node: &Node, region: &str) -> Option<String> {
    crate::operations::failover_from(node.registry(), region).map(|op| op.operation_id)
}

/// Renews the lease until `stop`: every `REGISTRY_CONTACT_PROBE_MS`, from the
/// local registry replica when this node leads it, else by asking the leader.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let mut ticker = crate::Ticker::new(Duration::from_millis(REGISTRY_CONTACT_PROBE_MS), stop);
    while ticker.tick().await {
        probe(&node).await;
        if let Some(age) = node.lease().age() {
            metrics::gauge!("keyhold_registry_contact_age_seconds").set(age.as_secs_f64());
        }
    }
}

/// One contact probe: records the last quorum acknowledgement it proves.
async fn probe(node: &Node) -> Option<()> {
    let sent = Instant::now();
    let wait = Duration::from_millis(REGISTRY_CONTACT_TIMEOUT_MS);
    // Read before the check: a term that changed meanwhile only makes the
    // proof count for no term this node leads, never for a later one.
    let metrics = node.registry().metrics();
    if metrics.current_leader == Some(node.registry().id()) {
        let confirmed = tokio::time::timeout(wait, node.registry().raft().ensure_linearizable());
        if !matches!(confirmed.await, Ok(Ok(_))) {
            return None;
        }
        // Other regions' probers are answered even while this one is fenced.
        node.lease().record_proven(metrics.current_term, sent);
        // Only now does the replica show a fence committed by an earlier leader.
        if fenced(node, node.region()).is_some() {
            return None;
        }
        node.lease().record(sent);
        return Some(());
    }
    if fenced(node, node.region()).is_some() {
        return None;
    }
    let leader = node.registry().leader()?;
    let info = node.registry().nodes().get(&leader)?.clone();
    let call = Call::get(
        CallKind::QuorumAge,
        format!("/internal/v1/registry/quorum-age?region={}", node.region()),
    );
    let age: QuorumAge = node
        .peers()
        .call_json(To::Node(&info.api_addr), &call)
        .await
        .ok()?;
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
    let at = sent.checked_sub(Duration::from_millis(age.millis_since_quorum_ack))?;
    node.lease().record(at);
    Some(())
}
