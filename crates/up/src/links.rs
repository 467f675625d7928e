//! The network between regions: a routed proxy (`keyhold-netem`) in front of
//! every node's API and Raft listener, through which every other node reaches
//! it. A proxy tells the calling region by the connection's source address
//! (each region's nodes connect out from their own loopback address): calls
//! from the node's own region pass at once and are never cut; calls between
//! regions get the simulated one-way delay, and are cut both ways while
//! either region is isolated. So with several nodes per region, the traffic
//! of a region's own group (Raft, forwarding to its leader) never crosses the
//! simulated network: an isolated region keeps working inside.

use crate::layout::{region_of, NodePlan};
use crate::Error;
use keyhold_netem::{Link, Proxy, Route};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Which regions are cut off, and the delay between the others.
#[derive(Debug)]
struct State {
    isolated: Vec<AtomicBool>,
    one_way: Duration,
}

/// The route of the proxies in front of one node.
struct ToRegion {
    state: Arc<State>,
    region: usize,
}

impl Route for ToRegion {
    fn link(&self, peer: IpAddr) -> Link {
        let regions = self.state.isolated.len();
        let from = region_of(peer, regions);
        if from == Some(self.region) {
            return Link::Open {
                delay: Duration::ZERO,
            };
        }
        // Anything else (another region, or a caller that is no node) crosses
        // the inter-region network.
        let isolated = |r: usize| self.state.isolated[r].load(Ordering::SeqCst);
        if isolated(self.region) || from.is_some_and(isolated) {
            return Link::Cut;
        }
        Link::Open {
            delay: self.state.one_way,
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
            isolated: (0..regions).map(|_| AtomicBool::new(false)).collect(),
            one_way: rtt / 2,
        });
        let mut proxies = Vec::new();
        for node in nodes {
            for (front, upstream) in [(node.api_proxy, node.api), (node.raft_proxy, node.raft)] {
                let route = Arc::new(ToRegion {
                    state: state.clone(),
                    region: node.region_index,
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
    pub fn set_isolated(&self, region: usize, isolated: bool) {
        self.state.isolated[region].store(isolated, Ordering::SeqCst);
        let proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        for proxy in proxies.iter() {
            proxy.reroute();
        }
    }

    pub fn is_isolated(&self, region: usize) -> bool {
        self.state.isolated[region].load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::region_ip;

    const ONE_WAY: Duration = Duration::from_millis(25);

    /// The route in front of a node of `region`, in a cluster of three regions
    /// of which those in `isolated` are cut off.
    fn route(region: usize, isolated: &[usize]) -> ToRegion {
        let state = State {
            isolated: (0..3)
                .map(|r| AtomicBool::new(isolated.contains(&r)))
                .collect(),
            one_way: ONE_WAY,
        };
        ToRegion {
            state: Arc::new(state),
            region,
        }
    }

    const NEAR: Link = Link::Open {
        delay: Duration::ZERO,
    };
    const FAR: Link = Link::Open { delay: ONE_WAY };

    #[test]
    fn calls_inside_a_region_pass_at_once_even_while_it_is_isolated() {
        for isolated in [&[][..], &[0], &[1], &[0, 1, 2]] {
            for r in 0..3 {
                assert_eq!(
                    route(r, isolated).link(region_ip(r)),
                    NEAR,
                    "region {r}, isolated {isolated:?}"
                );
            }
        }
    }

    #[test]
    fn calls_between_regions_are_delayed_and_cut_while_either_side_is_isolated() {
        assert_eq!(route(0, &[]).link(region_ip(1)), FAR);
        assert_eq!(
            route(0, &[2]).link(region_ip(1)),
            FAR,
            "a third region's cut"
        );
        assert_eq!(
            route(0, &[0]).link(region_ip(1)),
            Link::Cut,
            "into the isolated"
        );
        assert_eq!(
            route(0, &[1]).link(region_ip(1)),
            Link::Cut,
            "out of the isolated"
        );
    }

    #[test]
    fn a_caller_that_is_no_node_crosses_the_network_between_regions() {
        let elsewhere: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(route(0, &[]).link(elsewhere), FAR);
        assert_eq!(route(0, &[1]).link(elsewhere), FAR);
        assert_eq!(route(0, &[0]).link(elsewhere), Link::Cut);
    }
}
