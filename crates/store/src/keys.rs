//! The key layout of the region tree. One sled tree holds everything, each kind
//! of entry under its own one-byte prefix, so that one `apply_batch` writes a
//! command's order, record, marker, outbox event and index entries atomically.

use crate::consumer::Consumer;
use keyhold_core::{Scope, TenantId, UnixMillis};

pub const RECORD: u8 = b'r';
pub const ORDER: u8 = b'o';
pub const MARKER: u8 = b'm';
/// `(tenant, client_order_id) -> order_id`, kept as long as the order.
pub const ORDER_INDEX: u8 = b'i';
pub const OUTBOX: u8 = b'x';
/// `expires_at (big-endian) ++ kind ++ primary key -> ()`: the sweeper walks it in
/// time order. It indexes the processed entries of single-event commands, and
/// the records and markers written by releases before the sweeper scanned for
/// them (`Command::SweepKeys`); outbox events and their processed entries are
/// swept by walking the outbox (entries of older releases still point at
/// events and are dropped as stale).
pub const EXPIRY: u8 = b'e';
/// `consumer ++ 0 ++ event_id -> Processed`.
pub const PROCESSED: u8 = b'p';
/// `order_id ++ 0 ++ line (big-endian) -> Reservation`.
pub const RESERVATION: u8 = b'v';
/// The change index of a tenant whose move is copying it:
/// `tenant ++ 0 ++ changed key -> ()`, one entry per key written or deleted
/// since the move's first pass began (see `Command::TrackChanges`).
pub const CHANGE: u8 = b'k';
/// Meta entries (outbox sequence, cursors, fences) live under `s`.
pub const META_PREFIX: u8 = b's';
pub const META_OUTBOX_SEQ: &[u8] = b"soutbox_seq";
/// How far the region's standby copy holds the log (`Command::StandbyMatched`).
pub const META_STANDBY_MATCHED: &[u8] = b"sstandby_matched";

fn prefixed(prefix: u8, parts: &[&[u8]]) -> Vec<u8> {
    let len = 1 + parts.iter().map(|p| p.len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.push(prefix);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(part);
    }
    out
}

pub fn record(scope: &Scope) -> Vec<u8> {
    prefixed(RECORD, &[&scope.storage_key()])
}

pub fn order(order_id: &str) -> Vec<u8> {
    prefixed(ORDER, &[order_id.as_bytes()])
}

pub fn marker(tenant: &TenantId, client_order_id: &str) -> Vec<u8> {
    prefixed(
        MARKER,
        &[tenant.as_str().as_bytes(), client_order_id.as_bytes()],
    )
}

pub fn order_index(tenant: &TenantId, client_order_id: &str) -> Vec<u8> {
    prefixed(
        ORDER_INDEX,
        &[tenant.as_str().as_bytes(), client_order_id.as_bytes()],
    )
}

pub fn outbox(seq: u64) -> Vec<u8> {
    prefixed(OUTBOX, &[&seq.to_be_bytes()])
}

pub fn processed(consumer: Consumer, event_id: &str) -> Vec<u8> {
    prefixed(
        PROCESSED,
        &[consumer.as_str().as_bytes(), event_id.as_bytes()],
    )
}

pub fn reservation(order_id: &str, line: u32) -> Vec<u8> {
    prefixed(RESERVATION, &[order_id.as_bytes(), &line.to_be_bytes()])
}

/// Prefix of every reservation of one order.
pub fn reservations_of(order_id: &str) -> Vec<u8> {
    let mut key = prefixed(RESERVATION, &[order_id.as_bytes()]);
    key.push(0);
    key
}

/// The sequence number of a tenant's newest outbox event.
pub fn tenant_last_event(tenant: &TenantId) -> Vec<u8> {
    let mut key = b"slast_event:".to_vec();
    key.extend_from_slice(tenant.as_str().as_bytes());
    key
}

/// Prefix of the events a failover imported (`Command::ImportEvents`), by id.
pub const IMPORTED_EVENT_PREFIX: &[u8] = b"simported_event:";

/// Present once the event `event_id` was imported by a failover: its
/// sequence number here, or 0 while it is held (`held_event`).
pub fn imported_event(event_id: &str) -> Vec<u8> {
    let mut key = IMPORTED_EVENT_PREFIX.to_vec();
    key.extend_from_slice(event_id.as_bytes());
    key
}

/// Prefix of the events a failover carried that wait for the failover to be
/// done (`Command::ImportEvents`, released by `Command::OwnImported`).
pub const HELD_EVENT_PREFIX: &[u8] = b"sheld_event:";

/// Prefix of one tenant's held events.
pub fn held_events_of(tenant: &TenantId) -> Vec<u8> {
    let mut key = HELD_EVENT_PREFIX.to_vec();
    key.extend_from_slice(tenant.as_str().as_bytes());
    key.push(0);
    key
}

/// A held event of `tenant`, by its sequence number in the failed region's
/// outbox (so a tenant's held events keep that region's order).
pub fn held_event(tenant: &TenantId, source_seq: u64) -> Vec<u8> {
    let mut key = held_events_of(tenant);
    key.extend_from_slice(&source_seq.to_be_bytes());
    key
}

/// Prefix of the marks of tenants a failover took away from this region
/// (`Command::MarkLost`).
pub const LOST_PREFIX: &[u8] = b"slost:";

/// Prefix of `tenant`'s marks of `lost`.
pub fn lost_of(tenant: &TenantId) -> Vec<u8> {
    let mut key = LOST_PREFIX.to_vec();
    key.extend_from_slice(tenant.as_str().as_bytes());
    key.push(0);
    key
}

/// The mark that the failover `operation_id` took `tenant` away from this
/// region.
pub fn lost(tenant: &TenantId, operation_id: &str) -> Vec<u8> {
    let mut key = lost_of(tenant);
    key.extend_from_slice(operation_id.as_bytes());
    key
}

/// Prefix of the tenants' guards (`TenantGuard`).
pub const GUARD_PREFIX: &[u8] = b"sguard:";

/// The tenant's guard: where this store stands with it, by epoch.
pub fn guard(tenant: &TenantId) -> Vec<u8> {
    let mut key = GUARD_PREFIX.to_vec();
    key.extend_from_slice(tenant.as_str().as_bytes());
    key
}

/// The newest driver generation that imported the tenant under its
/// `Importing` guard (`Command::ImportPage`), kept beside the guard, whose
/// stored form older releases wrote and read, and dropped with it.
pub fn import_driver(tenant: &TenantId) -> Vec<u8> {
    let mut key = b"simport_driver:".to_vec();
    key.extend_from_slice(tenant.as_str().as_bytes());
    key
}

/// Prefix of the tenants whose changes are tracked (`Tracking`).
pub const TRACKING_PREFIX: &[u8] = b"strack:";

/// Present while the tenant's changes are tracked for a move.
pub fn tracking(tenant: &[u8]) -> Vec<u8> {
    let mut key = TRACKING_PREFIX.to_vec();
    key.extend_from_slice(tenant);
    key
}

/// Prefix of one tenant's change index.
pub fn changes_of(tenant: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + tenant.len());
    key.push(CHANGE);
    key.extend_from_slice(tenant);
    key.push(0);
    key
}

/// The change index entry saying `changed` (a full key) of `tenant` changed.
pub fn change(tenant: &[u8], changed: &[u8]) -> Vec<u8> {
    let mut key = changes_of(tenant);
    key.extend_from_slice(changed);
    key
}

/// Prefix of the fences of stores written before guards existed (`sfence:`
/// and the tenant), each rewritten as the guard it stands for when the store
/// opens or installs a snapshot (`Machine::migrate_legacy_fences`).
pub const LEGACY_FENCE_PREFIX: &[u8] = b"sfence:";

/// The guard key of the same tenant as a pre-guard fence key (`None` for
/// any other key).
pub fn guard_of_legacy_fence(key: &[u8]) -> Option<Vec<u8>> {
    let tenant = key.strip_prefix(LEGACY_FENCE_PREFIX)?;
    let mut guard = GUARD_PREFIX.to_vec();
    guard.extend_from_slice(tenant);
    Some(guard)
}

/// The tenant part of a record, marker or order-index key (`None` for others).
pub fn tenant_of(key: &[u8]) -> Option<&[u8]> {
    let rest = match key.first()? {
        &RECORD => key.get(2..)?,
        &MARKER | &ORDER_INDEX => key.get(1..)?,
        _ => return None,
    };
    rest.split(|&b| b == 0).next()
}

/// Key prefixes of everything a tenant move carries, in key order (orders, which
/// are keyed by id alone, are found by scanning and filtering).
pub fn tenant_prefixes(tenant: &TenantId) -> Vec<Vec<u8>> {
    let t = tenant.as_str().as_bytes();
    let with = |head: &[u8]| {
        let mut p = head.to_vec();
        p.extend_from_slice(t);
        p.push(0);
        p
    };
    vec![
        with(&[ORDER_INDEX]),
        with(&[MARKER]),
        vec![ORDER],
        with(&[RECORD, b'c']),
        with(&[RECORD, b'o']),
    ]
}

/// The reconciliation report of the failover `operation_id` away from this region.
pub fn reconciliation(operation_id: &str) -> Vec<u8> {
    let mut key = b"sreconcile:".to_vec();
    key.extend_from_slice(operation_id.as_bytes());
    key
}

/// The reconciliation report of the failover `operation_id` recorded in pages
/// (`Command::RecordReport`): its head; the orphans are in its pages.
pub fn report(operation_id: &str) -> Vec<u8> {
    let mut key = b"sreport:".to_vec();
    key.extend_from_slice(operation_id.as_bytes());
    key
}

/// Prefix of the pages of orphans staged for the report of `operation_id`.
pub fn report_pages(operation_id: &str) -> Vec<u8> {
    let mut key = b"sreport-page:".to_vec();
    key.extend_from_slice(operation_id.as_bytes());
    key.push(0);
    key
}

/// Page `page` of the orphans of the report of `operation_id`.
pub fn report_page(operation_id: &str, page: u32) -> Vec<u8> {
    let mut key = report_pages(operation_id);
    key.extend_from_slice(&page.to_be_bytes());
    key
}

/// The page number of a key of `report_pages(operation_id)`.
pub fn page_of(pages_prefix: &[u8], key: &[u8]) -> Option<u32> {
    let page = key.strip_prefix(pages_prefix)?;
    Some(u32::from_be_bytes(page.try_into().ok()?))
}

/// The position of a consumer in the outbox.
pub fn cursor(consumer: Consumer) -> Vec<u8> {
    let mut key = b"scursor:".to_vec();
    key.extend_from_slice(consumer.as_str().as_bytes());
    key
}

/// Prefix of the consumers' cursor generations.
pub const CURSOR_GENERATION_PREFIX: &[u8] = b"scursor_gen:";

/// The generation of a consumer's cursor (the batch number of the last outbox
/// replay): a cursor move read before a replay carries an older one and is dropped.
pub fn cursor_generation(consumer: Consumer) -> Vec<u8> {
    let mut key = CURSOR_GENERATION_PREFIX.to_vec();
    key.extend_from_slice(consumer.as_str().as_bytes());
    key
}

/// An expiry index entry pointing at `primary` (a full key from this module).
pub fn expiry(at: UnixMillis, primary: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + primary.len());
    out.push(EXPIRY);
    out.extend_from_slice(&at.0.to_be_bytes());
    out.extend_from_slice(primary);
    out
}

/// Splits an expiry index key into its instant and the primary key it points at.
pub fn parse_expiry(key: &[u8]) -> Option<(UnixMillis, &[u8])> {
    let rest = key.strip_prefix(&[EXPIRY])?;
    let (at, primary) = rest.split_at_checked(8)?;
    Some((UnixMillis(u64::from_be_bytes(at.try_into().ok()?)), primary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_keys_sort_by_time_and_parse_back() {
        let a = expiry(UnixMillis(5), b"rX");
        let b = expiry(UnixMillis(300), b"rA");
        assert!(a < b);
        assert_eq!(parse_expiry(&b), Some((UnixMillis(300), &b"rA"[..])));
        assert_eq!(parse_expiry(b"x"), None);
    }

    /// A consumer's keys spell its name as they did when names were strings,
    /// so existing cursors and processed-message entries are found.
    #[test]
    fn consumer_keys_spell_the_consumer_name() {
        assert_eq!(cursor(Consumer::Inventory), b"scursor:inventory");
        assert_eq!(
            cursor_generation(Consumer::Payments),
            b"scursor_gen:payments"
        );
        assert_eq!(processed(Consumer::Payments, "evt_1"), b"ppayments\0evt_1");
    }
}
