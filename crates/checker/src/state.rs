//! The final state of a cluster as the reader found it through the public and
//! admin APIs: orders by client_order_id and by id, the checker's own replays of
//! acknowledged keys and claims, the payment provider's charges and the
//! inventory reservations; and the failovers the run made with the orphans
//! their reconciliations listed. Plain data, so the analysis is tested without
//! servers.

use serde::{Deserialize, Serialize};

/// One read: found (with the JSON body), definitely absent (404), or not
/// readable even after retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Read {
    Found { body: serde_json::Value },
    Absent,
    Unreadable { reason: String },
}

/// `GET /v1/orders?client_order_id=X` for one tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ByClientOrderId {
    pub tenant: String,
    pub client_order_id: String,
    pub read: Read,
}

/// `GET /v1/orders/{order_id}` for one tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ByOrderId {
    pub tenant: String,
    pub order_id: String,
    pub read: Read,
}

/// The checker sent an acknowledged request again, with the same key and body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderReplay {
    pub tenant: String,
    pub key: String,
    pub status: u16,
    pub replayed: bool,
    pub body: String,
}

/// The checker claimed a scope whose completion was acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimReplay {
    pub tenant: String,
    pub operation: String,
    pub key: String,
    pub status: u16,
    pub body: serde_json::Value,
}

/// One entry of the payment provider's `GET /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub order_id: String,
    /// `succeeded` or `failed` (declined).
    pub status: String,
    pub amount: u64,
}

/// One entry of `GET /admin/v1/inventory/reservations?order_id=X`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub order_id: String,
    /// The item line it reserves (its index in the order's `items`).
    pub line: Option<u64>,
    pub sku: String,
    pub quantity: u64,
}

/// Everything the analysis compares the history with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FinalState {
    pub by_client_order_id: Vec<ByClientOrderId>,
    pub by_order_id: Vec<ByOrderId>,
    pub order_replays: Vec<OrderReplay>,
    pub claim_replays: Vec<ClaimReplay>,
    /// `None`: the downstream effects were not read (no provider or admin
    /// token given); their checks are skipped and the verdict says so.
    pub downstream: Option<Downstream>,
    /// Failovers the run made (filled in by the runner that made them, not by
    /// the reader): the only thing that excuses an acknowledged order missing.
    #[serde(default)]
    pub failovers: Vec<Failover>,
}

/// One failover of a region the run cut off, and what the lost region's
/// reconciliation listed once it was back. Times are on the history's clock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Failover {
    /// The region failed over (cut off, then failed over to `to`).
    pub region: String,
    pub to: String,
    /// When the cut was in place: the control call that isolated or killed the
    /// region had answered. The fault began no later than this, so an
    /// acknowledgement sent after `cut_ms + max_standby_lag_ms` is certainly
    /// later than the region may acknowledge what a failover then loses.
    pub cut_ms: u64,
    pub max_standby_lag_ms: u64,
    /// The failover result's `estimated_lost` (`seconds` in milliseconds);
    /// `None` when the result did not carry one.
    pub estimated_lost_ms: Option<u64>,
    pub estimated_lost_commands: Option<u64>,
    /// The reconciliation's orphans; `None` when it never reported `done`
    /// (then no loss is excused).
    pub orphans: Option<Vec<Orphan>>,
}

/// One orphan of `GET /admin/v1/regions/{r}/reconciliation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    pub tenant_id: String,
    /// `order` or `claim`.
    pub kind: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub order_id: Option<String>,
    #[serde(default)]
    pub client_order_id: Option<String>,
    #[serde(default)]
    pub duplicate_of: Option<String>,
}

/// The downstream effects: charges and reservations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Downstream {
    pub charges: Vec<Charge>,
    /// Reservations of every order found by client_order_id.
    pub reservations: Vec<Reservation>,
}
