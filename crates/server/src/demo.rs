//! `/demo`: the browser demo, on the node's own origin so the page calls the API
//! without CORS. By default the files are compiled into the binary: the page
//! and its script (wasm/www), the browser client (wasm/js/client.js) and the
//! `@keyhold/fingerprint` module built by `wasm/build.sh` and committed in
//! wasm/dist (so `cargo run -p keyhold-cli -- up` serves a working demo with no
//! wasm toolchain; wasm/test.sh fails when wasm/dist differs from a fresh
//! build). With `Config::demo_dir` (for working on the page) the folder is
//! served instead: only plain file names (no dot-files, no `..`, nothing
//! outside the folder, symlinks included). `/demo` redirects to `/demo/`.
//! `/demo/cluster.json` tells the page which regions the cluster has (names
//! only, from this node's registry replica), whichever folder is served.

use crate::node::Node;
use crate::problem::ApiError;
use axum::extract::OriginalUri;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use keyhold_core::Problem;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the demo is mounted; `routes::router` nests [`service`] here.
pub const MOUNT: &str = "/demo";

/// The demo compiled into the binary: each path below the mount and its bytes.
const EMBEDDED: [(&str, &[u8]); 5] = [
    (
        "/index.html",
        include_bytes!("../../../wasm/www/index.html"),
    ),
    ("/app.js", include_bytes!("../../../wasm/www/app.js")),
    (
        "/pkg/client.js",
        include_bytes!("../../../wasm/js/client.js"),
    ),
    (
        "/pkg/web/keyhold_fingerprint.js",
        include_bytes!("../../../wasm/dist/keyhold_fingerprint.js"),
    ),
    (
        "/pkg/web/keyhold_fingerprint_bg.wasm",
        include_bytes!("../../../wasm/dist/keyhold_fingerprint_bg.wasm"),
    ),
];

/// The service to nest at [`MOUNT`].
pub fn service(node: &Arc<Node>) -> Router {
    let dir = node.config().demo_dir.clone();
    let cluster_node = node.clone();
    Router::new()
        .route(
            "/cluster.json",
            get(move || {
                let node = cluster_node.clone();
                async move { cluster(&node) }
            }),
        )
        .fallback(
            move |method: Method, OriginalUri(original): OriginalUri, uri: Uri| {
                let dir = dir.clone();
                async move { serve(dir.as_deref(), &method, original.path(), uri.path()).await }
            },
        )
}

/// The regions the page shows: names are no secret (every answer's
/// `Keyhold-Region` carries one), addresses and tenants stay behind the admin API.
fn cluster(node: &Node) -> Response {
    let regions: Vec<_> = node
        .registry()
        .regions()
        .into_iter()
        .map(|r| serde_json::json!({ "name": r.name }))
        .collect();
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"))],
        Json(serde_json::json!({ "this_region": node.region(), "regions": regions })),
    )
        .into_response()
}

async fn serve(dir: Option<&Path>, method: &Method, original: &str, inner: &str) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return ApiError::new(Problem::MethodNotAllowed).into_response();
    }
    if original == MOUNT {
        return Redirect::permanent("/demo/").into_response();
    }
    let Some(dir) = dir else {
        return serve_embedded(inner);
    };
    let Some(path) = file_path(dir, inner) else {
        return not_found();
    };
    // Resolve symlinks and refuse anything that ends up outside the folder.
    let inside = match (
        tokio::fs::canonicalize(dir).await,
        tokio::fs::canonicalize(&path).await,
    ) {
        (Ok(root), Ok(file)) if file.starts_with(&root) => file,
        _ => return not_found(),
    };
    match tokio::fs::read(&inside).await {
        Ok(bytes) => file_response(&inside, bytes),
        Err(_) => not_found(),
    }
}

fn serve_embedded(inner: &str) -> Response {
    let wanted = match inner {
        "" | "/" => "/index.html",
        other => other,
    };
    match EMBEDDED.iter().find(|(path, _)| *path == wanted) {
        Some((path, bytes)) => file_response(Path::new(path), bytes.to_vec()),
        None => not_found(),
    }
}

fn file_response(path: &Path, bytes: Vec<u8>) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(path)),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        bytes,
    )
        .into_response()
}

fn not_found() -> Response {
    ApiError::new(Problem::NotFound).into_response()
}

/// The file for a path below the mount (`/`, `/app.js`, `/pkg/web/x.wasm`):
/// `index.html` for folders, `None` for anything but plain names.
fn file_path(dir: &Path, inner: &str) -> Option<PathBuf> {
    let rel = inner.strip_prefix('/').unwrap_or(inner);
    let mut path = dir.to_path_buf();
    let mut segments = rel.split('/').peekable();
    while let Some(segment) = segments.next() {
        if segment.is_empty() && segments.peek().is_none() {
            path.push("index.html");
            return Some(path);
        }
        let plain = !segment.is_empty()
            && !segment.starts_with('.')
            && segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !plain {
            return None;
        }
        path.push(segment);
    }
    Some(path)
}

fn content_type(path: &Path) -> &'static str {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("md" | "txt" | "ts") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_map_to_files() {
        let dir = Path::new("/srv/site");
        assert_eq!(file_path(dir, "/"), Some(dir.join("index.html")));
        assert_eq!(file_path(dir, ""), Some(dir.join("index.html")));
        assert_eq!(file_path(dir, "/app.js"), Some(dir.join("app.js")));
        assert_eq!(
            file_path(dir, "/pkg/web/keyhold_fingerprint_bg.wasm"),
            Some(dir.join("pkg/web/keyhold_fingerprint_bg.wasm"))
        );
        assert_eq!(file_path(dir, "/pkg/"), Some(dir.join("pkg/index.html")));
        for bad in [
            "/../etc/passwd",
            "/pkg/../../x",
            "/.env",
            "/a//b",
            "/%2e%2e/x",
            "/a\\b",
        ] {
            assert_eq!(file_path(dir, bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn serves_files_and_refuses_the_rest() {
        let site = tempfile::tempdir().unwrap();
        std::fs::write(site.path().join("index.html"), "<!doctype html>").unwrap();
        std::fs::create_dir(site.path().join("pkg")).unwrap();
        std::fs::write(site.path().join("pkg/m.wasm"), b"\0asm").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "no").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            site.path().join("leak.txt"),
        )
        .unwrap();
        let dir = Some(site.path());
        let get = Method::GET;

        let index = serve(dir, &get, "/demo/", "/").await;
        assert_eq!(index.status(), 200);
        assert_eq!(
            index.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let wasm = serve(dir, &get, "/demo/pkg/m.wasm", "/pkg/m.wasm").await;
        assert_eq!(wasm.status(), 200);
        assert_eq!(wasm.headers()[header::CONTENT_TYPE], "application/wasm");
        let redirect = serve(dir, &get, "/demo", "/").await;
        assert_eq!(redirect.status(), 308);
        assert_eq!(redirect.headers()[header::LOCATION], "/demo/");

        for (original, inner) in [
            ("/demo/leak.txt", "/leak.txt"),
            ("/demo/missing.js", "/missing.js"),
            ("/demo/../x", "/../x"),
        ] {
            let r = serve(dir, &get, original, inner).await;
            assert_eq!(r.status(), 404, "{original}");
        }
        assert_eq!(serve(dir, &Method::POST, "/demo/", "/").await.status(), 405);
    }

    #[tokio::test]
    async fn without_a_folder_the_compiled_in_demo_is_served() {
        let get = Method::GET;
        let index = serve(None, &get, "/demo/", "/").await;
        assert_eq!(index.status(), 200);
        assert_eq!(
            index.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let wasm = serve(
            None,
            &get,
            "/demo/pkg/web/keyhold_fingerprint_bg.wasm",
            "/pkg/web/keyhold_fingerprint_bg.wasm",
        )
        .await;
        assert_eq!(wasm.status(), 200);
        assert_eq!(wasm.headers()[header::CONTENT_TYPE], "application/wasm");
        let bytes = axum::body::to_bytes(wasm.into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(bytes.starts_with(b"\0asm"), "a WebAssembly module");
        assert_eq!(serve(None, &get, "/demo", "/").await.status(), 308);
        for (original, inner) in [("/demo/nope.js", "/nope.js"), ("/demo/../x", "/../x")] {
            let missing = serve(None, &get, original, inner).await;
            assert_eq!(missing.status(), 404, "{original}");
            assert_eq!(
                missing.headers()[header::CONTENT_TYPE],
                "application/problem+json"
            );
        }
        assert_eq!(
            serve(None, &Method::POST, "/demo/", "/").await.status(),
            405
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(content_type(Path::new("x.wasm")), "application/wasm");
        assert_eq!(
            content_type(Path::new("a/app.js")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type(Path::new("index.html")),
            "text/html; charset=utf-8"
        );
        assert_eq!(
            content_type(Path::new("client.d.ts")),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            content_type(Path::new("LICENSE")),
            "application/octet-stream"
        );
    }
}
