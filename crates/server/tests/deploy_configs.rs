//! The operator-facing configs under deploy/ stay valid: every local node config
//! parses and passes the node's start-up rules, and the Kubernetes ConfigMaps'
//! embedded node configs do too (with the admin token placeholder filled in).

use keyhold_server::Config;
use std::path::{Path, PathBuf};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn local_node_configs_are_valid_and_agree_on_the_members() {
    let mut members = Vec::new();
    for region in ["a", "b", "c"] {
        let path = deploy().join(format!("local/{region}.toml"));
        let text = std::fs::read_to_string(&path).expect("config exists");
        let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.region, region);
        let me = config
            .members
            .iter()
            .find(|m| m.id == config.node_id)
            .expect("self is a member");
        assert_eq!(
            me.api_addr, config.listen,
            "{region}: listen must be the advertised API address"
        );
        assert_eq!(
            me.raft_addr, config.raft_listen,
            "{region}: raft_listen must be advertised"
        );
        members.push(config.members);
    }
    assert!(
        members.windows(2).all(|w| w[0] == w[1]),
        "every node lists the same members"
    );
}

#[test]
fn kubernetes_node_configs_are_valid() {
    for region in ["a", "b", "c"] {
        let path = deploy().join(format!("k8s/region-{region}.yaml"));
        let text = std::fs::read_to_string(&path).expect("manifest exists");
        // The ConfigMap's `node.toml: |` block, indented by four spaces.
        let start =
            text.find("  node.toml: |\n").expect("node.toml block") + "  node.toml: |\n".len();
        let block: String = text[start..]
            .lines()
            .take_while(|l| l.starts_with("    ") || l.is_empty())
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        let toml = block.replace("${KEYHOLD_ADMIN_TOKEN}", "a-long-enough-admin-token");
        let config = Config::from_toml(&toml).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.region, region);
        assert_eq!(config.members.len(), 3);
    }
}
