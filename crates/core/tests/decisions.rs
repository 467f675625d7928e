//! Data-driven tests for the decision functions: one row per line of the
//! contract's outcome table (section 4) and per claims rule (section 5).

use keyhold_core::{
    check_owner, decide_claim, decide_order, ClaimDecision, Marker, OrderDecision, OwnerCheck,
    OwnerToken, Record, RecordState, StaleOwner, UnixMillis,
};

/// (row name, stored record, stored marker, request fingerprint, expected decision)
type OrderRow = (
    &'static str,
    Option<Record>,
    Option<Marker>,
    &'static str,
    OrderDecision,
);
/// (row name, stored record, presented token, expected check)
type FencingRow = (
    &'static str,
    Option<Record>,
    OwnerToken,
    Result<OwnerCheck, StaleOwner>,
);

const FP: &str = "sha256:aaaa";
const OTHER: &str = "sha256:bbbb";
const NOW: UnixMillis = UnixMillis(1_000_000);

fn record(state: RecordState, fingerprint: &str, lease_ms_left: i64, ttl_ms_left: i64) -> Record {
    let at = |delta: i64| UnixMillis((NOW.0 as i64 + delta) as u64);
    Record {
        fingerprint: fingerprint.to_owned(),
        state,
        generation: 3,
        nonce: 42,
        lease_expires_at: at(lease_ms_left),
        response: None,
        resource_id: None,
        created_at: at(-1000),
        expires_at: at(ttl_ms_left),
    }
}

fn marker(fingerprint: &str, ttl_ms_left: i64) -> Marker {
    Marker {
        order_id: "ord_1".into(),
        fingerprint: fingerprint.into(),
        expires_at: UnixMillis((NOW.0 as i64 + ttl_ms_left) as u64),
    }
}

#[test]
fn order_outcome_table() {
    use OrderDecision::*;
    use RecordState::*;
    let hit = || MarkerHit {
        order_id: "ord_1".into(),
    };
    // (row, record, marker, request fingerprint, expected)
    let rows: Vec<OrderRow> = vec![
        ("first request, nothing stored", None, None, FP, Create),
        (
            "first request, marker expired",
            None,
            Some(marker(FP, 0)),
            FP,
            Create,
        ),
        (
            "same scope, same fp, completed",
            Some(record(Succeeded, FP, 0, 10)),
            Some(marker(FP, 100)),
            FP,
            Replay,
        ),
        (
            "same scope, same fp, final failure",
            Some(record(FailedFinal, FP, 0, 10)),
            None,
            FP,
            Replay,
        ),
        (
            "same scope, different fp",
            Some(record(Succeeded, FP, 0, 10)),
            Some(marker(FP, 100)),
            OTHER,
            KeyReused,
        ),
        (
            "different fp wins over in-flight",
            Some(record(Processing, FP, 500, 10_000)),
            None,
            OTHER,
            KeyReused,
        ),
        (
            "same scope, in flight",
            Some(record(Processing, FP, 500, 10_000)),
            None,
            FP,
            InProgress {
                retry_after_ms: 500,
            },
        ),
        (
            "abandoned attempt is decided afresh",
            Some(record(Processing, FP, 0, 10_000)),
            None,
            FP,
            Create,
        ),
        (
            "retryable failure is decided afresh",
            Some(record(FailedRetryable, FP, 0, 10_000)),
            None,
            FP,
            Create,
        ),
        (
            "record expired, marker same fp",
            Some(record(Succeeded, FP, 0, 0)),
            Some(marker(FP, 100)),
            FP,
            hit(),
        ),
        (
            "new key, marker same fp",
            None,
            Some(marker(FP, 100)),
            FP,
            hit(),
        ),
        (
            "new key, marker other fp",
            None,
            Some(marker(OTHER, 100)),
            FP,
            MarkerConflict,
        ),
        (
            "record expired with other fp, marker other fp",
            Some(record(Succeeded, OTHER, 0, -5)),
            Some(marker(OTHER, 100)),
            FP,
            MarkerConflict,
        ),
        (
            "expired record and expired marker",
            Some(record(Succeeded, OTHER, 0, -5)),
            Some(marker(OTHER, -1)),
            FP,
            Create,
        ),
    ];
    for (row, rec, mark, fp, want) in rows {
        assert_eq!(
            decide_order(rec.as_ref(), mark.as_ref(), fp, NOW),
            want,
            "{row}"
        );
    }
}

#[test]
fn claim_rules() {
    use ClaimDecision::*;
    use RecordState::*;
    let rows: Vec<(&str, Option<Record>, &str, ClaimDecision)> = vec![
        (
            "absent: generation starts at the clock",
            None,
            FP,
            Acquire {
                generation: NOW.0,
                recovery: false,
            },
        ),
        (
            "expired abandoned attempt still warns",
            Some(record(Processing, FP, -10, 0)),
            FP,
            Acquire {
                generation: 4,
                recovery: true,
            },
        ),
        (
            "expired record keeps growing generation",
            Some(record(Succeeded, FP, 0, 0)),
            FP,
            Acquire {
                generation: 4,
                recovery: false,
            },
        ),
        (
            "live lease",
            Some(record(Processing, FP, 250, 10_000)),
            FP,
            InProgress {
                retry_after_ms: 250,
            },
        ),
        (
            "lease ran out",
            Some(record(Processing, FP, 0, 10_000)),
            FP,
            Acquire {
                generation: 4,
                recovery: true,
            },
        ),
        (
            "succeeded replays",
            Some(record(Succeeded, FP, 0, 10_000)),
            FP,
            Replay,
        ),
        (
            "final failure replays",
            Some(record(FailedFinal, FP, 0, 10_000)),
            FP,
            Replay,
        ),
        (
            "retryable re-acquires",
            Some(record(FailedRetryable, FP, 0, 10_000)),
            FP,
            Acquire {
                generation: 4,
                recovery: false,
            },
        ),
        (
            "different fingerprint",
            Some(record(Processing, FP, 250, 10_000)),
            OTHER,
            KeyReused,
        ),
        (
            "different fingerprint after success",
            Some(record(Succeeded, FP, 0, 10_000)),
            OTHER,
            KeyReused,
        ),
    ];
    for (row, rec, fp, want) in rows {
        assert_eq!(decide_claim(rec.as_ref(), fp, NOW), want, "{row}");
    }
}

#[test]
fn fencing() {
    use RecordState::*;
    let owner = OwnerToken {
        generation: 3,
        nonce: 42,
    };
    let old = OwnerToken {
        generation: 2,
        nonce: 42,
    };
    let guessed = OwnerToken {
        generation: 3,
        nonce: 43,
    };
    let rows: Vec<FencingRow> = vec![
        (
            "owner, live lease",
            Some(record(Processing, FP, 100, 10_000)),
            owner,
            Ok(OwnerCheck::Owner),
        ),
        (
            "owner, lease ran out but not taken over",
            Some(record(Processing, FP, -100, 10_000)),
            owner,
            Ok(OwnerCheck::Owner),
        ),
        (
            "previous generation is fenced",
            Some(record(Processing, FP, 100, 10_000)),
            old,
            Err(StaleOwner),
        ),
        (
            "wrong nonce",
            Some(record(Processing, FP, 100, 10_000)),
            guessed,
            Err(StaleOwner),
        ),
        (
            "repeat after completion",
            Some(record(Succeeded, FP, 0, 10_000)),
            owner,
            Ok(OwnerCheck::AlreadyCompleted),
        ),
        ("no record", None, owner, Err(StaleOwner)),
        (
            "expired record",
            Some(record(Processing, FP, 100, 0)),
            owner,
            Err(StaleOwner),
        ),
    ];
    for (row, rec, token, want) in rows {
        assert_eq!(check_owner(rec.as_ref(), token, NOW), want, "{row}");
    }
}
