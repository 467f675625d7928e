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
//!
//! How much longer a fenced region's lease can hold is known to the
//! registry's leader, which is the only node that hands contacts out: it
//! notes, per prober region, the newest contact it handed (before it reads the
//! fence, so a handout that passed the fence check is noted before the fence
//! was applied), and once the fence is applied it hands that region nothing
//! more. A contact an earlier leader handed was proved by a quorum that had
//! handled that leader's heartbeat, and a quorum holds a node outside the
//! fenced region (unless the region holds a majority of the registry's
//! voters): so it is older than the latest moment any voter outside the
//! region handled an earlier term's AppendEntries or proved a contact as an
//! earlier leader (`heard_before`, asked of each), and older than this
//! leader's own election. A fenced region's lease therefore ends at most
//! `REGION_LEASE_MS` after the latest of these (`lease_end`): a killed or cut
//! off region, even one whose node led the registry, is failed over one lease
//! after it last had contact, not one lease after the failover began.

use crate::limits::{REGION_LEASE_MS, REGISTRY_CONTACT_PROBE_MS, REGISTRY_CONTACT_TIMEOUT_MS};
use crate::node::Node;
use crate::peers::{Call, CallKind, To};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
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
    /// What this node handed out while it led the registry.
    handed: Mutex<Handed>,
    /// Woken whenever a contact is recorded.
    renewed: tokio::sync::Notify,
}

/// The contacts a registry leader handed out, for the bound on a fenced
/// region's lease (`lease_end`).
#[derive(Debug, Default)]
struct Handed {
    /// The term this node leads and when it first saw itself lead it, which
    /// is later than every contact an earlier leader handed.
    led: Option<(u64, Instant)>,
    /// Per prober region, the newest contact handed to one of its nodes (this
    /// node's own lease included).
    regions: HashMap<String, Instant>,
    /// A prober that did not name its region (a node of an earlier release)
    /// was handed a contact: no fence stops those, so no bound is known.
    unnamed: bool,
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

    /// When this node proved a contact as the registry's leader of `term`;
    /// `None` if it proved none in that term.
    fn proven_at(&self, term: u64) -> Option<Instant> {
        let proven = *self.proven.lock().expect("not poisoned");
        proven
            .filter(|proven| proven.term == term)
            .map(|proven| proven.at)
    }

    /// Notes that this node leads the registry in `term` (from now on, if it
    /// did not know it yet).
    fn note_leading(&self, term: u64, now: Instant) {
        let mut handed = self.handed.lock().expect("not poisoned");
        if handed.led.is_none_or(|(known, _)| known != term) {
            handed.led = Some((term, now));
        }
    }

    /// Notes a contact at `at` handed to a prober of `region` (`None`: it did
    /// not say). Called before the fence is read.
    fn note_handed(&self, region: Option<&str>, at: Instant) {
        let mut handed = self.handed.lock().expect("not poisoned");
        let Some(region) = region else {
            handed.unnamed = true;
            return;
        };
        let newest = handed.regions.entry(region.to_owned()).or_insert(at);
        *newest = (*newest).max(at);
    }

    /// What this node knows, as the leader of `term`, of the contacts handed
    /// to `region`: the newest it handed itself (any term), and since when it
    /// leads `term` (if it knows); `None` if it handed a contact to a prober
    /// that named no region.
    fn handed_to(&self, region: &str, term: u64) -> Option<HandedTo> {
        let handed = self.handed.lock().expect("not poisoned");
        if handed.unnamed {
            return None;
        }
        Some(HandedTo {
            newest: handed.regions.get(region).copied(),
            led_since: handed
                .led
                .filter(|(led, _)| *led == term)
                .map(|(_, since)| since),
        })
    }

    /// The contact this node proved as the registry's leader of a term before
    /// `term`, if its last proof was of one.
    fn proven_before(&self, term: u64) -> Option<Instant> {
        let proven = *self.proven.lock().expect("not poisoned");
        proven.filter(|p| p.term < term).map(|p| p.at)
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

/// `Lease::handed_to`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HandedTo {
    newest: Option<Instant>,
    led_since: Option<Instant>,
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
    let at = node
        .lease()
        .proven_at(metrics.current_term)
        .ok_or(NoContact::NotLeader)?;
    // Noted before the fence is read: see the module's comment.
    node.lease().note_handed(region, at);
    if let Some(operation_id) = region.and_then(|r| fenced(node, r)) {
        return Err(NoContact::Fenced { operation_id });
    }
    Ok(QuorumAge {
        millis_since_quorum_ack: u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
        registry_index: node.registry().applied_index(),
    })
}

/// The registry leader's answer to `GET /internal/v1/registry/lease-end`.
#[derive(Debug, Serialize, Deserialize)]
pub struct LeaseEnd {
    /// At most how much longer, from the answer, a lease of the fenced region
    /// may hold (0: it ended).
    pub holds_ms_max: u64,
}

/// Why the registry leader knows no end of a region's lease.
#[derive(Debug, PartialEq, Eq)]
pub enum NoLeaseEnd {
    /// This node does not lead the registry, or cannot bound what earlier
    /// leaders handed out yet (it does not know since when it leads, and a
    /// voter outside the region did not answer).
    NotLeader,
    /// The region is not fenced (no failover of it runs, by this replica): it
    /// may still renew its lease.
    NotFenced,
    /// A node that did not name its region was handed a contact: its lease is
    /// bounded only from the fence's commit.
    Unknown,
}

/// On the registry leader: at most how much longer a lease of `region`, which
/// a running failover fences, may hold (see the module's comment).
pub async fn lease_end(node: &Node, region: &str) -> Result<LeaseEnd, NoLeaseEnd> {
    let metrics = node.registry().metrics();
    if metrics.current_leader != Some(node.registry().id()) {
        return Err(NoLeaseEnd::NotLeader);
    }
    let term = metrics.current_term;
    // The fence first: from its apply on, no prober of the region is handed
    // anything, so what is read below is all there is.
    if fenced(node, region).is_none() {
        return Err(NoLeaseEnd::NotFenced);
    }
    let earlier_by_voters = earlier_leaders_bound(node, region, &metrics).await;
    let handed = node
        .lease()
        .handed_to(region, term)
        .ok_or(NoLeaseEnd::Unknown)?;
    // Both bound what earlier leaders handed out; the earlier one serves.
    let earlier = match (earlier_by_voters, handed.led_since) {
        (Some(voters), Some(led)) => voters.min(led),
        (Some(bound), None) | (None, Some(bound)) => bound,
        (None, None) => return Err(NoLeaseEnd::NotLeader),
    };
    let newest = handed.newest.map_or(earlier, |own| own.max(earlier));
    let ends = newest + Duration::from_millis(REGION_LEASE_MS);
    let left = ends.saturating_duration_since(Instant::now());
    Ok(LeaseEnd {
        holds_ms_max: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
    })
}

/// This node's part of the bound on what leaders before `term` handed out:
/// the latest moment it handled one of their AppendEntries or proved a
/// contact as one of them (`GET /internal/v1/registry/heard`).
pub fn heard_before(node: &Node, term: u64) -> Instant {
    let handled = node.registry().heard().handled_before(term);
    node.lease()
        .proven_before(term)
        .map_or(handled, |proven| proven.max(handled))
}

/// `GET /internal/v1/registry/heard`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Heard {
    /// How long before the answer `heard_before` was.
    pub ms_ago: u64,
}

/// The latest moment any registry voter outside `region` (this node
/// included) handled an earlier leader's AppendEntries or proved a contact as
/// one (`heard_before`); `None` unless every one of them answered, or if the
/// region holds a majority of the voters (a quorum may then lie inside it).
async fn earlier_leaders_bound(
    node: &Node,
    region: &str,
    metrics: &keyhold_registry::RaftMetrics,
) -> Option<Instant> {
    let term = metrics.current_term;
    let members = node.registry().nodes();
    let voters: Vec<u64> = metrics.membership_config.membership().voter_ids().collect();
    let inside = voters
        .iter()
        .filter(|id| members.get(id).is_none_or(|info| info.region == region))
        .count();
    // A majority inside: a quorum may lie wholly within the region.
    if inside > voters.len() / 2 {
        return None;
    }
    let me = node.registry().id();
    let call = Call::get(
        CallKind::LeaseEnd,
        format!("/internal/v1/registry/heard?before_term={term}"),
    );
    let asks = voters
        .iter()
        .filter(|id| **id != me)
        .filter_map(|id| members.get(id))
        .filter(|info| info.region != region)
        .map(|info| {
            let call = &call;
            async move {
                let heard: Heard = node
                    .peers()
                    .call_json(To::Node(&info.api_addr), call)
                    .await
                    .ok()?;
                // From the answer's arrival: later than the voter's reckoning.
                Instant::now().checked_sub(Duration::from_millis(heard.ms_ago))
            }
        });
    let answers = futures::future::join_all(asks).await;
    answers
        .into_iter()
        .try_fold(heard_before(node, term), |newest, answer| {
            answer.map(|at| at.max(newest))
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
        node.lease()
            .note_leading(metrics.current_term, Instant::now());
        // This node's own lease is a handout to its region like any other.
        node.lease().note_handed(Some(node.region()), sent);
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
    let leader = node.registry_leader_api()?;
    let call = Call::get(
        CallKind::QuorumAge,
        format!("/internal/v1/registry/quorum-age?region={}", node.region()),
    );
    let age: QuorumAge = node
        .peers()
        .call_json(To::Node(&leader), &call)
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

#[cfg(test)]
mod tests {
    use super::{HandedTo, Lease};
    use std::time::{Duration, Instant};

    #[test]
    fn a_leader_knows_the_newest_contact_it_handed_each_region_and_since_when_it_leads() {
        let lease = Lease::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let handed = |region, term| lease.handed_to(region, term).expect("named probers");
        assert_eq!(
            handed("a", 3),
            HandedTo {
                newest: None,
                led_since: None
            }
        );
        lease.note_handed(Some("a"), at(100));
        lease.note_leading(3, at(50));
        assert_eq!(
            handed("a", 3),
            HandedTo {
                newest: Some(at(100)),
                led_since: Some(at(50))
            }
        );
        // An older handout changes nothing; another region's is its own.
        lease.note_handed(Some("a"), at(80));
        lease.note_handed(Some("b"), at(900));
        assert_eq!(handed("a", 3).newest, Some(at(100)));
        assert_eq!(handed("c", 3).newest, None);
        // Seeing the same term again keeps its start; another term is unknown.
        lease.note_leading(3, at(700));
        assert_eq!(handed("c", 3).led_since, Some(at(50)));
        assert_eq!(handed("a", 4).led_since, None);
        // What was handed in an earlier term still counts.
        lease.note_leading(4, at(1_000));
        assert_eq!(
            handed("a", 4),
            HandedTo {
                newest: Some(at(100)),
                led_since: Some(at(1_000))
            }
        );
    }

    #[test]
    fn a_prober_that_names_no_region_leaves_no_bound() {
        let lease = Lease::default();
        let t0 = Instant::now();
        lease.note_leading(1, t0);
        lease.note_handed(Some("a"), t0);
        assert!(lease.handed_to("a", 1).is_some());
        // No fence stops such a prober, so its lease may run from any
        // contact it is handed.
        lease.note_handed(None, t0);
        assert_eq!(lease.handed_to("a", 1), None);
    }

    #[test]
    fn only_a_proof_of_an_earlier_term_bounds_earlier_leaders() {
        let lease = Lease::default();
        let t0 = Instant::now();
        assert_eq!(lease.proven_before(5), None);
        lease.record_proven(4, t0);
        assert_eq!(lease.proven_before(5), Some(t0));
        assert_eq!(lease.proven_before(4), None);
        let later = t0 + Duration::from_millis(10);
        lease.record_proven(5, later);
        assert_eq!(lease.proven_before(6), Some(later));
    }
}
