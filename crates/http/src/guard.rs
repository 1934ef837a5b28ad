//! Who may call: the bearer token (compared in constant time) and the refusal of requests
//! made by web pages (SPEC §10: a page in a browser must not drive the runtime). Browser
//! requests (`Origin`, a cross-site `Sec-Fetch-Site`) are refused; without a token, so are
//! non-loopback `Host` headers and request targets in absolute form (DNS rebinding), and a
//! request needs exactly one `Host`.

use ailab_sandbox_core::hash::sha256_hex;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

use crate::error::{ApiError, codes};

/// The expected token, kept only as its SHA-256 so that comparing takes the same time
/// whatever the presented token's length or content.
#[derive(Clone)]
pub(crate) struct Guard {
    token_digest: Option<Arc<str>>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("token", &self.token_digest.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Guard {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            token_digest: token.map(|t| Arc::from(sha256_hex(t.as_bytes()))),
        }
    }

    /// Whether the `Authorization` header carries the token. Without a configured token
    /// every request passes.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.token_digest else {
            return true;
        };
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return false;
        };
        let Some(presented) = bearer_token(value.as_bytes()) else {
            return false;
        };
        // An empty token never matches, even if one was configured empty.
        let matches = constant_time_eq(sha256_hex(presented).as_bytes(), expected.as_bytes());
        matches && !presented.is_empty()
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive, as RFC 9110 says).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let start = rest.iter().position(|b| *b != b' ')?;
    let end = rest.iter().rposition(|b| *b != b' ')?;
    Some(&rest[start..=end])
}

/// Compares two byte strings in time that depends only on their lengths (here both are
/// SHA-256 hex digests, so on nothing secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Why a request from a browser is refused, if it is one.
fn browser_refusal(req: &Request, token_set: bool) -> Option<ApiError> {
    let headers = req.headers();
    if headers.contains_key(header::ORIGIN) {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            codes::FORBIDDEN_ORIGIN,
            "requests from web pages (with an Origin header) are refused: this API is for agents and scripts, not browsers",
        ));
    }
    // Every value: a second one after `none` must not pass for the first.
    if headers
        .get_all("sec-fetch-site")
        .iter()
        .any(|site| site.as_bytes() != b"none")
    {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            codes::FORBIDDEN_ORIGIN,
            "requests made by web pages (Sec-Fetch-Site) are refused: this API is for agents and scripts, not browsers",
        ));
    }
    // Without a token the server listens on loopback only; a Host that is not a loopback
    // name means a DNS-rebinding page is talking to it. A request target in absolute form
    // names the host too, and RFC 9112 §3.2.2 puts it before the header: both must pass.
    let mut named = headers
        .get(header::HOST)
        .map(|h| h.as_bytes())
        .into_iter()
        .chain(req.uri().authority().map(|a| a.as_str().as_bytes()));
    if !token_set && named.any(|host| !is_loopback_host(host)) {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            codes::FORBIDDEN_HOST,
            "without a token only loopback host names are served (localhost, 127.0.0.1, [::1]); configure a token to serve other names",
        ));
    }
    None
}

/// Whether a `Host` header value names the loopback interface (`localhost`, a loopback
/// IPv4 or IPv6 literal), with or without a port.
pub(crate) fn is_loopback_host(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, port)) if port.is_empty() || port.starts_with(':') => inside,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    if name.eq_ignore_ascii_case("localhost") || name.eq_ignore_ascii_case("localhost.") {
        return true;
    }
    name.parse::<IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// The comma-separated entries of every `name` header, trimmed: `gzip, chunked` is
/// `gzip` then `chunked`, in one header or two.
pub(crate) fn header_list(
    headers: &HeaderMap,
    name: header::HeaderName,
) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(name)
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
}

/// Middleware: refuses browser requests (403) and requests without the token (401) on
/// every route, `/healthz` included (SPEC §10), so that nothing answers a caller who does
/// not hold the token. Each such refusal closes its connection (see [`closing`]).
pub(crate) async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    match admitted(&g, &req) {
        Some(refusal) => closing(refusal.into_response()),
        None => next.run(req).await,
    }
}

/// `response` with `Connection: close`, so that the connection ends once it is sent: a
/// caller refused for who it is would otherwise keep its connection, and its place among
/// the server's connections, by sending a request now and then (one holding no token
/// could so take every place of a server serving other hosts).
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// Why the request is refused before it is routed, if it is.
fn admitted(g: &Guard, req: &Request) -> Option<ApiError> {
    // RFC 9112 §3.2: answered 400. Served, several would pass the loopback check on one
    // Host while a proxy or the application could read another, and none would skip it.
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts != 1 {
        return Some(ApiError::bad_request(format!(
            "the request has {hosts} Host headers; this server needs exactly one (such as 'Host: localhost')"
        )));
    }
    if let Some(refusal) = browser_refusal(req, g.token_digest.is_some()) {
        return Some(refusal);
    }
    if !g.authorized(req.headers()) {
        return Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "this server needs 'Authorization: Bearer <token>' with the configured token",
        ));
    }
    // A transfer coding the server does not apply: read as plain, the body would differ
    // from what a proxy that applies it passed on. RFC 9112 §6.1 suggests 501; SPEC §10
    // answers bad input with a 4xx, never a 5xx: 400.
    let codings: Vec<&[u8]> = header_list(req.headers(), header::TRANSFER_ENCODING).collect();
    // `chunked` once, alone: anything else is a coding not applied (or applied twice).
    if codings.len() > 1 || codings.iter().any(|c| !c.eq_ignore_ascii_case(b"chunked")) {
        return Some(ApiError::bad_request(
            "the request's Transfer-Encoding names a coding this server does not apply; send the body as is, or chunked",
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer"), None);
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "LOCALHOST:8787",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.8.9.1:1",
            "[::1]",
            "[::1]:8787",
        ] {
            assert!(is_loopback_host(h.as_bytes()), "{h}");
        }
        for h in [
            "evil.com",
            "evil.com:8787",
            "10.0.0.1:80",
            "[::2]:1",
            "localhost.evil.com",
            "127.0.0.1:x",
            "[::1]x",
            "",
        ] {
            assert!(!is_loopback_host(h.as_bytes()), "{h}");
        }
    }

    #[test]
    fn empty_token_never_matches() {
        let g = Guard::new(Some(""));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Bearer x"),
        );
        assert!(!g.authorized(&h));
        h.insert(
            header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Bearer "),
        );
        assert!(!g.authorized(&h));
    }
}
