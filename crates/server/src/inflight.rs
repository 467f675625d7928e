//! Coalescing of in-flight duplicates.
//!
//! The first request for a scope becomes the leader and takes its command to the
//! store; every concurrent request for the same scope becomes a follower and
//! waits on the leader's notification, bounded by `inflight_wait`, instead of
//! polling the store or queueing a command of its own. When the leader finishes
//! (or gives up, or its task is dropped) the followers wake and decide again from
//! the durable record, which now normally means a replay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Default)]
pub struct Inflight {
    leaders: Arc<Mutex<HashMap<Vec<u8>, watch::Receiver<()>>>>,
}

pub enum Slot {
    /// This request runs the command; dropping the guard wakes the followers.
    Leader(LeaderGuard),
    /// Another request runs it; wait on this.
    Follower(watch::Receiver<()>),
}

pub struct LeaderGuard {
    key: Vec<u8>,
    leaders: Arc<Mutex<HashMap<Vec<u8>, watch::Receiver<()>>>>,
    // Dropping the sender closes every follower's receiver: that is the wake-up.
    _done: watch::Sender<()>,
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        self.leaders
            .lock()
            .expect("inflight lock")
            .remove(&self.key);
    }
}

impl Inflight {
    pub fn enter(&self, key: Vec<u8>) -> Slot {
        let mut leaders = self.leaders.lock().expect("inflight lock");
        if let Some(rx) = leaders.get(&key) {
            return Slot::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        leaders.insert(key.clone(), rx);
        Slot::Leader(LeaderGuard {
            key,
            leaders: self.leaders.clone(),
            _done: tx,
        })
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.leaders.lock().expect("inflight lock").len()
    }
}

/// Waits until the leader is done. `changed()` errs once the sender is dropped,
/// which is exactly the leader finishing; it never sends a value.
pub async fn wait_for_leader(mut rx: watch::Receiver<()>) {
    while rx.changed().await.is_ok() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn followers_wake_when_the_leader_finishes() {
        let inflight = Inflight::default();
        let Slot::Leader(guard) = inflight.enter(b"k".to_vec()) else {
            panic!("first is leader")
        };
        let followers: Vec<_> = (0..5)
            .map(|_| match inflight.enter(b"k".to_vec()) {
                Slot::Follower(rx) => tokio::spawn(wait_for_leader(rx)),
                Slot::Leader(_) => panic!("second must follow"),
            })
            .collect();
        assert!(matches!(inflight.enter(b"other".to_vec()), Slot::Leader(_)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(followers.iter().all(|f| !f.is_finished()));
        drop(guard);
        for f in followers {
            tokio::time::timeout(Duration::from_secs(1), f)
                .await
                .expect("woken")
                .unwrap();
        }
        assert_eq!(inflight.len(), 0);
        assert!(matches!(inflight.enter(b"k".to_vec()), Slot::Leader(_)));
    }
}
