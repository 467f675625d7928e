//! The on-disk value format: a format version byte, the number of the batch that
//! wrote the value (in a region group, the index of the log entry whose command
//! wrote it), then the bincode-2 (serde, standard config) payload.
//!
//! The stamp once told readers whether a value was durable yet; since the region
//! is a Raft state machine, every applied value is committed and nobody waits on
//! it, but it stays in the format: it says which entry last wrote a value (a
//! value migrated from storage format 1 keeps its old batch number, which may be
//! above the region log's indexes). Two readers compare stamps with a log
//! index: a failover's reconciliation (`reconcile.rs`, records above the cut)
//! and a move's change index (`Store::export_changes` since a mark), whose
//! entries only the region state machine writes, so theirs are log indexes.
//! The version byte lets a later release read values written by this one.

use crate::Error;
use serde::{de::DeserializeOwned, Serialize};

pub const FORMAT_VERSION: u8 = 1;
const HEADER_BYTES: usize = 9;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

pub fn encode<T: Serialize>(batch: u64, value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&batch.to_be_bytes());
    // Encoding our own plain data types into a Vec cannot fail.
    let payload = bincode::serde::encode_to_vec(value, config()).expect("value encodes");
    out.extend_from_slice(&payload);
    out
}

/// A value whose payload is already encoded (an imported entry), under a new stamp.
pub fn encode_raw(batch: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&batch.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A stored value's stamp (the batch that wrote it) and payload.
fn split(bytes: &[u8]) -> Result<(u64, &[u8]), Error> {
    if bytes.len() < HEADER_BYTES || bytes[0] != FORMAT_VERSION {
        return Err(Error::Corrupt(format!(
            "value of {} bytes with format byte {:?}",
            bytes.len(),
            bytes.first()
        )));
    }
    let batch = u64::from_be_bytes(bytes[1..HEADER_BYTES].try_into().expect("8 bytes"));
    Ok((batch, &bytes[HEADER_BYTES..]))
}

/// The payload of a stored value, without its header.
pub fn payload(bytes: &[u8]) -> Result<&[u8], Error> {
    Ok(split(bytes)?.1)
}

/// The batch (log index) that wrote a stored value, from its header alone.
pub fn stamp(bytes: &[u8]) -> Result<u64, Error> {
    Ok(split(bytes)?.0)
}

/// Returns the value and the batch that wrote it.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, u64), Error> {
    let (batch, payload) = split(bytes)?;
    let (value, _) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    Ok((value, batch))
}

/// Commands travel (and will be logged by Raft) in the same encoding.
pub fn encode_plain<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, config()).expect("value encodes")
}

/// The tenant an order's payload names, read without decoding the rest of it
/// (and without allocating): `keyhold_core::Order` starts with its id and its
/// tenant. Orders are keyed by id alone, so a move's export and a tenant's
/// erasure ask this of every order in the store.
pub fn order_tenant(payload: &[u8]) -> Result<&str, Error> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        _order_id: &'a str,
        tenant: &'a str,
    }
    let config = config().with_limit::<{ crate::limits::COMMAND_BYTES_MAX }>();
    let (head, _): (Head<'_>, usize) = bincode::serde::borrow_decode_from_slice(payload, config)
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    Ok(head.tenant)
}

/// What an outbox event's disposition needs (`OutboxEvent`'s id and tenant),
/// read from the head of its payload without decoding or copying the rest:
/// the consumers ask it of every event they take effect for.
pub struct EventHead<'a> {
    pub event_id: &'a str,
    pub tenant: &'a str,
}

/// `EventHead` of a stored event's payload (`payload`): `OutboxEvent` starts
/// with its sequence, id, kind and tenant.
pub fn event_head(payload: &[u8]) -> Result<EventHead<'_>, Error> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        _seq: u64,
        event_id: &'a str,
        _kind: &'a str,
        tenant: &'a str,
    }
    let config = config().with_limit::<{ crate::limits::COMMAND_BYTES_MAX }>();
    let (head, _): (Head<'_>, usize) = bincode::serde::borrow_decode_from_slice(payload, config)
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    Ok(EventHead {
        event_id: head.event_id,
        tenant: head.tenant,
    })
}

/// Decodes a command or an imported payload. The limit makes a length prefix
/// that claims more than `COMMAND_BYTES_MAX` an error before anything is
/// allocated for it (found by fuzzing: 11 bytes asked for 2.2 GB).
pub fn decode_plain<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let config = config().with_limit::<{ crate::limits::COMMAND_BYTES_MAX }>();
    bincode::serde::decode_from_slice(bytes, config)
        .map(|(v, _)| v)
        .map_err(|e| Error::Corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyhold_core::{Order, OrderRequest, OrderStatus, TenantId, UnixMillis};

    #[test]
    fn an_orders_tenant_is_read_from_its_head_alone() {
        let order = Order {
            order_id: "ord_1".into(),
            tenant: TenantId::parse("tenant-7").unwrap(),
            request: OrderRequest {
                client_order_id: "c1".into(),
                cart_id: "cart".into(),
                amount: 5,
                currency: "EUR".into(),
                shipping_address_id: Some("ship".into()),
                items: vec![],
                quote_id: None,
                metadata: Some("{}".into()),
            },
            status: OrderStatus::Paid,
            home_region: "a".into(),
            created_at: UnixMillis(1),
        };
        let stored = encode(9, &order);
        assert_eq!(order_tenant(payload(&stored).unwrap()).unwrap(), "tenant-7");
        assert!(order_tenant(&[0xff, 0xff]).is_err());
    }

    #[test]
    fn an_events_id_and_tenant_are_read_from_its_head_alone() {
        let event = crate::command::OutboxEvent {
            seq: 41,
            event_id: "evt_9".into(),
            kind: "order.created".into(),
            tenant: TenantId::parse("tenant-7").unwrap(),
            order_id: "ord_1".into(),
            occurred_at: UnixMillis(5),
            expires_at: UnixMillis(6),
            payload: br#"{"amount":5}"#.to_vec(),
        };
        let stored = encode(9, &event);
        let head = event_head(payload(&stored).unwrap()).unwrap();
        assert_eq!((head.event_id, head.tenant), ("evt_9", "tenant-7"));
        assert!(event_head(&[0xff, 0xff]).is_err());
    }
}
