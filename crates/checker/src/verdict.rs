//! The verdict: a small JSON document (kind and detail of every violation, with
//! the ops that show it) and a readable summary of the same.

use crate::limits::SUMMARY_VIOLATIONS_PER_KIND_MAX;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What went wrong. Each kind is a promise of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An acknowledged order (or claim completion) is gone.
    AckedMissing,
    /// An acknowledged order reads back with other fields.
    AckedChanged,
    /// Two orders for one client_order_id, or one key executed twice.
    Duplicate,
    /// A replay differs from the first answer.
    ReplayDiffers,
    /// An answer the contract rules out given the history (a changed request
    /// replayed, a same request refused as changed).
    WrongAnswer,
    /// An order with other than one charge.
    ChargeCount,
    /// A charge that contradicts its order (amount, or PAID vs declined).
    ChargeMismatch,
    /// An order whose reservations are not one per item line.
    ReservationCount,
    /// A claim completed by an owner whose lease had been taken over.
    FencedOwnerCompleted,
    /// Downstream work never finished (an order still CONFIRMED).
    Unsettled,
    /// The final state could not be read.
    Unreadable,
    /// A read during the run answered an order acknowledged before it was
    /// sent with 404 or with another order (a node answering from state it
    /// cannot show is current: review N2), and the order is no allowed loss.
    StaleRead,
    /// An acknowledged order a failover lost, listed among the orphans, but
    /// acknowledged after the cut plus `max_standby_lag`, or lost orders
    /// spanning more than the failover's `estimated_lost.seconds`.
    LossBeyondBound,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::AckedMissing => "acked_missing",
            Kind::AckedChanged => "acked_changed",
            Kind::Duplicate => "duplicate",
            Kind::ReplayDiffers => "replay_differs",
            Kind::WrongAnswer => "wrong_answer",
            Kind::ChargeCount => "charge_count",
            Kind::ChargeMismatch => "charge_mismatch",
            Kind::ReservationCount => "reservation_count",
            Kind::FencedOwnerCompleted => "fenced_owner_completed",
            Kind::Unsettled => "unsettled",
            Kind::Unreadable => "unreadable",
            Kind::StaleRead => "stale_read",
            Kind::LossBeyondBound => "loss_beyond_bound",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub kind: Kind,
    pub detail: String,
    /// Ids of the ops that show it.
    pub ops: Vec<u64>,
}

/// What the history and state held.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub ops: u64,
    pub ops_ok: u64,
    pub ops_fail: u64,
    pub ops_unknown: u64,
    pub order_keys: u64,
    pub orders_acked: u64,
    pub orders_found: u64,
    pub order_replays_checked: u64,
    pub claim_scopes: u64,
    pub charges_checked: u64,
    pub reservations_checked: u64,
    /// Whether charges and reservations were read and checked.
    pub downstream_checked: bool,
    /// Reads during the run (200 or 404 answers) judged against the history.
    #[serde(default)]
    pub reads_checked: u64,
    /// Acknowledged orders missing at the end, and of them those excused as a
    /// failover's loss (an orphan, acknowledged within the bound).
    #[serde(default)]
    pub orders_lost: u64,
    #[serde(default)]
    pub orders_lost_allowed: u64,
    /// Acknowledged claim completions lost and excused the same way.
    #[serde(default)]
    pub claims_lost_allowed: u64,
}

impl LossReport {
    /// One line for people (the verdict's summary, `keyhold chaos`'s seed line).
    pub fn line(&self) -> String {
        format!(
            "failover {} -> {}: {} acknowledged orders lost ({} listed as orphans, {} orphans \
             listed), newest sent {} ms after the cut (bound {} ms), span {} ms (estimate {})",
            self.region,
            self.to,
            self.orders_lost,
            self.orders_lost_orphaned,
            self.orphans_listed
                .map_or("no report".to_owned(), |n| n.to_string()),
            self.newest_lost_after_cut_ms,
            self.bound_ms - self.cut_ms,
            self.lost_span_ms,
            self.estimated_lost_ms
                .map_or("none".to_owned(), |ms| format!("{ms} ms")),
        )
    }
}

/// One failover's loss against its bounds, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossReport {
    pub region: String,
    pub to: String,
    /// History ms of the cut, and the latest acknowledgement a loss may have:
    /// `cut_ms + max_standby_lag`.
    pub cut_ms: u64,
    pub bound_ms: u64,
    /// Acknowledged orders of the failed region's tenants that are gone, and
    /// of them those the reconciliation listed as orphans.
    pub orders_lost: u64,
    pub orders_lost_orphaned: u64,
    /// Orphans the reconciliation listed (orders and claims); `None`: it never
    /// reported `done`.
    pub orphans_listed: Option<u64>,
    /// How long after the cut the newest lost order's acknowledgement was
    /// sent at the latest (0 when it was sent before the cut).
    pub newest_lost_after_cut_ms: u64,
    /// The span of the lost orders' acknowledgements as the clients saw them
    /// (first sent to last answered), and the failover's estimate.
    pub lost_span_ms: u64,
    pub estimated_lost_ms: Option<u64>,
    pub estimated_lost_commands: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ok: bool,
    pub stats: Stats,
    /// Per kind, how many.
    pub counts: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
    /// Per failover of the run, its loss against its bounds.
    #[serde(default)]
    pub losses: Vec<LossReport>,
}

impl Verdict {
    pub fn new(stats: Stats, mut violations: Vec<Violation>) -> Verdict {
        violations.sort_by(|a, b| (a.kind, &a.ops).cmp(&(b.kind, &b.ops)));
        let mut counts = BTreeMap::new();
        for v in &violations {
            *counts.entry(v.kind.name().to_owned()).or_insert(0) += 1;
        }
        Verdict {
            ok: violations.is_empty(),
            stats,
            counts,
            violations,
            losses: Vec::new(),
        }
    }

    pub fn has(&self, kind: Kind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    /// A few lines for people: the figures, then violations grouped by kind.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let mut out = format!(
            "checker: {} — {} ops ({} answered, {} failed, {} unknown), {} keys, \
             {} orders acknowledged, {} found, {} replays checked, {} reads checked, \
             {} claim scopes, {}",
            if self.ok { "OK" } else { "VIOLATIONS" },
            s.ops,
            s.ops_ok,
            s.ops_fail,
            s.ops_unknown,
            s.order_keys,
            s.orders_acked,
            s.orders_found,
            s.order_replays_checked,
            s.reads_checked,
            s.claim_scopes,
            if s.downstream_checked {
                format!(
                    "{} charges and {} reservations checked",
                    s.charges_checked, s.reservations_checked
                )
            } else {
                "downstream not checked".to_owned()
            },
        );
        for l in &self.losses {
            let _ = write!(out, "\n  {}", l.line());
        }
        let mut shown: BTreeMap<Kind, usize> = BTreeMap::new();
        for v in &self.violations {
            let n = shown.entry(v.kind).or_insert(0);
            *n += 1;
            if *n <= SUMMARY_VIOLATIONS_PER_KIND_MAX {
                let _ = write!(out, "\n  {}: {} (ops {:?})", v.kind.name(), v.detail, v.ops);
            }
        }
        for (kind, n) in shown {
            if n > SUMMARY_VIOLATIONS_PER_KIND_MAX {
                let _ = write!(
                    out,
                    "\n  {}: {} more",
                    kind.name(),
                    n - SUMMARY_VIOLATIONS_PER_KIND_MAX
                );
            }
        }
        out
    }
}
