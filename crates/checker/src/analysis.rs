//! The pure analysis: a history plus the final state give a verdict. No I/O,
//! so every violation kind is tested on purpose-built histories.
//!
//! Orders are judged per key (one execution; every replay byte-identical to the
//! first answer; a changed body refused, a same body never refused as changed),
//! per client_order_id (one order, found at the end with the acknowledged id and
//! fields), and downstream (one charge per surviving order that agrees with its
//! status and amount; one reservation per item line). Claims are judged by real
//! time: a completion acknowledged after another owner's acquisition had been
//! acknowledged is a fenced owner's write that got through.
//!
//! `unknown` ops may or may not have happened: they never count as
//! acknowledgements, but an order they may have created is allowed to exist.
//!
//! Reads during the run: an order acknowledged before a read was sent must read
//! back as itself; 404 or another order is a stale read. Losses: an
//! acknowledged order may be missing at the end only if a failover of the run
//! lost it, its lost region's reconciliation lists it as an orphan, and it was
//! acknowledged no later than `max_standby_lag` after the cut; the lost orders
//! of one failover must also span no more than its `estimated_lost.seconds`.
//! Such an allowed loss excuses what follows from it (a retry that executed
//! the key again in the new home, a replay that differs, a read of 404 after
//! the failover), and nothing else.

use crate::history::{History, Op, Outcome, Request};
use crate::state::{Charge, ClaimReplay, Downstream, FinalState, Read, Reservation};
use crate::verdict::{Kind, LossReport, Stats, Verdict, Violation};
use keyhold_fingerprint::Spec;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Fields of an order that never change after creation.
const IMMUTABLE_ORDER_FIELDS: [&str; 6] = [
    "order_id",
    "client_order_id",
    "cart_id",
    "amount",
    "currency",
    "created_at",
];
/// Order statuses after downstream work settled.
const SETTLED_STATUSES: [&str; 2] = ["PAID", "PAYMENT_FAILED"];

/// The order fingerprint of a request body (`None` if it is not I-JSON).
fn order_fingerprint(body: &str) -> Option<String> {
    let value = keyhold_fingerprint::parse(body.as_bytes()).ok()?;
    Some(Spec::orders().fingerprint(&value).as_str().to_owned())
}

fn str_field<'a>(value: &'a Value, name: &str) -> Option<&'a str> {
    value.get(name).and_then(Value::as_str)
}

struct OrderOp<'a> {
    op: &'a Op,
    client_order_id: &'a str,
    fingerprint: Option<String>,
}

/// Orders of the history, indexed the ways the rules need.
#[derive(Default)]
struct Orders<'a> {
    by_key: BTreeMap<(&'a str, &'a str), Vec<OrderOp<'a>>>,
    /// (tenant, client_order_id) → every request body sent for it.
    bodies: BTreeMap<(&'a str, &'a str), Vec<&'a str>>,
    /// (tenant, client_order_id) → (order id, op) of every answer naming an order.
    acked: BTreeMap<(&'a str, &'a str), Vec<(String, u64)>>,
    /// (tenant, order id) → the first answer body that acknowledged it.
    acked_bodies: BTreeMap<(&'a str, String), (Value, u64)>,
}

fn index(history: &History) -> Orders<'_> {
    let mut orders = Orders::default();
    for op in &history.ops {
        let Request::CreateOrder {
            key,
            client_order_id,
            body,
            ..
        } = &op.request
        else {
            continue;
        };
        let tenant = op.tenant.as_str();
        orders
            .bodies
            .entry((tenant, client_order_id))
            .or_default()
            .push(body);
        if let (Some((status, _)), Some(json)) = (op.outcome.answer(), op.outcome.json()) {
            if matches!(status, 200 | 201) {
                if let Some(order_id) = str_field(&json, "order_id") {
                    orders
                        .acked
                        .entry((tenant, client_order_id))
                        .or_default()
                        .push((order_id.to_owned(), op.id));
                    orders
                        .acked_bodies
                        .entry((tenant, order_id.to_owned()))
                        .or_insert((json.clone(), op.id));
                }
            }
        }
        orders
            .by_key
            .entry((tenant, key))
            .or_default()
            .push(OrderOp {
                op,
                client_order_id,
                fingerprint: order_fingerprint(body),
            });
    }
    orders
}

fn violation(kind: Kind, detail: String, ops: Vec<u64>) -> Violation {
    Violation { kind, detail, ops }
}

/// Acknowledged orders and claim completions that a failover lost within its
/// bounds, listed by its reconciliation.
#[derive(Default)]
struct Allowed {
    /// (tenant, order id).
    orders: BTreeSet<(String, String)>,
    /// (tenant, claim key).
    claims: BTreeSet<(String, String)>,
}

impl Allowed {
    fn order(&self, tenant: &str, order_id: &str) -> bool {
        self.orders
            .contains(&(tenant.to_owned(), order_id.to_owned()))
    }

    /// Whether an answer names an order that is an allowed loss.
    fn answer(&self, tenant: &str, outcome: &Outcome) -> bool {
        outcome
            .json()
            .and_then(|j| str_field(&j, "order_id").map(str::to_owned))
            .is_some_and(|id| self.order(tenant, &id))
    }
}

/// The earliest acknowledgement of each order: (tenant, order id) → op.
fn first_acks<'h>(
    orders: &Orders<'_>,
    ops: &BTreeMap<u64, &'h Op>,
) -> BTreeMap<(String, String), &'h Op> {
    let mut first: BTreeMap<(String, String), &Op> = BTreeMap::new();
    for ((tenant, _), acked) in &orders.acked {
        for (id, op) in acked {
            let Some(op) = ops.get(op) else { continue };
            let entry = first
                .entry(((*tenant).to_owned(), id.clone()))
                .or_insert(op);
            if op.invoked_ms < entry.invoked_ms {
                *entry = op;
            }
        }
    }
    first
}

/// Which missing acknowledged orders (and claim completions) the run's
/// failovers excuse, with each failover's loss against its bounds.
fn check_losses(
    history: &History,
    orders: &Orders<'_>,
    state: &FinalState,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) -> (Allowed, Vec<LossReport>) {
    let ops: BTreeMap<u64, &Op> = history.ops.iter().map(|op| (op.id, op)).collect();
    let first = first_acks(orders, &ops);
    let mut allowed = Allowed::default();
    let mut reports: Vec<LossReport> = state
        .failovers
        .iter()
        .map(|f| LossReport {
            region: f.region.clone(),
            to: f.to.clone(),
            cut_ms: f.cut_ms,
            bound_ms: f.cut_ms + f.max_standby_lag_ms,
            orphans_listed: f.orphans.as_ref().map(|o| o.len() as u64),
            estimated_lost_ms: f.estimated_lost_ms,
            estimated_lost_commands: f.estimated_lost_commands,
            ..LossReport::default()
        })
        .collect();
    // Per failover: the acknowledgements of its allowed losses.
    let mut lost_acks: Vec<Vec<&Op>> = vec![Vec::new(); state.failovers.len()];
    for lookup in &state.by_order_id {
        if lookup.read != Read::Absent {
            continue;
        }
        let key = (lookup.tenant.clone(), lookup.order_id.clone());
        let Some(ack) = first.get(&key) else { continue };
        stats.orders_lost += 1;
        let orphaned = state.failovers.iter().position(|f| {
            f.orphans.as_ref().is_some_and(|orphans| {
                orphans.iter().any(|o| {
                    o.kind == "order"
                        && o.tenant_id == lookup.tenant
                        && o.order_id.as_deref() == Some(lookup.order_id.as_str())
                })
            })
        });
        // Not an orphan of any failover: check_order_ids reports it missing.
        let Some(i) = orphaned else { continue };
        let report = &mut reports[i];
        report.orders_lost += 1;
        report.orders_lost_orphaned += 1;
        if ack.invoked_ms > report.bound_ms {
            out.push(violation(
                Kind::LossBeyondBound,
                format!(
                    "order {} was lost by the failover of {}, but its acknowledgement was sent \
                     {} ms after the cut, later than max_standby_lag ({} ms)",
                    lookup.order_id,
                    report.region,
                    ack.invoked_ms - report.cut_ms,
                    report.bound_ms - report.cut_ms
                ),
                vec![ack.id],
            ));
            continue;
        }
        stats.orders_lost_allowed += 1;
        lost_acks[i].push(ack);
        allowed.orders.insert(key);
    }
    for (report, acks) in reports.iter_mut().zip(&lost_acks) {
        let (Some(first_sent), Some(last_answered)) = (
            acks.iter().map(|a| a.invoked_ms).min(),
            acks.iter().map(|a| a.completed_ms).max(),
        ) else {
            continue;
        };
        let last_sent = acks.iter().map(|a| a.invoked_ms).max().unwrap_or(0);
        let first_answered = acks.iter().map(|a| a.completed_ms).min().unwrap_or(0);
        report.lost_span_ms = last_answered - first_sent;
        report.newest_lost_after_cut_ms = last_sent.saturating_sub(report.cut_ms);
        // The server acknowledged each between its sending and its answer:
        // the span is certainly at least this.
        let span_at_least = last_sent.saturating_sub(first_answered);
        if let Some(estimate) = report.estimated_lost_ms {
            if span_at_least > estimate {
                out.push(violation(
                    Kind::LossBeyondBound,
                    format!(
                        "the failover of {} lost orders acknowledged over at least {span_at_least} \
                         ms, more than its estimated_lost.seconds ({estimate} ms)",
                        report.region
                    ),
                    acks.iter().map(|a| a.id).collect(),
                ));
            }
        }
    }
    // Claims: a completion acknowledged, then a new claim of the scope at the
    // end acquired it afresh; excused as an orphan of kind `claim`.
    for r in state.claim_replays.iter().filter(|r| r.status != 200) {
        let completion = history.ops.iter().find(|op| {
            matches!(op.outcome, Outcome::Ok { status: 200, .. })
                && op.tenant == r.tenant
                && matches!(&op.request, Request::CompleteClaim { operation, key, outcome, .. }
                    if *operation == r.operation && *key == r.key
                        && FINAL_OUTCOMES.contains(&outcome.as_str()))
        });
        let Some(completion) = completion else {
            continue;
        };
        let excused = state.failovers.iter().any(|f| {
            completion.invoked_ms <= f.cut_ms + f.max_standby_lag_ms
                && f.orphans.as_ref().is_some_and(|orphans| {
                    orphans.iter().any(|o| {
                        o.kind == "claim"
                            && o.tenant_id == r.tenant
                            && o.idempotency_key.as_deref() == Some(r.key.as_str())
                    })
                })
        });
        if excused {
            stats.claims_lost_allowed += 1;
            allowed.claims.insert((r.tenant.clone(), r.key.clone()));
        }
    }
    (allowed, reports)
}

/// Reads during the run: an order acknowledged before the read was sent reads
/// back as itself (by id: the same immutable fields; by client_order_id: one of
/// the orders acknowledged for it), unless it is an allowed loss.
fn check_reads(
    history: &History,
    orders: &Orders<'_>,
    allowed: &Allowed,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) {
    let ops: BTreeMap<u64, &Op> = history.ops.iter().map(|op| (op.id, op)).collect();
    let first = first_acks(orders, &ops);
    for read in &history.ops {
        let Request::ReadOrder {
            order_id,
            client_order_id,
        } = &read.request
        else {
            continue;
        };
        let tenant = read.tenant.as_str();
        let Some((status @ (200 | 404), _)) = read.outcome.answer() else {
            continue;
        };
        let body = read.outcome.json().unwrap_or(Value::Null);
        let answered = str_field(&body, "order_id").unwrap_or_default();
        // Orders acknowledged (answered) before this read was sent.
        let expected: Vec<(&str, u64)> = match (order_id, client_order_id) {
            (Some(id), _) => first
                .get(&(tenant.to_owned(), id.clone()))
                .filter(|ack| ack.completed_ms <= read.invoked_ms)
                .map(|ack| (id.as_str(), ack.id))
                .into_iter()
                .collect(),
            (None, Some(coid)) => orders
                .acked
                .get(&(tenant, coid.as_str()))
                .map(|acked| {
                    acked
                        .iter()
                        .filter(|(_, op)| {
                            ops.get(op)
                                .is_some_and(|op| op.completed_ms <= read.invoked_ms)
                        })
                        .map(|(id, op)| (id.as_str(), *op))
                        .collect()
                })
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        };
        if expected.is_empty() {
            continue;
        }
        stats.reads_checked += 1;
        // Another order for the client_order_id is fine if it too was
        // acknowledged (a retry after a loss made it again).
        let all_acked = |id: &str| match client_order_id {
            Some(coid) => orders
                .acked
                .get(&(tenant, coid.as_str()))
                .is_some_and(|a| a.iter().any(|(a, _)| a == id)),
            None => false,
        };
        let current = status == 200
            && (expected.iter().any(|(id, _)| *id == answered) || all_acked(answered));
        if current {
            if let (Some(id), Some((acked, op))) = (
                order_id,
                order_id
                    .as_ref()
                    .and_then(|id| orders.acked_bodies.get(&(tenant, id.clone()))),
            ) {
                let changed: Vec<&str> = IMMUTABLE_ORDER_FIELDS
                    .iter()
                    .copied()
                    .filter(|f| body.get(f) != acked.get(f))
                    .collect();
                if !changed.is_empty() {
                    out.push(violation(
                        Kind::AckedChanged,
                        format!("a read of order {id} shows other fields: {changed:?}"),
                        vec![*op, read.id],
                    ));
                }
            }
            continue;
        }
        if expected.iter().all(|(id, _)| allowed.order(tenant, id)) {
            continue;
        }
        let what = if status == 404 {
            "404".to_owned()
        } else {
            format!("order {answered}")
        };
        let asked = match (order_id, client_order_id) {
            (Some(id), _) => format!("order {id}"),
            (None, Some(coid)) => format!("client_order_id {coid:?}"),
            (None, None) => unreachable!("expected is empty without either"),
        };
        out.push(violation(
            Kind::StaleRead,
            format!(
                "a read of {asked} of {tenant} through region {} answered {what} after {:?} \
                 had been acknowledged",
                read.region,
                expected.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            ),
            expected
                .iter()
                .map(|(_, op)| *op)
                .chain(std::iter::once(read.id))
                .collect(),
        ));
    }
}

/// Judges the history against the final state.
pub fn check(history: &History, state: &FinalState) -> Verdict {
    let orders = index(history);
    let mut out = Vec::new();
    let mut stats = Stats {
        ops: history.ops.len() as u64,
        order_keys: orders.by_key.len() as u64,
        downstream_checked: state.downstream.is_some(),
        ..Stats::default()
    };
    for op in &history.ops {
        match op.outcome {
            Outcome::Ok { .. } => stats.ops_ok += 1,
            Outcome::Fail { .. } => stats.ops_fail += 1,
            Outcome::Unknown { .. } => stats.ops_unknown += 1,
        }
    }
    let (allowed, losses) = check_losses(history, &orders, state, &mut stats, &mut out);
    check_keys(&orders, state, &allowed, &mut stats, &mut out);
    let found = check_client_order_ids(&orders, state, &allowed, &mut stats, &mut out);
    check_order_ids(&orders, state, &allowed, &mut out);
    check_reads(history, &orders, &allowed, &mut stats, &mut out);
    if let Some(downstream) = &state.downstream {
        check_downstream(&orders, &found, downstream, &mut stats, &mut out);
    }
    check_claims(history, state, &allowed, &mut stats, &mut out);
    let mut verdict = Verdict::new(stats, out);
    verdict.losses = losses;
    verdict
}

/// How many orders found at the end still wait for downstream work (status,
/// charge or reservations): the reader polls until this is zero.
pub fn downstream_pending(history: &History, state: &FinalState) -> usize {
    let Some(downstream) = &state.downstream else {
        return 0;
    };
    let orders = index(history);
    let effects = Effects::new(downstream);
    state
        .by_client_order_id
        .iter()
        .filter_map(|l| match &l.read {
            Read::Found { body } => Some((l.tenant.as_str(), body)),
            _ => None,
        })
        .filter(|(tenant, order)| !effects.of(&orders, tenant, order).settled())
        .count()
}

/// Per key: one execution, replays identical to the first answer, changed
/// bodies refused and same bodies not.
fn check_keys(
    orders: &Orders<'_>,
    state: &FinalState,
    allowed: &Allowed,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) {
    let final_replays: BTreeMap<(&str, &str), _> = state
        .order_replays
        .iter()
        .map(|r| ((r.tenant.as_str(), r.key.as_str()), r))
        .collect();
    for ((tenant, key), ops) in &orders.by_key {
        let lost = |o: &OrderOp<'_>| allowed.answer(tenant, &o.op.outcome);
        let all_executed: Vec<&OrderOp<'_>> = ops
            .iter()
            .filter(|o| {
                matches!(
                    o.op.outcome,
                    Outcome::Ok {
                        status: 201,
                        replayed: false,
                        ..
                    }
                )
            })
            .collect();
        // An execution a failover lost within its bounds may be followed by
        // another in the new home (a retry): only the survivors count.
        let mut executed: Vec<&OrderOp<'_>> =
            all_executed.iter().copied().filter(|o| !lost(o)).collect();
        if executed.is_empty() {
            executed = all_executed;
        }
        if executed.len() > 1 {
            out.push(violation(
                Kind::Duplicate,
                format!("key {key:?} of {tenant} executed {} times", executed.len()),
                executed.iter().map(|o| o.op.id).collect(),
            ));
        }
        // The reference answer: the first execution's body, else the first replay's.
        let first = executed.first().copied().or_else(|| {
            ops.iter().find(|o| {
                matches!(
                    o.op.outcome,
                    Outcome::Ok {
                        status: 201,
                        replayed: true,
                        ..
                    }
                )
            })
        });
        let Some(first) = first else { continue };
        let Some((_, first_body)) = first.op.outcome.answer() else {
            continue;
        };
        for o in ops {
            let Some((status, body)) = o.op.outcome.answer() else {
                continue;
            };
            let same_request = o.fingerprint == first.fingerprint;
            let either_lost = lost(first) || lost(o);
            match (status, same_request) {
                (201, true) if body != first_body && !either_lost => out.push(violation(
                    Kind::ReplayDiffers,
                    format!("key {key:?}: a replay differs from the first answer"),
                    vec![first.op.id, o.op.id],
                )),
                // A key a failover lost holds nothing in the new home: a
                // changed body under it executes there.
                (200 | 201, false) if !either_lost => out.push(violation(
                    Kind::WrongAnswer,
                    format!(
                        "key {key:?}: a changed body (client_order_id {:?}) was answered {status}, \
                         not 422",
                        o.client_order_id
                    ),
                    vec![first.op.id, o.op.id],
                )),
                (422, true) => out.push(violation(
                    Kind::WrongAnswer,
                    format!("key {key:?}: the same body was refused as changed (422)"),
                    vec![first.op.id, o.op.id],
                )),
                _ => {}
            }
        }
        // The final replay sends the key's first acknowledged body. When a
        // failover lost that execution and the new home then executed a
        // changed body under the key, the right answer is 422.
        let replayed = ops
            .iter()
            .find(|o| matches!(o.op.outcome, Outcome::Ok { status: 201, .. }));
        let replays_a_lost_other_body =
            replayed.is_some_and(|r| lost(r) && r.fingerprint != first.fingerprint);
        match final_replays.get(&(*tenant, *key)) {
            None => {}
            Some(_) if lost(first) => stats.order_replays_checked += 1,
            Some(r) if replays_a_lost_other_body => {
                stats.order_replays_checked += 1;
                if r.status != 422 {
                    out.push(violation(
                        Kind::ReplayDiffers,
                        format!(
                            "key {key:?}: the final replay of a body a failover lost, under a \
                             key the new home executed another body for, answered {}, not 422",
                            r.status
                        ),
                        vec![first.op.id],
                    ));
                }
            }
            Some(r) => {
                stats.order_replays_checked += 1;
                if r.status == 201 && !r.replayed {
                    out.push(violation(
                        Kind::AckedMissing,
                        format!("key {key:?}: the record is gone, a late retry executed again"),
                        vec![first.op.id],
                    ));
                } else if r.status == 201 && r.body != first_body {
                    out.push(violation(
                        Kind::ReplayDiffers,
                        format!("key {key:?}: the final replay differs from the first answer"),
                        vec![first.op.id],
                    ));
                } else if r.status != 201 {
                    out.push(violation(
                        Kind::ReplayDiffers,
                        format!("key {key:?}: the final replay answered {}", r.status),
                        vec![first.op.id],
                    ));
                }
            }
        }
    }
}

/// Per client_order_id: at most one order id acknowledged, and the order found
/// at the end is that one. Returns the orders found: (tenant, body).
fn check_client_order_ids<'s>(
    orders: &Orders<'_>,
    state: &'s FinalState,
    allowed: &Allowed,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) -> Vec<(&'s str, &'s Value)> {
    let mut found = Vec::new();
    for ((tenant, coid), acked) in &orders.acked {
        // A lost order and the one a retry then made in the new home are two
        // ids for one client_order_id: the reconciliation lists the pair.
        let ids: BTreeSet<&str> = acked
            .iter()
            .map(|(id, _)| id.as_str())
            .filter(|id| !allowed.order(tenant, id))
            .collect();
        stats.orders_acked += 1;
        if ids.len() > 1 {
            out.push(violation(
                Kind::Duplicate,
                format!("client_order_id {coid:?} of {tenant} acknowledged as orders {ids:?}"),
                acked.iter().map(|(_, op)| *op).collect(),
            ));
        }
    }
    for lookup in &state.by_client_order_id {
        let key = (lookup.tenant.as_str(), lookup.client_order_id.as_str());
        let acked = orders.acked.get(&key);
        let acked_ops = || acked.map_or(Vec::new(), |a| a.iter().map(|(_, op)| *op).collect());
        let all_lost = acked.is_some_and(|a| a.iter().all(|(id, _)| allowed.order(key.0, id)));
        match &lookup.read {
            Read::Unreadable { reason } => out.push(violation(
                Kind::Unreadable,
                format!("client_order_id {:?}: {reason}", lookup.client_order_id),
                acked_ops(),
            )),
            Read::Absent if acked.is_some() && !all_lost => out.push(violation(
                Kind::AckedMissing,
                format!(
                    "client_order_id {:?} of {} was acknowledged but has no order",
                    lookup.client_order_id, lookup.tenant
                ),
                acked_ops(),
            )),
            Read::Absent => {}
            Read::Found { body } => {
                stats.orders_found += 1;
                found.push((lookup.tenant.as_str(), body));
                let id = str_field(body, "order_id").unwrap_or_default();
                if let Some(acked) = acked {
                    if !acked.iter().any(|(a, _)| a == id) && !all_lost {
                        out.push(violation(
                            Kind::Duplicate,
                            format!(
                                "client_order_id {:?}: found order {id}, acknowledged {:?}",
                                lookup.client_order_id,
                                acked.iter().map(|(a, _)| a).collect::<Vec<_>>()
                            ),
                            acked_ops(),
                        ));
                    }
                }
                let sent = orders.bodies.get(&key).map(Vec::as_slice).unwrap_or(&[]);
                if !sent.iter().any(|b| order_matches_request(body, b)) {
                    out.push(violation(
                        Kind::AckedChanged,
                        format!(
                            "client_order_id {:?}: order {id} matches no request sent for it",
                            lookup.client_order_id
                        ),
                        acked_ops(),
                    ));
                }
            }
        }
    }
    found
}

/// Whether an order carries the fields of this request body.
fn order_matches_request(order: &Value, request: &str) -> bool {
    let Ok(request) = serde_json::from_str::<Value>(request) else {
        return false;
    };
    ["client_order_id", "cart_id", "amount", "currency"]
        .iter()
        .all(|f| order.get(f) == request.get(f))
}

/// Per acknowledged order id: still there, with the fields it was acknowledged with.
fn check_order_ids(
    orders: &Orders<'_>,
    state: &FinalState,
    allowed: &Allowed,
    out: &mut Vec<Violation>,
) {
    for lookup in &state.by_order_id {
        let Some((acked, op)) = orders
            .acked_bodies
            .get(&(lookup.tenant.as_str(), lookup.order_id.clone()))
        else {
            continue;
        };
        match &lookup.read {
            Read::Unreadable { reason } => out.push(violation(
                Kind::Unreadable,
                format!("order {}: {reason}", lookup.order_id),
                vec![*op],
            )),
            Read::Absent if allowed.order(&lookup.tenant, &lookup.order_id) => {}
            Read::Absent => out.push(violation(
                Kind::AckedMissing,
                format!(
                    "order {} was acknowledged but is not found{}",
                    lookup.order_id,
                    if state.failovers.is_empty() {
                        ""
                    } else {
                        " (and no failover's reconciliation lists it)"
                    }
                ),
                vec![*op],
            )),
            Read::Found { body } => {
                let changed: Vec<&str> = IMMUTABLE_ORDER_FIELDS
                    .iter()
                    .copied()
                    .filter(|f| body.get(f) != acked.get(f))
                    .collect();
                let acked_status = str_field(acked, "status");
                let status_went_back = acked_status.is_some_and(|s| SETTLED_STATUSES.contains(&s))
                    && str_field(body, "status") != acked_status;
                if !changed.is_empty() || status_went_back {
                    out.push(violation(
                        Kind::AckedChanged,
                        format!(
                            "order {} changed since acknowledged: fields {changed:?}{}",
                            lookup.order_id,
                            if status_went_back { ", status" } else { "" }
                        ),
                        vec![*op],
                    ));
                }
            }
        }
    }
}

/// The downstream effects, indexed by order id.
struct Effects<'s> {
    charges: BTreeMap<&'s str, Vec<&'s Charge>>,
    reservations: BTreeMap<&'s str, Vec<&'s Reservation>>,
}

/// One order's downstream effects.
struct OrderEffects<'s> {
    status: &'s str,
    charges: &'s [&'s Charge],
    reservations: &'s [&'s Reservation],
    /// Item lines of the request that created it (`None`: no request matches).
    lines: Option<usize>,
}

impl OrderEffects<'_> {
    /// Everything that will happen has happened: status final, a charge, and a
    /// reservation per line (more is a violation, not something to wait for).
    fn settled(&self) -> bool {
        SETTLED_STATUSES.contains(&self.status)
            && !self.charges.is_empty()
            && self.lines.is_none_or(|n| self.reservations.len() >= n)
    }
}

impl<'s> Effects<'s> {
    fn new(downstream: &'s Downstream) -> Effects<'s> {
        let mut charges: BTreeMap<&str, Vec<&Charge>> = BTreeMap::new();
        for c in &downstream.charges {
            charges.entry(c.order_id.as_str()).or_default().push(c);
        }
        let mut reservations: BTreeMap<&str, Vec<&Reservation>> = BTreeMap::new();
        for r in &downstream.reservations {
            reservations.entry(r.order_id.as_str()).or_default().push(r);
        }
        Effects {
            charges,
            reservations,
        }
    }

    fn of(&self, orders: &Orders<'_>, tenant: &str, order: &'s Value) -> OrderEffects<'_> {
        let id = str_field(order, "order_id").unwrap_or_default();
        let coid = str_field(order, "client_order_id").unwrap_or_default();
        let sent = orders
            .bodies
            .get(&(tenant, coid))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let lines = sent
            .iter()
            .find(|b| order_matches_request(order, b))
            .and_then(|b| serde_json::from_str::<Value>(b).ok())
            .map(|b| b.get("items").and_then(Value::as_array).map_or(0, Vec::len));
        OrderEffects {
            status: str_field(order, "status").unwrap_or_default(),
            charges: self.charges.get(id).map(Vec::as_slice).unwrap_or(&[]),
            reservations: self.reservations.get(id).map(Vec::as_slice).unwrap_or(&[]),
            lines,
        }
    }
}

/// One charge per surviving order agreeing with it; one reservation per item line.
fn check_downstream(
    orders: &Orders<'_>,
    found: &[(&str, &Value)],
    downstream: &Downstream,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) {
    let effects = Effects::new(downstream);
    for (tenant, order) in found {
        let id = str_field(order, "order_id").unwrap_or_default();
        let coid = str_field(order, "client_order_id").unwrap_or_default();
        let acked_ops: Vec<u64> = orders
            .acked
            .get(&(*tenant, coid))
            .map_or(Vec::new(), |a| a.iter().map(|(_, op)| *op).collect());
        let mine = effects.of(orders, tenant, order);
        let status = mine.status;
        if !SETTLED_STATUSES.contains(&status) {
            out.push(violation(
                Kind::Unsettled,
                format!("order {id} is still {status}"),
                acked_ops.clone(),
            ));
        }
        stats.charges_checked += mine.charges.len() as u64;
        match mine.charges {
            [] => out.push(violation(
                Kind::ChargeCount,
                format!("order {id}: no charge"),
                acked_ops.clone(),
            )),
            [charge] => {
                let agrees = match status {
                    "PAID" => charge.status == "succeeded",
                    "PAYMENT_FAILED" => charge.status == "failed",
                    _ => true,
                };
                let amount = order.get("amount").and_then(Value::as_u64);
                if !agrees || amount != Some(charge.amount) {
                    out.push(violation(
                        Kind::ChargeMismatch,
                        format!(
                            "order {id} is {status} for {amount:?}, its charge is {} for {}",
                            charge.status, charge.amount
                        ),
                        acked_ops.clone(),
                    ));
                }
            }
            more => out.push(violation(
                Kind::ChargeCount,
                format!("order {id}: {} charges", more.len()),
                acked_ops.clone(),
            )),
        }
        let Some(lines) = mine.lines else { continue };
        stats.reservations_checked += mine.reservations.len() as u64;
        let distinct: BTreeSet<Option<u64>> = mine.reservations.iter().map(|r| r.line).collect();
        if mine.reservations.len() != lines || distinct.len() != lines {
            out.push(violation(
                Kind::ReservationCount,
                format!(
                    "order {id}: {} reservations ({} distinct lines) for {lines} item lines",
                    mine.reservations.len(),
                    distinct.len()
                ),
                acked_ops,
            ));
        }
    }
}

const FINAL_OUTCOMES: [&str; 2] = ["SUCCEEDED", "FAILED_FINAL"];

/// A claim's scope in the history: (tenant, operation, key).
type ClaimScope<'a> = (&'a str, &'a str, &'a str);

/// One completion sent: (token, outcome, body, op).
type Completion<'a> = (&'a str, &'a str, &'a str, &'a Op);

/// What the history did with each claim scope.
#[derive(Default)]
struct ClaimOps<'a> {
    // Per scope: acquisitions (token, op) and completions (token, outcome, body, op).
    acquired: BTreeMap<ClaimScope<'a>, Vec<(String, &'a Op)>>,
    completions: BTreeMap<ClaimScope<'a>, Vec<Completion<'a>>>,
    /// Replays: the body each showed, and its op.
    replays: BTreeMap<ClaimScope<'a>, Vec<(Value, &'a Op)>>,
}

/// Whether a completion's `op` was acknowledged (200).
fn completion_acked(op: &Op) -> bool {
    matches!(op.outcome, Outcome::Ok { status: 200, .. })
}

/// Claims: no completion acknowledged from an owner that was already fenced,
/// and every replay equal to the one acknowledged final completion.
fn check_claims(
    history: &History,
    state: &FinalState,
    lost_claims: &Allowed,
    stats: &mut Stats,
    out: &mut Vec<Violation>,
) {
    let ops = claim_ops(history);
    let final_replays: BTreeMap<ClaimScope<'_>, _> = state
        .claim_replays
        .iter()
        .map(|r| ((r.tenant.as_str(), r.operation.as_str(), r.key.as_str()), r))
        .collect();
    let scopes: BTreeSet<ClaimScope<'_>> = ops
        .acquired
        .keys()
        .chain(ops.completions.keys())
        .copied()
        .collect();
    stats.claim_scopes = scopes.len() as u64;
    for scope in scopes {
        check_claim(
            scope,
            &ops,
            final_replays.get(&scope).copied(),
            lost_claims,
            out,
        );
    }
}

/// Each claim scope's acquisitions, completions and replays in `history`.
fn claim_ops(history: &History) -> ClaimOps<'_> {
    let mut ops = ClaimOps::default();
    let ClaimOps {
        acquired,
        completions,
        replays,
    } = &mut ops;
    for op in &history.ops {
        match &op.request {
            Request::Claim { operation, key, .. } => {
                let scope = (op.tenant.as_str(), operation.as_str(), key.as_str());
                let (Some((status, _)), Some(json)) = (op.outcome.answer(), op.outcome.json())
                else {
                    acquired.entry(scope).or_default();
                    continue;
                };
                match (status, str_field(&json, "owner_token")) {
                    (201, Some(token)) => acquired
                        .entry(scope)
                        .or_default()
                        .push((token.to_owned(), op)),
                    (200, _) => replays
                        .entry(scope)
                        .or_default()
                        .push((json["response"]["body"].clone(), op)),
                    _ => {}
                }
            }
            Request::CompleteClaim {
                operation,
                key,
                owner_token,
                outcome,
                response_body,
            } => {
                let scope = (op.tenant.as_str(), operation.as_str(), key.as_str());
                completions.entry(scope).or_default().push((
                    owner_token,
                    outcome,
                    response_body,
                    op,
                ));
            }
            Request::CreateOrder { .. } | Request::ReadOrder { .. } => {}
        }
    }
    ops
}

/// One claim scope: no completion from a fenced owner, one owner's final
/// completion at most, and every replay (and the final one) showing a body
/// that may have completed.
fn check_claim(
    scope: ClaimScope<'_>,
    ops: &ClaimOps<'_>,
    final_replay: Option<&ClaimReplay>,
    lost_claims: &Allowed,
    out: &mut Vec<Violation>,
) {
    let (_, operation, key) = scope;
    let acqs = ops.acquired.get(&scope).map(Vec::as_slice).unwrap_or(&[]);
    let comps = ops
        .completions
        .get(&scope)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    check_fenced_owners(scope, acqs, comps, out);
    let finals: Vec<&Completion<'_>> = comps
        .iter()
        .filter(|c| completion_acked(c.3) && FINAL_OUTCOMES.contains(&c.1))
        .collect();
    let tokens: BTreeSet<&str> = finals.iter().map(|c| c.0).collect();
    if tokens.len() > 1 {
        out.push(violation(
            Kind::FencedOwnerCompleted,
            format!(
                "claim {operation} {key:?}: {} owners' final completions acknowledged",
                tokens.len()
            ),
            finals.iter().map(|c| c.3.id).collect(),
        ));
    }
    let parse = |text: &str| serde_json::from_str::<Value>(text).ok();
    // What a replay may show: the acknowledged final completion if there is
    // one, else any final completion that was attempted and not refused
    // (no answer, or a 503 that may have executed).
    let unsettled = |o: &Outcome| o.answer().is_none() || o.may_have_executed();
    let allowed: Vec<(Option<Value>, u64)> = if finals.is_empty() {
        comps
            .iter()
            .filter(|c| FINAL_OUTCOMES.contains(&c.1) && unsettled(&c.3.outcome))
            .map(|c| (parse(c.2), c.3.id))
            .collect()
    } else {
        finals.iter().map(|c| (parse(c.2), c.3.id)).collect()
    };
    for (body, op) in ops.replays.get(&scope).map(Vec::as_slice).unwrap_or(&[]) {
        if !allowed.iter().any(|(b, _)| b.as_ref() == Some(body)) {
            out.push(violation(
                Kind::ReplayDiffers,
                format!("claim {operation} {key:?}: a replay shows a body never completed"),
                std::iter::once(op.id)
                    .chain(allowed.iter().map(|(_, id)| *id))
                    .collect(),
            ));
        }
    }
    let Some(r) = final_replay else {
        return;
    };
    let Some(first) = finals.first() else {
        return;
    };
    // A completion a failover lost: the new home holds the claim as it
    // was before, so the final claim may acquire it afresh.
    if lost_claims
        .claims
        .contains(&(scope.0.to_owned(), key.to_owned()))
    {
        return;
    }
    if r.status != 200 {
        out.push(violation(
            Kind::AckedMissing,
            format!(
                "claim {operation} {key:?}: completion acknowledged, a new claim answered {}",
                r.status
            ),
            vec![first.3.id],
        ));
    } else if !allowed
        .iter()
        .any(|(b, _)| b.as_ref() == Some(&r.body["response"]["body"]))
    {
        out.push(violation(
            Kind::ReplayDiffers,
            format!("claim {operation} {key:?}: the final replay differs from the completion"),
            vec![first.3.id],
        ));
    }
}

/// No completion acknowledged from a fenced owner: one whose claim another
/// owner had acquired, acknowledged, before the completion was sent.
fn check_fenced_owners(
    scope: ClaimScope<'_>,
    acqs: &[(String, &Op)],
    comps: &[Completion<'_>],
    out: &mut Vec<Violation>,
) {
    let (_, operation, key) = scope;
    for (token, _, _, op) in comps.iter().filter(|c| completion_acked(c.3)) {
        let Some((_, mine)) = acqs.iter().find(|(t, _)| t == token) else {
            continue;
        };
        // Another owner acquired after this one, acknowledged before this
        // completion was even sent: this owner was fenced.
        let taken_over = acqs.iter().find(|(t, other)| {
            t != token
                && other.invoked_ms >= mine.completed_ms
                && other.completed_ms < op.invoked_ms
        });
        if let Some((_, other)) = taken_over {
            out.push(violation(
                Kind::FencedOwnerCompleted,
                format!("claim {operation} {key:?}: completed by a fenced owner"),
                vec![mine.id, other.id, op.id],
            ));
        }
    }
}
