//! openraft's `Suite::test_all` against the region group's sled log store and state
//! machine, each case in a fresh directory.

use keyhold_store::raft::{self, RegionConfig, RegionLogStore, RegionStateMachine, StorageError};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};
use tempfile::TempDir;

struct RegionBuilder;

impl StoreBuilder<RegionConfig, RegionLogStore, RegionStateMachine, TempDir> for RegionBuilder {
    async fn build(&self) -> Result<(TempDir, RegionLogStore, RegionStateMachine), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, state_machine) = raft::open(dir.path(), "region-eu")
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn region_stores_pass_the_openraft_suite() {
    if let Err(e) = Suite::test_all(RegionBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
