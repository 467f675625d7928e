//! Empty AppendEntries to a group's learners in other regions, answered at once
//! and delivered in the background (`HttpNetwork::with_learner_heartbeats_detached`).
//!
//! openraft 0.9 keeps one AppendEntries in flight per member, and sends its
//! heartbeats and its commit-index updates (AppendEntries without entries) on
//! that same stream. To a standby learner one region away each of them holds
//! the stream for a whole inter-region round trip, so a new entry usually
//! waits behind one: a region-survival write, answered once the standby holds
//! its entry, took about three round trips instead of one.
//!
//! Such an AppendEntries tells openraft nothing when the member already
//! acknowledged its `prev_log_id` under the same vote: it carries no entries,
//! so a success leaves the member's match where it is, and a learner's answer
//! counts toward no quorum, leader lease or linearizable read. Then the
//! connection answers it `Success` at once and sends it afterwards from a
//! task of its own (the newest one replacing any not yet sent), so the member
//! still learns the commit index within a round trip and applies what it holds.
//! Any other answer from the member (a conflict after its copy was reset, a
//! higher vote, no answer) forgets what it acknowledged, so the next empty
//! AppendEntries goes the ordinary way and openraft sees the member's real
//! state one heartbeat later.
//!
//! Only learners: a voter's heartbeat answers are what the leader's lease and
//! `ensure_linearizable` rest on, so they are never made up. A region group's
//! voters are all of its own region's nodes (`routes/members.rs` adds no other),
//! which is how a connection tells a learner: by the member's region.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::{LogId, RaftTypeConfig, Vote};

use crate::credential::NodeCredentials;
use crate::network::{exchange, NodeGroup};
use crate::types::{NodeId, RaftError};

/// The detached empty AppendEntries of one connection (one member).
pub(crate) struct Detached<C: RaftTypeConfig> {
    shared: Arc<Mutex<Shared<C>>>,
    courier: Courier,
}

impl<C: RaftTypeConfig> std::fmt::Debug for Detached<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("url", &self.courier.url)
            .finish_non_exhaustive()
    }
}

/// Where and how the background task sends.
#[derive(Clone)]
pub(crate) struct Courier {
    pub client: reqwest::Client,
    pub credentials: NodeCredentials,
    pub url: String,
    /// Where the member's answers are noted, and its id (`HttpNetwork::with_contacts_noted`).
    pub contacts: Option<(keyhold_raftlog::Contacts, NodeId)>,
}

/// What a member acknowledged: everything up to `matched`, under `vote`.
type Acked = (Vote<NodeId>, Option<LogId<NodeId>>);

struct Shared<C: RaftTypeConfig> {
    /// The member's last acknowledgement; `None` when nothing is known (no
    /// success yet in this connection, or an answer since that was not one).
    acked: Option<Acked>,
    /// The newest empty AppendEntries not yet sent.
    next: Option<AppendEntriesRequest<C>>,
    /// A task is sending (it sends `next` until there is none).
    sending: bool,
}

impl<C: NodeGroup> Detached<C> {
    pub(crate) fn new(courier: Courier) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Shared {
                acked: None,
                next: None,
                sending: false,
            })),
            courier,
        }
    }

    /// The member answered an AppendEntries sent the ordinary way: `Some` with
    /// what it now holds when that was a success, `None` otherwise.
    pub(crate) fn answered(&self, acked: Option<Acked>) {
        lock(&self.shared).acked = acked;
    }

    /// Takes `rpc` to send in the background when it carries no entries and the
    /// member acknowledged its `prev_log_id` under its vote; the caller then
    /// answers `Success`. Otherwise gives it back, to be sent the ordinary way.
    pub(crate) fn take(
        &self,
        rpc: AppendEntriesRequest<C>,
        timeout: Duration,
    ) -> Result<(), AppendEntriesRequest<C>> {
        let mut shared = lock(&self.shared);
        let answerable = rpc.entries.is_empty()
            && shared
                .acked
                .as_ref()
                .is_some_and(|(vote, matched)| *vote == rpc.vote && *matched == rpc.prev_log_id);
        if !answerable {
            return Err(rpc);
        }
        shared.next = Some(rpc);
        if !shared.sending {
            shared.sending = true;
            tokio::spawn(deliver(self.shared.clone(), self.courier.clone(), timeout));
        }
        Ok(())
    }
}

/// Sends the queued empty AppendEntries one after another until none is left.
async fn deliver<C: NodeGroup>(shared: Arc<Mutex<Shared<C>>>, courier: Courier, timeout: Duration) {
    loop {
        let rpc = {
            let mut shared = lock(&shared);
            match shared.next.take() {
                Some(rpc) => rpc,
                None => {
                    shared.sending = false;
                    return;
                }
            }
        };
        let sent = std::time::Instant::now();
        let answer = exchange::<_, Result<AppendEntriesResponse<NodeId>, RaftError>>(
            &courier.client,
            &courier.credentials,
            &courier.url,
            &rpc,
            timeout,
        )
        .await;
        if let (Ok(Ok(_)), Some((contacts, member))) = (&answer, &courier.contacts) {
            contacts.answered(*member, sent);
        }
        if !matches!(answer, Ok(Ok(AppendEntriesResponse::Success))) {
            tracing::debug!(url = %courier.url, "a detached heartbeat was not a success: the next one goes the ordinary way");
            lock(&shared).acked = None;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing a holder does can leave `Shared` half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    //! A connection to a fake member whose append route holds every request
    //! until the test lets it go (a semaphore, not a clock), so "answered
    //! without the member" is told apart from "answered by it" by whether the
    //! call returns while the member holds on.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::routing::post;
    use axum::Router;
    use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};
    use tokio::sync::{mpsc, Semaphore};

    use crate::codec;
    use crate::network::{HttpConnection, HttpNetwork};
    use crate::types::{Entry, NodeId, NodeInfo, RaftError, TypeConfig};
    use crate::NodeCredentials;

    const CREDENTIAL: &str = "detached-test-credential-0123456789";
    /// Long enough never to be what a test waits for.
    const STUCK: Duration = Duration::from_millis(300);

    /// The fake member: what it received, what it answers, and its gate.
    #[derive(Clone)]
    struct Member {
        received: mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>,
        conflict: Arc<Mutex<bool>>,
        gate: Arc<Semaphore>,
    }

    async fn append(State(member): State<Member>, body: Bytes) -> Vec<u8> {
        let request: AppendEntriesRequest<TypeConfig> = codec::decode(&body).unwrap();
        member.received.send(request).unwrap();
        member.gate.acquire().await.unwrap().forget();
        let answer: Result<AppendEntriesResponse<NodeId>, RaftError> =
            Ok(match *member.conflict.lock().unwrap() {
                true => AppendEntriesResponse::Conflict,
                false => AppendEntriesResponse::Success,
            });
        codec::encode(&answer).unwrap()
    }

    struct Fixture {
        connection: HttpConnection<TypeConfig>,
        received: mpsc::UnboundedReceiver<AppendEntriesRequest<TypeConfig>>,
        conflict: Arc<Mutex<bool>>,
        gate: Arc<Semaphore>,
    }

    /// A connection from node 1 of a group homed in region `a` to node 2, of
    /// region `member_region`.
    async fn fixture(member_region: &str) -> Fixture {
        let (tx, received) = mpsc::unbounded_channel();
        let member = Member {
            received: tx,
            conflict: Arc::new(Mutex::new(false)),
            gate: Arc::new(Semaphore::new(0)),
        };
        let (conflict, gate) = (member.conflict.clone(), member.gate.clone());
        let router = Router::new()
            .route("/raft/g/append", post(append))
            .with_state(member);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let credentials = NodeCredentials::parse(CREDENTIAL).unwrap();
        let mut network = HttpNetwork::<TypeConfig>::new(client, "g", 1, credentials)
            .with_learner_heartbeats_detached("a");
        let info = NodeInfo::new(member_region, "127.0.0.1:1", addr);
        let connection = network.new_client(2, &info).await;
        Fixture {
            connection,
            received,
            conflict,
            gate,
        }
    }

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn request(prev: u64, entries: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: (prev + 1..=prev + entries)
                .map(|index| Entry {
                    log_id: log_id(index),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(10))
    }

    impl Fixture {
        /// Sends `rpc` through the member, which answers it.
        async fn through_member(
            &mut self,
            rpc: AppendEntriesRequest<TypeConfig>,
        ) -> AppendEntriesResponse<NodeId> {
            self.gate.add_permits(1);
            let answer = self.connection.append_entries(rpc, option()).await;
            self.received.recv().await.expect("the member got it");
            answer.expect("the member answered")
        }

        /// Sends `rpc` and says whether it was answered while the member
        /// holds every request.
        async fn answered_without_member(&mut self, rpc: AppendEntriesRequest<TypeConfig>) -> bool {
            let call = self.connection.append_entries(rpc, option());
            match tokio::time::timeout(STUCK, call).await {
                Ok(answer) => {
                    assert_eq!(answer.unwrap(), AppendEntriesResponse::Success);
                    true
                }
                Err(_) => false,
            }
        }
    }

    /// After the learner acknowledged entry 5, an empty AppendEntries after 5
    /// is answered at once and still reaches it (with the commit index); one
    /// after another entry, or under another vote, waits for the member.
    #[tokio::test]
    async fn a_learners_heartbeat_after_what_it_acknowledged_does_not_wait_for_it() {
        let mut f = fixture("b").await;
        assert!(
            !f.answered_without_member(request(0, 0, 0)).await,
            "nothing acknowledged yet: the first heartbeat goes the ordinary way"
        );
        f.gate.add_permits(1);
        assert_eq!(f.received.recv().await.unwrap().entries.len(), 0);

        let answer = f.through_member(request(0, 5, 0)).await;
        assert_eq!(answer, AppendEntriesResponse::Success);
        assert!(f.answered_without_member(request(5, 0, 5)).await);
        let delivered = f
            .received
            .recv()
            .await
            .expect("delivered in the background");
        assert_eq!(delivered.leader_commit, Some(log_id(5)));
        assert!(delivered.entries.is_empty());
        // While the member holds that one, the next heartbeats are answered at
        // once too, and only the newest goes after it.
        assert!(f.answered_without_member(request(5, 0, 5)).await);
        assert!(f.answered_without_member(request(5, 0, 6)).await);
        f.gate.add_permits(1);
        f.gate.add_permits(1);
        let newest = f.received.recv().await.unwrap();
        assert_eq!(newest.leader_commit, Some(log_id(6)));
        tokio::time::sleep(STUCK).await;
        assert!(
            f.received.try_recv().is_err(),
            "the heartbeat a newer one replaced was never sent"
        );

        assert!(
            !f.answered_without_member(request(4, 0, 5)).await,
            "a prev_log_id it did not acknowledge goes the ordinary way"
        );
        f.gate.add_permits(1);
        f.received.recv().await.unwrap();
        let mut other_vote = request(5, 0, 5);
        other_vote.vote = Vote::new_committed(2, 1);
        assert!(!f.answered_without_member(other_vote).await);
        f.gate.add_permits(1);
        f.received.recv().await.unwrap();
    }

    /// The same connection to a member of the group's own region (a voter):
    /// every heartbeat waits for the member's answer.
    #[tokio::test]
    async fn a_voters_heartbeats_always_wait_for_it() {
        let mut f = fixture("a").await;
        f.through_member(request(0, 5, 0)).await;
        assert!(!f.answered_without_member(request(5, 0, 5)).await);
        f.gate.add_permits(1);
        f.received.recv().await.unwrap();
    }

    /// A background heartbeat the member did not take (its copy was reset and
    /// conflicts): the next heartbeat goes the ordinary way, so openraft sees
    /// the conflict; a success after that detaches them again.
    #[tokio::test]
    async fn a_refused_background_heartbeat_sends_the_next_one_the_ordinary_way() {
        let mut f = fixture("b").await;
        f.through_member(request(0, 5, 0)).await;
        *f.conflict.lock().unwrap() = true;
        assert!(f.answered_without_member(request(5, 0, 5)).await);
        f.gate.add_permits(1);
        f.received.recv().await.unwrap();
        // The background task records the refusal once the answer is in.
        let mut sent_ordinarily = false;
        for _ in 0..50 {
            if !f.answered_without_member(request(5, 0, 5)).await {
                sent_ordinarily = true;
                break;
            }
            f.gate.add_permits(1);
            f.received.recv().await.unwrap();
        }
        assert!(sent_ordinarily, "the conflict was forgotten");
        f.gate.add_permits(1);
        f.received.recv().await.unwrap();
        *f.conflict.lock().unwrap() = false;
        f.through_member(request(0, 5, 5)).await;
        assert!(f.answered_without_member(request(5, 0, 5)).await);
    }
}
