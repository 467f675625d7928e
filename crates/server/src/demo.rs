//! `/demo`: the browser demo's static files (the `wasm/site` folder that
//! `wasm/build.sh` assembles: a page, its script and the `@keyhold/fingerprint`
//! package) served from `Config::demo_dir`, so the page calls the API on its own
//! origin and needs no CORS. Only plain file names are served (no dot-files, no
//! `..`, nothing outside the folder, symlinks included); `/demo` redirects to
//! `/demo/`. Without a `demo_dir` every `/demo` path is a 404 problem.

use crate::node::Node;
use crate::problem::ApiError;
use axum::extract::OriginalUri;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Router;
use keyhold_core::Problem;
use std::path::{Path, PathBuf};

/// Where the demo is mounted; `routes::router` nests [`service`] here.
pub const MOUNT: &str = "/demo";

/// The service to nest at [`MOUNT`].
pub fn service(node: &Node) -> Router {
    let dir = node.config().demo_dir.clone();
    Router::new().fallback(
        move |method: Method, OriginalUri(original): OriginalUri, uri: Uri| {
            let dir = dir.clone();
            async move { serve(dir.as_deref(), &method, original.path(), uri.path()).await }
        },
    )
}

async fn serve(dir: Option<&Path>, method: &Method, original: &str, inner: &str) -> Response {
    let Some(dir) = dir else {
        return ApiError::new(Problem::NotFound)
            .detail("this node serves no demo (start it with --demo-dir)")
            .into_response();
    };
    if method != Method::GET && method != Method::HEAD {
        return ApiError::new(Problem::MethodNotAllowed).into_response();
    }
    if original == MOUNT {
        return Redirect::permanent("/demo/").into_response();
    }
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
        Ok(bytes) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(content_type(&inside)),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                (
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                ),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => not_found(),
    }
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
        let off = serve(None, &get, "/demo/", "/").await;
        assert_eq!(off.status(), 404);
        assert_eq!(
            off.headers()[header::CONTENT_TYPE],
            "application/problem+json"
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
