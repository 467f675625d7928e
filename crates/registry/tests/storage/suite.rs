//! openraft's `Suite::test_all` against the sled stores, each case in a fresh directory.

use keyhold_registry::store::{self, LogStore, StateMachineStore};
use keyhold_registry::types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, state_machine) =
            store::open(dir.path()).map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        // The directory guard is returned first so it outlives nothing it must not.
        Ok((dir, log, state_machine))
    }
}

#[test]
fn sled_stores_pass_the_openraft_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
