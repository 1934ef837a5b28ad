//! Plans and rollbacks through HTTP, checked on disk.

use crate::support::*;
use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn plan_writes_exact_bytes_then_rollback_removes_them() {
    let e = writable();
    let content = "# Hi\nünïcödé — bytes\n";
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_http", "notes/hello.md", content),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "success");
    assert_eq!(v["simulation_only"], false);
    assert_eq!(v["workflow_id"], "wf_http");
    assert!(v.get("reason_code").is_none(), "no reason on success: {v}");
    let path = e.root.join("notes/hello.md");
    assert_eq!(std::fs::read(&path).unwrap(), content.as_bytes());

    let arts = get(&e.app, "/agentic/artifacts?workflow_id=wf_http").await;
    assert_eq!(arts.status, StatusCode::OK);
    let arts = arts.json();
    assert_eq!(arts.as_array().unwrap().len(), 1);
    assert_eq!(
        arts[0]["checksum_sha256"],
        v["actions"][0]["after_checksum"]
    );

    let info = get(&e.app, "/agentic/rollback/wf_http").await;
    assert_eq!(info.status, StatusCode::OK);
    let info = info.json();
    assert_eq!(info["rollback_available"], true);
    assert_eq!(info["actions"][0]["action_id"], "a1");

    let rb = post(&e.app, "/agentic/rollback/wf_http", Body::empty()).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    let rb = rb.json();
    assert_eq!(rb["status"], "rolled_back");
    assert_eq!(rb["steps_rolled_back"], 1);
    assert_eq!(rb["steps"][0]["checksum_validated"], true);
    assert!(!path.exists(), "rollback removes the created file");

    let again = post(&e.app, "/agentic/rollback/wf_http", Body::empty()).await;
    let v = again.assert_error(StatusCode::NOT_FOUND, "no_rollback_data");
    assert_eq!(v["status"], "refused");

    // The audit chain written through HTTP verifies.
    let report = e.sandbox.audit_verify().unwrap();
    assert!(report.ok, "{report:?}");
}

#[tokio::test]
async fn rollback_without_content_type_or_body_works() {
    let e = writable();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_bare", "a.txt", "x"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let req = request(Method::POST, "/agentic/rollback/wf_bare")
        .body(Body::empty())
        .unwrap();
    let rb = send(&e.app, req).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    assert!(!e.root.join("a.txt").exists());
}

#[tokio::test]
async fn secure_defaults_only_simulate() {
    let e = simulating();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_sim", "notes/sim.md", "hello"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "simulated_success");
    assert_eq!(v["simulation_only"], true);
    assert_eq!(v["actions"][0]["status"], "simulated");
    assert!(!e.root.join("notes/sim.md").exists());
    let audit = get(&e.app, "/agentic/executions?workflow_id=wf_sim")
        .await
        .json();
    assert_eq!(audit[0]["status"], "simulated");
}

#[tokio::test]
async fn blocked_plan_is_422_with_the_run_result_and_writes_nothing() {
    let e = writable();
    let plan = json!({
        "workflow_id": "wf_blocked",
        "actions": [
            { "action_id": "ok", "intent": "create_file", "path": "fine.md", "content": "x" },
            { "action_id": "bad", "intent": "create_file", "path": "../escape.md", "content": "x" }
        ]
    });
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    let v = r.assert_error(StatusCode::UNPROCESSABLE_ENTITY, "path_traversal");
    assert_eq!(v["status"], "blocked");
    assert_eq!(v["actions"][1]["status"], "blocked");
    assert_eq!(v["actions"][1]["reason_code"], "path_traversal");
    assert_eq!(v["actions"][0]["status"], "skipped");
    assert!(v["timeline"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(!e.root.join("fine.md").exists());
    assert!(!e.tmp.path().join("escape.md").exists());
}

/// A plan refused only because the server's storage failed (here its run record cannot
/// be written) is 500, not 422: the plan is fine, and the client may try again once the
/// operator fixes the server.
#[tokio::test]
async fn a_plan_refused_by_the_servers_storage_is_500() {
    let e = writable();
    std::fs::create_dir_all(e.state_dir.join("inflight/wf_io.json")).unwrap();
    let plan = json!({"workflow_id": "wf_io", "actions": [
        {"intent": "create_file", "path": "a.txt", "content": "a"}]});
    let v = post_json(&e.app, "/agentic/plans", &plan)
        .await
        .assert_error(StatusCode::INTERNAL_SERVER_ERROR, "io_error");
    assert_eq!(v["status"], "blocked");
    assert!(!e.root.join("a.txt").exists());
}

/// A write that fails on the server's storage (a full disk, say) is 500 too, whether it
/// was the run's first change or earlier ones had to be rolled back: the plan is fine and
/// nobody else got in the way, which 409 would say.
#[tokio::test]
async fn a_write_failing_on_the_servers_storage_is_500() {
    let e = writable();
    std::fs::write(e.root.join("keep.txt"), "original").unwrap();
    e.sandbox.failpoints().arm("before_mutate", 1);
    let plan = json!({"workflow_id": "wf_io1", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "a"}]});
    let v = post_json(&e.app, "/agentic/plans", &plan)
        .await
        .assert_error(StatusCode::INTERNAL_SERVER_ERROR, "io_error");
    assert_eq!(v["actions"][0]["status"], "failed");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("changed nothing else") && !reason.contains("earlier changes"),
        "{reason}"
    );
    assert!(!e.root.join("a.txt").exists());

    e.sandbox.failpoints().arm("before_mutate", 2);
    let plan = json!({"workflow_id": "wf_io2", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "keep.txt", "content": "changed"},
        {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "b"}]});
    let v = post_json(&e.app, "/agentic/plans", &plan)
        .await
        .assert_error(StatusCode::INTERNAL_SERVER_ERROR, "io_error");
    assert_eq!(v["status"], "rolled_back");
    assert_eq!(v["actions"][0]["status"], "rolled_back");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("earlier changes were rolled back"),
        "{reason}"
    );
    assert_eq!(
        std::fs::read_to_string(e.root.join("keep.txt")).unwrap(),
        "original"
    );
    assert!(!e.root.join("b.txt").exists());
}

/// A storage failure whose plan rollback then meets another writer's change (an
/// earlier write left in place, `conflict`) is 409: someone else got in the way.
#[tokio::test]
async fn a_storage_failure_that_leaves_a_conflict_is_409() {
    let e = writable();
    let x = e.root.join("x.txt");
    std::fs::write(&x, "original").unwrap();
    let racer = x.clone();
    e.sandbox.failpoints().interleave(
        "before_audit",
        std::sync::Arc::new(move || std::fs::write(&racer, "theirs").unwrap()),
    );
    e.sandbox.failpoints().arm("before_mutate", 2);
    let plan = json!({"workflow_id": "wf_mixed", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "x.txt", "content": "ours"},
        {"action_id": "a2", "intent": "create_file", "path": "y.txt", "content": "y"}]});
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    let v = r.json();
    assert_eq!(v["actions"][0]["reason_code"], "conflict", "{v}");
    assert_eq!(v["actions"][1]["reason_code"], "io_error", "{v}");
    assert_eq!(std::fs::read_to_string(&x).unwrap(), "theirs");
}

/// A rollback whose steps fail only on the server's storage is 500, like a plan; the
/// steps that went through stay done, and a later rollback finishes the rest.
#[tokio::test]
async fn a_rollback_failing_on_the_servers_storage_is_500() {
    let e = writable();
    let plan = json!({"workflow_id": "wf_rbio", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
        {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]});
    assert_eq!(
        post_json(&e.app, "/agentic/plans", &plan).await.status,
        StatusCode::OK
    );
    e.sandbox.failpoints().arm("during_restore", 2);
    let r = post(&e.app, "/agentic/rollback/wf_rbio", "").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    let v = r.json();
    assert_eq!(v["steps"][1]["reason_code"], "io_error", "{v}");
    assert!(!e.root.join("two.txt").exists());
    assert!(e.root.join("one.txt").exists());
    let r = post(&e.app, "/agentic/rollback/wf_rbio", "").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(!e.root.join("one.txt").exists());
}

/// A rollback that restored every file but whose audit line could not be synced (the
/// state directory's disk failing) is 500 too: only the server's storage failed.
#[tokio::test]
async fn a_rollback_the_trail_could_not_record_is_500() {
    let e = env_with(Opts {
        write: true,
        strict: true,
        ..Opts::default()
    });
    let plan = json!({"workflow_id": "wf_rbtrail", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"}]});
    assert_eq!(
        post_json(&e.app, "/agentic/plans", &plan).await.status,
        StatusCode::OK
    );
    e.sandbox.failpoints().arm("audit_sync", 1);
    let r = post(&e.app, "/agentic/rollback/wf_rbtrail", "").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    let v = r.json();
    assert_eq!(v["reason_code"], "io_error", "{v}");
    assert_eq!(v["steps"][0]["restored"], true, "{v}");
    assert!(!e.root.join("one.txt").exists());
}

/// A write that fails because someone else got in the way is 409.
#[tokio::test]
async fn a_write_beaten_by_another_writer_is_409() {
    let e = writable();
    let racer = e.root.join("race.txt");
    e.sandbox.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || std::fs::write(&racer, "theirs").unwrap()),
    );
    let plan = json!({"workflow_id": "wf_race", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "race.txt", "content": "ours"}]});
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    let v = r.json();
    assert_eq!(v["actions"][0]["status"], "failed");
    assert_ne!(v["reason_code"], "io_error");
    assert_eq!(
        std::fs::read_to_string(e.root.join("race.txt")).unwrap(),
        "theirs"
    );
}

#[tokio::test]
async fn blocked_extension_and_forbidden_intent_are_422() {
    let e = writable();
    let plan =
        json!({"actions": [{"intent": "create_file", "path": "x.service", "content": "[Unit]"}]});
    post_json(&e.app, "/agentic/plans", &plan)
        .await
        .assert_error(StatusCode::UNPROCESSABLE_ENTITY, "blocked_extension");
    let plan = json!({"actions": [{"intent": "run_command", "path": "x.sh"}]});
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    assert_eq!(r.json()["status"], "blocked");
    assert!(!e.root.join("x.service").exists());
}

#[tokio::test]
async fn rollback_conflict_is_409_until_forced() {
    let e = writable();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_conf", "c.md", "original"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let path = e.root.join("c.md");
    std::fs::write(&path, "changed by someone else").unwrap();

    let info = get(&e.app, "/agentic/rollback/wf_conf").await.json();
    assert_eq!(info["conflicts"].as_array().unwrap().len(), 1);

    let rb = post(&e.app, "/agentic/rollback/wf_conf", "{}").await;
    let v = rb.assert_error(StatusCode::CONFLICT, "conflict");
    assert_eq!(v["conflicts"].as_array().unwrap().len(), 1);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "changed by someone else"
    );

    let rb = post_json(&e.app, "/agentic/rollback/wf_conf", &json!({"force": true})).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    assert!(!path.exists());
}

#[tokio::test]
async fn rollback_of_one_action() {
    let e = writable();
    let plan = json!({
        "workflow_id": "wf_two",
        "actions": [
            { "action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1" },
            { "action_id": "a2", "intent": "write_json", "path": "two.json", "data": {"k": 2} }
        ]
    });
    assert_eq!(
        post_json(&e.app, "/agentic/plans", &plan).await.status,
        StatusCode::OK
    );
    let rb = post_json(
        &e.app,
        "/agentic/rollback/wf_two",
        &json!({"action_id": "a2"}),
    )
    .await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    assert_eq!(rb.json()["steps_rolled_back"], 1);
    assert!(e.root.join("one.txt").exists());
    assert!(!e.root.join("two.json").exists());

    let rb = post_json(
        &e.app,
        "/agentic/rollback/wf_two",
        &json!({"action_id": "nope"}),
    )
    .await;
    rb.assert_error(StatusCode::NOT_FOUND, "no_rollback_data");
}

#[tokio::test]
async fn artifact_lineage_across_workflows() {
    let e = writable();
    let r1 = post_json(
        &e.app,
        "/agentic/plans",
        &create_plan("wf_l1", "doc.md", "v1"),
    )
    .await
    .json();
    let plan = json!({
        "workflow_id": "wf_l2", "parent_workflow_id": "wf_l1",
        "actions": [ { "action_id": "a1", "intent": "replace_file", "path": "doc.md", "content": "v2" } ]
    });
    let r2 = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r2.status, StatusCode::OK, "{}", r2.text());
    let r2 = r2.json();
    assert_eq!(
        std::fs::read_to_string(e.root.join("doc.md")).unwrap(),
        "v2"
    );
    let first = r1["actions"][0]["artifact_id"].as_str().unwrap();
    let second = r2["actions"][0]["artifact_id"].as_str().unwrap();

    let doc = get(&e.app, &format!("/agentic/artifacts/{second}")).await;
    assert_eq!(doc.status, StatusCode::OK, "{}", doc.text());
    let doc = doc.json();
    assert_eq!(doc["artifact"]["artifact_id"], second);
    assert_eq!(doc["artifact"]["parent_workflow_id"], "wf_l1");
    assert_eq!(doc["lineage"].as_array().unwrap().len(), 1);
    assert_eq!(doc["lineage"][0]["artifact_id"], first);

    let doc = get(&e.app, &format!("/agentic/artifacts/{first}"))
        .await
        .json();
    assert_eq!(doc["lineage"].as_array().unwrap().len(), 0);

    // Undone, the second write stays in the registry, marked: its file holds v1 again.
    assert_eq!(doc["artifact"]["rolled_back"], false, "{doc}");
    let rb = post_json(&e.app, "/agentic/rollback/wf_l2", &json!({})).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    assert_eq!(
        std::fs::read_to_string(e.root.join("doc.md")).unwrap(),
        "v1"
    );
    let doc = get(&e.app, &format!("/agentic/artifacts/{second}"))
        .await
        .json();
    assert_eq!(doc["artifact"]["rolled_back"], true, "{doc}");
    assert_eq!(doc["lineage"][0]["rolled_back"], false, "{doc}");
    let list = get(&e.app, "/agentic/artifacts").await.json();
    let marks: Vec<(&str, bool)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["artifact_id"].as_str().unwrap(),
                a["rolled_back"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(marks, [(second, true), (first, false)], "{list}");
}

#[tokio::test]
async fn rate_limit_blocks_the_eleventh_write() {
    let e = writable();
    let actions: Vec<_> = (0..11)
        .map(|i| json!({"action_id": format!("a{i}"), "intent": "create_file", "path": format!("r{i}.txt"), "content": "x"}))
        .collect();
    let r = post_json(
        &e.app,
        "/agentic/plans",
        &json!({"workflow_id": "wf_rate", "actions": actions}),
    )
    .await;
    let v = r.assert_error(StatusCode::UNPROCESSABLE_ENTITY, "rate_limited");
    assert_eq!(v["actions"][10]["reason_code"], "rate_limited");
    assert!(!e.root.join("r0.txt").exists());
}

/// A plan refused only because the workflow's tokens are spent is answered 429 with
/// `Retry-After` (and the seconds in the action's `retry_after_seconds`); one that could
/// never pass (more writes than the burst, above) stays 422.
#[tokio::test]
async fn a_plan_that_must_wait_for_the_rate_limit_is_429_with_retry_after() {
    let e = writable();
    let plan = |i: usize| {
        json!({"workflow_id": "wf_wait", "actions": [
            {"action_id": format!("a{i}"), "intent": "create_file", "path": format!("w{i}.txt"), "content": "x"}]})
    };
    for i in 0..10 {
        let r = post_json(&e.app, "/agentic/plans", &plan(i)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let r = post_json(&e.app, "/agentic/plans", &plan(10)).await;
    let v = r.assert_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    let secs = retry_after(&r);
    assert!((1..=60).contains(&secs), "{secs}");
    assert_eq!(v["actions"][0]["retry_after_seconds"], secs);
    assert!(!e.root.join("w10.txt").exists());
    // A plan of two writes waits for both: the sentence gives the wait `Retry-After`
    // gives, not only its first action's.
    let two = json!({"workflow_id": "wf_wait", "actions": [
        {"action_id": "b0", "intent": "create_file", "path": "b0.txt", "content": "x"},
        {"action_id": "b1", "intent": "create_file", "path": "b1.txt", "content": "x"}]});
    let r = post_json(&e.app, "/agentic/plans", &two).await;
    let v = r.assert_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    let secs = retry_after(&r);
    assert_eq!(v["actions"][1]["retry_after_seconds"], secs, "{v}");
    assert!(
        v["actions"][0]["retry_after_seconds"].as_u64().unwrap() < secs,
        "{v}"
    );
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.ends_with(&format!(
            "the whole plan can be sent again in {secs} seconds"
        )),
        "{reason}"
    );
}

/// The seconds of an answer's `Retry-After`.
fn retry_after(r: &Resp) -> u64 {
    r.headers[axum::http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn concurrent_plans_on_distinct_workflows() {
    let e = writable();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let app = e.app.clone();
        tasks.push(tokio::spawn(async move {
            let plan = create_plan(&format!("wf_c{i}"), &format!("c/{i}.txt"), &format!("n{i}"));
            post_json(&app, "/agentic/plans", &plan).await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    for i in 0..8 {
        assert_eq!(
            std::fs::read_to_string(e.root.join(format!("c/{i}.txt"))).unwrap(),
            format!("n{i}")
        );
    }
    let arts = get(&e.app, "/agentic/artifacts?limit=1000").await.json();
    assert_eq!(arts.as_array().unwrap().len(), 8);
}

/// The body limit `serve` uses when none is configured.
fn default_limit() -> usize {
    ailab_sandbox_core::Config::default().max_body_bytes
}

#[tokio::test]
async fn a_report_over_four_mib_fits_the_default_body_limit() {
    let e = env_with(Opts {
        write: true,
        body_limit: default_limit(),
        ..Opts::default()
    });
    // 4.1 MiB of report text, under generate_report's 5 MiB, with quotes and newlines
    // that JSON escaping makes longer on the wire.
    let line = "| \"metric\" | value |\n";
    let content = line.repeat((41 * 1024 * 1024 / 10) / line.len() + 1);
    assert!(content.len() > 4 * 1024 * 1024 + 100 * 1024);
    let plan = json!({"workflow_id": "wf_report", "actions": [
        {"action_id": "a1", "intent": "generate_report", "path": "reports/big.md", "content": content}]});
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["status"], "success");
    assert_eq!(
        std::fs::read(e.root.join("reports/big.md")).unwrap().len(),
        content.len()
    );
}

#[tokio::test]
async fn a_plan_filling_the_workflow_budget_fits_the_default_body_limit() {
    let e = env_with(Opts {
        body_limit: default_limit(),
        ..Opts::default()
    });
    // Five reports at generate_report's 5 MiB add up to the 25 MiB workflow budget;
    // every byte is a quote or a newline, so the body is twice that.
    let max = 5 * 1024 * 1024;
    let content: String = "\"\n".repeat(max / 2);
    let actions: Vec<_> = (0..5)
        .map(|i| json!({"intent": "generate_report", "path": format!("r{i}.md"), "content": content}))
        .collect();
    let body =
        serde_json::to_vec(&json!({"workflow_id": "wf_budget", "actions": actions})).unwrap();
    assert!(body.len() > 50 * 1024 * 1024);
    let r = post(&e.app, "/agentic/plans", body).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        &r.text()[..r.text().len().min(2000)]
    );
    assert_eq!(r.json()["status"], "simulated_success");
}

/// `/healthz` answers 200 while the process can write, and 503 `io_error` once its audit
/// trail was replaced under it (every write then fails until a restart), so that a
/// supervisor restarts it.
#[tokio::test]
async fn healthz_fails_once_the_process_can_write_nothing_more() {
    let e = writable();
    let r = get(&e.app, "/healthz").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["status"], "ok");
    let log = e.state_dir.join("sandbox_audit.jsonl");
    let aside = e.state_dir.join("moved.jsonl");
    std::fs::rename(&log, &aside).unwrap();
    std::fs::copy(&aside, &log).unwrap();
    let r = get(&e.app, "/healthz").await;
    let v = r.assert_error(StatusCode::SERVICE_UNAVAILABLE, "io_error");
    assert!(
        v["reason"].as_str().unwrap().contains(
            "sandbox_audit.jsonl in the state directory is no longer the file this process opened"
        ),
        "{v}"
    );
    // A path outside the roots is named to no client (SPEC §10).
    let state = e.state_dir.display().to_string();
    assert!(!r.text().contains(&state), "{v}");
    let plan = create_plan("wf_h", "h.txt", "h");
    let r = post_json(&e.app, "/agentic/plans", &plan).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    assert!(!e.root.join("h.txt").exists());
}

/// `/healthz` answers at once while a plan waits for the audit trail another process
/// holds: a supervisor's probe with a short timeout must not restart a server that is
/// only busy.
#[tokio::test]
async fn healthz_answers_at_once_while_a_plan_waits_for_the_trail() {
    use rustix::fs::{FlockOperation, flock};
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(&tmp, true);
    config.limits.lock_wait_seconds = 5;
    let sandbox = std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config).unwrap());
    let app = ailab_sandbox_http::router(sandbox, None, ailab_sandbox_http::DEFAULT_BODY_LIMIT);
    let log = std::fs::File::open(tmp.path().join("state/sandbox_audit.jsonl")).unwrap();
    flock(&log, FlockOperation::LockExclusive).unwrap();
    let busy = app.clone();
    let plan = tokio::spawn(async move {
        post_json(
            &busy,
            "/agentic/plans",
            &create_plan("wf_busy", "b.txt", "b"),
        )
        .await
    });
    // Well inside the plan's wait for the trail.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let health =
        tokio::time::timeout(std::time::Duration::from_secs(2), get(&app, "/healthz")).await;
    drop(log);
    let plan = plan.await.unwrap();
    let health = health.expect("no answer within 2 s while a plan waited for the trail");
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    assert_eq!(plan.status, StatusCode::OK, "{}", plan.text());
}

/// Plans piling up on a workflow another process holds (a stopped CLI run, say) wait
/// for its turn without a thread of the blocking pool: reads and other workflows are
/// answered meanwhile, and once the workflow is free the plans run one after the other.
#[test]
fn plans_waiting_on_one_workflow_leave_the_pool_to_other_calls() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tmp, app, held) = workflow_held(5);
        let plans: Vec<_> = (0..6)
            .map(|i| {
                let app = app.clone();
                tokio::spawn(async move {
                    let plan = json!({"workflow_id": "wf_held", "actions": [
                        {"action_id": format!("a{i}"), "intent": "create_file", "path": format!("f{i}.txt"), "content": "x"}]});
                    post_json(&app, "/agentic/plans", &plan).await.status
                })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let state = get(&app, "/agentic/state").await;
        assert_eq!(state.status, StatusCode::OK);
        let other = post_json(&app, "/agentic/plans", &create_plan("wf_free", "g.txt", "y")).await;
        assert_eq!(other.status, StatusCode::OK, "{}", other.text());
        assert!(
            plans.iter().all(|p| !p.is_finished()),
            "answered while the held workflow's plans still wait"
        );
        held.unlock().unwrap();
        for p in plans {
            assert_eq!(p.await.unwrap(), StatusCode::OK);
        }
        assert!(tmp.path().join("root/f5.txt").exists());
    });
}

/// A runtime whose blocking pool holds `threads` threads, and the router, built for that
/// pool, of a writable sandbox that waits `lock_wait_seconds` for a lock.
fn on_pool(
    threads: usize,
    lock_wait_seconds: u64,
) -> (tokio::runtime::Runtime, tempfile::TempDir, axum::Router) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(&tmp, true);
    config.limits.lock_wait_seconds = lock_wait_seconds;
    let sandbox = std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config).unwrap());
    let app = ailab_sandbox_http::router_for_pool(
        sandbox,
        None,
        ailab_sandbox_http::DEFAULT_BODY_LIMIT,
        threads,
    );
    (rt, tmp, app)
}

/// Plans of many workflows all waiting for target locks another process holds run on
/// three quarters of the blocking pool at most, whether or not they name their
/// workflow: reads are answered meanwhile, and the plans that waited for room run once
/// the locks are free.
#[test]
fn plans_waiting_for_held_targets_leave_room_for_reads() {
    use rustix::fs::{FlockOperation, flock};
    let (rt, tmp, app) = on_pool(4, 5);
    rt.block_on(async {
        // Every target lock, as another process writing would hold them.
        let held: Vec<std::fs::File> = (0..64)
            .map(|i| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(tmp.path().join(format!("state/locks/target-{i:02}.lock")))
                    .unwrap();
                flock(&f, FlockOperation::LockExclusive).unwrap();
                f
            })
            .collect();
        // Half of them name no workflow (the runtime makes one): room all the same.
        let plans: Vec<_> = (0..6)
            .map(|i| {
                let app = app.clone();
                tokio::spawn(async move {
                    let mut plan = create_plan(&format!("wf_{i}"), &format!("f{i}.txt"), "x");
                    if i % 2 == 1 {
                        plan.as_object_mut().unwrap().remove("workflow_id");
                    }
                    post_json(&app, "/agentic/plans", &plan).await
                })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        for route in ["/agentic/state", "/agentic/artifacts", "/metrics"] {
            let read = get(&app, route).await;
            assert_eq!(read.status, StatusCode::OK, "{route}: {}", read.text());
        }
        assert!(
            plans.iter().all(|p| !p.is_finished()),
            "answered while the plans still wait"
        );
        drop(held);
        for p in plans {
            let r = p.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        }
        assert!(tmp.path().join("root/f5.txt").exists());
    });
}

/// Plans and a read all waiting for the audit trail or the registry another process
/// holds keep to their shares of the blocking pool: `/metrics` (which waits for no lock)
/// is answered at once meanwhile, and they all succeed once the log is free.
#[test]
fn calls_waiting_for_a_held_log_leave_a_thread_for_metrics() {
    for held in ["sandbox_audit.jsonl", "artifacts.jsonl"] {
        calls_wait_for_held_log(held);
    }
}

fn calls_wait_for_held_log(held: &str) {
    use rustix::fs::{FlockOperation, flock};
    // Six threads for changes, one for reads, one free.
    let (rt, tmp, app) = on_pool(8, 10);
    rt.block_on(async {
        let log = std::fs::File::open(tmp.path().join("state").join(held)).unwrap();
        flock(&log, FlockOperation::LockExclusive).unwrap();
        let plans: Vec<_> = (0..8)
            .map(|i| {
                let app = app.clone();
                tokio::spawn(async move {
                    let plan = create_plan(&format!("wf_{i}"), &format!("f{i}.txt"), "x");
                    post_json(&app, "/agentic/plans", &plan).await
                })
            })
            .collect();
        // Once a plan appending waits for the log, holding it in the process.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let read = tokio::spawn({
            let app = app.clone();
            async move { get(&app, "/agentic/state").await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let metrics = get(&app, "/metrics").await;
        assert_eq!(metrics.status, StatusCode::OK, "{held}");
        assert!(
            plans.iter().all(|p| !p.is_finished()) && !read.is_finished(),
            "{held}: /metrics answered only once the calls waiting for it gave up"
        );
        drop(log);
        for p in plans {
            let r = p.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "{held}: {}", r.text());
        }
        assert_eq!(read.await.unwrap().status, StatusCode::OK, "{held}");
    });
}

/// A plan whose turn on its workflow does not come within `lock_wait_seconds` is answered
/// 503 `server_busy` without being run, unless it is not a valid plan: bad input is 400
/// however busy the workflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_whose_turn_does_not_come_is_busy_unless_it_is_bad_input() {
    let (tmp, app, _held) = workflow_held(1);
    let send = |plan: serde_json::Value| {
        let app = app.clone();
        tokio::spawn(async move { post_json(&app, "/agentic/plans", &plan).await })
    };
    let plan = |id: &str| {
        json!({"workflow_id": "wf_held", "actions": [
            {"action_id": id, "intent": "create_file", "path": format!("{id}.txt"), "content": "x"}]})
    };
    // The first waits for the lock, the second for the first's turn and then the lock:
    // the workflow's turn is taken for about twice the wait.
    let first = send(plan("a1"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let second = send(plan("a2"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut bad = plan("a3");
    bad["bogus"] = json!(1);
    let (bad, busy) = (send(bad), send(plan("a4")));
    let bad = bad.await.unwrap();
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text());
    let busy = busy.await.unwrap();
    busy.assert_error(StatusCode::SERVICE_UNAVAILABLE, "server_busy");
    assert!(busy.headers.contains_key("retry-after"));
    for r in [first, second] {
        let r = r.await.unwrap();
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    }
    assert!(!tmp.path().join("root/a4.txt").exists());
}
