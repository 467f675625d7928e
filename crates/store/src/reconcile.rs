//! Reconciliation of a region after a failover away from it: the orphans and
//! the report.
//!
//! A failover promotes the standby's copy of this region's log up to a position;
//! the copy holds the same entries as this region's log up to the failover's
//! *cut* `at` (`Store::failover_cut`, at most that position), and whatever this
//! region's store applied after `at` for the tenants it lost never reached
//! their new home. Every value is stamped with the index of the log
//! entry that wrote it (`codec.rs`), so that suffix is found by reading: a record
//! whose stamp is above `at` was written (created, completed, extended) by an
//! entry the copy does not hold. Records, not orders, decide, because an order is
//! rewritten by its payment result (a later stamp) while its record is written
//! once, when the order is created; the order supplies what a person needs to
//! compensate it (client order id, creation time, whether it was charged).
//!
//! The report (`Reconciliation`) is stored by commands, so it is in the
//! region's log and survives a change of leader; the first one recorded for a
//! failover stays (a second leader that computed it again after the erasure
//! began would find fewer orphans). A full report (`RECONCILIATION_ORPHANS_MAX`
//! orphans) is tens of megabytes, more than a log entry holds, so its orphans
//! go in pages of `RECONCILIATION_PAGE_BYTES_MAX` (`StageOrphans`, one command
//! each), and the report is recorded by a last command that lists the pages
//! (`RecordReport`, the commit point: until it, no report is recorded, and
//! another pass stages its pages over these). Reports recorded whole by the
//! single command of earlier releases (`RecordReconciliation`) are read as
//! they were.

use crate::codec::decode;
use crate::keys;
use crate::limits::{RECONCILIATION_ORPHANS_MAX, RECONCILIATION_PAGE_BYTES_MAX};
use crate::overlay::{Changes, View};
use crate::{Error, Store};
use keyhold_core::{Order, OrderStatus, Record, TenantId, UnixMillis};
use serde::{Deserialize, Serialize};

/// What an orphan's record was written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrphanKind {
    Order,
    Claim,
}

impl OrphanKind {
    /// The contract's name of the kind (`"order"` | `"claim"`).
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanKind::Order => "order",
            OrphanKind::Claim => "claim",
        }
    }
}

/// One record this region acknowledged after the failover's position: the new
/// home never received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    pub tenant_id: TenantId,
    pub kind: OrphanKind,
    pub idempotency_key: String,
    /// The order created (orders); `None` for a claim.
    pub order_id: Option<String>,
    pub client_order_id: Option<String>,
    /// The order's creation (orders) or the claim record's.
    pub created_at: UnixMillis,
    /// This region's payments consumer charged the order (its result is on the
    /// order, written with its processed-message entry in one command).
    pub charged: bool,
    /// The order the new home holds under the same client order id (a client's
    /// retry there); filled by the caller, which asks the new home.
    pub duplicate_of: Option<String>,
}

/// The reconciliation of one failover away from this region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// The failover operation.
    pub operation_id: String,
    /// The failover's cut: this region's log and the promoted copy hold the
    /// same entries up to it (`Store::failover_cut`).
    pub at: u64,
    /// The tenants the failover re-homed away from this region.
    pub tenants: Vec<TenantId>,
    /// At most `RECONCILIATION_ORPHANS_MAX`, oldest first.
    pub orphans: Vec<Orphan>,
    /// Orphans found beyond that limit, not listed.
    pub omitted: u64,
    /// The lost tenants' data has been erased from this store.
    pub done: bool,
}

/// A report recorded in pages (`Command::RecordReport`), as stored: the
/// report without its orphans, which are in `pages` pages
/// (`keys::report_page`), `listed` in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReportHead {
    pub operation_id: String,
    pub at: u64,
    pub tenants: Vec<TenantId>,
    pub pages: u32,
    pub listed: u64,
    pub omitted: u64,
    pub done: bool,
}

impl ReportHead {
    pub fn new(report: &Reconciliation, pages: u32, listed: u64) -> ReportHead {
        ReportHead {
            operation_id: report.operation_id.clone(),
            at: report.at,
            tenants: report.tenants.clone(),
            pages,
            listed,
            omitted: report.omitted,
            done: report.done,
        }
    }

    /// The report with `orphans`, its pages read.
    fn report(&self, orphans: Vec<Orphan>) -> Reconciliation {
        Reconciliation {
            operation_id: self.operation_id.clone(),
            at: self.at,
            tenants: self.tenants.clone(),
            orphans,
            omitted: self.omitted,
            done: self.done,
        }
    }
}

/// The orphans of the first `pages` pages staged for `operation_id`, or the
/// first page missing.
pub(crate) fn staged(
    view: &View<'_>,
    operation_id: &str,
    pages: u32,
) -> Result<Result<Vec<Orphan>, u32>, Error> {
    let mut orphans = Vec::new();
    for page in 0..pages {
        match view.get::<Vec<Orphan>>(&keys::report_page(operation_id, page))? {
            Some(listed) => orphans.extend(listed),
            None => return Ok(Err(page)),
        }
    }
    Ok(Ok(orphans))
}

/// `head`'s report with its orphans.
pub(crate) fn with_orphans(view: &View<'_>, head: &ReportHead) -> Result<Reconciliation, Error> {
    match staged(view, &head.operation_id, head.pages)? {
        Ok(orphans) if orphans.len() as u64 == head.listed => Ok(head.report(orphans)),
        _ => Err(Error::Corrupt(format!(
            "the recorded report of failover {} lacks orphans of its {} pages",
            head.operation_id, head.pages
        ))),
    }
}

/// The report recorded for `operation_id` (in pages, or whole by an earlier
/// release), with its orphans.
pub(crate) fn recorded(
    view: &View<'_>,
    operation_id: &str,
) -> Result<Option<Reconciliation>, Error> {
    if let Some(head) = view.get::<ReportHead>(&keys::report(operation_id))? {
        return Ok(Some(with_orphans(view, &head)?));
    }
    view.get(&keys::reconciliation(operation_id))
}

/// `orphans` in pages of at most `RECONCILIATION_PAGE_BYTES_MAX` encoded bytes
/// (a larger orphan alone), in order; no orphans make no page.
pub(crate) fn pages(orphans: Vec<Orphan>) -> Vec<Vec<Orphan>> {
    let mut pages: Vec<Vec<Orphan>> = Vec::new();
    let mut bytes = 0usize;
    for orphan in orphans {
        let size = keyhold_raftlog::codec::encoded_len(&orphan).expect("an orphan encodes");
        match pages.last_mut() {
            Some(page) if bytes + size <= RECONCILIATION_PAGE_BYTES_MAX => {
                bytes += size;
                page.push(orphan);
            }
            _ => {
                bytes = size;
                pages.push(vec![orphan]);
            }
        }
    }
    pages
}

/// The mark that a failover took a tenant away from this region
/// (`Command::MarkLost`), stamped with the log index that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostTenant {
    /// The failover.
    pub operation_id: String,
    /// Its cut (`Reconciliation::at`).
    pub at: u64,
}

/// Whose an outbox event is to take effect for, by the marks of its tenant.
/// An event written before a mark (by a lower log index) belongs to the
/// earliest such mark's failover: the copy it promoted held the event when
/// the event's index is at or below that failover's `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// This store's consumers take its effects.
    Ours,
    /// The failover carried it to the tenant's new home, whose consumers
    /// take its effects; here it is settled without any.
    Carried,
    /// The failover lost it with its order (an orphan): no consumer takes a
    /// new effect for it; its payment is only looked up at the provider, so
    /// that the orphan's `charged` says what an earlier attempt did.
    Orphan,
}

impl Disposition {
    /// The disposition of an event written at log index `written` for a
    /// tenant with `marks` (each with the index that wrote it).
    pub(crate) fn of(written: u64, marks: impl IntoIterator<Item = (LostTenant, u64)>) -> Self {
        let first_after = marks
            .into_iter()
            .filter(|(_, marked)| *marked > written)
            .min_by_key(|(_, marked)| *marked);
        match first_after {
            None => Disposition::Ours,
            Some((mark, _)) if written <= mark.at => Disposition::Carried,
            Some(_) => Disposition::Orphan,
        }
    }
}

/// Every record of `tenants` written by a log entry above `at`, oldest first
/// (by creation, then tenant and key), at most `RECONCILIATION_ORPHANS_MAX`,
/// and how many more there were.
pub(crate) fn orphans(
    tree: &sled::Tree,
    tenants: &[TenantId],
    at: u64,
) -> Result<(Vec<Orphan>, u64), Error> {
    let mut out = Vec::new();
    for tenant in tenants {
        for (namespace, kind) in [(b'o', OrphanKind::Order), (b'c', OrphanKind::Claim)] {
            let mut prefix = vec![keys::RECORD, namespace];
            prefix.extend_from_slice(tenant.as_str().as_bytes());
            prefix.push(0);
            for item in tree.scan_prefix(&prefix) {
                let (key, value) = item?;
                let (record, stamp) = decode::<Record>(&value)?;
                if stamp <= at {
                    continue;
                }
                // `operation ++ 0 ++ idempotency key` follows the prefix.
                let rest = &key[prefix.len()..];
                let idempotency_key = rest
                    .iter()
                    .position(|&b| b == 0)
                    .map(|i| String::from_utf8_lossy(&rest[i + 1..]).into_owned())
                    .ok_or_else(|| Error::Corrupt("record key without a scope key".into()))?;
                out.push(orphan(tree, tenant, kind, idempotency_key, &record)?);
            }
        }
    }
    out.sort_by(|a, b| {
        (a.created_at, a.tenant_id.as_str(), &a.idempotency_key).cmp(&(
            b.created_at,
            b.tenant_id.as_str(),
            &b.idempotency_key,
        ))
    });
    let omitted = out.len().saturating_sub(RECONCILIATION_ORPHANS_MAX) as u64;
    out.truncate(RECONCILIATION_ORPHANS_MAX);
    Ok((out, omitted))
}

fn orphan(
    tree: &sled::Tree,
    tenant: &TenantId,
    kind: OrphanKind,
    idempotency_key: String,
    record: &Record,
) -> Result<Orphan, Error> {
    let mut orphan = Orphan {
        tenant_id: tenant.clone(),
        kind,
        idempotency_key,
        order_id: None,
        client_order_id: None,
        created_at: record.created_at,
        charged: false,
        duplicate_of: None,
    };
    if kind == OrphanKind::Order {
        orphan.order_id = record.resource_id.clone();
        let order = match &record.resource_id {
            Some(id) => tree.get(keys::order(id))?,
            None => None,
        };
        if let Some(bytes) = order {
            let order: Order = decode(&bytes)?.0;
            orphan.client_order_id = Some(order.request.client_order_id);
            orphan.created_at = order.created_at;
            orphan.charged = order.status == OrderStatus::Paid;
        }
    }
    Ok(orphan)
}

impl Store {
    /// The orphans of a failover at `at` that re-homed `tenants` away from this
    /// region: every record of theirs this store holds that a log entry above
    /// `at` wrote (see the module's doc), oldest first, with how many were left
    /// out beyond `RECONCILIATION_ORPHANS_MAX`.
    pub fn orphans(&self, tenants: &[TenantId], at: u64) -> Result<(Vec<Orphan>, u64), Error> {
        orphans(self.inner.machine_tree(), tenants, at)
    }

    /// The cut of a failover whose promoted copy of this region had `tail`:
    /// the last log index up to which the copy holds the same entries as this
    /// store applied (`LogTail::agreement` against the leaders this store
    /// recorded), so every record stamped above it is an orphan. Below the
    /// copy's `tail.last` wherever a leader the copy never heard from
    /// rewrote the copy's unconfirmed entries here. The same on every call
    /// for the lost tenants, whose records all precede their fence.
    pub fn failover_cut(&self, tail: &keyhold_raftlog::LogTail) -> Result<u64, Error> {
        let machine = self.inner.group.state_machine();
        let applied = machine.applied_index()?;
        let runs = machine.leader_runs(tail.committed + 1, tail.last.min(applied))?;
        Ok(tail.agreement(&runs, applied))
    }

    /// The stored reconciliation of the failover `operation_id`, if recorded.
    pub fn reconciliation(&self, operation_id: &str) -> Result<Option<Reconciliation>, Error> {
        recorded(&self.inner.machine.view(&Changes::default()), operation_id)
    }

    /// True once the failover `operation_id`'s loss of `tenant` is marked
    /// (`Command::MarkLost`).
    pub fn lost_marked(&self, tenant: &TenantId, operation_id: &str) -> Result<bool, Error> {
        Ok(self
            .inner
            .machine
            .get::<LostTenant>(&keys::lost(tenant, operation_id))?
            .is_some())
    }

    /// Whose `event` (read from this store's outbox) is to take effect for;
    /// `Ours` when it is no longer in the outbox.
    pub fn disposition(&self, event: &crate::OutboxEvent) -> Result<Disposition, Error> {
        self.inner.machine.disposition(event.seq, &event.event_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_common::{open, scope, tenant_order, T0};
    use crate::{Command, Rejection};
    use keyhold_core::scope::Namespace;
    use keyhold_core::Policy;

    const POLICY: Policy = Policy {
        response_ttl_ms: 3_600_000,
        marker_ttl_ms: 86_400_000,
        processed_ttl_ms: 172_800_000,
        inflight_wait_ms: 1_000,
    };

    fn t(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    fn applied_index(store: &Store) -> u64 {
        let metrics = store.group().raft().metrics().borrow().clone();
        metrics.last_applied.map_or(0, |l| l.index)
    }

    async fn pay(store: &Store, order_id: &str, paid: bool) {
        store
            .consume_payment(
                format!("evt_{order_id}"),
                order_id.to_owned(),
                format!("ch_{order_id}"),
                paid,
                T0,
                &POLICY,
            )
            .await
            .unwrap();
    }

    /// Orders and claims written after `at` are orphans, with what a person
    /// needs to compensate them; an order created before `at` is not one, even
    /// when its payment result (a rewrite of the order) came after `at`; a
    /// tenant the failover did not re-home is not read.
    #[tokio::test]
    async fn the_orphans_are_the_records_written_after_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        store.execute(tenant_order("t1", 1)).await.unwrap();
        store.execute(tenant_order("t1", 2)).await.unwrap();
        let at = applied_index(&store);
        // Written after `at`: the payment of order 1 (created before),
        // orders 3 (charged), 4 (payment failed) and 5 (not charged), a claim,
        // and an order of a tenant that stays.
        pay(&store, "ord_t1_000000000001", true).await;
        for n in 3..=5 {
            store.execute(tenant_order("t1", n)).await.unwrap();
        }
        pay(&store, "ord_t1_000000000003", true).await;
        pay(&store, "ord_t1_000000000004", false).await;
        let job = scope(Namespace::Claims, "job-1");
        store
            .claim(job, "fp".into(), 1_000, 7, T0.plus_ms(10), &POLICY)
            .await
            .unwrap();
        store.execute(tenant_order("t2", 1)).await.unwrap();

        let (orphans, omitted) = store.orphans(&[t("t1")], at).unwrap();
        assert_eq!(omitted, 0);
        let listed: Vec<_> = orphans
            .iter()
            .map(|o| (o.kind, o.idempotency_key.as_str(), o.charged))
            .collect();
        assert_eq!(
            listed,
            vec![
                (OrphanKind::Order, "key-t1-3", true),
                (OrphanKind::Order, "key-t1-4", false),
                (OrphanKind::Order, "key-t1-5", false),
                (OrphanKind::Claim, "job-1", false),
            ]
        );
        let third = &orphans[0];
        assert_eq!(third.tenant_id, t("t1"));
        assert_eq!(third.order_id.as_deref(), Some("ord_t1_000000000003"));
        assert_eq!(third.client_order_id.as_deref(), Some("client-t1-3"));
        assert_eq!(third.created_at, T0.plus_ms(3));
        assert_eq!(third.duplicate_of, None);
        let claim = &orphans[3];
        assert_eq!(
            (claim.order_id.as_ref(), claim.client_order_id.as_ref()),
            (None, None)
        );
        assert_eq!(claim.created_at, T0.plus_ms(10));

        // The new home answers `duplicate_of` from its marker by client order id.
        let by_marker = store.order_id_by_marker(&t("t1"), "client-t1-3").await;
        assert_eq!(by_marker.unwrap().as_deref(), Some("ord_t1_000000000003"));
        let unknown = store.order_id_by_marker(&t("t1"), "client-t1-9").await;
        assert_eq!(unknown.unwrap(), None);

        // At the last position nothing is an orphan; at 0 every record is.
        let (none, _) = store.orphans(&[t("t1")], applied_index(&store)).unwrap();
        assert!(none.is_empty(), "{none:?}");
        let (all, _) = store.orphans(&[t("t1"), t("t2")], 0).unwrap();
        assert_eq!(all.len(), 7);
    }

    /// The largest orphan: the longest idempotency key, ids and client order
    /// id the API accepts.
    fn largest_orphan(n: usize) -> Orphan {
        let id = |prefix: &str| format!("{prefix}{n:0>60}");
        Orphan {
            tenant_id: t(&format!("tenant-{:0>57}", n % 7)),
            kind: OrphanKind::Order,
            idempotency_key: format!("{n:0>255}"),
            order_id: Some(id("ord_")),
            client_order_id: Some(format!("{n:0>64}")),
            created_at: T0,
            charged: true,
            duplicate_of: Some(id("ord_")),
        }
    }

    /// A report of `RECONCILIATION_ORPHANS_MAX` orphans of the largest size
    /// (over 40 MB, more than any log entry may hold) is recorded in pages, a
    /// command each, every entry within `ENTRY_BYTES_MAX`, and reads back
    /// whole, before and after finishing and a reopen. Before, it was one
    /// command: an entry of that size no member could take. A second pass
    /// with other orphans changes nothing, and a page staged by an earlier
    /// pass beyond the report's pages is dropped. A report recorded whole,
    /// as earlier releases did (`RecordReconciliation`), still reads and
    /// finishes.
    #[tokio::test]
    async fn a_maximal_report_is_recorded_in_pages_and_reads_back_whole() {
        use crate::limits::{ENTRY_BYTES_MAX, RECONCILIATION_PAGE_BYTES_MAX};
        let dir = tempfile::tempdir().unwrap();
        let orphans: Vec<Orphan> = (0..RECONCILIATION_ORPHANS_MAX)
            .map(largest_orphan)
            .collect();
        let bytes: usize = orphans
            .iter()
            .map(|o| keyhold_raftlog::codec::encoded_len(o).unwrap())
            .sum();
        assert!(bytes > 5 * ENTRY_BYTES_MAX, "{bytes} bytes of orphans");
        let report = Reconciliation {
            operation_id: "op_big".into(),
            at: 7,
            tenants: vec![t("t1")],
            orphans,
            omitted: 12,
            done: false,
        };
        let pages = bytes.div_ceil(RECONCILIATION_PAGE_BYTES_MAX) as u64;
        {
            let store = open(dir.path()).await;
            // A page of an earlier pass, beyond the pages of this one.
            let stale = Command::StageOrphans {
                operation_id: "op_big".into(),
                page: 999,
                orphans: vec![largest_orphan(0)],
            };
            store.execute(stale).await.unwrap();
            let before = store.group().stats().commands();
            let stored = store.record_reconciliation(report.clone()).await.unwrap();
            let commands = store.group().stats().commands() - before;
            assert!(stored == report, "the answer is the whole report");
            assert!(
                commands > pages && commands <= pages + 2,
                "{commands} commands for {pages} pages of orphans"
            );
            let again = Reconciliation {
                orphans: vec![largest_orphan(1)],
                ..report.clone()
            };
            assert!(store.record_reconciliation(again).await.unwrap() == report);
            let page = keys::report_page("op_big", 999);
            assert!(store.inner.machine.tree().get(page).unwrap().is_none());
            let done = store.finish_reconciliation("op_big".into()).await.unwrap();
            assert!(done.done && done.orphans == report.orphans);
            // A report recorded whole by an earlier release.
            let whole = Reconciliation {
                operation_id: "op_old".into(),
                orphans: report.orphans[..3].to_vec(),
                ..report.clone()
            };
            let old = Command::RecordReconciliation {
                reconciliation: Box::new(whole.clone()),
            };
            store.execute(old).await.unwrap();
            assert!(store.reconciliation("op_old").unwrap() == Some(whole.clone()));
            let done = store.finish_reconciliation("op_old".into()).await.unwrap();
            assert!(done.done && done.orphans == whole.orphans);
            store.shutdown().await.unwrap();
        }
        let store = open(dir.path()).await;
        let kept = store.reconciliation("op_big").unwrap().unwrap();
        assert!(kept.done && kept.orphans == report.orphans && kept.omitted == 12);
        assert!(store.reconciliation("op_old").unwrap().unwrap().done);
    }

    /// The first report recorded for a failover stays (a later leader's, read
    /// after part of the data was erased, does not replace it); finishing it
    /// marks it done; both survive a reopen. Finishing an unknown one is refused.
    #[tokio::test]
    async fn the_first_report_stays_and_is_finished_once() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path()).await;
            store.execute(tenant_order("t1", 1)).await.unwrap();
            let (orphans, omitted) = store.orphans(&[t("t1")], 0).unwrap();
            let report = Reconciliation {
                operation_id: "op_f".into(),
                at: 0,
                tenants: vec![t("t1")],
                orphans,
                omitted,
                done: false,
            };
            let stored = store.record_reconciliation(report.clone()).await.unwrap();
            assert_eq!(stored, report);
            let later = Reconciliation {
                orphans: vec![],
                ..report.clone()
            };
            let again = store.record_reconciliation(later).await.unwrap();
            assert_eq!(again, report);
            let done = store.finish_reconciliation("op_f".into()).await.unwrap();
            assert!(done.done && done.orphans.len() == 1, "{done:?}");
            let unknown = store.finish_reconciliation("op_x".into()).await;
            assert!(
                matches!(
                    unknown,
                    Err(Error::Rejected(Rejection::UnknownReconciliation { .. }))
                ),
                "{unknown:?}"
            );
            store.shutdown().await.unwrap();
        }
        let store = open(dir.path()).await;
        let kept = store.reconciliation("op_f").unwrap().unwrap();
        assert!(kept.done && kept.orphans.len() == 1, "{kept:?}");
        assert_eq!(store.reconciliation("op_x").unwrap(), None);
        // The command replays to the same answer.
        let replay = Command::FinishReconciliation {
            operation_id: "op_f".into(),
        };
        store.execute(replay).await.unwrap();
        assert_eq!(store.reconciliation("op_f").unwrap().unwrap(), kept);
    }

    /// Whose an event is, by the index that wrote it: a mark written before
    /// it (the tenant came back) leaves it this store's; the earliest mark
    /// after it decides between carried (at or below that failover's `at`)
    /// and orphan.
    #[test]
    fn an_event_belongs_to_the_first_loss_marked_after_it() {
        let mark = |at: u64, marked: u64| {
            (
                LostTenant {
                    operation_id: format!("op_{marked}"),
                    at,
                },
                marked,
            )
        };
        assert_eq!(Disposition::of(10, []), Disposition::Ours);
        assert_eq!(Disposition::of(10, [mark(10, 20)]), Disposition::Carried);
        assert_eq!(Disposition::of(11, [mark(10, 20)]), Disposition::Orphan);
        assert_eq!(Disposition::of(21, [mark(10, 20)]), Disposition::Ours);
        // Lost, moved back, lost again: the second loss owns what came after
        // the first mark.
        let both = [mark(40, 50), mark(10, 20)];
        assert_eq!(Disposition::of(15, both.clone()), Disposition::Orphan);
        assert_eq!(Disposition::of(30, both.clone()), Disposition::Carried);
        assert_eq!(Disposition::of(45, both.clone()), Disposition::Orphan);
        assert_eq!(Disposition::of(55, both), Disposition::Ours);
    }

    /// Issue 12: once a failover's loss of a tenant is marked, the store's
    /// consumers take no effect for an event of the tenant written before
    /// the mark, as a value (`NotOurs`) that lets the cursor move on: the
    /// carried event (in the copy at `at`) reserves and records nothing, the
    /// orphan's reserves nothing and records only a payment the relay looked
    /// up. Another tenant's event, and the tenant's own after the mark (back
    /// home), take effect as before. The first mark of a failover stays.
    #[tokio::test]
    async fn a_lost_tenants_events_take_no_effect_here() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        store.execute(tenant_order("t1", 1)).await.unwrap();
        let at = applied_index(&store);
        store.execute(tenant_order("t1", 2)).await.unwrap();
        store.execute(tenant_order("t2", 1)).await.unwrap();
        let unmarked = store.outbox_after_disposed(0, 10).await.unwrap();
        assert!(
            unmarked.iter().all(|(_, d)| *d == Disposition::Ours),
            "no loss marked yet: every event is ours"
        );
        let mark = store.mark_lost(t("t1"), "op_f".into(), at).await.unwrap();
        assert_eq!(mark.at, at);
        let again = store.mark_lost(t("t1"), "op_f".into(), at + 5).await;
        assert_eq!(again.unwrap(), mark, "the first mark stays");
        assert!(store.lost_marked(&t("t1"), "op_f").unwrap());
        assert!(!store.lost_marked(&t("t2"), "op_f").unwrap());
        store.execute(tenant_order("t1", 3)).await.unwrap();

        let events = store.outbox_after(0, 10).await.unwrap();
        let order_ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
        assert_eq!(
            order_ids,
            [
                "ord_t1_000000000001",
                "ord_t1_000000000002",
                "ord_t2_000000000001",
                "ord_t1_000000000003"
            ]
        );
        let dispositions: Vec<Disposition> = events
            .iter()
            .map(|e| store.disposition(e).unwrap())
            .collect();
        use Disposition::{Carried, Orphan, Ours};
        assert_eq!(dispositions, [Carried, Orphan, Ours, Ours]);
        // The relay's read says the same, from one pass over the outbox.
        let disposed = store.outbox_after_disposed(0, 10).await.unwrap();
        assert_eq!(
            disposed,
            events
                .iter()
                .cloned()
                .zip(dispositions.iter().copied())
                .collect::<Vec<_>>()
        );
        let after_first = store.outbox_after_disposed(1, 10).await.unwrap();
        assert_eq!(after_first.len(), 3);
        assert_eq!(after_first[0].1, Orphan);

        let inventory = reserve_all(&events);
        let cursor = crate::Cursor {
            seq: 4,
            generation: 0,
        };
        let done = store
            .consume_inventory_batch(inventory, Some(cursor), T0, &POLICY)
            .await
            .unwrap();
        use crate::ConsumeOutcome::{Applied, NotOurs};
        assert_eq!(
            done.events,
            [Ok(NotOurs), Ok(NotOurs), Ok(Applied), Ok(Applied)]
        );
        assert_eq!(store.cursor(crate::Consumer::Inventory).await.unwrap(), 4);
        let reserved: Vec<usize> = reservation_counts(&store, &order_ids).await;
        assert_eq!(reserved, [0, 0, 1, 1]);

        let payments = events
            .iter()
            .map(|e| crate::PaymentEffect {
                seq: e.seq,
                event_id: e.event_id.clone(),
                order_id: e.order_id.clone(),
                charge_id: format!("ch_{}", e.order_id),
                paid: true,
            })
            .collect();
        let done = store
            .consume_payment_batch(payments, Some(cursor), T0, &POLICY)
            .await
            .unwrap();
        assert_eq!(
            done.events,
            [Ok(NotOurs), Ok(Applied), Ok(Applied), Ok(Applied)]
        );
        assert_eq!(store.cursor(crate::Consumer::Payments).await.unwrap(), 4);
        let processed = store
            .is_processed(crate::Consumer::Payments, &events[0].event_id)
            .await
            .unwrap();
        assert!(!processed, "the carried event is the new home's");
        let (orphans, _) = store.orphans(&[t("t1")], at).unwrap();
        let charged: Vec<bool> = orphans.iter().map(|o| o.charged).collect();
        // Order 2, looked up as charged before the loss; order 3 is the
        // tenant's again (written after the mark) and charged here.
        assert_eq!(charged, [true, true]);
    }

    /// The inventory effect of each of `events`.
    fn reserve_all(events: &[crate::OutboxEvent]) -> Vec<crate::InventoryEffect> {
        events
            .iter()
            .map(|e| crate::InventoryEffect {
                seq: e.seq,
                event_id: e.event_id.clone(),
                order_id: e.order_id.clone(),
                items: vec![keyhold_core::Item {
                    sku: "sku-1".into(),
                    quantity: 1,
                }],
            })
            .collect()
    }

    /// A reservation this region made after the copy's position for an event
    /// the copy held is released once the loss is marked (the new home made
    /// it again); one made before the position (the copy had it handled, the
    /// new home made none), an orphan's, and another tenant's stay.
    #[tokio::test]
    async fn the_reservations_the_new_home_made_again_are_released() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        store.execute(tenant_order("t1", 1)).await.unwrap();
        let first = store.outbox_after(0, 10).await.unwrap();
        reserve_here(&store, &first).await;
        store.execute(tenant_order("t1", 2)).await.unwrap();
        store.execute(tenant_order("t2", 1)).await.unwrap();
        let at = applied_index(&store);
        // In the lease's last moments: handled here, not in the copy.
        store.execute(tenant_order("t1", 3)).await.unwrap();
        let rest = store.outbox_after(1, 10).await.unwrap();
        reserve_here(&store, &rest).await;
        let orders = [
            "ord_t1_000000000001",
            "ord_t1_000000000002",
            "ord_t2_000000000001",
            "ord_t1_000000000003",
        ];
        assert_eq!(reservation_counts(&store, &orders).await, [1, 1, 1, 1]);

        let unmarked = store
            .release_carried_reservations(t("t1"), "op_f".into(), 10)
            .await
            .unwrap();
        assert_eq!((unmarked.entries, unmarked.more), (0, false));
        store.mark_lost(t("t1"), "op_f".into(), at).await.unwrap();
        let released = store
            .release_carried_reservations(t("t1"), "op_f".into(), 10)
            .await
            .unwrap();
        assert_eq!((released.entries, released.more), (1, false));
        assert_eq!(reservation_counts(&store, &orders).await, [1, 0, 1, 1]);
        let again = store
            .release_carried_reservations(t("t1"), "op_f".into(), 10)
            .await
            .unwrap();
        assert_eq!(again.entries, 0);
        let processed = store
            .is_processed(crate::Consumer::Inventory, "evt_ord_t1_000000000002")
            .await
            .unwrap();
        assert!(processed, "nothing reserves it here again");
    }

    /// Reserves each of `events` here, as the inventory relay would.
    async fn reserve_here(store: &Store, events: &[crate::OutboxEvent]) {
        let inventory = reserve_all(events);
        let round = store.consume_inventory_batch(inventory, None, T0, &POLICY);
        round.await.unwrap();
    }

    /// How many reservations each order has.
    async fn reservation_counts(store: &Store, order_ids: &[&str]) -> Vec<usize> {
        let mut out = Vec::new();
        for id in order_ids {
            out.push(store.reservations(id).await.unwrap().len());
        }
        out
    }
}
