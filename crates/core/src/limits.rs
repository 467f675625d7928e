//! Every size and count limit of the contract's request rules, in one place.
//!
//! Units are last in each name. The server reads these for validation and publishes
//! several of them in `GET /v1/idempotency-policy`.

/// Idempotency keys are 1 to 255 visible ASCII characters (contract section 2).
pub const KEY_LENGTH_MAX: usize = 255;
/// Operation names (`METHOD:/path`) used by the claims API.
pub const OPERATION_LENGTH_MAX: usize = 200;
/// Tenant ids: 1 to 64 of `[A-Za-z0-9_.-]`.
pub const TENANT_ID_LENGTH_MAX: usize = 64;
/// `client_order_id`: 1 to 64 of `[A-Za-z0-9_.:-]`.
pub const CLIENT_ORDER_ID_LENGTH_MAX: usize = 64;
/// `cart_id`, `shipping_address_id`, `quote_id`, `sku`.
pub const ORDER_STRING_LENGTH_MAX: usize = 64;
/// `amount` in minor units.
pub const AMOUNT_MAX: u64 = 1_000_000_000_000_000;
/// Items per order.
pub const ITEMS_MAX: usize = 100;
/// Quantity per item line.
pub const QUANTITY_MAX: u64 = 1_000_000;
/// `metadata`, measured as its canonical JSON.
pub const METADATA_BYTES_MAX: usize = 4 * 1024;
/// Claim leases, honoured as given inside this range.
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 3_600_000;
/// Caller-supplied fingerprints on the claims API.
pub const FINGERPRINT_LENGTH_MAX: usize = 200;
/// `resource_id` on claim completion.
pub const RESOURCE_ID_LENGTH_MAX: usize = 255;

// Amounts must stay exact when a JSON number is read as an IEEE double.
const _: () = assert!(AMOUNT_MAX < (1u64 << 53));
const _: () = assert!(LEASE_MS_MIN < LEASE_MS_MAX);
