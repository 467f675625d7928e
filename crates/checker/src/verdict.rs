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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ok: bool,
    pub stats: Stats,
    /// Per kind, how many.
    pub counts: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
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
             {} orders acknowledged, {} found, {} replays checked, {} claim scopes, {}",
            if self.ok { "OK" } else { "VIOLATIONS" },
            s.ops,
            s.ops_ok,
            s.ops_fail,
            s.ops_unknown,
            s.order_keys,
            s.orders_acked,
            s.orders_found,
            s.order_replays_checked,
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
