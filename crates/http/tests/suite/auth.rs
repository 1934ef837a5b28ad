//! The token and the refusal of browser requests.

use crate::support::*;
use axum::body::Body;
use axum::http::{Method, StatusCode, header};

fn with_token() -> Env {
    env_with(Opts {
        write: true,
        token: Some(TOKEN),
        ..Opts::default()
    })
}

#[tokio::test]
async fn every_route_needs_the_token() {
    let e = with_token();
    let routes = [
        (Method::GET, "/healthz"),
        (Method::GET, "/agentic/state"),
        (Method::GET, "/agentic/executions"),
        (Method::GET, "/agentic/executions/stats"),
        (Method::GET, "/agentic/artifacts"),
        (Method::GET, "/agentic/artifacts/art_x"),
        (Method::GET, "/agentic/rollback/wf_x"),
        (Method::POST, "/agentic/plans"),
        (Method::POST, "/agentic/rollback/wf_x"),
        (Method::GET, "/metrics"),
        (Method::GET, "/unknown"),
        // A method the route lacks: the refusal does not say which it has either.
        (Method::DELETE, "/agentic/plans"),
        (Method::PUT, "/healthz"),
    ];
    for (m, uri) in routes {
        let r = send(&e.app, request(m.clone(), uri).body(Body::empty()).unwrap()).await;
        r.assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(
            r.headers.get(header::WWW_AUTHENTICATE).unwrap(),
            "Bearer",
            "{m} {uri}"
        );
        assert!(!r.headers.contains_key(header::ALLOW), "{m} {uri}");
    }
    let r = get_auth(&e.app, "/healthz", TOKEN).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json(), serde_json::json!({"status": "ok"}));
}

#[tokio::test]
async fn the_right_token_passes() {
    let e = with_token();
    assert_eq!(
        get_auth(&e.app, "/agentic/state", TOKEN).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_auth(&e.app, "/metrics", TOKEN).await.status,
        StatusCode::OK
    );
    let req = request(Method::POST, "/agentic/plans")
        .header(header::AUTHORIZATION, format!("bearer {TOKEN}"))
        .body(Body::from(
            serde_json::to_vec(&create_plan("wf_tok", "t.txt", "tok")).unwrap(),
        ))
        .unwrap();
    let r = send(&e.app, req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        std::fs::read_to_string(e.root.join("t.txt")).unwrap(),
        "tok"
    );
}

#[tokio::test]
async fn wrong_tokens_and_schemes_are_refused() {
    let e = with_token();
    let bad = [
        format!("Bearer {TOKEN}x"),
        format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
        "Bearer ".to_owned(),
        format!("Basic {TOKEN}"),
        TOKEN.to_owned(),
        format!("Bearer{TOKEN}"),
        format!("Bearer {}", TOKEN.to_uppercase()),
    ];
    for value in bad {
        let req = request(Method::GET, "/agentic/state")
            .header(header::AUTHORIZATION, value.as_str())
            .body(Body::empty())
            .unwrap();
        send(&e.app, req)
            .await
            .assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    // Two Authorization headers are ambiguous: refused even if one is right.
    let req = request(Method::GET, "/agentic/state")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::AUTHORIZATION, "Bearer other")
        .body(Body::empty())
        .unwrap();
    send(&e.app, req)
        .await
        .assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
}

#[tokio::test]
async fn unauthorized_plans_write_nothing() {
    let e = with_token();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_noauth", "n.txt", "x"),
    )
    .await;
    r.assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
    assert!(!e.root.join("n.txt").exists());
}

#[tokio::test]
async fn requests_from_web_pages_are_refused() {
    let e = writable();
    for headers in [
        &[("origin", "https://evil.example")][..],
        &[("origin", "null")],
        &[("sec-fetch-site", "cross-site")],
        &[("sec-fetch-site", "same-site")],
        // Every value counts: a second after `none` does not pass behind the first.
        &[("sec-fetch-site", "none"), ("sec-fetch-site", "cross-site")],
    ] {
        let mut req = request(Method::POST, "/agentic/plans");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from(
                serde_json::to_vec(&create_plan("wf_csrf", "csrf.txt", "x")).unwrap(),
            ))
            .unwrap();
        send(&e.app, req)
            .await
            .assert_error(StatusCode::FORBIDDEN, "forbidden_origin");
    }
    assert!(!e.root.join("csrf.txt").exists());
    // Typing the URL into the address bar (Sec-Fetch-Site: none) is not a page's request.
    let req = request(Method::GET, "/agentic/state")
        .header("sec-fetch-site", "none")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&e.app, req).await.status, StatusCode::OK);
}

#[tokio::test]
async fn without_a_token_only_loopback_hosts_are_served() {
    let e = simulating();
    for host in [
        "evil.example",
        "evil.example:8787",
        "10.1.2.3:8787",
        "localhost.evil.example",
    ] {
        let req = request(Method::GET, "/agentic/state")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        send(&e.app, req)
            .await
            .assert_error(StatusCode::FORBIDDEN, "forbidden_host");
    }
    for host in [
        "localhost:8787",
        "127.0.0.1:8787",
        "[::1]:8787",
        "127.0.0.1",
    ] {
        let req = request(Method::GET, "/agentic/state")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&e.app, req).await.status, StatusCode::OK, "{host}");
    }
    // Two Host headers are refused (RFC 9112 §3.2), a loopback one first or not.
    for app in [&e.app, &with_token().app] {
        let req = request(Method::GET, "/agentic/state")
            .header(header::HOST, "localhost")
            .header(header::HOST, "evil.example")
            .body(Body::empty())
            .unwrap();
        send(app, req)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    // With a token, any Host is fine (the token is the authority).
    let t = with_token();
    let req = request(Method::GET, "/agentic/state")
        .header(header::HOST, "sandbox.internal:8787")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&t.app, req).await.status, StatusCode::OK);
}

#[test]
fn constant_time_eq_is_exported() {
    assert!(ailab_sandbox_http::constant_time_eq(b"same", b"same"));
    assert!(!ailab_sandbox_http::constant_time_eq(b"same", b"sane"));
    assert!(!ailab_sandbox_http::constant_time_eq(b"same", b"samey"));
}
