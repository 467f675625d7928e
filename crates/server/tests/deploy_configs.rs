//! The operator-facing configs under deploy/ stay valid: every local node config
//! (one node per region in `local/`, three per region in `local-3/`) parses and
//! passes the node's start-up rules, and the Kubernetes ConfigMaps' embedded
//! node configs do too (with the id and admin token each pod takes from its
//! host name and environment). The three-node layouts list every member in every
//! config, with unique ids and one group of three nodes per region.

use keyhold_server::config::{Host, Member};
use keyhold_server::Config;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const REGIONS: [&str; 3] = ["a", "b", "c"];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn local_node_configs_are_valid_and_agree_on_the_members() {
    let mut members = Vec::new();
    for region in REGIONS {
        let config = read_local(&format!("local/{region}.toml"), region);
        members.push(config.members);
    }
    assert!(
        members.windows(2).all(|w| w[0] == w[1]),
        "every node lists the same members"
    );
}

fn read_config(path: &Path, text: &str) -> Config {
    let config = Config::from_toml(text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    config
        .validate()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    config
}

/// A node config under deploy/ for a node of `region` listening where its own
/// member entry says the others reach it.
fn read_local(file: &str, region: &str) -> Config {
    let path = deploy().join(file);
    let text = std::fs::read_to_string(&path).expect("config exists");
    let config = read_config(&path, &text);
    assert_eq!(config.region, region, "{file}");
    let me = config
        .members
        .iter()
        .find(|m| m.id == config.node_id)
        .unwrap_or_else(|| panic!("{file}: self is a member"));
    assert_eq!(me.region, region, "{file}");
    assert_eq!(
        me.api_addr, config.listen,
        "{file}: listen must be the advertised API address"
    );
    assert_eq!(
        me.raft_addr, config.raft_listen,
        "{file}: raft_listen must be advertised"
    );
    config
}

/// Three regions of three nodes: nine members with distinct ids, three in
/// each region (that region's group).
fn assert_three_per_region(members: &[Member], what: &str) {
    let ids: BTreeSet<u64> = members.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 9, "{what}: nine members with distinct ids");
    let mut per_region: BTreeMap<&str, usize> = BTreeMap::new();
    for m in members {
        *per_region.entry(m.region.as_str()).or_default() += 1;
    }
    assert_eq!(
        per_region,
        REGIONS.iter().map(|r| (*r, 3)).collect(),
        "{what}: one group of three per region"
    );
}

/// The configs of one three-node layout, checked as they are read.
#[derive(Default)]
struct Layout {
    ids: BTreeSet<u64>,
    members: Vec<Vec<Member>>,
}

impl Layout {
    fn add(&mut self, config: Config, what: &str) {
        let id = config.node_id;
        assert!(self.ids.insert(id), "{what}: node id {id} reused");
        assert_three_per_region(&config.members, what);
        self.members.push(config.members);
    }

    /// Every config lists the same members, and every member has a config.
    fn check(&self) {
        assert!(
            self.members.windows(2).all(|w| w[0] == w[1]),
            "every config lists the same members"
        );
        let listed: BTreeSet<u64> = self.members[0].iter().map(|m| m.id).collect();
        assert_eq!(self.ids, listed, "every member has its config");
    }
}

#[test]
fn local_three_node_regions_list_every_member_and_make_one_group_of_three_per_region() {
    let mut layout = Layout::default();
    for region in REGIONS {
        for replica in 1..=3 {
            let file = format!("local-3/{region}{replica}.toml");
            let config = read_local(&file, region);
            layout.add(config, &file);
        }
    }
    layout.check();
}

#[test]
fn kubernetes_regions_run_three_nodes_each_listing_every_member() {
    let mut layout = Layout::default();
    for region in REGIONS {
        let path = deploy().join(format!("k8s/region-{region}.yaml"));
        let text = std::fs::read_to_string(&path).expect("manifest exists");
        for needed in [
            "kind: StatefulSet",
            "replicas: 3",
            // Ordered start would wait for a pod that needs the others to be ready.
            "podManagementPolicy: Parallel",
            "publishNotReadyAddresses: true",
            "kind: PodDisruptionBudget",
            "maxUnavailable: 1",
        ] {
            assert!(text.contains(needed), "{}: no {needed:?}", path.display());
        }
        // The ConfigMap's `node.toml: |` block, indented by four spaces.
        let start =
            text.find("  node.toml: |\n").expect("node.toml block") + "  node.toml: |\n".len();
        let block: String = text[start..]
            .lines()
            .take_while(|l| l.starts_with("    ") || l.is_empty())
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        // Each pod fills in what the config takes from its host: the id from its
        // name, the admin token from the Secret's variable.
        let env = |name: &str| {
            (name == "KEYHOLD_ADMIN_TOKEN").then(|| "a-long-enough-admin-token".to_owned())
        };
        for ordinal in 0..3 {
            let mut config =
                Config::from_toml(&block).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let host = Host {
                name: format!("keyhold-{region}-{ordinal}"),
                var: &env,
            };
            config
                .take_from_host(&host)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            config
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let id = config.node_id;
            assert_eq!(config.region, region);
            let me = config
                .members
                .iter()
                .find(|m| m.id == id)
                .unwrap_or_else(|| panic!("{}: pod {ordinal} is no member", path.display()));
            assert_eq!(me.region, region, "{}: pod {ordinal}", path.display());
            assert_eq!(
                me.api_addr,
                format!("keyhold-{region}-{ordinal}.keyhold-{region}:7400"),
                "{}: pod {ordinal}'s member entry names the pod",
                path.display()
            );
            layout.add(config, &path.display().to_string());
        }
    }
    layout.check();
}
