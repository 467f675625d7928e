//! The registry's half of region failover and of per-tenant survival: the
//! transitions `BeginFailover` (the failed region is fenced: none of its nodes
//! may renew its lease), `CompleteFailover` (every tenant of the failed region
//! is re-homed in `to` with a higher epoch, in one entry, and the result is
//! kept) and `FailFailover`, and a tenant's `Survival`.
//!
//! These facts live in maps of their own in `RegistryState` rather than in
//! `TenantRecord` or `Operation`: those structs are encoded positionally
//! (bincode) in sled values and in Raft log entries written before failover
//! existed, which must still decode.

use keyhold_raftlog::LogTail;
use serde::{Deserialize, Serialize};

use crate::state::{
    check_name, Operation, OperationKind, OperationState, RegistryState, Rejection, Response,
    StateKey, TenantRecord, TenantState,
};

/// What a tenant's answers wait for before they are given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Survival {
    /// A majority of the home region's nodes hold the command: it survives the
    /// loss of any one node (zone) of the region.
    #[default]
    Zone,
    /// The standby region holds the command too: it survives the loss of the
    /// whole home region, for one inter-region round trip per write.
    Region,
}

impl Survival {
    /// The name used in the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Survival::Zone => "zone",
            Survival::Region => "region",
        }
    }

    /// Parses the admin API's name.
    pub fn parse(name: &str) -> Option<Survival> {
        match name {
            "zone" => Some(Survival::Zone),
            "region" => Some(Survival::Region),
            _ => None,
        }
    }
}

/// How much a failover lost, estimated from the last lag the standby knew.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LostEstimate {
    /// Commands the failed region had applied that the copy lacked.
    pub commands: u64,
    /// Age of the oldest of them.
    pub seconds: f64,
}

/// What a done failover did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverResult {
    /// The log index of the failed region's group that the promoted copy held:
    /// everything the region wrote after it is lost (and listed by its
    /// reconciliation once it is back).
    pub at: u64,
    pub estimated_lost: LostEstimate,
    /// The tenants it re-homed, sorted.
    pub tenants: Vec<String>,
}

impl RegistryState {
    /// A tenant's survival (`Zone` unless set).
    pub fn survival_of(&self, tenant_id: &str) -> Survival {
        self.survival.get(tenant_id).copied().unwrap_or_default()
    }

    /// The failover of `region` that is running, if any: while it runs, the
    /// region is fenced.
    pub fn failover_running_from(&self, region: &str) -> Option<&Operation> {
        self.operations.values().find(|op| {
            op.kind == OperationKind::Failover && op.from == region && !op.state.is_terminal()
        })
    }

    /// The done failovers of `region`, oldest first.
    pub fn failovers_from(&self, region: &str) -> Vec<&Operation> {
        let mut done: Vec<&Operation> = self
            .operations
            .values()
            .filter(|op| {
                op.kind == OperationKind::Failover
                    && op.from == region
                    && op.state == OperationState::Done
            })
            .collect();
        done.sort_by_key(|op| op.updated_at_ms);
        done
    }

    /// The result of done failover `operation_id`.
    pub fn failover_result(&self, operation_id: &str) -> Option<&FailoverResult> {
        self.failovers.get(operation_id)
    }

    /// The log tail of the copy done failover `operation_id` promoted; for one
    /// completed without it (`Request::CompleteFailover`), its position taken
    /// as all committed.
    pub fn failover_tail(&self, operation_id: &str) -> Option<LogTail> {
        let result = self.failovers.get(operation_id)?;
        Some(
            self.failover_tails
                .get(operation_id)
                .cloned()
                .unwrap_or_else(|| LogTail::confirmed(result.at)),
        )
    }

    /// Refuses a change that would give `region` a tenant while it is fenced.
    pub(crate) fn check_not_failing_over(&self, region: &str) -> Result<(), Rejection> {
        match self.failover_running_from(region) {
            Some(op) => Err(Rejection::RegionFailingOver {
                region: region.to_string(),
                operation_id: op.operation_id.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Keys `CompleteFailover` of `operation_id` may change: the operation, its
    /// result, and every tenant of the failed region with its move operation.
    pub(crate) fn failover_touched_keys(&self, operation_id: &str) -> Vec<StateKey> {
        let mut keys = vec![
            StateKey::Operation(operation_id.to_string()),
            StateKey::Failover(operation_id.to_string()),
            StateKey::FailoverTail(operation_id.to_string()),
        ];
        let Some(op) = self.operations.get(operation_id) else {
            return keys;
        };
        for tenant in self.tenants.values() {
            if tenant.home_region != op.from {
                continue;
            }
            keys.push(StateKey::Tenant(tenant.tenant_id.clone()));
            if let TenantState::Moving { operation_id, .. } = &tenant.state {
                keys.push(StateKey::Operation(operation_id.clone()));
            }
        }
        keys
    }

    pub(crate) fn create_tenant_with(
        &mut self,
        record: &TenantRecord,
        survival: Survival,
    ) -> Result<Response, Rejection> {
        if let Some(existing) = self.tenants.get(&record.tenant_id) {
            // A replay must also agree on survival.
            if existing == record && self.survival_of(&record.tenant_id) != survival {
                return Err(Rejection::TenantExists {
                    tenant_id: record.tenant_id.clone(),
                });
            }
        }
        let response = self.create_tenant(record)?;
        self.put_survival(&record.tenant_id, survival);
        Ok(response)
    }

    pub(crate) fn set_survival(
        &mut self,
        tenant_id: &str,
        survival: Survival,
    ) -> Result<Response, Rejection> {
        let record = self.live_tenant(tenant_id)?.clone();
        self.put_survival(tenant_id, survival);
        Ok(Response::TenantUpdated { record })
    }

    fn put_survival(&mut self, tenant_id: &str, survival: Survival) {
        match survival {
            Survival::Zone => self.survival.remove(tenant_id),
            other => self.survival.insert(tenant_id.to_string(), other),
        };
    }

    pub(crate) fn begin_failover(
        &mut self,
        operation_id: &str,
        region: &str,
        to: &str,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        check_name("operation_id", operation_id)?;
        if let Some(existing) = self.operations.get(operation_id) {
            // A replay of this very request answers as the first did.
            let same = existing.kind == OperationKind::Failover
                && existing.from == region
                && existing.to == to;
            if same {
                return Ok(Response::OperationUpdated {
                    operation: existing.clone(),
                });
            }
            return Err(Rejection::OperationExists {
                operation_id: operation_id.to_string(),
            });
        }
        for name in [region, to] {
            if !self.regions.contains_key(name) {
                return Err(Rejection::UnknownRegion {
                    region: name.to_string(),
                });
            }
        }
        if region == to {
            return Err(Rejection::Invalid {
                reason: format!("region {region} cannot fail over to itself"),
            });
        }
        self.check_not_failing_over(region)?;
        self.check_not_failing_over(to)?;
        let operation = Operation {
            operation_id: operation_id.to_string(),
            kind: OperationKind::Failover,
            tenant_id: String::new(),
            from: region.to_string(),
            to: to.to_string(),
            state: OperationState::Running,
            progress: 0.0,
            error: None,
            updated_at_ms: now_ms,
        };
        self.operations
            .insert(operation_id.to_string(), operation.clone());
        Ok(Response::OperationUpdated { operation })
    }

    /// The failover operation `operation_id`, or why there is none.
    fn failover_operation(&self, operation_id: &str) -> Result<&Operation, Rejection> {
        let op = self
            .operations
            .get(operation_id)
            .filter(|op| op.kind == OperationKind::Failover)
            .ok_or_else(|| Rejection::UnknownOperation {
                operation_id: operation_id.to_string(),
            })?;
        Ok(op)
    }

    pub(crate) fn complete_failover(
        &mut self,
        operation_id: &str,
        at: u64,
        tail: Option<&LogTail>,
        estimated_lost: &LostEstimate,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        let op = self.failover_operation(operation_id)?;
        match op.state {
            OperationState::Done => {
                return Ok(Response::OperationUpdated {
                    operation: op.clone(),
                })
            }
            OperationState::Failed => {
                return Err(Rejection::OperationFinished {
                    operation_id: operation_id.to_string(),
                    state: op.state,
                })
            }
            OperationState::Pending | OperationState::Running => {}
        }
        let (from, to) = (op.from.clone(), op.to.clone());
        let mut tenants = Vec::new();
        let mut failed_moves = Vec::new();
        for tenant in self.tenants.values_mut() {
            if tenant.home_region != from || tenant.is_deleted() {
                continue;
            }
            if let TenantState::Moving { operation_id, .. } = &tenant.state {
                failed_moves.push(operation_id.clone());
            }
            tenant.home_region = to.clone();
            tenant.epoch += 1;
            tenant.state = TenantState::Active;
            tenants.push(tenant.tenant_id.clone());
        }
        for move_id in failed_moves {
            if let Some(moving) = self.operations.get_mut(&move_id) {
                moving.state = OperationState::Failed;
                moving.error = Some(format!("region {from} failed over to {to}"));
                moving.updated_at_ms = now_ms;
            }
        }
        let result = FailoverResult {
            at,
            estimated_lost: *estimated_lost,
            tenants,
        };
        self.failovers.insert(operation_id.to_string(), result);
        if let Some(tail) = tail {
            self.failover_tails
                .insert(operation_id.to_string(), tail.clone());
        }
        let op = self.operations.get_mut(operation_id).expect("found above");
        op.state = OperationState::Done;
        op.progress = 1.0;
        op.updated_at_ms = now_ms;
        Ok(Response::OperationUpdated {
            operation: op.clone(),
        })
    }

    pub(crate) fn fail_failover(
        &mut self,
        operation_id: &str,
        error: &str,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        let op = self.failover_operation(operation_id)?;
        match op.state {
            OperationState::Failed => {
                return Ok(Response::OperationUpdated {
                    operation: op.clone(),
                })
            }
            OperationState::Done => {
                return Err(Rejection::OperationFinished {
                    operation_id: operation_id.to_string(),
                    state: op.state,
                })
            }
            OperationState::Pending | OperationState::Running => {}
        }
        let op = self.operations.get_mut(operation_id).expect("found above");
        op.state = OperationState::Failed;
        op.error = Some(error.to_string());
        op.updated_at_ms = now_ms;
        Ok(Response::OperationUpdated {
            operation: op.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::tenant;
    use crate::state::Request;

    fn three_regions() -> RegistryState {
        let mut state = RegistryState::default();
        for name in ["a", "b", "c"] {
            let added = state.apply(&Request::AddRegion {
                name: name.to_string(),
                now_ms: 1,
            });
            assert_eq!(added, Response::Ok);
        }
        state
    }

    fn begin(op: &str, region: &str, to: &str) -> Request {
        Request::BeginFailover {
            operation_id: op.to_string(),
            region: region.to_string(),
            to: to.to_string(),
            now_ms: 10,
        }
    }

    fn complete(op: &str, at: u64) -> Request {
        Request::CompleteFailover {
            operation_id: op.to_string(),
            at,
            estimated_lost: LostEstimate {
                commands: 3,
                seconds: 0.5,
            },
            now_ms: 20,
        }
    }

    #[test]
    fn a_failover_rehomes_every_tenant_of_the_region_with_a_higher_epoch_once() {
        let mut state = three_regions();
        for (id, home) in [("t1", "a"), ("t2", "a"), ("t3", "b")] {
            state.apply(&Request::CreateTenant {
                record: tenant(id, home),
            });
        }
        // t2 was moving out of a: the move fails with the failover.
        let moving = state.apply(&Request::BeginMove {
            tenant_id: "t2".into(),
            to: "c".into(),
            operation_id: "m1".into(),
            now_ms: 5,
        });
        assert!(moving.rejection().is_none(), "{moving:?}");

        let begun = state.apply(&begin("f1", "a", "b"));
        assert!(begun.rejection().is_none(), "{begun:?}");
        assert!(state.failover_running_from("a").is_some());
        assert!(state.failover_running_from("b").is_none());
        // While a is fenced, it gets no new tenant and no move.
        let refused = state.apply(&Request::CreateTenantWith {
            record: tenant("t4", "a"),
            survival: Survival::Zone,
        });
        assert!(matches!(
            refused.rejection(),
            Some(Rejection::RegionFailingOver { .. })
        ));

        let keys = state.failover_touched_keys("f1");
        assert!(keys.contains(&StateKey::Tenant("t1".into())));
        assert!(keys.contains(&StateKey::Operation("m1".into())));
        assert!(!keys.contains(&StateKey::Tenant("t3".into())));

        let done = state.apply(&complete("f1", 42));
        assert!(done.rejection().is_none(), "{done:?}");
        for id in ["t1", "t2"] {
            let t = &state.tenants[id];
            assert_eq!((t.home_region.as_str(), t.epoch), ("b", 2), "{id}");
            assert!(t.is_active());
        }
        assert_eq!(state.tenants["t3"].epoch, 1);
        assert_eq!(state.operations["m1"].state, OperationState::Failed);
        assert_eq!(state.operations["f1"].state, OperationState::Done);
        let result = state.failover_result("f1").expect("kept");
        assert_eq!(result.at, 42);
        assert_eq!(state.failover_tail("f1"), Some(LogTail::confirmed(42)));
        assert_eq!(result.tenants, vec!["t1".to_string(), "t2".to_string()]);
        assert!(state.failover_running_from("a").is_none());
        assert_eq!(state.failovers_from("a").len(), 1);

        // A replay changes nothing: no second epoch bump.
        let before = state.clone();
        let replay = state.apply(&complete("f1", 42));
        assert!(replay.rejection().is_none());
        assert_eq!(state, before);
        // Failing a done failover is refused.
        let fail = state.apply(&Request::FailFailover {
            operation_id: "f1".into(),
            error: "late".into(),
            now_ms: 30,
        });
        assert!(fail.rejection().is_some());
    }

    #[test]
    fn a_failed_failover_unfences_the_region_and_moves_nothing() {
        let mut state = three_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "a"),
        });
        state.apply(&begin("f1", "a", "b"));
        let failed = state.apply(&Request::FailFailover {
            operation_id: "f1".into(),
            error: "no copy".into(),
            now_ms: 30,
        });
        assert!(failed.rejection().is_none());
        assert!(state.failover_running_from("a").is_none());
        assert_eq!(state.tenants["t1"].home_region, "a");
        assert_eq!(state.tenants["t1"].epoch, 1);
        let late = state.apply(&complete("f1", 1));
        assert!(late.rejection().is_some());
    }

    #[test]
    fn begin_failover_checks_its_regions_and_replays() {
        let mut state = three_regions();
        let to_itself = state.apply(&begin("f1", "a", "a"));
        assert!(matches!(
            to_itself.rejection(),
            Some(Rejection::Invalid { .. })
        ));
        let unknown = state.apply(&begin("f1", "a", "z"));
        assert!(matches!(
            unknown.rejection(),
            Some(Rejection::UnknownRegion { .. })
        ));
        assert!(state.apply(&begin("f1", "a", "b")).rejection().is_none());
        assert!(state.apply(&begin("f1", "a", "b")).rejection().is_none());
        let second = state.apply(&begin("f2", "a", "c"));
        assert!(matches!(
            second.rejection(),
            Some(Rejection::RegionFailingOver { .. })
        ));
    }

    #[test]
    fn a_failover_from_a_tail_keeps_the_tail_it_completed_with() {
        let mut state = three_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "a"),
        });
        state.apply(&begin("f1", "a", "b"));
        let tail = LogTail::of(
            40,
            [41, 42].map(|i| openraft::LogId::new(openraft::CommittedLeaderId::new(3, 7), i)),
        );
        let complete = |tail: &LogTail| Request::CompleteFailoverFrom {
            operation_id: "f1".into(),
            tail: tail.clone(),
            estimated_lost: LostEstimate::default(),
            now_ms: 20,
        };
        let keys = complete(&tail).touched_keys(&state);
        assert!(keys.contains(&StateKey::FailoverTail("f1".into())));
        let done = state.apply(&complete(&tail));
        assert!(done.rejection().is_none(), "{done:?}");
        assert_eq!(state.failover_result("f1").expect("kept").at, 42);
        assert_eq!(state.tenants["t1"].home_region, "b");
        // A repeat with another tail (a second driver's) keeps the first.
        let replay = state.apply(&complete(&LogTail::confirmed(43)));
        assert!(replay.rejection().is_none(), "{replay:?}");
        assert_eq!(state.failover_tail("f1"), Some(tail));
        assert_eq!(state.failover_result("f1").expect("kept").at, 42);
    }

    #[test]
    fn survival_is_kept_beside_the_record_and_defaults_to_zone() {
        let mut state = three_regions();
        let created = state.apply(&Request::CreateTenantWith {
            record: tenant("t1", "a"),
            survival: Survival::Region,
        });
        assert!(created.rejection().is_none(), "{created:?}");
        assert_eq!(state.survival_of("t1"), Survival::Region);
        // The replay answers the same; a replay that disagrees is refused.
        let replay = state.apply(&Request::CreateTenantWith {
            record: tenant("t1", "a"),
            survival: Survival::Region,
        });
        assert!(replay.rejection().is_none());
        let other = state.apply(&Request::CreateTenantWith {
            record: tenant("t1", "a"),
            survival: Survival::Zone,
        });
        assert!(other.rejection().is_some());
        state.apply(&Request::SetSurvival {
            tenant_id: "t1".into(),
            survival: Survival::Zone,
        });
        assert_eq!(state.survival_of("t1"), Survival::Zone);
        assert!(state.survival.is_empty());
        assert_eq!(Survival::parse("region"), Some(Survival::Region));
        assert_eq!(Survival::parse("Region"), None);
    }
}
