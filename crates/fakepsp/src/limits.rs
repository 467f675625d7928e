//! Limits of the fake payment provider, units last, in one place.

/// Charge request bodies above this get 413 `body_too_large`.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// An `Idempotency-Key` is 1 to this many visible ASCII characters (Stripe's cap).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;
/// A charge's `order_id` is 1 to this many bytes.
pub const ORDER_ID_BYTES_MAX: usize = 255;
/// The largest `amount`, in minor units: keyhold's own order limit (10^15), so every
/// valid order can be charged.
pub const AMOUNT_CENTS_MAX: u64 = 1_000_000_000_000_000;

const _: () = assert!(IDEMPOTENCY_KEY_BYTES_MAX < BODY_BYTES_MAX);
const _: () = assert!(AMOUNT_CENTS_MAX > 0);
