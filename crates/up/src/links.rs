//! The network between nodes: a routed proxy (`keyhold-netem`) in front of
//! every node's API and Raft listener, through which every other node reaches
//! it. A proxy tells the calling node by the connection's source address (each
//! node connects out from its own loopback address, `layout::node_ip`):
//! calls from the node's own region pass at once; calls between regions get
//! the simulated one-way delay, and are cut both ways while either region is
//! isolated. A node can be isolated alone (contract section 11): every call
//! between it and any other node, its own region's included, is cut both ways,
//! while clients still reach its API directly. So with several nodes per
//! region, the traffic of a region's own group (Raft, forwarding to its leader)
//! never crosses the simulated network: an isolated region keeps working
//! inside, and an isolated node is cut off from its own group too.

use crate::layout::{node_of, NodePlan};
use crate::Error;
use keyhold_netem::{Link, Proxy, Route};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Which regions and nodes are cut off, and the delay between regions.
#[derive(Debug)]
struct State {
    isolated_regions: Vec<AtomicBool>,
    isolated_nodes: Vec<AtomicBool>,
    /// The region (index) of each node (index in the plan).
    region_of_node: Vec<usize>,
    one_way: Duration,
}

/// The route of the proxies in front of one node.
struct ToNode {
    state: Arc<State>,
    node: usize,
}

impl Route for ToNode {
    fn link(&self, peer: IpAddr) -> Link {
        let state = &self.state;
        let from = node_of(peer, state.region_of_node.len());
        let node_isolated = |k: usize| state.isolated_nodes[k].load(Ordering::SeqCst);
        if node_isolated(self.node) || from.is_some_and(node_isolated) {
            return Link::Cut;
        }
        let region = state.region_of_node[self.node];
        let from_region = from.map(|k| state.region_of_node[k]);
        if from_region == Some(region) {
            return Link::Open {
                delay: Duration::ZERO,
            };
        }
        // Anything else (another region, or a caller that is no node) crosses
        // the inter-region network.
        let region_isolated = |r: usize| state.isolated_regions[r].load(Ordering::SeqCst);
        if region_isolated(region) || from_region.is_some_and(region_isolated) {
            return Link::Cut;
        }
        Link::Open {
            delay: state.one_way,
        }
    }
}

/// Every proxy of the cluster.
pub struct Links {
    state: Arc<State>,
    proxies: Mutex<Vec<Proxy>>,
}

impl Links {
    /// Binds and starts the two proxies of every node.
    pub async fn start(nodes: &[NodePlan], regions: usize, rtt: Duration) -> Result<Links, Error> {
        let state = Arc::new(State {
            isolated_regions: (0..regions).map(|_| AtomicBool::new(false)).collect(),
            isolated_nodes: nodes.iter().map(|_| AtomicBool::new(false)).collect(),
            region_of_node: nodes.iter().map(|n| n.region_index).collect(),
            one_way: rtt / 2,
        });
        let mut proxies = Vec::new();
        for (k, node) in nodes.iter().enumerate() {
            for (front, upstream) in [(node.api_proxy, node.api), (node.raft_proxy, node.raft)] {
                let route = Arc::new(ToNode {
                    state: state.clone(),
                    node: k,
                });
                proxies.push(Proxy::routed(crate::bind(front).await?, upstream, route)?);
            }
        }
        Ok(Links {
            state,
            proxies: Mutex::new(proxies),
        })
    }

    /// Cuts (`true`) or restores (`false`) every link between `region` and the
    /// other regions. Open connections across a cut are closed by their own
    /// tasks, which see the change at once (callers wait `REROUTE_SETTLE_MS`).
    pub fn set_region_isolated(&self, region: usize, isolated: bool) {
        self.state.isolated_regions[region].store(isolated, Ordering::SeqCst);
        self.reroute();
    }

    pub fn is_region_isolated(&self, region: usize) -> bool {
        self.state.isolated_regions[region].load(Ordering::SeqCst)
    }

    /// Cuts (`true`) or restores (`false`) every link between node `k` (its
    /// index in the plan) and every other node, as `set_region_isolated` does.
    pub fn set_node_isolated(&self, k: usize, isolated: bool) {
        self.state.isolated_nodes[k].store(isolated, Ordering::SeqCst);
        self.reroute();
    }

    pub fn is_node_isolated(&self, k: usize) -> bool {
        self.state.isolated_nodes[k].load(Ordering::SeqCst)
    }

    fn reroute(&self) {
        let proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        for proxy in proxies.iter() {
            proxy.reroute();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::node_ip;

    const ONE_WAY: Duration = Duration::from_millis(25);

    /// The route in front of node `node` in a cluster of three regions of
    /// three nodes (node `k` in region `k % 3`, as `layout::plan` places them),
    /// of which the regions in `regions` and the nodes in `nodes` are cut off.
    fn route(node: usize, regions: &[usize], nodes: &[usize]) -> ToNode {
        let state = State {
            isolated_regions: (0..3)
                .map(|r| AtomicBool::new(regions.contains(&r)))
                .collect(),
            isolated_nodes: (0..9)
                .map(|k| AtomicBool::new(nodes.contains(&k)))
                .collect(),
            region_of_node: (0..9).map(|k| k % 3).collect(),
            one_way: ONE_WAY,
        };
        ToNode {
            state: Arc::new(state),
            node,
        }
    }

    const NEAR: Link = Link::Open {
        delay: Duration::ZERO,
    };
    const FAR: Link = Link::Open { delay: ONE_WAY };

    #[test]
    fn calls_inside_a_region_pass_at_once_even_while_it_is_isolated() {
        for isolated in [&[][..], &[0], &[1], &[0, 1, 2]] {
            for k in 0..9 {
                let peer = (k + 3) % 9;
                assert_eq!(
                    route(k, isolated, &[]).link(node_ip(peer)),
                    NEAR,
                    "node {k} from {peer}, isolated {isolated:?}"
                );
            }
        }
    }

    #[test]
    fn calls_between_regions_are_delayed_and_cut_while_either_side_is_isolated() {
        assert_eq!(route(0, &[], &[]).link(node_ip(1)), FAR);
        assert_eq!(
            route(0, &[2], &[]).link(node_ip(4)),
            FAR,
            "a third region's cut"
        );
        assert_eq!(
            route(0, &[0], &[]).link(node_ip(1)),
            Link::Cut,
            "into the isolated"
        );
        assert_eq!(
            route(0, &[1], &[]).link(node_ip(1)),
            Link::Cut,
            "out of the isolated"
        );
    }

    #[test]
    fn an_isolated_node_is_cut_from_every_node_its_own_region_included() {
        // Node 3 is the second node of region 0, beside nodes 0 and 6.
        for peer in (0..9).filter(|&k| k != 3) {
            assert_eq!(
                route(3, &[], &[3]).link(node_ip(peer)),
                Link::Cut,
                "into 3 from {peer}"
            );
            assert_eq!(
                route(peer, &[], &[3]).link(node_ip(3)),
                Link::Cut,
                "out of 3 to {peer}"
            );
        }
        // The rest of its region, and of the cluster, is untouched.
        assert_eq!(route(0, &[], &[3]).link(node_ip(6)), NEAR);
        assert_eq!(route(0, &[], &[3]).link(node_ip(1)), FAR);
        // A caller that is no node crosses the network, which the node is cut from.
        let elsewhere: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(route(3, &[], &[3]).link(elsewhere), Link::Cut);
    }

    #[test]
    fn a_caller_that_is_no_node_crosses_the_network_between_regions() {
        let elsewhere: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(route(0, &[], &[]).link(elsewhere), FAR);
        assert_eq!(route(0, &[1], &[]).link(elsewhere), FAR);
        assert_eq!(route(0, &[0], &[]).link(elsewhere), Link::Cut);
    }
}
