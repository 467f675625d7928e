//! A drill's report: the figures, how they were measured, the verdict, and the
//! table printed at the end (the same report is written as JSON).

use crate::limits::ACK_TIME_TOLERANCE_MS;
use crate::traffic::{Failed, Record};
use crate::{Fault, Trigger, Verdicts};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::time::{Instant, SystemTime};

/// Timings from the drill's client's point of view, in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Where the window went, phase by phase.
    pub phases: Phases,
    /// From the fault to the client's first failed attempt.
    pub time_to_detect_s: Option<f64>,
    /// From the first failed attempt after the fault to the last.
    pub failed_window_s: Option<f64>,
    /// Failed attempts after the fault (each retried).
    pub failed_attempts: u64,
    /// From the fault to the failover's `done`.
    pub done_after_fault_s: f64,
    /// From the failover's request to its `done` (mostly the lease wait).
    pub failover_s: f64,
}

/// The window of a failover, split by phase (seconds), as the drill saw it
/// (the failover's operation is polled every `FAILOVER_POLL_MS`): detection,
/// the wait for the lost region's lease, the promotion and import of its
/// copy with the registry's commit, and the clients finding the new home.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Phases {
    /// From the fault to the client's first success in the new home: what
    /// contract section 11 bounds (10 s with `--auto-failover-after 2s`).
    pub served_again_s: Option<f64>,
    /// From the fault to the failover's start: its request, or with `--auto`
    /// the moment the drill first saw the cluster's own failover.
    pub detection_s: f64,
    /// From the start until the driver had waited the lost region's lease out
    /// (its progress reached the wait's share); unknown if the drill saw only
    /// `done`.
    pub lease_wait_s: Option<f64>,
    /// From then to `done`: reading the copies, promoting the best, importing
    /// it and committing the new homes.
    pub promotion_s: Option<f64>,
    /// From `done` to the client's first success in the new home (0 when the
    /// new home answered before the drill saw `done`).
    pub clients_s: Option<f64>,
}

/// The moments the phases run between.
#[derive(Debug, Clone, Copy)]
pub struct PhaseMarks {
    pub fault_at: Instant,
    pub begun_at: Instant,
    pub lease_waited_at: Option<Instant>,
    pub done_at: Instant,
}

impl Phases {
    pub fn measure(record: &Record, marks: PhaseMarks, to: &str) -> Phases {
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        let first_success = record
            .acked
            .iter()
            .filter(|a| a.at >= marks.fault_at && a.executed_in == to)
            .map(|a| a.at)
            .min();
        Phases {
            served_again_s: first_success.map(|at| secs(marks.fault_at, at)),
            detection_s: secs(marks.fault_at, marks.begun_at),
            lease_wait_s: marks.lease_waited_at.map(|at| secs(marks.begun_at, at)),
            promotion_s: marks.lease_waited_at.map(|at| secs(at, marks.done_at)),
            clients_s: first_success.map(|at| secs(marks.done_at, at)),
        }
    }
}

impl Timings {
    pub fn measure(record: &Record, marks: PhaseMarks, to: &str) -> Timings {
        let PhaseMarks {
            fault_at,
            begun_at: failover_requested_at,
            done_at,
            ..
        } = marks;
        let failures: Vec<Instant> = record
            .failures
            .iter()
            .map(|f| f.at)
            .filter(|at| *at >= fault_at)
            .collect();
        let first = failures.iter().min().copied();
        let last = failures.iter().max().copied();
        Timings {
            phases: Phases::measure(record, marks, to),
            time_to_detect_s: first.map(|f| (f - fault_at).as_secs_f64()),
            failed_window_s: first.zip(last).map(|(f, l)| (l - f).as_secs_f64()),
            failed_attempts: failures.len() as u64,
            done_after_fault_s: (done_at - fault_at).as_secs_f64(),
            failover_s: (done_at - failover_requested_at).as_secs_f64(),
        }
    }
}

impl Phases {
    /// The phases on one line of the report's table.
    pub fn line(&self) -> String {
        let secs = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{s:.2} s"));
        format!(
            "{} after the fault: detection {:.2} s, lease wait {}, promotion and commit {}, \
             clients finding the new home {}",
            secs(self.served_again_s),
            self.detection_s,
            secs(self.lease_wait_s),
            secs(self.promotion_s),
            secs(self.clients_s)
        )
    }
}

/// Turns the drill's instants into wall-clock times: one reading of both
/// clocks, taken by `run` (an input, so tests choose it).
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    pub instant: Instant,
    pub system: SystemTime,
}

impl WallClock {
    pub fn now() -> WallClock {
        WallClock {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    /// `at` as UTC, RFC 3339 with milliseconds.
    fn format(&self, at: Instant) -> String {
        let system = match at.checked_duration_since(self.instant) {
            Some(after) => self.system + after,
            None => self.system - (self.instant - at),
        };
        humantime::format_rfc3339_millis(system).to_string()
    }
}

/// What happened when during the drill, besides the client's own record.
#[derive(Debug, Clone)]
pub struct Instants {
    pub clock: WallClock,
    pub fault: Fault,
    pub trigger: Trigger,
    pub fault_at: Instant,
    /// When the failover was requested, or with `--auto` first seen.
    pub failover_requested_at: Instant,
    /// When the drill saw the driver's lease wait over, if it did.
    pub lease_waited_at: Option<Instant>,
    pub done_at: Instant,
    pub returned_at: Instant,
    pub reconciled_at: Instant,
    /// The registry's leader as a node of another region saw it change:
    /// when, from, to (`None`: no leader known).
    pub leader_changes: Vec<(Instant, Option<u64>, Option<u64>)>,
}

/// One moment of the drill's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Moment {
    pub what: String,
    /// Seconds after the fault (negative: before it).
    pub after_fault_s: f64,
    /// UTC, RFC 3339.
    pub at: String,
}

/// The drill's timeline, in the order things happened: the fault, the
/// client's first failure, registry leader changes, the failover's request
/// and end, the client's first success in the new home, its last failure,
/// the region's return and its reconciliation.
pub fn timeline(
    record: &Record,
    i: &Instants,
    to: &str,
    rehomed: u64,
    orphans: usize,
) -> Vec<Moment> {
    let fault = match i.fault {
        Fault::Kill => "fault: every node of the region killed",
        Fault::Isolate => "fault: the region isolated",
    };
    let begun = match i.trigger {
        Trigger::Request => "failover requested",
        Trigger::Automatic => "failover begun by the cluster (--auto-failover-after)",
    };
    let mut moments: Vec<(Instant, String)> = vec![
        (i.fault_at, fault.to_owned()),
        (i.failover_requested_at, begun.to_owned()),
        (
            i.done_at,
            format!("failover done: {rehomed} tenants re-homed to {to}"),
        ),
        (i.returned_at, "the region is back (fault ended)".to_owned()),
        (
            i.reconciled_at,
            format!("reconciliation done: {orphans} orphans listed"),
        ),
    ];
    if let Some(at) = i.lease_waited_at {
        moments.push((at, "the lost region's lease waited out".to_owned()));
    }
    let after_fault: Vec<&Failed> = record
        .failures
        .iter()
        .filter(|f| f.at >= i.fault_at)
        .collect();
    if let Some(first) = after_fault.iter().min_by_key(|f| f.at) {
        moments.push((first.at, format!("first failed request ({})", first.why)));
    }
    if let Some(last) = after_fault.iter().max_by_key(|f| f.at) {
        moments.push((last.at, format!("last failed request ({})", last.why)));
    }
    if let Some(first) = record
        .acked
        .iter()
        .filter(|a| a.at >= i.fault_at && a.executed_in == to)
        .min_by_key(|a| a.at)
    {
        moments.push((first.at, format!("first success in the new home {to}")));
    }
    let name = |leader: Option<u64>| leader.map_or("none".to_owned(), |id| format!("node {id}"));
    for (at, from, into) in &i.leader_changes {
        moments.push((
            *at,
            format!("registry leader {} -> {}", name(*from), name(*into)),
        ));
    }
    moments.sort_by_key(|(at, _)| *at);
    moments
        .into_iter()
        .map(|(at, what)| Moment {
            what,
            after_fault_s: match at.checked_duration_since(i.fault_at) {
                Some(after) => after.as_secs_f64(),
                None => -(i.fault_at - at).as_secs_f64(),
            },
            at: i.clock.format(at),
        })
        .collect()
}

/// The client's failed attempts after the fault, counted by reason (a
/// problem's slug, a status, or `no answer`).
pub fn failures_by_reason(record: &Record, fault_at: Instant) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for f in record.failures.iter().filter(|f| f.at >= fault_at) {
        *counts.entry(f.why.clone()).or_default() += 1;
    }
    counts
}

/// Charges per surviving (present) order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Charges {
    pub orders: u64,
    pub exactly_once: u64,
    pub more_than_once: u64,
    pub not_charged: u64,
}

impl Charges {
    pub fn count(present: &[String], per_order: &HashMap<String, u64>) -> Charges {
        let mut c = Charges {
            orders: present.len() as u64,
            ..Charges::default()
        };
        for order in present {
            match per_order.get(order).copied().unwrap_or(0) {
                0 => c.not_charged += 1,
                1 => c.exactly_once += 1,
                _ => c.more_than_once += 1,
            }
        }
        c
    }
}

/// Orphans the reconciliation listed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Orphans {
    pub listed: u64,
    pub orders: u64,
    pub claims: u64,
    pub charged: u64,
    pub with_duplicate: u64,
}

/// What `Report::new` is made from.
/// Where a drilled tenant lives after the drill.
#[derive(Debug, Clone, Serialize)]
pub struct TenantHome {
    pub tenant_id: String,
    pub home_region: String,
}

pub struct Inputs {
    pub region: String,
    pub to: String,
    pub fault: Fault,
    pub trigger: Trigger,
    pub operation_id: String,
    pub failover: Value,
    pub lag_before_fault: Option<Value>,
    pub timings: Timings,
    pub timeline: Vec<Moment>,
    pub failures_by_reason: BTreeMap<String, u64>,
    pub sent: u64,
    pub unanswered: u64,
    pub acked: u64,
    pub acked_after_done_in_region: u64,
    pub verdicts: Verdicts,
    pub orphans: Vec<Value>,
    pub charges: Charges,
    /// The cluster's `max_standby_lag`, in seconds.
    pub max_standby_lag_s: f64,
    /// When each lost acknowledged order was acknowledged, in seconds after
    /// the fault took effect.
    pub lost_acks_after_fault_s: Vec<f64>,
    /// The drilled tenants' homes after the drill (the registry's).
    pub tenants_now: Vec<TenantHome>,
    /// The admin URL the move-back commands name (a node of another region).
    pub admin_url: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub region: String,
    pub to: String,
    pub fault: Fault,
    pub trigger: Trigger,
    pub failover_operation_id: String,
    /// The failover's `result` (`at`, `estimated_lost`).
    pub failover_result: Value,
    pub lag_before_fault: Option<Value>,
    pub timings: Timings,
    /// What happened when (`timeline`).
    pub timeline: Vec<Moment>,
    /// The client's failed attempts after the fault, by reason.
    pub failures_by_reason: BTreeMap<String, u64>,
    pub orders_sent: u64,
    pub orders_acknowledged: u64,
    /// Never acknowledged by the end (still failing when the drill stopped).
    pub orders_unanswered: u64,
    /// Acknowledged orders missing from their new home.
    pub observed_lost: u64,
    pub lost_unlisted: Vec<String>,
    /// Acknowledged orders whose client order id the new home holds under
    /// another order.
    pub duplicates: u64,
    pub duplicates_unlisted: Vec<String>,
    /// Acknowledged by the failed region after the failover was done (split
    /// brain).
    pub acknowledged_after_done_in_region: u64,
    pub orphans: Orphans,
    pub charges: Charges,
    pub max_standby_lag_s: f64,
    /// The latest acknowledgement of a lost order, in seconds after the fault.
    pub lost_acked_after_fault_max_s: Option<f64>,
    /// From the first to the last acknowledgement of a lost order, in seconds:
    /// at most the failover's `estimated_lost.seconds`.
    pub lost_acked_span_s: Option<f64>,
    /// The drilled tenants' homes after the drill: the failover re-homed
    /// them, and a second drill of the region would find none.
    pub tenants_now: Vec<TenantHome>,
    /// One `keyhold tenant move` per drilled tenant living elsewhere now.
    pub move_back: Vec<String>,
    pub passed: bool,
    /// Why it did not pass.
    pub failures: Vec<String>,
}

impl Report {
    pub fn new(i: Inputs) -> Report {
        let v = &i.verdicts;
        let mut failures = Vec::new();
        if !v.lost_unlisted.is_empty() {
            failures.push(format!(
                "{} acknowledged orders are missing and not listed as orphans",
                v.lost_unlisted.len()
            ));
        }
        if !v.duplicate_unlisted.is_empty() {
            failures.push(format!(
                "{} duplicates are not listed as orphans",
                v.duplicate_unlisted.len()
            ));
        }
        if i.acked_after_done_in_region > 0 {
            failures.push(format!(
                "{} orders were acknowledged by {} after the failover was done",
                i.acked_after_done_in_region, i.region
            ));
        }
        if i.charges.more_than_once > 0 {
            failures.push(format!(
                "{} orders were charged more than once",
                i.charges.more_than_once
            ));
        }
        let lost_max = i.lost_acks_after_fault_s.iter().copied().reduce(f64::max);
        let lost_min = i.lost_acks_after_fault_s.iter().copied().reduce(f64::min);
        let tolerance = ACK_TIME_TOLERANCE_MS as f64 / 1_000.0;
        if let Some(latest) = lost_max {
            if latest > i.max_standby_lag_s + tolerance {
                failures.push(format!(
                    "a lost order was acknowledged {latest:.2} s after the fault, more than \
                     max_standby_lag ({:.2} s)",
                    i.max_standby_lag_s
                ));
            }
        }
        let span = lost_max.zip(lost_min).map(|(max, min)| max - min);
        let bound = i.failover["result"]["estimated_lost"]["seconds"].as_f64();
        if let (Some(span), Some(bound)) = (span, bound) {
            if span > bound + tolerance {
                failures.push(format!(
                    "the lost orders were acknowledged over {span:.2} s, more than the \
                     failover's estimated_lost.seconds ({bound:.2} s)"
                ));
            }
        }
        let orphans = Orphans {
            listed: i.orphans.len() as u64,
            orders: count(&i.orphans, |o| o["kind"] == "order"),
            claims: count(&i.orphans, |o| o["kind"] == "claim"),
            charged: count(&i.orphans, |o| o["charged"] == true),
            with_duplicate: count(&i.orphans, |o| !o["duplicate_of"].is_null()),
        };
        let move_back = i
            .tenants_now
            .iter()
            .filter(|t| t.home_region != i.region)
            .map(|t| {
                format!(
                    "keyhold tenant move --url {} --id {} --to {}",
                    i.admin_url, t.tenant_id, i.region
                )
            })
            .collect();
        Report {
            region: i.region,
            to: i.to,
            fault: i.fault,
            trigger: i.trigger,
            failover_operation_id: i.operation_id,
            failover_result: i.failover["result"].clone(),
            lag_before_fault: i.lag_before_fault,
            timings: i.timings,
            timeline: i.timeline,
            failures_by_reason: i.failures_by_reason,
            orders_sent: i.sent,
            orders_acknowledged: i.acked,
            orders_unanswered: i.unanswered,
            observed_lost: (v.lost_listed.len() + v.lost_unlisted.len()) as u64,
            lost_unlisted: v.lost_unlisted.clone(),
            duplicates: (v.duplicate_listed.len() + v.duplicate_unlisted.len()) as u64,
            duplicates_unlisted: v.duplicate_unlisted.clone(),
            acknowledged_after_done_in_region: i.acked_after_done_in_region,
            orphans,
            charges: i.charges,
            max_standby_lag_s: i.max_standby_lag_s,
            lost_acked_after_fault_max_s: lost_max,
            lost_acked_span_s: span,
            move_back,
            tenants_now: i.tenants_now,
            passed: failures.is_empty(),
            failures,
        }
    }

    /// The report as the table the CLI prints.
    /// The failed attempts by reason and the timeline, after the figures.
    fn write_timeline(&self, t: &mut String) {
        if !self.failures_by_reason.is_empty() {
            let reasons: Vec<String> = self
                .failures_by_reason
                .iter()
                .map(|(why, n)| format!("{why} {n}"))
                .collect();
            let _ = writeln!(
                t,
                "  {:<31} {}",
                "failed attempts by reason",
                reasons.join(", ")
            );
        }
        let _ = writeln!(t, "  timeline (seconds after the fault, UTC):");
        for m in &self.timeline {
            let _ = writeln!(t, "    {:+8.2}  {}  {}", m.after_fault_s, m.at, m.what);
        }
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let secs = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{s:.2} s"));
        let lag = |v: &Option<Value>| match v {
            Some(l) if l.is_object() => {
                format!("{} commands, {} s", l["commands"], l["seconds"])
            }
            _ => "unknown".to_owned(),
        };
        let r = &self.failover_result;
        let rows: Vec<(&str, String)> = vec![
            (
                "drill",
                format!("{} -> {}, fault {:?}", self.region, self.to, self.fault).to_lowercase(),
            ),
            (
                "failover",
                format!("{} at {}", self.failover_operation_id, r["at"]),
            ),
            ("lag before the fault", lag(&self.lag_before_fault)),
            ("time to detect", secs(self.timings.time_to_detect_s)),
            (
                "failed-request window",
                format!(
                    "{} ({} failed attempts, each retried)",
                    secs(self.timings.failed_window_s),
                    self.timings.failed_attempts
                ),
            ),
            (
                "failover done",
                format!(
                    "{:.2} s after the fault ({:.2} s after the {})",
                    self.timings.done_after_fault_s,
                    self.timings.failover_s,
                    match self.trigger {
                        Trigger::Request => "request",
                        Trigger::Automatic => "cluster began it",
                    }
                ),
            ),
            ("served again by phase", self.timings.phases.line()),
            (
                "orders",
                format!(
                    "{} sent, {} acknowledged, {} never answered",
                    self.orders_sent, self.orders_acknowledged, self.orders_unanswered
                ),
            ),
            ("estimated lost", lag(&Some(r["estimated_lost"].clone()))),
            (
                "lost acknowledged over",
                format!(
                    "{} (bound: estimated_lost.seconds)",
                    secs(self.lost_acked_span_s)
                ),
            ),
            (
                "last lost ack after the fault",
                format!(
                    "{} (bound: max_standby_lag {:.2} s)",
                    secs(self.lost_acked_after_fault_max_s),
                    self.max_standby_lag_s
                ),
            ),
            (
                "observed lost",
                format!(
                    "{} acknowledged orders ({} not listed as orphans)",
                    self.observed_lost,
                    self.lost_unlisted.len()
                ),
            ),
            (
                "duplicates",
                format!(
                    "{} ({} not listed)",
                    self.duplicates,
                    self.duplicates_unlisted.len()
                ),
            ),
            (
                "orphans listed",
                format!(
                    "{} ({} orders, {} claims, {} charged, {} with duplicate_of)",
                    self.orphans.listed,
                    self.orphans.orders,
                    self.orphans.claims,
                    self.orphans.charged,
                    self.orphans.with_duplicate
                ),
            ),
            (
                "charges per order",
                format!(
                    "{} surviving orders: {} charged once, {} more than once, {} not charged",
                    self.charges.orders,
                    self.charges.exactly_once,
                    self.charges.more_than_once,
                    self.charges.not_charged
                ),
            ),
            (
                "acked by the region after done",
                self.acknowledged_after_done_in_region.to_string(),
            ),
            (
                "tenants re-homed",
                format!("{} by the failover", self.failover_result["tenants"]),
            ),
            (
                "tenants live now in",
                self.tenants_now
                    .iter()
                    .map(|t| format!("{} in {}", t.tenant_id, t.home_region))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            (
                "verdict",
                if self.passed {
                    "PASS".to_owned()
                } else {
                    format!("FAIL: {}", self.failures.join("; "))
                },
            ),
        ];
        for (name, value) in rows {
            let _ = writeln!(t, "  {name:<31} {value}");
        }
        self.write_timeline(&mut t);
        if !self.move_back.is_empty() {
            let _ = writeln!(t, "  to move them back to {}:", self.region);
            for command in &self.move_back {
                let _ = writeln!(t, "    {command}");
            }
        }
        t
    }
}

fn count(items: &[Value], f: impl Fn(&Value) -> bool) -> u64 {
    items.iter().filter(|o| f(o)).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn inputs(verdicts: Verdicts, charges: Charges, after_done: u64) -> Inputs {
        Inputs {
            region: "a".into(),
            to: "b".into(),
            fault: Fault::Isolate,
            trigger: Trigger::Request,
            operation_id: "op_1".into(),
            failover: serde_json::json!({"result": {"at": 7, "estimated_lost": {"commands": 1, "seconds": 0.1}}}),
            lag_before_fault: None,
            timings: Timings::default(),
            timeline: Vec::new(),
            failures_by_reason: BTreeMap::new(),
            sent: 10,
            unanswered: 0,
            acked: 10,
            acked_after_done_in_region: after_done,
            verdicts,
            orphans: vec![
                serde_json::json!({"kind": "order", "order_id": "o2", "charged": true, "duplicate_of": null}),
            ],
            charges,
            max_standby_lag_s: 1.0,
            lost_acks_after_fault_s: vec![0.2],
            tenants_now: vec![TenantHome {
                tenant_id: "t1".into(),
                home_region: "b".into(),
            }],
            admin_url: "http://127.0.0.1:1".into(),
        }
    }

    /// The drill judges the failover's bound (contract section 11): a lost
    /// order acknowledged later than `max_standby_lag` after the fault fails
    /// it, and so do lost orders acknowledged over a longer span than
    /// `estimated_lost.seconds`; both are printed beside their bounds.
    #[test]
    fn a_drill_fails_when_the_loss_exceeds_its_bounds() {
        let listed = Verdicts {
            lost_listed: vec!["o2".into()],
            ..Verdicts::default()
        };
        let with = |acks: Vec<f64>, estimate: f64| {
            let mut i = inputs(listed.clone(), Charges::default(), 0);
            i.lost_acks_after_fault_s = acks;
            i.failover = serde_json::json!({"result": {"estimated_lost": {"commands": 3, "seconds": estimate}}});
            Report::new(i)
        };
        let ok = with(vec![-0.5, 0.1, 0.9], 2.0);
        assert!(ok.passed, "{:?}", ok.failures);
        assert!(ok
            .table()
            .contains("1.40 s (bound: estimated_lost.seconds)"));
        let late = with(vec![0.1, 1.5], 2.0);
        assert!(!late.passed);
        assert!(
            late.failures[0].contains("after the fault"),
            "{:?}",
            late.failures
        );
        let wide = with(vec![-3.0, 0.5], 2.0);
        assert!(!wide.passed);
        assert!(
            wide.failures[0].contains("estimated_lost.seconds"),
            "{:?}",
            wide.failures
        );
        // Nothing lost: nothing to judge.
        assert!(with(Vec::new(), 0.0).passed);
    }

    #[test]
    fn a_drill_passes_only_with_every_loss_and_duplicate_listed_and_no_late_ack() {
        let listed = Verdicts {
            present: vec!["o1".into()],
            lost_listed: vec!["o2".into()],
            ..Verdicts::default()
        };
        let ok = Report::new(inputs(listed.clone(), Charges::default(), 0));
        assert!(ok.passed, "{:?}", ok.failures);
        assert_eq!((ok.observed_lost, ok.orphans.charged), (1, 1));
        assert!(ok.table().contains("PASS"));

        let unlisted = Verdicts {
            lost_unlisted: vec!["o3".into()],
            ..listed.clone()
        };
        let lost = Report::new(inputs(unlisted, Charges::default(), 0));
        assert!(!lost.passed);
        assert!(lost.table().contains("FAIL"));

        let dup = Verdicts {
            duplicate_unlisted: vec!["o4".into()],
            ..listed.clone()
        };
        assert!(!Report::new(inputs(dup, Charges::default(), 0)).passed);
        assert!(!Report::new(inputs(listed.clone(), Charges::default(), 1)).passed);
        let twice = Charges {
            more_than_once: 1,
            ..Charges::default()
        };
        assert!(!Report::new(inputs(listed, twice, 0)).passed);
    }

    fn failed(at: Instant, why: &str) -> Failed {
        Failed {
            at,
            why: why.to_owned(),
        }
    }

    #[test]
    fn timings_start_at_the_fault() {
        let t0 = Instant::now();
        let record = Record {
            acked: Vec::new(),
            failures: vec![
                failed(t0, "no answer"),
                failed(t0 + Duration::from_millis(1500), "store-unavailable"),
                failed(t0 + Duration::from_millis(4000), "owner-unreachable"),
            ],
            successes: Vec::new(),
        };
        let fault = t0 + Duration::from_millis(1000);
        let marks = PhaseMarks {
            fault_at: fault,
            begun_at: fault + Duration::from_millis(100),
            lease_waited_at: None,
            done_at: fault + Duration::from_millis(9000),
        };
        let t = Timings::measure(&record, marks, "b");
        assert_eq!(t.failed_attempts, 2);
        assert!((t.time_to_detect_s.unwrap() - 0.5).abs() < 1e-6);
        assert!((t.failed_window_s.unwrap() - 2.5).abs() < 1e-6);
        assert!((t.done_after_fault_s - 9.0).abs() < 1e-6);

        let per_order = HashMap::from([("o1".to_string(), 1), ("o2".to_string(), 2)]);
        let c = Charges::count(&["o1".into(), "o2".into(), "o3".into()], &per_order);
        assert_eq!((c.exactly_once, c.more_than_once, c.not_charged), (1, 1, 1));
    }

    /// Issue 39: the window is split by phase, from the fault to the first
    /// success in the new home.
    #[test]
    fn the_window_splits_into_detection_lease_wait_promotion_and_clients() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let record = Record {
            acked: vec![
                acked(ms(500), "a"),
                acked(ms(6_900), "b"),
                acked(ms(7_500), "b"),
            ],
            failures: vec![failed(ms(1_100), "owner-unreachable")],
            successes: Vec::new(),
        };
        let marks = PhaseMarks {
            fault_at: ms(1_000),
            begun_at: ms(3_300),
            lease_waited_at: Some(ms(6_500)),
            done_at: ms(6_700),
        };
        let p = Phases::measure(&record, marks, "b");
        let close = |a: Option<f64>, b: f64| (a.expect("measured") - b).abs() < 1e-6;
        assert!(close(p.served_again_s, 5.9));
        assert!(close(Some(p.detection_s), 2.3));
        assert!(close(p.lease_wait_s, 3.2));
        assert!(close(p.promotion_s, 0.2));
        assert!(close(p.clients_s, 0.2));
        assert!(
            p.line()
                .starts_with("5.90 s after the fault: detection 2.30 s, lease wait 3.20 s"),
            "{}",
            p.line()
        );
        // Without the lease wait seen, those phases are unknown, not zero.
        let p = Phases::measure(
            &record,
            PhaseMarks {
                lease_waited_at: None,
                ..marks
            },
            "b",
        );
        assert_eq!((p.lease_wait_s, p.promotion_s), (None, None));
        assert!(
            p.line().contains("lease wait -, promotion and commit -"),
            "{}",
            p.line()
        );
    }

    fn acked(at: Instant, executed_in: &str) -> crate::traffic::Acked {
        crate::traffic::Acked {
            tenant_id: "t1".into(),
            token: "kh_x".into(),
            key: "k".into(),
            client_order_id: "c".into(),
            order_id: "o".into(),
            at,
            executed_in: executed_in.into(),
        }
    }

    /// Contract section 11: the drill reports each phase with its time, in
    /// the order it happened, and its failures by slug.
    #[test]
    fn the_timeline_orders_the_phases_and_names_failures_by_slug() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let clock = WallClock {
            instant: t0,
            // 2026-12-07T14:00:00Z
            system: SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_652_000),
        };
        let record = Record {
            acked: vec![
                acked(ms(500), "a"),
                acked(ms(4_000), "a"),
                acked(ms(9_300), "b"),
            ],
            failures: vec![
                failed(ms(200), "no answer"),
                failed(ms(1_150), "store-unavailable"),
                failed(ms(3_000), "owner-unreachable"),
                failed(ms(8_800), "owner-unreachable"),
            ],
            successes: Vec::new(),
        };
        let instants = Instants {
            clock,
            fault: Fault::Isolate,
            trigger: Trigger::Request,
            fault_at: ms(1_000),
            failover_requested_at: ms(1_100),
            lease_waited_at: Some(ms(7_600)),
            done_at: ms(9_000),
            returned_at: ms(11_000),
            reconciled_at: ms(12_500),
            leader_changes: vec![(ms(2_000), Some(1), None), (ms(2_600), None, Some(2))],
        };
        let moments = timeline(&record, &instants, "b", 1, 3);
        let whats: Vec<&str> = moments.iter().map(|m| m.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "fault: the region isolated",
                "failover requested",
                "first failed request (store-unavailable)",
                "registry leader node 1 -> none",
                "registry leader none -> node 2",
                "the lost region's lease waited out",
                "last failed request (owner-unreachable)",
                "failover done: 1 tenants re-homed to b",
                "first success in the new home b",
                "the region is back (fault ended)",
                "reconciliation done: 3 orphans listed",
            ]
        );
        assert_eq!(moments[0].at, "2026-12-07T14:00:01.000Z");
        assert!((moments[2].after_fault_s - 0.15).abs() < 1e-6);
        // The acknowledgement in a at 4.0 s is not the new home's.
        assert!((moments[8].after_fault_s - 8.3).abs() < 1e-6);
        let by_reason = failures_by_reason(&record, ms(1_000));
        assert_eq!(
            by_reason,
            BTreeMap::from([
                ("owner-unreachable".to_owned(), 2),
                ("store-unavailable".to_owned(), 1)
            ])
        );
        let mut i = inputs(Verdicts::default(), Charges::default(), 0);
        i.timeline = moments;
        i.failures_by_reason = by_reason;
        let table = Report::new(i).table();
        assert!(
            table.contains("owner-unreachable 2, store-unavailable 1"),
            "{table}"
        );
        assert!(
            table.contains("   +8.30  2026-12-07T14:00:09.300Z  first success in the new home b"),
            "{table}"
        );
    }
}
