//! Keeps the API documents honest: docs/openapi.json must list exactly the routes
//! the router in `src/routes/mod.rs` serves (no more, no fewer), its problem schema
//! must name exactly the problem types of `keyhold_core::Problem::ALL`, and
//! docs/api.md must mention every problem slug. A route added or removed without
//! updating the documents fails here.

use keyhold_core::Problem;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The router of `src/routes/mod.rs`, written out by hand. Update it together with
/// the router, docs/openapi.json and docs/api.md.
const ROUTES: [(&str, &str); 28] = [
    ("POST", "/v1/orders"),
    ("GET", "/v1/orders"),
    ("GET", "/v1/orders/{order_id}"),
    ("POST", "/v1/claims"),
    ("POST", "/v1/claims/complete"),
    ("POST", "/v1/claims/heartbeat"),
    ("GET", "/v1/idempotency-policy"),
    ("GET", "/v1/fingerprint-specs"),
    ("POST", "/admin/v1/tenants"),
    ("GET", "/admin/v1/tenants"),
    ("GET", "/admin/v1/operations"),
    ("GET", "/admin/v1/tenants/{tenant_id}"),
    ("DELETE", "/admin/v1/tenants/{tenant_id}"),
    ("POST", "/admin/v1/tenants/{tenant_id}/token"),
    ("PUT", "/admin/v1/tenants/{tenant_id}/limits"),
    ("POST", "/admin/v1/tenants/{tenant_id}/move"),
    ("GET", "/admin/v1/operations/{operation_id}"),
    ("GET", "/admin/v1/cluster"),
    ("GET", "/admin/v1/regions/{region}/reconciliation"),
    ("POST", "/admin/v1/outbox/replay"),
    ("GET", "/admin/v1/inventory/reservations"),
    ("POST", "/admin/v1/regions/{region}/failover"),
    ("POST", "/admin/v1/nodes"),
    ("POST", "/admin/v1/nodes/{node_id}/remove"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/server sits two levels below the root")
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn expected() -> BTreeSet<(String, String)> {
    let set: BTreeSet<_> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(set.len(), ROUTES.len(), "ROUTES lists a route twice");
    set
}

fn openapi() -> serde_json::Value {
    serde_json::from_str(&read("docs/openapi.json")).expect("docs/openapi.json is valid JSON")
}

/// `(METHOD, path)` for every `.route("path", get(..).post(..))` call in the
/// router's source: the path literal, then every method router inside the call.
fn routes_in_source(source: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find(".route(") {
        // rustfmt may break the call after the parenthesis.
        rest = rest[at + ".route(".len()..].trim_start();
        let Some(after_quote) = rest.strip_prefix('"') else {
            continue;
        };
        rest = after_quote;
        let end = rest.find('"').expect("route path literal is closed");
        let path = &rest[..end];
        // The call's arguments run to the parenthesis that closes `.route(`.
        let mut depth = 1usize;
        let mut close = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let call = &rest[end + 1..close];
        let mut methods = 0;
        for method in HTTP_METHODS {
            let needle = format!("{method}(");
            let found = call.match_indices(&needle).any(|(i, _)| {
                // `get(` but not `forget(`: the method must start a word.
                i == 0 || !call.as_bytes()[i - 1].is_ascii_alphanumeric()
            });
            if found {
                methods += 1;
                out.insert((method.to_ascii_uppercase(), path.to_owned()));
            }
        }
        assert!(methods > 0, "no method router found for route {path}");
        rest = &rest[close..];
    }
    out
}

#[test]
fn the_route_list_mirrors_the_router_source() {
    let source = read("crates/server/src/routes/mod.rs");
    for (_, path) in ROUTES {
        assert!(
            source.contains(&format!("\"{path}\"")),
            "{path} is in this test's list but not in routes/mod.rs"
        );
    }
    assert_eq!(
        routes_in_source(&source),
        expected(),
        "routes/mod.rs and this test's ROUTES disagree"
    );
}

#[test]
fn openapi_documents_exactly_the_routes() {
    let doc = openapi();
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "docs/openapi.json must be OpenAPI 3.1"
    );
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut documented = BTreeSet::new();
    for (path, item) in paths {
        let item = item.as_object().expect("a path item is an object");
        for (key, operation) in item {
            if HTTP_METHODS.contains(&key.as_str()) {
                assert!(
                    operation["responses"]
                        .as_object()
                        .is_some_and(|r| !r.is_empty()),
                    "{key} {path} documents no responses"
                );
                documented.insert((key.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    assert_eq!(
        documented,
        expected(),
        "docs/openapi.json and the router disagree"
    );
}

#[test]
fn openapi_problem_types_are_exactly_the_problems() {
    let doc = openapi();
    let listed: BTreeSet<String> = doc["components"]["schemas"]["Problem"]["properties"]["type"]
        ["enum"]
        .as_array()
        .expect("the Problem schema enumerates its type URIs")
        .iter()
        .map(|v| v.as_str().expect("type URIs are strings").to_owned())
        .collect();
    let known: BTreeSet<String> = Problem::ALL.iter().map(|p| p.type_uri()).collect();
    assert_eq!(listed, known);
}

#[test]
fn api_md_names_every_problem_slug() {
    let text = read("docs/api.md");
    let missing: Vec<&str> = Problem::ALL
        .iter()
        .map(|p| p.slug())
        .filter(|slug| !text.contains(&format!("`{slug}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/api.md does not mention {missing:?}"
    );
}
