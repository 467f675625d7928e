//! One client address cannot starve the others (contract section 11, "The HTTP
//! edge"; probe d44e5cf, O1 and O2), against a real `keyhold up` node:
//! - 20,000 idle connections from 127.0.0.1 (as many as this process may open
//!   when its descriptor limit cannot be raised that far, at least 19,000),
//!   then a flood of 300 new idle connections a second from the same address,
//!   while a client connecting from 127.0.0.2 creates orders, each within 2 s;
//! - made-up tokens of the tenant form: only a bounded number of them wait
//!   for the registry, the others are refused at once.
//!
//! The node listens on 127.0.0.1; all of 127/8 is loopback on Linux, so a
//! socket bound to 127.0.0.2 reaches it from another address. Every connection
//! and process the tests open is closed when they end.

mod common;

use common::{order_body, unique, Cluster};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Idle connections the first phase opens from one address.
const IDLE_CONNECTIONS: usize = 20_000;
/// The contract's number: what one process may hold here.
const IDLE_CONNECTIONS_MIN: usize = 19_000;
/// Descriptors this process keeps for everything else (the cluster's pipes,
/// the HTTP client, the test harness).
const SPARE_DESCRIPTORS: u64 = 100;
/// One idle connection's handshake.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// The flood: new idle connections a second, for this long.
const FLOOD_PER_SECOND: u32 = 300;
const FLOOD_SECONDS: u64 = 6;
/// Each order of the other client must be created within this (contract).
const ORDER_WITHIN: Duration = Duration::from_secs(2);
/// The node's bound on concurrent registry waits for unknown tokens
/// (`REGISTRY_CATCH_UP_WAITS_MAX`), and the made-up tokens sent at once.
const TOKEN_WAITS_MAX: usize = 32;
const MADE_UP_TOKENS: usize = 100;
/// A made-up token that waited for the registry took at least this long
/// (`REGISTRY_CATCH_UP_WAIT_MS`, with a margin for the timer); one refused
/// at once takes milliseconds.
const TOKEN_WAITED: Duration = Duration::from_millis(900);

const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Raises this process's descriptor limit to `want` (root may raise the hard
/// limit too); returns the soft limit in force afterwards.
fn raise_descriptor_limit(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let wanted = Rlimit {
        current: Some(want),
        maximum: Some(want),
    };
    if setrlimit(Resource::Nofile, wanted).is_err() {
        let now = getrlimit(Resource::Nofile);
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: now.maximum,
                maximum: now.maximum,
            },
        );
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// A client whose connections come from 127.0.0.2.
fn other_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .local_address(OTHER)
        .timeout(ORDER_WITHIN)
        .build()
        .expect("client")
}

/// Creates one order from 127.0.0.2; how long it took, or what went wrong.
fn create_order(
    client: &reqwest::blocking::Client,
    base: &str,
    token: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    let coid = unique("conn");
    let answer = client
        .post(format!("{base}/v1/orders"))
        .bearer_auth(token)
        .header("idempotency-key", unique("key"))
        .header("content-type", "application/json")
        .body(order_body(&coid, 10))
        .send()
        .map_err(|e| format!("no answer within {ORDER_WITHIN:?}: {e}"))?;
    let took = started.elapsed();
    if answer.status().as_u16() != 201 {
        return Err(format!("{} after {took:?}", answer.status()));
    }
    if took > ORDER_WITHIN {
        return Err(format!("201 after {took:?}"));
    }
    Ok(took)
}

/// Opens an idle connection from the flooding address; `None` when the
/// handshake does not complete in time (a SYN the kernel dropped because the
/// accept queue was full is sent again after 1 s, then 2 s). A plain connect:
/// to 127.0.0.1 its source is 127.0.0.1, and the kernel picks its port for
/// this destination alone, where a bind to port 0 first must find a port free
/// for every destination, which took most of a minute once ~15,000 were open.
fn idle_connection(to: SocketAddr) -> Option<TcpStream> {
    let conn = TcpStream::connect_timeout(&to, CONNECT_WITHIN).ok()?;
    assert_eq!(
        conn.local_addr().ok()?.ip(),
        FLOODER,
        "the flooder's address"
    );
    Some(conn)
}

#[test]
fn one_address_cannot_starve_the_others() {
    let limit = raise_descriptor_limit(IDLE_CONNECTIONS as u64 + SPARE_DESCRIPTORS);
    let idle_target = IDLE_CONNECTIONS.min(limit.saturating_sub(SPARE_DESCRIPTORS) as usize);
    assert!(
        idle_target >= IDLE_CONNECTIONS_MIN,
        "this process may open only {limit} descriptors"
    );
    let cluster = Cluster::start("a", &[]);
    let base = cluster.region("a").api_url.clone();
    let to: SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .expect("api address");
    assert_eq!(to.ip(), FLOODER, "the node listens on 127.0.0.1");
    let token = cluster.tenant("a").token;
    let client = other_client();
    create_order(&client, &base, &token).expect("an order before the flood");

    // Phase 1: every idle connection opened and held, then orders from the
    // other address.
    let opened_at = Instant::now();
    let mut idle: Vec<TcpStream> = Vec::with_capacity(idle_target);
    for _ in 0..idle_target {
        match idle_connection(to) {
            Some(conn) => idle.push(conn),
            None => break,
        }
    }
    let opening = opened_at.elapsed();
    assert_eq!(
        idle.len(),
        idle_target,
        "only {} of {idle_target} connections opened in {opening:?}: the node stopped accepting",
        idle.len()
    );
    let mut took = Vec::new();
    for _ in 0..5 {
        took.push(
            create_order(&client, &base, &token).expect("an order while idle connections are held"),
        );
    }
    eprintln!(
        "{} idle connections from 127.0.0.1 (descriptor limit {limit}) opened in {opening:?}; \
         orders from 127.0.0.2 took {took:?}",
        idle.len()
    );
    drop(idle);

    // Phase 2: a flood of new idle connections, while orders keep coming.
    let flood_done = std::sync::atomic::AtomicBool::new(false);
    let (opened, failures) = std::thread::scope(|s| {
        let flood = s.spawn(|| {
            let mut held = Vec::new();
            let started = Instant::now();
            let total = FLOOD_PER_SECOND as u64 * FLOOD_SECONDS;
            for i in 0..total {
                let due = started + Duration::from_secs(1) * i as u32 / FLOOD_PER_SECOND;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if let Some(conn) = idle_connection(to) {
                    held.push(conn);
                }
            }
            flood_done.store(true, std::sync::atomic::Ordering::SeqCst);
            held.len()
        });
        let mut failures = Vec::new();
        let mut orders = 0;
        while !flood_done.load(std::sync::atomic::Ordering::SeqCst) {
            orders += 1;
            if let Err(e) = create_order(&client, &base, &token) {
                failures.push(e);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let opened = flood.join().expect("flood thread");
        eprintln!(
            "flood: {opened} connections opened; {orders} orders, {} failed",
            failures.len()
        );
        (opened, failures)
    });
    assert!(
        opened as u64 >= FLOOD_PER_SECOND as u64 * FLOOD_SECONDS * 9 / 10,
        "the flood opened only {opened} connections: the node stopped accepting"
    );
    assert!(
        failures.is_empty(),
        "orders from 127.0.0.2 failed: {failures:?}"
    );
    // From the other address: the flooder's closed connections may still
    // hold its share for a moment.
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(
        metrics.contains(
            "keyhold_http_connections_refused_total{limit=\"connections_per_address_max\"}"
        ),
        "no connection was refused for its address: {metrics}"
    );
}

#[test]
fn made_up_tokens_wait_for_the_registry_only_a_few_at_a_time() {
    let cluster = Cluster::start("a", &[]);
    let base = cluster.region("a").api_url.clone();
    // All sent at once, so that the first waits have not ended when the
    // last tokens arrive.
    let start = std::sync::Barrier::new(MADE_UP_TOKENS);
    let durations: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..MADE_UP_TOKENS)
            .map(|i| {
                let url = format!("{base}/v1/orders?client_order_id=x");
                let start = &start;
                s.spawn(move || {
                    let client = reqwest::blocking::Client::new();
                    let token = format!("kh_{i:043}");
                    start.wait();
                    let started = Instant::now();
                    let answer = client
                        .get(url)
                        .bearer_auth(token)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .expect("answer");
                    assert_eq!(answer.status().as_u16(), 401);
                    started.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    let waited = durations.iter().filter(|d| **d >= TOKEN_WAITED).count();
    eprintln!("{waited} of {MADE_UP_TOKENS} made-up tokens waited for the registry");
    assert!(
        waited <= TOKEN_WAITS_MAX,
        "{waited} made-up tokens waited at once (at most {TOKEN_WAITS_MAX})"
    );
    // The bound did the refusing: the node counted the waits it skipped.
    let metrics = cluster.api("a").get("/metrics", None).text();
    let skipped = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyhold_token_waits_skipped_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    eprintln!("{skipped} registry waits skipped");
    assert!(
        skipped as usize >= MADE_UP_TOKENS - TOKEN_WAITS_MAX,
        "only {skipped} waits skipped: {durations:?}"
    );
}
