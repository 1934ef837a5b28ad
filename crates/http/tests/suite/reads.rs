//! The read routes.

use crate::support::*;
use axum::http::{Method, StatusCode, header};
use serde_json::json;

#[tokio::test]
async fn healthz_is_ok() {
    let e = simulating();
    let r = get(&e.app, "/healthz").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!({"status": "ok"}));
}

#[tokio::test]
async fn state_document_has_the_spec_fields() {
    let e = simulating();
    let r = get(&e.app, "/agentic/state").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers.get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let v = r.json();
    assert_eq!(v["execution_mode"], "simulation");
    assert_eq!(v["phase"], "28.3");
    assert_eq!(v["executor_enabled"], false);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["sandbox_roots"], json!([e.root.display().to_string()]));
    assert!(v["version"].as_str().is_some_and(|s| !s.is_empty()));

    let w = writable();
    let v = get(&w.app, "/agentic/state").await.json();
    assert_eq!(v["execution_mode"], "sandbox_write");
    assert_eq!(v["executor_enabled"], true);
    assert_eq!(v["dry_run"], false);
}

#[tokio::test]
async fn executions_list_filter_and_limit() {
    let e = writable();
    for wf in ["wf_e1", "wf_e2"] {
        let plan = json!({"workflow_id": wf, "actions": [
            {"action_id": "a1", "intent": "create_file", "path": format!("{wf}/1.txt"), "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": format!("{wf}/2.txt"), "content": "2"}
        ]});
        assert_eq!(
            post_json(&e.app, "/agentic/plans", &plan).await.status,
            StatusCode::OK
        );
    }
    let all = get(&e.app, "/agentic/executions").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(all.json().as_array().unwrap().len(), 4);
    let one = get(&e.app, "/agentic/executions?workflow_id=wf_e1")
        .await
        .json();
    let one = one.as_array().unwrap();
    assert_eq!(one.len(), 2);
    assert!(
        one.iter()
            .all(|x| x["workflow_id"] == "wf_e1" && x["status"] == "success")
    );
    assert!(one.iter().all(|x| x["entry_hash"].is_string()));
    let limited = get(&e.app, "/agentic/executions?limit=1&workflow_id=wf_e2")
        .await
        .json();
    assert_eq!(limited.as_array().unwrap().len(), 1);
    assert_eq!(limited[0]["action_id"], "a2", "newest first");
    // An empty workflow_id is no filter (the SPEC's URL template).
    let empty = get(&e.app, "/agentic/executions?limit=50&workflow_id=")
        .await
        .json();
    assert_eq!(empty.as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn execution_stats_count_outcomes() {
    let e = writable();
    post_json(&e.app, "/agentic/plans", &create_plan("wf_s", "s.txt", "x")).await;
    post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_s2", "../out.txt", "x"),
    )
    .await;
    let r = get(&e.app, "/agentic/executions/stats").await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["total"], 2);
    assert_eq!(v["success"], 1);
    assert_eq!(v["blocked"], 1);
    for key in ["failed", "simulated", "rolled_back"] {
        assert!(v[key].is_u64(), "{key} in {v}");
    }
}

#[tokio::test]
async fn artifacts_list_limit_and_filter() {
    let e = writable();
    for (wf, n) in [("wf_a", 3), ("wf_b", 2)] {
        let actions: Vec<_> = (0..n)
            .map(|i| json!({"action_id": format!("a{i}"), "intent": "create_file", "path": format!("{wf}/{i}.md"), "content": "x"}))
            .collect();
        let r = post_json(
            &e.app,
            "/agentic/plans",
            &json!({"workflow_id": wf, "actions": actions}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert_eq!(
        get(&e.app, "/agentic/artifacts")
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        5
    );
    let b = get(&e.app, "/agentic/artifacts?workflow_id=wf_b")
        .await
        .json();
    assert_eq!(b.as_array().unwrap().len(), 2);
    assert!(
        b.as_array()
            .unwrap()
            .iter()
            .all(|a| a["workflow_id"] == "wf_b")
    );
    let two = get(&e.app, "/agentic/artifacts?limit=2").await.json();
    assert_eq!(two.as_array().unwrap().len(), 2);
    assert_eq!(two[0]["workflow_id"], "wf_b", "newest first");
    let max = get(&e.app, "/agentic/artifacts?limit=1000").await;
    assert_eq!(max.status, StatusCode::OK);
    let unknown = get(&e.app, "/agentic/artifacts?workflow_id=wf_none")
        .await
        .json();
    assert_eq!(unknown, json!([]));
}

#[tokio::test]
async fn rollback_info_of_an_unknown_workflow_is_empty() {
    let e = simulating();
    let r = get(&e.app, "/agentic/rollback/wf_never").await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["workflow_id"], "wf_never");
    assert_eq!(v["rollback_available"], false);
    assert_eq!(v["actions"], json!([]));
    assert_eq!(v["reason_code"], "no_rollback_data", "as POST answers");
}

/// `/metrics` as Prometheus's own `Accept` header asks for it, OpenMetrics, and
/// otherwise in the classic text format, where each counter family is declared under
/// the name its samples carry (read as OpenMetrics, a classic parser gave each counter's
/// samples no type).
#[tokio::test]
async fn metrics_are_openmetrics_text_or_classic_text_as_asked() {
    let e = writable();
    post_json(&e.app, "/agentic/plans", &create_plan("wf_m", "m.txt", "x")).await;
    post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_m2", "../m.txt", "x"),
    )
    .await;
    let scrape = |accept: Option<&'static str>| {
        let mut req = request(Method::GET, "/metrics");
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        send(&e.app, req.body(axum::body::Body::empty()).unwrap())
    };
    const PROMETHEUS: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let families = [
        "ailab_sandbox_mutations_total",
        "ailab_sandbox_policy_denied_total",
        "ailab_sandbox_escape_attempts_total",
        "ailab_sandbox_artifacts_total",
        "ailab_sandbox_checksum_mismatch_total",
        "ailab_sandbox_mutation_duration_seconds",
    ];
    for accept in [
        Some(PROMETHEUS),
        Some("application/openmetrics-text"),
        Some("text/*;q=0.3, Application/OpenMetrics-Text;q=0.3"),
    ] {
        let r = scrape(accept).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "{accept:?}"
        );
        assert_eq!(r.headers.get(header::VARY).unwrap(), "accept");
        let text = r.text();
        for name in families {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        assert!(
            text.contains("# TYPE ailab_sandbox_mutations counter"),
            "{text}"
        );
        assert!(text.contains("create_file"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
    assert_eq!(
        ailab_sandbox_http::OPENMETRICS_CONTENT_TYPE,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    for accept in [
        None,
        Some("*/*"),
        Some("text/plain; version=0.0.4"),
        Some("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.9"),
        Some("application/openmetrics-text;q=0"),
        Some("text/*;q=1, application/openmetrics-text;q=0.2"),
        Some("*/*, application/openmetrics-text;q=0.9"),
        Some("application/openmetrics-text;q=nan"),
        Some("text/plain;q=0.5, application/openmetrics-text;q=inf"),
    ] {
        let r = scrape(accept).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.headers.get(header::CONTENT_TYPE).unwrap(),
            "text/plain; version=0.0.4; charset=utf-8",
            "{accept:?}"
        );
        let text = r.text();
        assert!(!text.contains("# EOF"), "{text}");
        // Every sample's family is declared, counters under their `_total` names.
        let typed: std::collections::HashMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        for name in families {
            assert!(typed.contains_key(name), "{name} not declared in\n{text}");
        }
        assert_eq!(typed["ailab_sandbox_mutations_total"], "counter", "{text}");
        assert_eq!(typed["ailab_sandbox_artifacts_total"], "gauge", "{text}");
        assert_eq!(
            typed["ailab_sandbox_mutation_duration_seconds"], "histogram",
            "{text}"
        );
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| typed.get(f) == Some(&"histogram"))
                })
                .unwrap_or(name);
            assert!(
                typed.contains_key(family),
                "{sample} has no TYPE in\n{text}"
            );
        }
        assert!(
            text.contains(
                r#"ailab_sandbox_mutations_total{type="create_file",result="success"} 1"#
            ),
            "{text}"
        );
    }
}

#[tokio::test]
async fn answers_are_uncacheable_and_carry_no_cors_headers() {
    let e = simulating();
    for uri in ["/healthz", "/agentic/state", "/metrics", "/nope"] {
        let r = get(&e.app, uri).await;
        assert_eq!(
            r.headers.get(header::CACHE_CONTROL).unwrap(),
            "no-store",
            "{uri}"
        );
        assert_eq!(
            r.headers.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(),
            "nosniff",
            "{uri}"
        );
        assert!(
            r.headers
                .keys()
                .all(|k| !k.as_str().starts_with("access-control-")),
            "{uri}: {:?}",
            r.headers
        );
    }
}

/// The artifacts gauge counts what the registry holds when it is scraped, including
/// artifacts another process registered since this server last wrote.
#[tokio::test]
async fn the_artifacts_gauge_counts_other_processes_writes() {
    let e = writable();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_g1", "g1.txt", "x"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // Another process on the same root and state directory.
    let other = ailab_sandbox_core::Sandbox::open(config(&e.tmp, true)).unwrap();
    for (wf, name) in [("wf_g2", "g2.txt"), ("wf_g3", "g3.txt")] {
        let plan = serde_json::from_value(create_plan(wf, name, "y")).unwrap();
        assert!(other.run_plan(plan).unwrap().is_success());
    }
    let text = get(&e.app, "/metrics").await.text();
    assert!(
        text.lines().any(|l| l == "ailab_sandbox_artifacts_total 3"),
        "{text}"
    );
}

/// Another process of the runtime holding the audit trail past `lock_wait_seconds` (a
/// stopped or hung writer) makes the reads of it busy: 409 `conflict`, as on the command
/// line, never a 500; the rollback preview says it could not look (`conflict`).
#[tokio::test]
async fn a_held_audit_trail_is_busy_not_broken() {
    use rustix::fs::{FlockOperation, flock};
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(&tmp, true);
    config.limits.lock_wait_seconds = 2;
    let server = std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config.clone()).unwrap());
    let app = ailab_sandbox_http::router(server, None, ailab_sandbox_http::DEFAULT_BODY_LIMIT);
    // Another writer: the server has lines to read.
    let other = ailab_sandbox_core::Sandbox::open(config).unwrap();
    let plan = serde_json::from_value(create_plan("wf_held", "h.txt", "h")).unwrap();
    assert!(other.run_plan(plan).unwrap().is_success());
    let log = std::fs::File::open(tmp.path().join("state/sandbox_audit.jsonl")).unwrap();
    flock(&log, FlockOperation::LockExclusive).unwrap();
    // The wait each request had is the one it says: the whole wait, then a shorter one
    // while the holder is taken as stuck.
    for (route, waited) in [
        (
            "/agentic/executions",
            "held it past the wait (waited 2 s; limits.lock_wait_seconds sets it)",
        ),
        (
            "/agentic/executions/stats",
            "(waited 1 s only, since a whole wait of 2 s for it ran out less than 2 s ago; limits.lock_wait_seconds sets it)",
        ),
    ] {
        let v = get(&app, route)
            .await
            .assert_error(StatusCode::CONFLICT, "conflict");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("try again") && reason.contains(waited),
            "{v}"
        );
    }
    // Busy, not "no rollback available"; nor a state of zero artifacts.
    get(&app, "/agentic/rollback/wf_held")
        .await
        .assert_error(StatusCode::CONFLICT, "conflict");
    get(&app, "/agentic/state")
        .await
        .assert_error(StatusCode::CONFLICT, "conflict");
    drop(log);
    let r = get(&app, "/agentic/state").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["audit_entries"], 1);
    let r = get(&app, "/agentic/executions").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}
