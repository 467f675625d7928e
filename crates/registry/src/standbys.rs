//! Whether each region's standby streams its copy or is lost (contract section
//! 11, "Losing the standby"). A region acknowledges its zone tenants' writes
//! only while its standby confirms its log within `max_standby_lag`; when the
//! standby stops confirming, the region's leader asks the registry to record
//! the standby as lost, and from that entry on the region runs unprotected
//! until the standby has caught up and is recorded as streaming again.
//!
//! The decision is the registry's: a region cut off from the registry majority
//! cannot commit `MarkStandbyLost`, so it cannot decide on its own to run
//! unprotected (it stays protected: its writes answer 503). Nor can a region
//! being failed over: its losses are bounded by `max_standby_lag` only while
//! it stays protected (`estimated_lost`, and a failover that would wait the
//! standby's grant instead of the lease; see docs/benchmarks.md), so
//! `MarkStandbyLost` is refused while a failover from the region runs. Only regions whose
//! standby is lost are kept (`RegistryState::standby_lost`, region → since when,
//! by the requester's clock); every other region's standby streams.

use crate::state::{RegistryState, Rejection, Response};

/// A region's standby as the registry records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyState {
    /// The standby confirms the region's log (or has not been recorded lost).
    Streaming,
    /// Recorded lost at `since_ms`: the region acknowledges its zone tenants'
    /// writes without the standby's confirmation.
    Lost { since_ms: u64 },
}

impl StandbyState {
    /// The name in the admin API (`regions[].standby_state`).
    pub fn as_str(self) -> &'static str {
        match self {
            StandbyState::Streaming => "streaming",
            StandbyState::Lost { .. } => "lost",
        }
    }

    pub fn is_lost(self) -> bool {
        matches!(self, StandbyState::Lost { .. })
    }
}

impl RegistryState {
    /// `region`'s standby as recorded.
    pub fn standby_state(&self, region: &str) -> StandbyState {
        self.standby_lost
            .get(region)
            .map_or(StandbyState::Streaming, |&since_ms| StandbyState::Lost {
                since_ms,
            })
    }

    pub(crate) fn mark_standby_lost(
        &mut self,
        region: &str,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        self.known_region(region)?;
        if let Some(op) = self.failover_running_from(region) {
            return Err(Rejection::RegionFailingOver {
                region: region.to_string(),
                operation_id: op.operation_id.clone(),
            });
        }
        // A region already recorded lost keeps its first time (a replay, or a
        // second leader's report, changes nothing).
        self.standby_lost
            .entry(region.to_string())
            .or_insert(now_ms);
        Ok(Response::Ok)
    }

    pub(crate) fn mark_standby_streaming(&mut self, region: &str) -> Result<Response, Rejection> {
        self.known_region(region)?;
        self.standby_lost.remove(region);
        Ok(Response::Ok)
    }

    fn known_region(&self, region: &str) -> Result<(), Rejection> {
        if self.regions.contains_key(region) {
            return Ok(());
        }
        Err(Rejection::UnknownRegion {
            region: region.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::StandbyState;
    use crate::state::{RegistryState, Rejection, Request, Response};

    fn with_region(name: &str) -> RegistryState {
        let mut state = RegistryState::default();
        let added = state.apply(&Request::AddRegion {
            name: name.to_string(),
            now_ms: 1,
        });
        assert_eq!(added, Response::Ok);
        state
    }

    #[test]
    fn a_standby_is_lost_from_its_first_report_until_it_streams_again() {
        let mut state = with_region("a");
        assert_eq!(state.standby_state("a"), StandbyState::Streaming);
        let lost = Request::MarkStandbyLost {
            region: "a".into(),
            now_ms: 10,
        };
        assert_eq!(state.apply(&lost), Response::Ok);
        // A replay, or a later report, keeps the first time.
        let later = Request::MarkStandbyLost {
            region: "a".into(),
            now_ms: 20,
        };
        assert_eq!(state.apply(&lost), Response::Ok);
        assert_eq!(state.apply(&later), Response::Ok);
        assert_eq!(
            state.standby_state("a"),
            StandbyState::Lost { since_ms: 10 }
        );
        let streaming = Request::MarkStandbyStreaming { region: "a".into() };
        assert_eq!(state.apply(&streaming), Response::Ok);
        assert_eq!(state.apply(&streaming), Response::Ok);
        assert_eq!(state.standby_state("a"), StandbyState::Streaming);
    }

    #[test]
    fn a_region_being_failed_over_cannot_have_its_standby_recorded_lost() {
        let mut state = with_region("a");
        let added = state.apply(&Request::AddRegion {
            name: "b".into(),
            now_ms: 1,
        });
        assert_eq!(added, Response::Ok);
        let begun = state.apply(&Request::BeginFailover {
            operation_id: "f1".into(),
            region: "a".into(),
            to: "b".into(),
            now_ms: 5,
        });
        assert!(begun.rejection().is_none(), "{begun:?}");
        let lost = Request::MarkStandbyLost {
            region: "a".into(),
            now_ms: 10,
        };
        assert!(matches!(
            state.apply(&lost).rejection(),
            Some(Rejection::RegionFailingOver { .. })
        ));
        assert_eq!(state.standby_state("a"), StandbyState::Streaming);
        // Another region's standby may still be recorded lost.
        let other = Request::MarkStandbyLost {
            region: "b".into(),
            now_ms: 10,
        };
        assert_eq!(state.apply(&other), Response::Ok);
    }

    #[test]
    fn an_unknown_region_is_refused() {
        let mut state = with_region("a");
        let lost = Request::MarkStandbyLost {
            region: "zz".into(),
            now_ms: 10,
        };
        assert!(state.apply(&lost).rejection().is_some());
        assert!(state.standby_lost.is_empty());
    }
}
