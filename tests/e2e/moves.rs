//! End-to-end tests of planned moves and of the inter-node boundary they rely on
//! (contract section 8, last two bullets), against the real binary: inter-node
//! endpoints (Raft, move copy) refuse every caller without the cluster's node
//! credential and change nothing; a client's `Keyhold-Epoch` has no effect.

mod common;

use common::{assert_order, order_body, unique, Cluster};

const REGIONS: [&str; 3] = ["a", "b", "c"];

/// A raw answer from a listener that is not an API node (no common checks).
fn raw(rb: reqwest::blocking::RequestBuilder) -> (u16, String, String) {
    let r = rb.send().expect("the listener answers");
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, content_type, r.text().unwrap_or_default())
}

/// Inter-node (1): Raft and move endpoints answer 401 `unauthenticated` to the
/// admin token, a tenant token, no credential and a wrong one; nothing changes
/// (the tenant still executes, the registry still has its leader and tenants);
/// the right credential opens them. A client's `Keyhold-Epoch` is ignored.
#[test]
fn inter_node_endpoints_need_the_node_credential() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let tenant = cluster.tenant("a");
    let credential = std::fs::read_to_string(cluster.data_dir().join("node-credential"))
        .expect("keyhold up keeps the node credential in its data dir")
        .trim()
        .to_owned();
    assert!(credential.len() >= 32);
    assert_ne!(credential, admin);
    let http = reqwest::blocking::Client::new();
    let tenants_before = cluster.api("b").get(
        &format!("/admin/v1/tenants/{}", tenant.tenant_id),
        Some(&admin),
    );
    tenants_before.assert_status(200);

    let wrong = "wrong-node-credential-0123456789abcdef";
    type Caller<'a> = (
        &'a str,
        Box<dyn Fn(reqwest::blocking::RequestBuilder) -> reqwest::blocking::RequestBuilder + 'a>,
    );
    let callers: Vec<Caller> = vec![
        ("nobody", Box::new(|rb| rb)),
        ("the admin token", Box::new(|rb| rb.bearer_auth(&admin))),
        (
            "a tenant token",
            Box::new(|rb| rb.bearer_auth(&tenant.token)),
        ),
        (
            "a wrong credential",
            Box::new(|rb| rb.header("keyhold-node-credential", wrong)),
        ),
        (
            "the admin token as credential",
            Box::new(|rb| rb.header("keyhold-node-credential", &admin)),
        ),
    ];
    let t = &tenant.tenant_id;
    for (i, region) in REGIONS.iter().enumerate() {
        let raft = format!(
            "http://127.0.0.1:{}",
            cluster.base_port + common::RAFT_PORT_OFFSET + i as u16
        );
        let api = cluster.region(region).api_url.clone();
        for (who, with) in &callers {
            for rpc in ["append", "vote", "snapshot", "write"] {
                let url = format!("{raft}/raft/registry/{rpc}");
                let (status, content_type, body) = raw(with(http.post(url)).body(vec![0u8; 8]));
                assert_eq!(status, 401, "{rpc} on {region} from {who}: {body}");
                assert_eq!(content_type, "application/problem+json");
                assert!(body.contains("/problems/unauthenticated"), "{body}");
            }
            let internal = [
                http.post(format!(
                    "{api}/internal/v1/moves/{t}/fence?registry_index=0"
                )),
                http.get(format!("{api}/internal/v1/moves/{t}/export?max=10")),
                http.post(format!("{api}/internal/v1/moves/{t}/import"))
                    .body(vec![0u8]),
            ];
            for rb in internal {
                let api = cluster.api(region);
                let r = api.send(with(rb));
                r.assert_problem(401, "unauthenticated");
            }
        }
    }
    // Nothing changed: the tenant is still active at home, and executes there.
    let after = cluster
        .api("b")
        .get(&format!("/admin/v1/tenants/{t}"), Some(&admin));
    assert_eq!(after.json(), tenants_before.json());
    let coid = unique("co");
    let r = cluster
        .api("a")
        .create_order(&tenant.token, &unique("k"), &order_body(&coid, 7));
    assert_order(&r, 201, &coid, 7);

    // The right credential opens an internal endpoint (export reads only).
    let api = cluster.region("a").api_url.clone();
    let (status, _, _) = raw(http
        .get(format!("{api}/internal/v1/moves/{t}/export?max=10"))
        .header("keyhold-node-credential", &credential));
    assert_eq!(status, 200);

    // A client's Keyhold-Epoch changes nothing: sent to the home or to another
    // region, with any value, the order is placed and executed as usual.
    for via in REGIONS {
        for epoch in ["0", "1", "99"] {
            let coid = unique("co");
            let api = cluster.api(via).expecting("a");
            let rb = api
                .order_rb(&tenant.token, &unique("k"), &order_body(&coid, 8))
                .header("keyhold-epoch", epoch);
            let r = api.send(rb);
            assert_order(&r, 201, &coid, 8);
        }
        // A wrong credential on a tenant route is refused, never trusted.
        let api = cluster.api(via);
        let rb = api
            .order_rb(&tenant.token, &unique("k"), &order_body(&unique("co"), 9))
            .header("keyhold-epoch", "1")
            .header("keyhold-node-credential", wrong);
        api.send(rb).assert_problem(401, "unauthenticated");
    }
}
