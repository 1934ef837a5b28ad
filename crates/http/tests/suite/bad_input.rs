//! Every class of bad input gets a 4xx JSON `{"reason_code", "reason"}`, never a 5xx.

use crate::support::*;
use axum::body::Body;
use axum::http::{Method, StatusCode, header};
use serde_json::json;

#[tokio::test]
async fn malformed_plan_json_is_400_invalid_plan() {
    let e = writable();
    for body in ["{", "not json", "[]", "{\"actions\": [}", "\u{0}"] {
        let r = post(&e.app, "/agentic/plans", body).await;
        r.assert_error(StatusCode::BAD_REQUEST, "invalid_plan");
    }
}

#[tokio::test]
async fn empty_plan_body_is_400() {
    let e = writable();
    post(&e.app, "/agentic/plans", Body::empty())
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_plan");
    post_json(&e.app, "/agentic/plans", &json!({"actions": []}))
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_plan");
}

#[tokio::test]
async fn plan_with_unknown_fields_or_wrong_types_is_400() {
    let e = writable();
    let cases = [
        json!({"actions": [{"intent": "create_file", "path": "a.md", "content": "x"}], "surprise": 1}),
        json!({"actions": [{"intent": "create_file", "path": "a.md", "content": "x", "mode": "0755"}]}),
        json!({"actions": "create_file"}),
        json!({"actions": [{"intent": 7, "path": "a.md"}]}),
        json!({"actions": [{"intent": "create_file", "path": ["a.md"]}]}),
        json!({"on_failure": "explode", "actions": [{"intent": "create_file", "path": "a.md", "content": "x"}]}),
    ];
    for plan in cases {
        let r = post_json(&e.app, "/agentic/plans", &plan).await;
        let v = r.assert_error(StatusCode::BAD_REQUEST, "invalid_plan");
        assert!(
            v.get("status").is_none(),
            "a parse error is not a run result: {v}"
        );
    }
    assert!(!e.root.join("a.md").exists());
}

#[tokio::test]
async fn plan_with_invalid_ids_is_400_invalid_id() {
    let e = writable();
    for plan in [
        create_plan("../evil", "a.md", "x"),
        create_plan("has space", "a.md", "x"),
        json!({"actions": [{"action_id": "-x", "intent": "create_file", "path": "a.md", "content": "x"}]}),
        json!({"parent_workflow_id": "a/b", "actions": [{"intent": "create_file", "path": "a.md", "content": "x"}]}),
    ] {
        post_json(&e.app, "/agentic/plans", &plan)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
    }
}

#[tokio::test]
async fn oversized_bodies_are_413_json() {
    let e = env_with(Opts {
        write: true,
        body_limit: 1024,
        ..Opts::default()
    });
    let big = create_plan("wf_big", "big.txt", &"x".repeat(4096));
    let bytes = serde_json::to_vec(&big).unwrap();
    // Declared length over the limit: refused before reading.
    let req = request(Method::POST, "/agentic/plans")
        .header(header::CONTENT_LENGTH, bytes.len())
        .body(Body::from(bytes.clone()))
        .unwrap();
    let v = send(&e.app, req)
        .await
        .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert!(v["reason"].as_str().unwrap().contains("1024"), "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("max_body_bytes, or --max-body-bytes): split the plan"),
        "{v}"
    );
    // No declared length: refused while reading.
    let req = request(Method::POST, "/agentic/plans")
        .body(Body::from(bytes.clone()))
        .unwrap();
    let v = send(&e.app, req)
        .await
        .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert!(v["reason"].as_str().unwrap().contains("1024"), "{v}");
    // The rollback route has the same limit.
    let req = request(Method::POST, "/agentic/rollback/wf_big")
        .body(Body::from(bytes))
        .unwrap();
    send(&e.app, req)
        .await
        .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert!(!e.root.join("big.txt").exists());
    // A read takes no body: one sent is ignored whatever its size or framing.
    for declared in [true, false] {
        let mut req = request(Method::GET, "/healthz");
        if declared {
            req = req.header(header::CONTENT_LENGTH, 4096);
        }
        let r = send(&e.app, req.body(Body::from("x".repeat(4096))).unwrap()).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "declared {declared}: {}",
            r.text()
        );
    }
    // Under the limit still works.
    let small = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_small", "small.txt", "ok"),
    )
    .await;
    assert_eq!(small.status, StatusCode::OK, "{}", small.text());
}

#[tokio::test]
async fn bad_limits_are_400() {
    let e = simulating();
    for route in ["/agentic/executions", "/agentic/artifacts"] {
        for q in [
            "limit=0",
            "limit=1001",
            "limit=-1",
            "limit=abc",
            "limit=",
            "limit=1.5",
            "limit=99999999999999999999",
            "limit=1&limit=2",
        ] {
            let r = get(&e.app, &format!("{route}?{q}")).await;
            let v = r.assert_error(StatusCode::BAD_REQUEST, "invalid_request");
            // The refusal says what is allowed, and names the value it got.
            let reason = v["reason"].as_str().unwrap();
            assert!(reason.contains("1 to 1000"), "{q}: {reason}");
            let given = q.trim_start_matches("limit=");
            if !given.contains('&') {
                assert!(reason.contains(&format!("{given:?}")), "{q}: {reason}");
            }
        }
        let ok = get(&e.app, &format!("{route}?limit=1")).await;
        assert_eq!(ok.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn unknown_query_parameters_are_400() {
    let e = simulating();
    let v = get(&e.app, "/agentic/artifacts?workflow=wf_x")
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    let why = v["reason"].as_str().unwrap();
    assert_eq!(
        why,
        "the query is not valid: the query has no field 'workflow'; it takes 'limit' and 'workflow_id'",
        "said once: {v}"
    );
    assert!(!why.contains("Failed to deserialize"), "{v}");
    get(&e.app, "/agentic/executions?workflow_id=../x")
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
}

#[tokio::test]
async fn bad_rollback_bodies_are_400() {
    let e = writable();
    for body in [
        "{",
        "{\"force\": \"yes\"}",
        "{\"forse\": true}",
        "[]",
        "true",
        "{\"action_id\": 5}",
        // An unset variable must not widen a one-action rollback to the whole workflow.
        "{\"action_id\": null}",
        "{\"force\": null}",
    ] {
        post(&e.app, "/agentic/rollback/wf_x", body)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    // A value of the wrong type is named by its field, in words.
    let v = post(&e.app, "/agentic/rollback/wf_x", "{\"force\": \"yes\"}")
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("'force' must be true or false, not a string (\"yes\") (line 1, column ")
            && !reason.contains("invalid type"),
        "{v}"
    );
    // A byte order mark is named, not taken for a body that is no object.
    let v = post(
        &e.app,
        "/agentic/rollback/wf_x",
        "\u{feff}{\"force\": false}",
    )
    .await
    .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        v["reason"].as_str().unwrap().contains("byte order mark"),
        "{v}"
    );
    post_json(
        &e.app,
        "/agentic/rollback/wf_x",
        &json!({"action_id": "../a"}),
    )
    .await
    .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
}

#[tokio::test]
async fn a_query_on_a_route_that_reads_none_is_refused_not_ignored() {
    let e = writable();
    for (a, path) in [("a1", "one.txt"), ("a2", "two.txt")] {
        let plan = json!({"workflow_id": "wf_q", "actions": [
            {"action_id": a, "intent": "create_file", "path": path, "content": "x"}]});
        assert_eq!(
            post_json(&e.app, "/agentic/plans", &plan).await.status,
            StatusCode::OK
        );
    }
    // A caller who thinks the query names the action must not lose the whole workflow.
    let v = post(&e.app, "/agentic/rollback/wf_q?action_id=a2", Body::empty())
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("action_id=a2")
            && reason.contains("drop the query")
            && reason.contains("\"action_id\""),
        "{v}"
    );
    assert!(e.root.join("one.txt").exists() && e.root.join("two.txt").exists());
    // Nor may a plan write while its caller asked for a dry run.
    let plan = create_plan("wf_d", "three.txt", "x");
    post_json(&e.app, "/agentic/plans?dry_run=true", &plan)
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    assert!(!e.root.join("three.txt").exists());
    for uri in [
        "/healthz?x",
        "/agentic/state?verbose=1",
        "/agentic/rollback/wf_q?force=true",
    ] {
        get(&e.app, uri)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    // A method the route does not have is still 405, query or not.
    for (method, uri) in [
        (Method::PUT, "/healthz?x"),
        (Method::POST, "/metrics?x"),
        (Method::DELETE, "/agentic/plans?dry_run=true"),
    ] {
        let r = send(&e.app, request(method, uri).body(Body::empty()).unwrap()).await;
        r.assert_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    }
    // An empty query is no query.
    assert_eq!(get(&e.app, "/agentic/state?").await.status, StatusCode::OK);
    let mut body = post(&e.app, "/agentic/rollback/wf_q", r#"{"action_id": "a2"}"#).await;
    assert_eq!(body.status, StatusCode::OK, "{}", body.text());
    body = get(&e.app, "/agentic/executions?workflow_id=wf_q").await;
    assert_eq!(
        body.status,
        StatusCode::OK,
        "list routes keep their queries"
    );
    assert!(e.root.join("one.txt").exists() && !e.root.join("two.txt").exists());
}

#[tokio::test]
async fn invalid_workflow_ids_in_the_path_are_400() {
    let e = writable();
    for id in ["-bad", "a%20b", "..", "%2E%2E", "a%2Fb", &"x".repeat(65)] {
        get(&e.app, &format!("/agentic/rollback/{id}"))
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
        post(&e.app, &format!("/agentic/rollback/{id}"), Body::empty())
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
    }
    // Not UTF-8 once decoded: a malformed id too (it was `invalid_request`), named as sent.
    let v = get(&e.app, "/agentic/rollback/%FF")
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
    assert!(v["reason"].as_str().unwrap().contains("%FF"), "{v}");
    // The rollback answers with its report, as for every other malformed id.
    let v = post(&e.app, "/agentic/rollback/%FF", Body::empty())
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
    assert_eq!(v["status"], "refused", "{v}");
    assert_eq!(v["steps"], json!([]), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("%FF"), "{v}");
    // In a query too, and a bad limit as well: quoted as sent, not as decoded.
    for route in ["/agentic/executions", "/agentic/artifacts"] {
        let v = get(&e.app, &format!("{route}?workflow_id=%FF"))
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_id");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("'%FF'") && !reason.contains('\u{fffd}'),
            "{v}"
        );
        let v = get(&e.app, &format!("{route}?limit=+5"))
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
        assert!(v["reason"].as_str().unwrap().contains("\"+5\""), "{v}");
        // A sign sent encoded is refused too, as the CLI refuses `--limit +5`, and quoted
        // as the text it stands for; a stray byte is quoted as sent.
        for (limit, quoted) in [("%2B5", "\"+5\""), ("-5", "\"-5\""), ("%FF", "\"%FF\"")] {
            let v = get(&e.app, &format!("{route}?limit={limit}"))
                .await
                .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
            assert!(v["reason"].as_str().unwrap().contains(quoted), "{v}");
        }
    }
}

#[tokio::test]
async fn rollback_of_an_unknown_workflow_is_404() {
    let e = writable();
    post(&e.app, "/agentic/rollback/wf_unknown", Body::empty())
        .await
        .assert_error(StatusCode::NOT_FOUND, "no_rollback_data");
}

#[tokio::test]
async fn unknown_or_malformed_artifact_ids_are_404() {
    let e = simulating();
    let v = get(&e.app, "/agentic/artifacts/art_doesnotexist")
        .await
        .assert_error(StatusCode::NOT_FOUND, "not_found");
    assert!(v["reason"].as_str().unwrap().contains("art_doesnotexist"));
    // An id no artifact can have is unknown too (SPEC §10); the reason names it and
    // says what ids look like.
    for (uri, shown) in [
        ("/agentic/artifacts/..%2F..%2Fetc", "../../etc"),
        ("/agentic/artifacts/has%20space", "has space"),
        ("/agentic/artifacts/-x", "-x"),
        ("/agentic/artifacts/%FF%FE", "%FF%FE"),
    ] {
        let v = get(&e.app, uri)
            .await
            .assert_error(StatusCode::NOT_FOUND, "not_found");
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.contains(shown), "{uri}: {reason}");
        assert!(reason.contains("1 to 64 letters"), "{uri}: {reason}");
    }
}

#[tokio::test]
async fn unknown_routes_are_404_json() {
    let e = simulating();
    for uri in [
        "/",
        "/agentic",
        "/agentic/state/",
        "/agentic/plans/x",
        "/agentic/artifacts/a/b",
        "/%00",
    ] {
        get(&e.app, uri)
            .await
            .assert_error(StatusCode::NOT_FOUND, "not_found");
    }
    post(&e.app, "/nope", "{}")
        .await
        .assert_error(StatusCode::NOT_FOUND, "not_found");
    // A target in authority form is named as sent, not as an empty path.
    let r = send(
        &e.app,
        request(Method::CONNECT, "127.0.0.1:8787")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let v = r.assert_error(StatusCode::NOT_FOUND, "not_found");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("CONNECT 127.0.0.1:8787;"), "{reason}");
}

#[tokio::test]
async fn wrong_methods_are_405_json() {
    let e = simulating();
    let cases = [
        (Method::GET, "/agentic/plans"),
        (Method::POST, "/agentic/state"),
        (Method::DELETE, "/agentic/artifacts/art_x"),
        (Method::PUT, "/agentic/rollback/wf_x"),
        (Method::POST, "/metrics"),
        (Method::OPTIONS, "/agentic/plans"),
    ];
    for (m, uri) in cases {
        let r = send(&e.app, request(m.clone(), uri).body(Body::empty()).unwrap()).await;
        let body = r.assert_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        let allow = r.headers.get(header::ALLOW).map(|v| v.to_str().unwrap());
        let allow = allow.unwrap_or_else(|| panic!("{m} {uri}: {:?}", r.headers));
        // The reason names them too, for a client that shows only the body.
        assert!(
            body["reason"]
                .as_str()
                .unwrap()
                .ends_with(&format!("allowed: {allow}")),
            "{m} {uri}: {body}"
        );
    }
}

#[tokio::test]
async fn error_answers_do_not_reveal_the_state_directory() {
    let e = writable();
    let state = e.state_dir.display().to_string();
    let tmp = e.tmp.path().display().to_string();
    let answers = vec![
        post(&e.app, "/agentic/plans", "{").await,
        post_json(
            &e.app,
            "/agentic/plans",
            &create_plan("wf_p", "../../x.md", "x"),
        )
        .await,
        post_json(
            &e.app,
            "/agentic/plans",
            &create_plan("wf_p", &format!("{state}/audit.md"), "x"),
        )
        .await,
        post(&e.app, "/agentic/rollback/wf_none", Body::empty()).await,
        get(&e.app, "/agentic/artifacts/art_none").await,
        get(&e.app, "/agentic/nope").await,
    ];
    for r in answers {
        assert!(r.status.is_client_error(), "{} {}", r.status, r.text());
        let text = r.text();
        // The offending path given by the caller may be echoed; nothing else of the host's.
        // Paths inside the root may be named; nothing else under the temporary directory.
        let echoed = text
            .replace(&format!("{state}/audit.md"), "<given>")
            .replace(&e.root.display().to_string(), "<root>");
        assert!(!echoed.contains(&state), "{text}");
        assert!(!echoed.contains(&tmp), "{text}");
    }
}

/// A transfer coding the server does not apply is bad input (400, never a 5xx, SPEC §10),
/// never a body read as plain, and a caller without the token hears only 401; a body
/// sent where no route reads one leaves the route's own answer (404, 405), not 413.
#[tokio::test]
async fn unknown_codings_and_bodies_nowhere_read_get_the_right_answer() {
    let e = env_with(Opts {
        write: true,
        body_limit: 1024,
        ..Opts::default()
    });
    let plan = serde_json::to_vec(&create_plan("wf_te", "te.md", "x")).unwrap();
    for coding in [
        "gzip, chunked",
        "foo, chunked",
        "identity",
        "chunked, chunked",
    ] {
        let req = request(Method::POST, "/agentic/plans")
            .header(header::TRANSFER_ENCODING, coding)
            .body(Body::from(plan.clone()))
            .unwrap();
        let v = send(&e.app, req)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid_request");
        assert!(
            v["reason"].as_str().unwrap().contains("Transfer-Encoding"),
            "{v}"
        );
    }
    assert!(!e.root.join("te.md").exists());
    let locked = env_with(Opts {
        write: true,
        token: Some(TOKEN),
        ..Opts::default()
    });
    for (auth, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(format!("Bearer {TOKEN}")), StatusCode::BAD_REQUEST),
    ] {
        let mut req = request(Method::POST, "/agentic/plans")
            .header(header::TRANSFER_ENCODING, "gzip, chunked");
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let resp = send(&locked.app, req.body(Body::from(plan.clone())).unwrap()).await;
        assert_eq!(resp.status, status, "{}", resp.text());
    }
    assert!(!locked.root.join("te.md").exists());
    // A content coding is not decoded: 415 saying so, not a plan "not UTF-8".
    for coding in ["gzip", "br", "identity, gzip"] {
        let req = request(Method::POST, "/agentic/plans")
            .header(header::CONTENT_ENCODING, coding)
            .body(Body::from(plan.clone()))
            .unwrap();
        let v = send(&e.app, req)
            .await
            .assert_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("Content-Encoding") && reason.contains("uncompressed"),
            "{coding}: {reason}"
        );
    }
    assert!(!e.root.join("te.md").exists());
    // Only where a body is read: elsewhere the route's own answer stands.
    for (method, path, status) in [
        (Method::GET, "/healthz", StatusCode::OK),
        (Method::GET, "/agentic/state", StatusCode::OK),
        (Method::POST, "/nope", StatusCode::NOT_FOUND),
        (
            Method::DELETE,
            "/agentic/plans",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ] {
        let req = request(method.clone(), path)
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::empty())
            .unwrap();
        let resp = send(&e.app, req).await;
        assert_eq!(resp.status, status, "{method} {path}: {}", resp.text());
    }
    // A long coding is cut, and says so.
    let req = request(Method::POST, "/agentic/plans")
        .header(header::CONTENT_ENCODING, "x".repeat(100))
        .body(Body::from(plan.clone()))
        .unwrap();
    let v = send(&e.app, req)
        .await
        .assert_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("{}…", "x".repeat(40))),
        "{v}"
    );
    let req = request(Method::POST, "/agentic/plans")
        .header(header::CONTENT_ENCODING, "identity")
        .body(Body::from(plan.clone()))
        .unwrap();
    let resp = send(&e.app, req).await;
    assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    assert!(e.root.join("te.md").exists());
    for (method, path, status, code) in [
        (
            Method::POST,
            "/healthz",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (Method::POST, "/nope", StatusCode::NOT_FOUND, "not_found"),
        (
            Method::POST,
            "/agentic/rollback/a/b",
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ] {
        let req = request(method, path)
            .header(header::CONTENT_LENGTH, 4096)
            .body(Body::from("x".repeat(4096)))
            .unwrap();
        send(&e.app, req).await.assert_error(status, code);
    }
}
