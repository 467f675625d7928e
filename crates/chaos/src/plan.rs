//! A seed's plan: everything a run will do, drawn up front from one seeded RNG,
//! so the same seed gives the same cluster options, the same requests (keys,
//! bodies, regions, client timeouts, pauses) at the same offsets, and the same
//! faults at the same offsets. Only the interleaving the machine produces
//! differs between two runs of one seed.
//!
//! What issue 37 added (3-node regions, node isolation, standby loss,
//! failovers, reads after steps) is drawn from a second stream of the same
//! seed, so the first stream, and with it every seed's earlier clients and
//! faults, is what it was: the seeds pinned in tests/e2e/chaos.rs still play
//! the part they were chosen for.

use crate::limits::{
    AUTO_FAILOVER_AFTER_MS, CLIENTS, CLIENT_TIMEOUT_MS_MAX, DOWN_MS_MAX, DUPLICATES_MAX,
    FAILOVER_AT_MS_MAX, FAILOVER_AT_MS_MIN, FAILOVER_REQUEST_DELAY_MS_MAX, FAULTS_MAX, FAULTS_MIN,
    FAULT_START_MS, ISOLATE_MS_MAX, ISOLATE_MS_MIN, ITEMS_MAX, KILLS_MAX, LEASE_MS_MAX,
    LEASE_MS_MIN, NODES_PER_REGION_REPLICATED, NODE_ISOLATE_MS_MAX, NODE_ISOLATE_MS_MIN,
    READ_AFTER_STEP_PERCENT, REPLICATED_SEED_ONE_IN, STANDBY_LOSS_MS_MAX, STANDBY_LOSS_MS_MIN,
    STEPS_PER_CLIENT_MAX, STEPS_PER_CLIENT_MIN, TRAFFIC_MS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The local cluster's regions; each has one demo tenant, `demo-<region>`.
pub const REGIONS: [&str; 3] = ["a", "b", "c"];

/// Region `region`'s standby (`keyhold up`'s default: the next region).
pub fn standby_of(region: usize) -> usize {
    (region + 1) % REGIONS.len()
}

/// XORed into the seed for the second stream (what issue 37 added).
const SECOND_STREAM: u64 = 0x3737_3737_5eed_0037;

fn one() -> usize {
    1
}

/// Options `keyhold up` is started with (the same at every restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterOptions {
    pub psp_drop_response_rate: f64,
    pub psp_decline_rate: f64,
    pub inter_region_rtt_ms: Option<u64>,
    /// `--nodes-per-region` (1 or 3).
    #[serde(default = "one")]
    pub nodes_per_region: usize,
    /// `--auto-failover-after`, only in seeds whose failover the cluster makes.
    #[serde(default)]
    pub auto_failover_after_ms: Option<u64>,
}

impl ClusterOptions {
    /// The node ids of region `REGIONS[region]` (`up`: node `k` is in region
    /// `k % R`, ids from 1).
    pub fn nodes_of(&self, region: usize) -> Vec<u64> {
        (0..self.nodes_per_region)
            .map(|k| (k * REGIONS.len() + region + 1) as u64)
            .collect()
    }
}

/// A read-back after a client step: one of the orders the client saw
/// acknowledged so far (`pick` modulo their number), by id or by
/// client_order_id, through region `region`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBack {
    pub pick: u32,
    pub region: usize,
    pub by_id: bool,
}

/// One order a step sends: its tenant (index into [`REGIONS`]: `demo-<region>`),
/// key and fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderSpec {
    pub tenant: usize,
    pub key: String,
    pub client_order_id: String,
    pub amount: u64,
    pub items: u8,
}

impl OrderSpec {
    /// The exact body text: serde_json sorts keys, so a retry sends the same bytes.
    pub fn body(&self) -> String {
        let mut body = serde_json::json!({
            "client_order_id": self.client_order_id,
            "cart_id": format!("cart-{}", self.client_order_id),
            "amount": self.amount,
            "currency": "EUR",
            "metadata": {"source": "chaos"},
        });
        if self.items > 0 {
            body["items"] = (0..self.items)
                .map(|i| serde_json::json!({"sku": format!("sku-{i}"), "quantity": i + 1}))
                .collect();
        }
        body.to_string()
    }
}

/// One client step. `of` names an earlier `New` or `Duplicates` step of the
/// same client (its index in the client's list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Step {
    /// A new order; with `timeout_ms` the client gives up early (an `unknown`).
    New {
        order: OrderSpec,
        region: usize,
        timeout_ms: Option<u64>,
    },
    /// The same key and body again (a retry after a timeout is a reconnect).
    Retry { of: usize, region: usize },
    /// The same key with a changed amount: must be 422.
    Conflict { of: usize, region: usize },
    /// A new key with the same body: the marker answers 200.
    NewKeySameOrder {
        of: usize,
        key: String,
        region: usize,
    },
    /// A new key with a changed amount: 409 `client-order-id-conflict`.
    NewKeyChangedOrder {
        of: usize,
        key: String,
        region: usize,
    },
    /// The same new order sent `regions.len()` times at once.
    Duplicates {
        order: OrderSpec,
        regions: Vec<usize>,
    },
    /// A claim; its holder either completes it, or crashes, and after the
    /// lease a second worker takes over and completes, and then the crashed
    /// holder wakes up and tries to complete with its stale token.
    ClaimJob {
        tenant: usize,
        key: String,
        region: usize,
        lease_ms: u64,
        holder_crashes: bool,
    },
}

/// A step and when it is due (ms after the traffic starts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timed<T> {
    pub at_ms: u64,
    #[serde(flatten)]
    pub what: T,
}

/// What can go wrong: kills of one node (through `up`'s control API) or of the
/// whole cluster (`up` itself), region isolation, moves and outbox replays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL, stay down `down_ms`, restart on the same data dir.
    Kill { target: KillTarget, down_ms: u64 },
    /// `POST /admin/v1/outbox/replay`.
    OutboxReplay,
    /// `POST /admin/v1/tenants/demo-<tenant>/move` to `to`.
    Move { tenant: usize, to: usize },
    /// Cut a region off from the others (both ways, registry included) and
    /// heal it after `for_ms`, through `up`'s control API.
    Isolate { region: usize, for_ms: u64 },
    /// Cut one node from every other node (its region's included) and heal
    /// it after `for_ms` (`POST /v1/nodes/{id}/isolate`, `/heal`).
    IsolateNode { node: u64, for_ms: u64 },
    /// Lose region `standby_of`'s standby (region `standby_of(standby_of)`):
    /// cut it off or kill its nodes for `for_ms`, then heal or start it.
    StandbyLoss {
        standby_of: usize,
        cut: Cut,
        for_ms: u64,
    },
    /// Cut region `region` off (isolate or kill every node), fail it over to
    /// its standby (by hand `request_after_ms` after the cut, or by the
    /// cluster's `--auto-failover-after`), wait for `done`, bring the region
    /// back and wait for its reconciliation's orphans. The demo tenant stays
    /// in its new home.
    Failover {
        region: usize,
        mode: FailoverMode,
        cut: Cut,
        request_after_ms: u64,
    },
}

/// How a region is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// `POST /v1/regions/{r}/isolate`, later `/heal`.
    Isolate,
    /// SIGKILL of every node of the region, later started again.
    Kill,
}

/// Who starts a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverMode {
    /// `POST /admin/v1/regions/{r}/failover`.
    Manual,
    /// The cluster, `--auto-failover-after` after the region stopped being ready.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillTarget {
    /// The whole `keyhold up` process (every node at once).
    Cluster,
    /// One node by id (`up` gives region `REGIONS[i]`'s node the id `i + 1`).
    Node(u64),
}

impl Fault {
    /// True unless the fault may keep a region from being ready for longer
    /// than the shortest `--auto-failover-after` (2 s; a killed node's
    /// restart alone may take that long), which would fail the region over
    /// where the plan does not expect it: a seed with automatic failover
    /// keeps only such faults besides its failover. A whole cluster's kill
    /// stays (a watcher gives regions it has not seen ready since it started
    /// far longer), and so do a node's kill and isolation in 3-node regions.
    pub fn leaves_regions_ready(&self, replicated: bool) -> bool {
        match self {
            Fault::Failover { .. } => true,
            Fault::OutboxReplay | Fault::Move { .. } => true,
            Fault::Kill {
                target: KillTarget::Cluster,
                ..
            } => true,
            Fault::Kill {
                target: KillTarget::Node(_),
                ..
            }
            | Fault::IsolateNode { .. } => replicated,
            Fault::Isolate { .. } | Fault::StandbyLoss { .. } => false,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill {
                target: KillTarget::Cluster,
                ..
            } => "kill_cluster",
            Fault::Kill {
                target: KillTarget::Node(_),
                ..
            } => "kill_node",
            Fault::OutboxReplay => "outbox_replay",
            Fault::Move { .. } => "move",
            Fault::Isolate { .. } => "isolate",
            Fault::IsolateNode { .. } => "isolate_node",
            Fault::StandbyLoss { .. } => "standby_loss",
            Fault::Failover {
                mode: FailoverMode::Manual,
                ..
            } => "failover_manual",
            Fault::Failover {
                mode: FailoverMode::Auto,
                ..
            } => "failover_auto",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub seed: u64,
    pub cluster: ClusterOptions,
    pub clients: Vec<Vec<Timed<Step>>>,
    pub faults: Vec<Timed<Fault>>,
    /// Per client, per step: the read-back after it, if any.
    #[serde(default)]
    pub reads: Vec<Vec<Option<ReadBack>>>,
}

fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> T {
    items[rng.gen_range(0..items.len())]
}

fn region(rng: &mut StdRng) -> usize {
    rng.gen_range(0..REGIONS.len())
}

impl Plan {
    /// The plan of `seed`.
    pub fn new(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cluster = ClusterOptions {
            psp_drop_response_rate: pick(&mut rng, &[0.0, 0.1, 0.3]),
            psp_decline_rate: pick(&mut rng, &[0.0, 0.1, 0.25]),
            inter_region_rtt_ms: pick(&mut rng, &[None, Some(10), Some(40)]),
            nodes_per_region: 1,
            auto_failover_after_ms: None,
        };
        let clients: Vec<Vec<Timed<Step>>> = (0..CLIENTS)
            .map(|c| client_steps(&mut rng, seed, c))
            .collect();
        let mut faults = Vec::new();
        let mut kills = 0;
        for _ in 0..rng.gen_range(FAULTS_MIN..=FAULTS_MAX) {
            let at_ms = rng.gen_range(FAULT_START_MS..TRAFFIC_MS);
            let fault = match rng.gen_range(0..5) {
                0 if kills < KILLS_MAX => {
                    kills += 1;
                    Fault::Kill {
                        target: KillTarget::Cluster,
                        down_ms: rng.gen_range(0..=DOWN_MS_MAX),
                    }
                }
                1 if kills < KILLS_MAX => {
                    kills += 1;
                    Fault::Kill {
                        target: KillTarget::Node(region(&mut rng) as u64 + 1),
                        down_ms: rng.gen_range(0..=DOWN_MS_MAX),
                    }
                }
                2 => Fault::Isolate {
                    region: region(&mut rng),
                    for_ms: rng.gen_range(ISOLATE_MS_MIN..=ISOLATE_MS_MAX),
                },
                3 => {
                    let tenant = region(&mut rng);
                    let to = (tenant + rng.gen_range(1..REGIONS.len())) % REGIONS.len();
                    Fault::Move { tenant, to }
                }
                _ => Fault::OutboxReplay,
            };
            faults.push(Timed { at_ms, what: fault });
        }
        let mut second = StdRng::seed_from_u64(seed ^ SECOND_STREAM);
        if second.gen_range(0..REPLICATED_SEED_ONE_IN) == 0 {
            cluster.nodes_per_region = NODES_PER_REGION_REPLICATED;
        }
        faults.push(new_fault(&mut second, &mut cluster));
        if cluster.auto_failover_after_ms.is_some() {
            let replicated = cluster.nodes_per_region > 1;
            faults.retain(|f| f.what.leaves_regions_ready(replicated));
        }
        faults.sort_by_key(|f| f.at_ms);
        let reads = clients
            .iter()
            .map(|steps| {
                steps
                    .iter()
                    .map(|_| {
                        (second.gen_range(0..100) < READ_AFTER_STEP_PERCENT).then(|| ReadBack {
                            pick: second.gen(),
                            region: region(&mut second),
                            by_id: second.gen_bool(0.5),
                        })
                    })
                    .collect()
            })
            .collect();
        Plan {
            seed,
            cluster,
            clients,
            faults,
            reads,
        }
    }

    pub fn requests_planned(&self) -> usize {
        self.clients.iter().map(Vec::len).sum()
    }
}

/// One fault of a kind issue 37 added; an automatic failover also sets the
/// cluster's `--auto-failover-after`.
fn new_fault(rng: &mut StdRng, cluster: &mut ClusterOptions) -> Timed<Fault> {
    let cut = |rng: &mut StdRng| {
        if rng.gen_bool(0.5) {
            Cut::Isolate
        } else {
            Cut::Kill
        }
    };
    let (at_ms, fault) = match rng.gen_range(0..7) {
        0 | 1 => (
            rng.gen_range(FAULT_START_MS..TRAFFIC_MS),
            Fault::IsolateNode {
                node: rng.gen_range(1..=(cluster.nodes_per_region * REGIONS.len()) as u64),
                for_ms: rng.gen_range(NODE_ISOLATE_MS_MIN..=NODE_ISOLATE_MS_MAX),
            },
        ),
        2 | 3 => (
            rng.gen_range(FAULT_START_MS..TRAFFIC_MS),
            Fault::StandbyLoss {
                standby_of: region(rng),
                cut: cut(rng),
                for_ms: rng.gen_range(STANDBY_LOSS_MS_MIN..=STANDBY_LOSS_MS_MAX),
            },
        ),
        roll => {
            let mode = if roll == 6 {
                cluster.auto_failover_after_ms = Some(AUTO_FAILOVER_AFTER_MS);
                FailoverMode::Auto
            } else {
                FailoverMode::Manual
            };
            (
                rng.gen_range(FAILOVER_AT_MS_MIN..=FAILOVER_AT_MS_MAX),
                Fault::Failover {
                    region: region(rng),
                    mode,
                    cut: cut(rng),
                    request_after_ms: rng.gen_range(0..=FAILOVER_REQUEST_DELAY_MS_MAX),
                },
            )
        }
    };
    Timed { at_ms, what: fault }
}

fn client_steps(rng: &mut StdRng, seed: u64, client: u32) -> Vec<Timed<Step>> {
    let n = rng.gen_range(STEPS_PER_CLIENT_MIN..=STEPS_PER_CLIENT_MAX);
    let mut steps: Vec<Timed<Step>> = Vec::with_capacity(n);
    // Indices of steps that created (or tried to create) an order.
    let mut orders: Vec<usize> = Vec::new();
    let mut serial = 0u32;
    let mut name = |what: &str| {
        serial += 1;
        format!("s{seed}-c{client}-{what}{serial}")
    };
    for i in 0..n {
        let at_ms = TRAFFIC_MS * i as u64 / n as u64;
        let roll = rng.gen_range(0..100);
        let earlier = (!orders.is_empty()).then(|| orders[rng.gen_range(0..orders.len())]);
        let step = match (roll, earlier) {
            (0..=11, Some(of)) => Step::Retry {
                of,
                region: region(rng),
            },
            (12..=17, Some(of)) => Step::Conflict {
                of,
                region: region(rng),
            },
            (18..=22, Some(of)) => Step::NewKeySameOrder {
                of,
                key: name("k"),
                region: region(rng),
            },
            (23..=26, Some(of)) => Step::NewKeyChangedOrder {
                of,
                key: name("k"),
                region: region(rng),
            },
            (27..=34, _) => {
                let copies = rng.gen_range(2..=DUPLICATES_MAX);
                Step::Duplicates {
                    order: order(rng, &mut name),
                    regions: (0..copies).map(|_| region(rng)).collect(),
                }
            }
            (35..=40, _) => Step::ClaimJob {
                tenant: region(rng),
                key: name("job"),
                region: region(rng),
                lease_ms: rng.gen_range(LEASE_MS_MIN..=LEASE_MS_MAX),
                holder_crashes: rng.gen_bool(0.5),
            },
            _ => Step::New {
                order: order(rng, &mut name),
                region: region(rng),
                timeout_ms: rng
                    .gen_bool(0.12)
                    .then(|| rng.gen_range(1..=CLIENT_TIMEOUT_MS_MAX)),
            },
        };
        if matches!(step, Step::New { .. } | Step::Duplicates { .. }) {
            orders.push(i);
        }
        steps.push(Timed { at_ms, what: step });
    }
    steps
}

fn order(rng: &mut StdRng, name: &mut impl FnMut(&str) -> String) -> OrderSpec {
    let coid = name("o");
    OrderSpec {
        tenant: region(rng),
        key: format!("k-{coid}"),
        client_order_id: coid,
        amount: rng.gen_range(1..=100_000),
        items: rng.gen_range(0..=ITEMS_MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::NEW_FAULTS_PER_SEED;

    #[test]
    fn one_seed_gives_one_plan() {
        let a = Plan::new(7);
        assert_eq!(a, Plan::new(7));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&Plan::new(7)).unwrap()
        );
        assert_ne!(a, Plan::new(8));
    }

    #[test]
    fn plans_stay_within_their_limits() {
        for seed in 0..200 {
            let plan = Plan::new(seed);
            assert_eq!(plan.clients.len(), CLIENTS as usize);
            let kills = plan
                .faults
                .iter()
                .filter(|f| matches!(f.what, Fault::Kill { .. }))
                .count();
            assert!(kills <= KILLS_MAX);
            assert!((FAULTS_MIN..=FAULTS_MAX + NEW_FAULTS_PER_SEED).contains(&plan.faults.len()));
            assert_eq!(plan.reads.len(), plan.clients.len());
            for (reads, steps) in plan.reads.iter().zip(&plan.clients) {
                assert_eq!(reads.len(), steps.len());
            }
            let failovers = plan
                .faults
                .iter()
                .filter(|f| matches!(f.what, Fault::Failover { .. }))
                .count();
            assert!(failovers <= 1);
            let auto = plan.faults.iter().any(|f| {
                matches!(
                    f.what,
                    Fault::Failover {
                        mode: FailoverMode::Auto,
                        ..
                    }
                )
            });
            assert_eq!(auto, plan.cluster.auto_failover_after_ms.is_some());
            // With a 2 s automatic failover, no other fault may fail a
            // region over behind the plan's back.
            let replicated = plan.cluster.nodes_per_region > 1;
            assert!(
                !auto
                    || plan
                        .faults
                        .iter()
                        .all(|f| f.what.leaves_regions_ready(replicated)),
                "seed {seed}: {:?}",
                plan.faults
            );
            for f in &plan.faults {
                if let Fault::IsolateNode { node, .. } = f.what {
                    assert!(node >= 1 && node as usize <= plan.cluster.nodes_per_region * 3);
                }
            }
            for steps in &plan.clients {
                assert!((STEPS_PER_CLIENT_MIN..=STEPS_PER_CLIENT_MAX).contains(&steps.len()));
                for (i, step) in steps.iter().enumerate() {
                    assert!(step.at_ms < TRAFFIC_MS);
                    // A reference always names an earlier order step.
                    if let Step::Retry { of, .. }
                    | Step::Conflict { of, .. }
                    | Step::NewKeySameOrder { of, .. }
                    | Step::NewKeyChangedOrder { of, .. } = step.what
                    {
                        assert!(of < i);
                        assert!(matches!(
                            steps[of].what,
                            Step::New { .. } | Step::Duplicates { .. }
                        ));
                    }
                }
            }
        }
    }

    #[test]
    fn across_seeds_every_step_and_fault_kind_is_planned() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..50 {
            let plan = Plan::new(seed);
            for f in &plan.faults {
                kinds.insert(f.what.kind().to_owned());
            }
            for s in plan.clients.iter().flatten() {
                let json = serde_json::to_value(&s.what).unwrap();
                kinds.insert(json["type"].as_str().unwrap().to_owned());
            }
        }
        for k in [
            "kill_cluster",
            "kill_node",
            "isolate",
            "move",
            "outbox_replay",
            "isolate_node",
            "standby_loss",
            "failover_manual",
            "failover_auto",
            "new",
            "retry",
            "conflict",
            "new_key_same_order",
            "new_key_changed_order",
            "duplicates",
            "claim_job",
        ] {
            assert!(kinds.contains(k), "{k} never planned: {kinds:?}");
        }
    }

    /// The second stream leaves the first alone: seed 106 still kills the
    /// cluster 268 ms after a move (tests/e2e/chaos.rs pins it for that).
    #[test]
    fn the_first_stream_is_unchanged() {
        let plan = Plan::new(106);
        let old: Vec<&Timed<Fault>> = plan
            .faults
            .iter()
            .filter(|f| {
                !matches!(
                    f.what,
                    Fault::IsolateNode { .. } | Fault::StandbyLoss { .. } | Fault::Failover { .. }
                )
            })
            .collect();
        let at_move = old.iter().find(|f| matches!(f.what, Fault::Move { .. }));
        let at_kill = old.iter().find(|f| {
            matches!(
                f.what,
                Fault::Kill {
                    target: KillTarget::Cluster,
                    ..
                }
            )
        });
        let (Some(m), Some(k)) = (at_move, at_kill) else {
            panic!("seed 106 lost its move or kill: {:?}", plan.faults);
        };
        assert_eq!(k.at_ms - m.at_ms, 268, "{:?}", plan.faults);
    }

    #[test]
    fn replicated_regions_name_their_nodes() {
        let mut o = Plan::new(1).cluster;
        o.nodes_per_region = 3;
        assert_eq!(o.nodes_of(1), vec![2, 5, 8]);
        o.nodes_per_region = 1;
        assert_eq!(o.nodes_of(2), vec![3]);
    }

    #[test]
    fn a_retry_sends_the_same_bytes() {
        let o = OrderSpec {
            tenant: 0,
            key: "k".into(),
            client_order_id: "c".into(),
            amount: 5,
            items: 2,
        };
        assert_eq!(o.body(), o.clone().body());
        assert!(o.body().contains(r#""quantity":2"#));
    }
}
