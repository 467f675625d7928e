//! Helpers shared by the registry's integration tests: record and log-entry builders
//! and a bounded polling wait.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::time::{Duration, Instant};

use keyhold_registry::types::{Entry, LogId};
use keyhold_registry::{Request, TenantRecord, TenantState};
use openraft::{CommittedLeaderId, EntryPayload};

/// SHA-256 of "test", a valid `token_sha256`.
pub const TOKEN_SHA256: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

pub fn tenant(tenant_id: &str, home_region: &str) -> TenantRecord {
    TenantRecord {
        tenant_id: tenant_id.to_string(),
        home_region: home_region.to_string(),
        epoch: 1,
        token_sha256: TOKEN_SHA256.to_string(),
        requests_per_second: 100,
        new_keys_per_second: 10,
        state: TenantState::Active,
        created_at_ms: 1_700_000_000_000,
        previous_token: None,
    }
}

pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// A normal entry carrying `request` at `index` of `term`.
pub fn entry(term: u64, index: u64, request: Request) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(request),
    }
}

pub fn add_region(name: &str) -> Request {
    Request::AddRegion {
        name: name.to_string(),
        now_ms: 1,
    }
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes; returns whether it
/// held, so the caller's assertion can say what was expected.
pub async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
