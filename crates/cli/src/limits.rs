//! The limits of the `keyhold` binary itself (the libraries keep their own),
//! named with their unit, and the relations between them checked at compile
//! time.

/// A WARN or ERROR line from one place in the code is written at most once per
/// this interval; the repeats are counted and summarised in one line when it
/// ends (a region that is down makes openraft retry, and log, thousands of
/// times a second).
pub const LOG_REPEAT_INTERVAL_MS: u64 = 10_000;
/// Places in the code whose repeats are counted at once; lines from further
/// places are written unsummarised (the table cannot grow without bound).
pub const LOG_REPEAT_PLACES_MAX: usize = 1_024;
/// Bytes of a summarised line's first message quoted in its summary.
pub const LOG_SUMMARY_MESSAGE_BYTES_MAX: usize = 300;

const _: () = assert!(LOG_REPEAT_INTERVAL_MS >= 1_000);
const _: () = assert!(LOG_SUMMARY_MESSAGE_BYTES_MAX > 0);

// `keyhold chaos` runs its automatic failovers at the shortest value the node
// accepts, and waits for them longer than the node may take.
const _: () = assert!(
    keyhold_chaos::limits::AUTO_FAILOVER_AFTER_MS
        == keyhold_server::limits::AUTO_FAILOVER_AFTER_MS_MIN
);
const _: () = assert!(
    keyhold_chaos::limits::FAILOVER_WAIT_MS
        > keyhold_server::limits::AUTO_FAILOVER_UNSEEN_MS
            + keyhold_server::limits::REGION_LEASE_MS
            + keyhold_server::limits::FAILOVER_LEASE_MARGIN_MS
);
// `keyhold drill` tells the lease wait from the import by the progress the
// failover's driver reports when its wait is over.
const _: () = assert!(
    keyhold_drill::limits::LEASE_WAITED_PROGRESS
        == keyhold_server::limits::FAILOVER_WAIT_PROGRESS_SHARE
);
