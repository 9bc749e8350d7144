//! The inspector page at `/ui` (docs/http-api.md#the-inspector-page): one HTML page, one
//! script and one stylesheet built into the binary, no build step and nothing loaded from
//! elsewhere. The page reads only the public endpoints, with the caller's own token, so it
//! shows nothing the API would not show the same caller.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::app::App;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Only this origin's script and stylesheet run: no inline script or style, no plugin, no
/// framing, no form posting elsewhere. Message text is inserted as text by the script, and
/// this is the second wall should it ever not be.
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    frame-ancestors 'none'; form-action 'none'";

pub(crate) fn router() -> Router<App> {
    Router::new()
        .route("/ui", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/", get(|| async { Redirect::permanent("/ui") }))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

/// A static asset with the page's security headers.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_loads_only_its_own_assets() {
        // No inline script or style (the CSP would block them) and nothing from elsewhere.
        assert!(!INDEX.contains("<style"));
        assert!(!INDEX.contains(" style="));
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"));
        assert_eq!(INDEX.matches("<script").count(), 1);
        assert!(INDEX.contains(r#"<script src="/ui/app.js"></script>"#));
        // Message text is never parsed as HTML.
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML"));
        assert!(!SCRIPT.contains("insertAdjacentHTML") && !SCRIPT.contains("document.write"));
        assert!(!SCRIPT.contains("eval("));
    }
}
