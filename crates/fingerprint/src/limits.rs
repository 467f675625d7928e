//! Named limits of the fingerprint crate, in one place so the server, the CLI
//! and the WASM module enforce the same bounds. Units come last in each name.

/// Deepest nesting of arrays and objects that [`crate::parse`] accepts. The
/// top-level container is level 1. Bodies of real requests are shallow; the
/// limit keeps every recursive walk (canonicalization, drop) far from the
/// stack limit, including on wasm32 where the stack is 1 MiB.
pub const DEPTH_MAX: usize = 64;

/// Largest input [`crate::parse`] accepts. The server's body limit (64 KiB by
/// default, configurable) sits below this hard cap.
pub const INPUT_BYTES_MAX: usize = 1 << 20;

/// Most pointers an `include` or `exclude` list of a spec may hold.
pub const POINTERS_MAX: usize = 256;

/// Longest JSON pointer accepted by [`crate::Pointer::parse`].
pub const POINTER_BYTES_MAX: usize = 1024;

/// Longest `operation` string of a spec (`METHOD:/path-template`).
pub const OPERATION_BYTES_MAX: usize = 256;

/// Largest spec document accepted by [`crate::Spec::from_json`].
pub const SPEC_BYTES_MAX: usize = 512 * 1024;

/// Objects up to this many members are checked for duplicate names by a
/// linear scan (cheapest for request bodies); larger ones switch to an ordered
/// set so a 1 MiB object with many members stays O(n log n).
pub const DUPLICATE_SCAN_MEMBERS_MAX: usize = 16;

/// Levels the preimage `{"fields": {pointer: value}}` wraps around body values,
/// which canonicalization must still walk.
pub const PREIMAGE_DEPTH_ADDED: usize = 2;

/// Bound on the recursion depth of canonicalizing anything produced from a
/// parsed body.
pub const CANONICAL_DEPTH_MAX: usize = DEPTH_MAX + PREIMAGE_DEPTH_ADDED;

// A spec must fit in what the parser accepts, and the largest pointer list must
// fit in a spec document.
const _: () = assert!(SPEC_BYTES_MAX <= INPUT_BYTES_MAX);
const _: () = assert!(POINTERS_MAX * (POINTER_BYTES_MAX + 3) <= SPEC_BYTES_MAX);
// Recursion stays shallow enough for a 1 MiB wasm stack even with large frames.
const _: () = assert!(CANONICAL_DEPTH_MAX <= 128);
// Bodies must at least be allowed to be one object.
const _: () = assert!(DEPTH_MAX >= 1);
const _: () = assert!(DUPLICATE_SCAN_MEMBERS_MAX >= 1);
