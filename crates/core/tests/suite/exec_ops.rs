//! Each of the 11 operations: bytes on disk, checksums, artifacts, audit.

use crate::support::*;
use ailab_sandbox_core::sandbox::CheckRequest;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;

fn one(w: &World, action: serde_json::Value) -> ailab_sandbox_core::RunResult {
    let sb = w.sandbox();
    run(&sb, json!({"actions": [action]}))
}

#[test]
fn create_file_writes_exact_bytes_and_checksum() {
    let w = World::new();
    let r = one(
        &w,
        json!({"action_id": "a1", "intent": "create_file", "path": "notes/hello.md", "content": "# Hi\n"}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(w.read("notes/hello.md"), b"# Hi\n");
    assert_eq!(
        r.actions[0].after_checksum.as_deref(),
        Some(sha(b"# Hi\n").as_str())
    );
    assert_eq!(r.actions[0].before_checksum, None);
    assert_eq!(r.actions[0].size_bytes, Some(5));
    assert!(
        r.actions[0]
            .artifact_id
            .as_deref()
            .unwrap()
            .starts_with("art_")
    );
    assert_eq!(
        r.actions[0].rollback_path.as_deref(),
        Some(format!(".rollback/{}/a1", r.workflow_id).as_str())
    );
}

#[test]
fn create_file_refuses_existing_target() {
    let w = World::new();
    w.write("a.txt", b"old");
    let r = one(
        &w,
        json!({"intent": "create_file", "path": "a.txt", "content": "new"}),
    );
    assert_eq!(status(&r), "blocked");
    assert_eq!(code(&r, 0).as_deref(), Some("already_exists"));
    assert_eq!(w.read("a.txt"), b"old");
}

#[test]
fn append_file_creates_then_appends() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf", "actions": [
        {"intent": "append_file", "path": "log.txt", "content": "one\n"},
        {"intent": "append_file", "path": "log.txt", "content": "two\n"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(w.read("log.txt"), b"one\ntwo\n");
    assert_eq!(
        r.actions[1].before_checksum.as_deref(),
        Some(sha(b"one\n").as_str())
    );
    assert_eq!(
        r.actions[1].after_checksum.as_deref(),
        Some(sha(b"one\ntwo\n").as_str())
    );
}

#[test]
fn replace_file_needs_existing_file() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "replace_file", "path": "missing.txt", "content": "x"}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("not_found"));
    assert!(!w.path("missing.txt").exists());
    w.write("present.txt", b"before");
    let r = one(
        &w,
        json!({"intent": "replace_file", "path": "present.txt", "content": "after"}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(w.read("present.txt"), b"after");
    assert_eq!(
        r.actions[0].before_checksum.as_deref(),
        Some(sha(b"before").as_str())
    );
}

#[test]
fn create_directory_is_mkdir_p_and_idempotent() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_directory", "path": "a/b/c"}]}),
    );
    assert_eq!(status(&r), "success");
    assert!(w.path("a/b/c").is_dir());
    let mode = std::fs::metadata(w.path("a/b/c"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode & 0o022, 0, "no group/other write: {mode:o}");
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_directory", "path": "a/b/c"}]}),
    );
    assert_eq!(status(&r), "success");
    assert!(
        r.actions[0].artifact_id.is_none(),
        "directories are not artifacts"
    );
}

#[test]
fn a_blocked_extension_is_never_a_directory_name() {
    let w = World::new();
    let sb = w.sandbox();
    let before = w.tree();
    for action in [
        json!({"intent": "create_directory", "path": "evil.service"}),
        json!({"intent": "create_directory", "path": "units/x.Timer./drop"}),
        json!({"intent": "create_file", "path": "lib.so/readme.md", "content": "x"}),
        json!({"intent": "write_json", "path": "a/b.socket/c.json", "data": {}}),
        // Drop-in and dependency folders of units, which systemd reads as the unit.
        json!({"intent": "create_file", "path": "sshd.service.d/override.conf", "content": "x"}),
        json!({"intent": "create_directory", "path": "user/backup.TIMER.d."}),
        json!({"intent": "create_file", "path": "m.target.wants/x.conf", "content": "x"}),
        json!({"intent": "create_file", "path": "m.socket.requires/x.conf", "content": "x"}),
        // A type's own drop-in folder, read for every unit of that type.
        json!({"intent": "create_file", "path": "service.d/override.conf", "content": "x"}),
        json!({"intent": "create_directory", "path": "u/Timer.d"}),
    ] {
        let (intent, path) = (&action["intent"], &action["path"]);
        let r = run(&sb, json!({ "actions": [action] }));
        assert_eq!(status(&r), "blocked", "{intent} {path}");
        assert_eq!(
            code(&r, 0).as_deref(),
            Some("blocked_extension"),
            "{intent} {path}"
        );
        let reason = r.actions[0].reason.as_deref().unwrap_or_default();
        assert!(reason.contains("directory name"), "{reason}");
    }
    assert_eq!(w.tree(), before, "nothing was created");
    // A dot inside a directory name that is not a blocked extension is fine, and so is a
    // `.d` folder of any other name.
    let r = run(
        &sb,
        json!({"actions": [
            {"intent": "create_file", "path": "v1.2/notes.md", "content": "x"},
            {"intent": "create_file", "path": "conf.d/app.conf", "content": "x"},
            {"intent": "create_file", "path": "nginx.conf.d/site.conf", "content": "x"},
            {"intent": "create_directory", "path": ".d"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

/// Something other than a folder where `.rollback` belongs (a file, a symbolic link, a
/// FIFO) stops every write in the root, with a reason naming it and what to do, not an
/// operating-system error about a snapshot.
#[test]
fn a_snapshot_store_that_is_not_a_folder_stops_every_write_naming_it() {
    for what in ["a file", "a symbolic link", "a FIFO"] {
        let w = World::new();
        w.write("doc.md", b"original\n");
        let store = w.path(".rollback");
        match what {
            "a file" => std::fs::write(&store, b"x").unwrap(),
            "a symbolic link" => std::os::unix::fs::symlink(w.tmp.path(), &store).unwrap(),
            _ => rustix::fs::mknodat(
                rustix::fs::CWD,
                &store,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap(),
        }
        let sb = w.sandbox();
        let r = run(
            &sb,
            json!({"actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
        );
        assert_eq!(
            code(&r, 0).as_deref(),
            Some("reserved_path"),
            "{what}: {r:?}"
        );
        let reason = r.actions[0].reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(".rollback")
                && reason.contains(&format!("is {what}"))
                && reason.contains("removes it"),
            "{what}: {reason}"
        );
        assert_eq!(w.read("doc.md"), b"original\n", "{what}");
    }
    // In a workflow's place, it stops that workflow only.
    let w = World::new();
    std::fs::create_dir_all(w.path(".rollback")).unwrap();
    std::fs::set_permissions(w.path(".rollback"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(w.path(".rollback/wf_x"), b"x").unwrap();
    let sb = w.sandbox();
    let one = |wf: &str| json!({"workflow_id": wf, "actions": [{"intent": "create_file", "path": format!("{wf}.md"), "content": "x"}]});
    let r = run(&sb, one("wf_x"));
    assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"), "{r:?}");
    let reason = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("nothing is written for workflow wf_x"),
        "{reason}"
    );
    assert_eq!(status(&run(&sb, one("wf_y"))), "success");
    // In an action's place: that action id is not "already used", something is in the way.
    std::fs::create_dir(w.path(".rollback/wf_z")).unwrap();
    std::fs::set_permissions(
        w.path(".rollback/wf_z"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(w.path(".rollback/wf_z/a1"), b"x").unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_z", "actions": [{"action_id": "a1", "intent": "create_file", "path": "z.md", "content": "x"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"), "{r:?}");
    let reason = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains(".rollback/wf_z/a1") && reason.contains("is a file"),
        "{reason}"
    );
}

/// A root whose snapshot store is unusable blocks the whole plan at validation, as any
/// refusal does: an earlier action of the plan in another root is not written first
/// (nor written and undone), and a simulation says the same.
#[test]
fn an_unusable_snapshot_store_blocks_the_plan_before_anything_is_written() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &w.writable_config());
    std::fs::write(root2.join(".rollback"), b"x").unwrap();
    let p = json!({"workflow_id": "wf_two", "on_failure": "stop", "actions": [
        {"intent": "create_file", "path": "a.txt", "content": "x"},
        {"intent": "create_file", "path": "b.txt", "content": "y", "root": root2.display().to_string()}]});
    let r = run(&w.open(both.clone()), p.clone());
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 1).as_deref(), Some("reserved_path"));
    assert!(!w.path("a.txt").exists(), "nothing written");
    let mut sim = both.clone();
    sim.dry_run = true;
    let r = run(&w.open(sim), p);
    assert_eq!(status(&r), "blocked", "{r:?}");
    let v = w.open(both.clone()).check(&CheckRequest {
        intent: "create_file",
        path: "b.txt",
        size: 1,
        root: Some(&root2.display().to_string()),
        ..CheckRequest::default()
    });
    assert!(!v.allowed, "{v:?}");
    assert_eq!(
        v.reason_code,
        Some(ailab_sandbox_core::ReasonCode::ReservedPath)
    );
    // The same for a file in the place of the action's own snapshot folder.
    std::fs::remove_file(root2.join(".rollback")).unwrap();
    std::fs::create_dir_all(root2.join(".rollback/wf_three")).unwrap();
    for d in [".rollback", ".rollback/wf_three"] {
        std::fs::set_permissions(root2.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::fs::write(root2.join(".rollback/wf_three/a2"), b"z").unwrap();
    let p = json!({"workflow_id": "wf_three", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "x"},
        {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "y", "root": root2.display().to_string()}]});
    let r = run(&w.open(both), p);
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 1).as_deref(), Some("reserved_path"));
    assert!(!w.path("a.txt").exists(), "nothing written");
}

/// A `.rollback` another user could write in (made before the runtime's own, say, in a
/// root others may write to) would let them remove the snapshots: nothing is written.
#[test]
fn a_snapshot_folder_others_can_write_in_stops_every_write() {
    let w = World::new();
    w.write("doc.md", b"original\n");
    let store = w.path(".rollback");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
    );
    assert_ne!(status(&r), "success");
    assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"));
    let reason = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains(".rollback") && reason.contains("writable by other users"),
        "{reason}"
    );
    assert_eq!(w.read("doc.md"), b"original\n");
    assert_eq!(std::fs::read_dir(&store).unwrap().count(), 0);
    // Made by another user (when this process may give it away): the same.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    if std::os::unix::fs::chown(&store, Some(65534), None).is_ok()
        && rustix::process::geteuid().as_raw() != 65534
    {
        let r = run(
            &sb,
            json!({"actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"));
        assert!(
            r.actions[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("owned by uid 65534"),
            "{r:?}"
        );
        assert_eq!(w.read("doc.md"), b"original\n");
    }
    // A private store with a workflow folder others can write in: that workflow writes
    // nothing, others do.
    std::fs::remove_dir(&store).unwrap();
    std::fs::create_dir_all(store.join("wf_open")).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(
        store.join("wf_open"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_open", "actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"), "{r:?}");
    assert!(
        r.actions[0]
            .reason
            .as_deref()
            .unwrap()
            .contains(".rollback/wf_open"),
        "{r:?}"
    );
    assert_eq!(w.read("doc.md"), b"original\n");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_mine", "actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

/// An access control list giving another user write on `.rollback` or on a workflow's
/// folder opens it to them as a mode would (the group bits then show only the list's
/// mask): the plan is blocked before anything is written. A list naming only this
/// process's user changes nothing.
#[test]
fn a_snapshot_folder_an_access_control_list_opens_to_others_stops_the_plan() {
    let me = rustix::process::geteuid().as_raw();
    let other = if me == 65534 { 65533 } else { 65534 };
    let w = World::new();
    w.write("doc.md", b"original\n");
    let store = w.path(".rollback");
    std::fs::create_dir_all(store.join("wf_acl")).unwrap();
    for d in [store.clone(), store.join("wf_acl")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    if acl_giving_write(&store, other, true).is_err() {
        eprintln!("no access control lists on this filesystem: skipped");
        return;
    }
    let sb = w.sandbox();
    let replace = |wf: &str| {
        run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"intent": "replace_file", "path": "doc.md", "content": "new\n"}]}),
        )
    };
    let refused_for = |r: &ailab_sandbox_core::RunResult, folder: &str| {
        assert_eq!(status(r), "blocked", "{r:?}");
        assert_eq!(code(r, 0).as_deref(), Some("reserved_path"), "{r:?}");
        let reason = r.actions[0].reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(&format!(
                "{folder}' is writable by other users through its access control list"
            )),
            "{reason}"
        );
        assert_eq!(w.read("doc.md"), b"original\n");
    };
    let names = || {
        let mut n: Vec<_> = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    refused_for(&replace("wf_new"), ".rollback");
    assert_eq!(names(), ["wf_acl"], "nothing written in the store");
    let doc_md = CheckRequest {
        intent: "replace_file",
        path: "doc.md",
        size: 4,
        ..CheckRequest::default()
    };
    let v = sb.check(&doc_md);
    assert!(!v.allowed, "{v:?}");
    assert_eq!(
        v.reason_code,
        Some(ailab_sandbox_core::ReasonCode::ReservedPath)
    );
    // A mode without group write is the list's mask: it caps the other user's entry.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(sb.check(&doc_md).allowed);

    acl_giving_write(&store, me, true).unwrap();
    acl_giving_write(&store.join("wf_acl"), other, true).unwrap();
    refused_for(&replace("wf_acl"), ".rollback/wf_acl");
    assert_eq!(std::fs::read_dir(store.join("wf_acl")).unwrap().count(), 0);
    assert!(sb.check(&doc_md).allowed);
    let r = replace("wf_mine");
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("doc.md"), b"new\n");

    acl_giving_write(&store.join("wf_acl"), me, true).unwrap();
    let r = replace("wf_acl");
    assert_eq!(status(&r), "success", "{r:?}");
}

#[test]
fn write_json_serializes_data_pretty() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "write_json", "path": "out/data.json", "data": {"k": 1, "list": [1, 2]}}),
    );
    assert_eq!(status(&r), "success");
    let text = String::from_utf8(w.read("out/data.json")).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back, json!({"k": 1, "list": [1, 2]}));
    assert!(text.ends_with('\n'));
    assert_eq!(
        r.actions[0].after_checksum.as_deref(),
        Some(sha(text.as_bytes()).as_str())
    );
}

/// `data: null` is no data, whether the plan came as JSON text or was built in Rust (a
/// library caller's `Some(Value::Null)` was written as `null`).
#[test]
fn null_data_is_no_data_on_every_route() {
    let w = World::new();
    let sb = w.sandbox();
    let built = ailab_sandbox_core::Plan {
        actions: vec![ailab_sandbox_core::plan::Action {
            intent: "write_json".to_owned(),
            path: "n.json".to_owned(),
            data: Some(serde_json::Value::Null),
            ..Default::default()
        }],
        ..Default::default()
    };
    let from_text = br#"{"actions":[{"intent":"write_json","path":"n.json","data":null}]}"#;
    for r in [
        sb.run_plan(built).unwrap(),
        sb.run_plan_json(from_text).unwrap(),
    ] {
        assert_eq!(status(&r), "blocked", "{r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
    }
    assert!(!w.path("n.json").exists());
}

#[test]
fn numbers_are_written_as_sent_or_refused() {
    let w = World::new();
    let sb = w.sandbox();
    let plan = |n: &str| {
        format!(
            r#"{{"actions": [{{"intent": "write_json", "path": "n.json", "data": {{"n": {n}}}}}]}}"#
        )
    };
    let err = sb
        .run_plan_json(plan("12345678901234567890123").as_bytes())
        .unwrap_err();
    assert_eq!(err.reason_code, ailab_sandbox_core::ReasonCode::InvalidPlan);
    assert!(
        err.reason.contains("12345678901234567890123"),
        "{}",
        err.reason
    );
    let err = sb
        .run_plan_json(plan("3.14159265358979323846").as_bytes())
        .unwrap_err();
    assert_eq!(
        err.reason_code,
        ailab_sandbox_core::ReasonCode::InvalidPlan,
        "{}",
        err.reason
    );
    assert!(!w.path("n.json").exists());
    assert!(sb.audit_entries(10, None).unwrap().is_empty());
    // The largest integers and ordinary decimals reach the file as sent.
    let r = sb
        .run_plan_json(
            plan("[18446744073709551615, -9223372036854775808, 0.1, 2.5, 3.89024412130861e+37, 2.2532106301827582e+30]")
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(status(&r), "success");
    let text = String::from_utf8(w.read("n.json")).unwrap();
    // Doubles are parsed correctly rounded, so one that round-trips is not refused.
    for n in [
        "18446744073709551615",
        "-9223372036854775808",
        "0.1",
        "2.5",
        "3.89024412130861e+37",
        "2.2532106301827582e+30",
    ] {
        assert!(text.contains(n), "{n} in {text}");
    }
}

#[test]
fn write_yaml_serializes_data() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "write_yaml", "path": "c.yaml", "data": {"name": "x", "count": 3, "flag": "yes", "day": "2020-01-01"}}),
    );
    assert_eq!(status(&r), "success");
    let text = String::from_utf8(w.read("c.yaml")).unwrap();
    assert!(text.contains("name: x"), "{text}");
    assert!(text.contains("count: 3"), "{text}");
    // Strings a YAML 1.1 reader would take for a boolean or a date stay strings.
    assert!(text.contains("flag: \"yes\""), "{text}");
    assert!(text.contains("day: \"2020-01-01\""), "{text}");
}

#[test]
fn write_markdown_and_generate_report_write_content() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "write_markdown", "path": "doc.md", "content": "# Doc\n"},
        {"intent": "generate_report", "path": "report.md", "content": "# Report\n"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(w.read("doc.md"), b"# Doc\n");
    assert_eq!(w.read("report.md"), b"# Report\n");
}

#[test]
fn generate_config_picks_format_by_extension() {
    let w = World::new();
    let sb = w.sandbox();
    let data = json!({"name": "svc", "server": {"port": 8080, "debug": false}});
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "generate_config", "path": "c.json", "data": data},
        {"intent": "generate_config", "path": "c.toml", "data": data},
        {"intent": "generate_config", "path": "c.ini", "data": {"server": data["server"]}},
        {"intent": "generate_config", "path": "c.yml", "data": data}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    let toml_text = String::from_utf8(w.read("c.toml")).unwrap();
    let parsed: toml::Value = toml::from_str(&toml_text).unwrap();
    assert_eq!(parsed["server"]["port"].as_integer(), Some(8080));
    assert_eq!(
        String::from_utf8(w.read("c.ini")).unwrap(),
        "[server]\ndebug = false\nport = 8080\n"
    );
    let back: serde_json::Value = serde_json::from_slice(&w.read("c.json")).unwrap();
    assert_eq!(back, data);
    assert!(
        String::from_utf8(w.read("c.yml"))
            .unwrap()
            .contains("port: 8080")
    );
}

#[test]
fn generate_config_toml_refuses_non_object() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "generate_config", "path": "c.toml", "data": [1, 2]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
}

#[test]
fn generate_config_refuses_data_that_would_not_read_back() {
    let w = World::new();
    for (path, data, names) in [
        (
            "c.toml",
            json!({"a": 18446744073709551615_u64}),
            "'a' is 18446744073709551615",
        ),
        (
            "c.toml",
            json!({"a": {"b": [1, 2, {"c": null}]}}),
            "'a.b[2].c' is null",
        ),
        (
            "c.ini",
            json!({"s": {"a": null}}),
            "key 'a' of section 's' is null, and INI has no null",
        ),
        (
            "c.toml",
            json!({"a.b": {"c": [1, null]}, "a": {"b.c": [1]}}),
            "'\"a.b\".c[1]' is null",
        ),
        (
            "c.ini",
            json!({"name": "svc", "server": {"port": 8080}}),
            "'name' is a plain value at the top level, outside any section",
        ),
        ("c.ini", json!({"s": {";k": "v"}}), "the key ';k'"),
        ("c.ini", json!({"s": {"#k": "v"}}), "the key '#k'"),
        ("c.ini", json!({"s": {"k:x": "v"}}), "the key 'k:x'"),
        ("c.ini", json!({"s": {"": "v"}}), "the key '' is empty"),
        (
            "c.ini",
            json!({"": {"k": "v"}}),
            "the section name '' is empty",
        ),
        ("c.ini", json!({"s": {" k": "v"}}), "the key ' k'"),
        (
            "c.ini",
            json!({"s": {";k": "v"}}),
            "take for a comment (in section 's')",
        ),
        (
            "c.ini",
            json!({"DEFAULT": {"t": "5"}, "db": {"h": "h"}}),
            "the section name 'DEFAULT' names the section readers (Python's configparser) take for defaults copied into every other section; give the section another name",
        ),
        (
            "c.ini",
            json!({"s": {"\u{feff}name": "x"}}),
            "starts with U+FEFF",
        ),
        (
            "c.ini",
            json!({"db": {"rate": "1"}, "web": {"rate": "100%"}}),
            "holds '%'",
        ),
        (
            "c.ini",
            json!({"db": {"rate": "1"}, "web": {"rate": "100%"}}),
            "(key 'rate' of section 'web')",
        ),
        ("c.ini", json!({"s": {"k": " v "}}), "the value ' v '"),
        (
            "c.ini",
            json!({"s": {"c": ";not a comment"}}),
            "the value ';not a comment' starts with ';' or '#'",
        ),
        (
            "c.ini",
            json!({"s": {"c": "#x"}}),
            "the value '#x' starts with",
        ),
        (
            "c.ini",
            json!({"s": {"k": "v\u{0}x"}}),
            "the value 'v\\0x' has a control character",
        ),
        (
            "c.ini",
            json!({"s": {"k\u{1b}": "v"}}),
            "has a control character",
        ),
        (
            "c.ini",
            json!({"s": {"k": "a\nb"}}),
            "the value 'a\\nb' has a line break",
        ),
        (
            "c.ini",
            json!({"[s]": {"k": "v"}}),
            "the section name '[s]'",
        ),
        (
            "c.ini",
            json!({"s": {"Key": "1", "key": "2"}}),
            "differ only in case",
        ),
    ] {
        let r = one(
            &w,
            json!({"intent": "generate_config", "path": path, "data": data}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"), "{data}");
        let reason = r.actions[0].reason.as_deref().unwrap();
        assert!(reason.contains(names), "{data}: {reason}");
        assert!(!w.path(path).exists(), "{data}");
    }
    // What INI and TOML can hold is written as given.
    let r = one(
        &w,
        json!({"intent": "generate_config", "path": "c.toml",
               "data": {"max": 9223372036854775807_i64, "min": -9223372036854775808_i64}}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    let back: toml::Value =
        toml::from_str(std::str::from_utf8(&w.read("c.toml")).unwrap()).unwrap();
    assert_eq!(back["max"].as_integer(), Some(i64::MAX));
    let r = one(
        &w,
        json!({"intent": "generate_config", "path": "c.ini",
               "data": {";s": {"a.b": "x;y # z", "empty": ""}}}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    assert_eq!(w.read("c.ini"), b"[;s]\na.b = x;y # z\nempty = \n");
    // A value never opens a line: one that starts with U+FEFF reads back whole.
    let r = one(
        &w,
        json!({"intent": "generate_config", "path": "bom.ini",
               "data": {"s": {"k": "\u{feff}x"}}}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    assert_eq!(w.read("bom.ini"), "[s]\nk = \u{feff}x\n".as_bytes());
}

#[test]
fn generate_script_never_has_execute_bit() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "generate_script", "path": "run.sh", "content": "#!/bin/sh\necho hi\n"}),
    );
    assert_eq!(status(&r), "success");
    let mode = std::fs::metadata(w.path("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0, "mode {mode:o}");
    assert_eq!(w.read("run.sh"), b"#!/bin/sh\necho hi\n");
}

#[test]
fn replace_of_executable_file_drops_execute_bits() {
    let w = World::new();
    w.write("tool.sh", b"old");
    std::fs::set_permissions(w.path("tool.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = one(
        &w,
        json!({"intent": "replace_file", "path": "tool.sh", "content": "new"}),
    );
    assert_eq!(status(&r), "success");
    let mode = std::fs::metadata(w.path("tool.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0, "mode {mode:o}");
}

#[test]
fn sandbox_transform_applies_edits_in_order() {
    let w = World::new();
    w.write("t.md", b"alpha beta gamma\n");
    let r = one(
        &w,
        json!({"intent": "sandbox_transform", "path": "t.md", "edits": [
        {"old": "alpha", "new": "ALPHA"}, {"old": "ALPHA beta", "new": "AB"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(w.read("t.md"), b"AB gamma\n");
}

#[test]
fn sandbox_transform_edit_not_found_and_ambiguous_change_nothing() {
    let w = World::new();
    w.write("t.md", b"one two two\n");
    let r = one(
        &w,
        json!({"intent": "sandbox_transform", "path": "t.md", "edits": [{"old": "one", "new": "1"}, {"old": "three", "new": "3"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("edit_not_found"));
    let r = one(
        &w,
        json!({"intent": "sandbox_transform", "path": "t.md", "edits": [{"old": "two", "new": "2"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("edit_ambiguous"));
    assert_eq!(w.read("t.md"), b"one two two\n");

    // Overlapping occurrences are occurrences too.
    w.write("o.md", "aaa x\u{e9}\u{e9}\u{e9} xababay\n".as_bytes());
    for (old, times) in [
        ("aa", "the occurrences overlap"),
        ("\u{e9}\u{e9}", "the occurrences overlap"),
        ("aba", "the occurrences overlap"),
        ("a", "6 times"),
    ] {
        let r = one(
            &w,
            json!({"intent": "sandbox_transform", "path": "o.md", "edits": [{"old": old, "new": "X"}]}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("edit_ambiguous"), "{old}");
        let reason = r.actions[0].reason.clone().unwrap_or_default();
        assert!(reason.contains(times), "{old}: {reason}");
    }
    assert_eq!(
        w.read("o.md"),
        "aaa x\u{e9}\u{e9}\u{e9} xababay\n".as_bytes()
    );
}

#[test]
fn sandbox_transform_of_missing_file_is_not_found() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "sandbox_transform", "path": "nope.md", "edits": [{"old": "a", "new": "b"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("not_found"));
}

/// Edits that could change nothing are refused as the plan's fault before the target is
/// looked at, as MCP's schema refuses them: a missing file does not hide it.
#[test]
fn sandbox_transform_without_edits_is_invalid_whatever_the_target() {
    let w = World::new();
    for path in ["nope.md", "t.md"] {
        if path == "t.md" {
            w.write(path, b"text\n");
        }
        let r = one(
            &w,
            json!({"intent": "sandbox_transform", "path": path, "edits": []}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"), "{path}");
        let r = one(
            &w,
            json!({"intent": "sandbox_transform", "path": path, "edits": [{"old": "x", "new": "y"}, {"old": "", "new": "z"}]}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"), "{path}");
        assert!(
            r.actions[0]
                .reason
                .as_deref()
                .is_some_and(|t| t.contains("edit 2 has an empty 'old'")),
            "{:?}",
            r.actions[0].reason
        );
    }
    assert_eq!(w.read("t.md"), b"text\n");
}

#[test]
fn size_limit_counts_bytes_on_disk() {
    let w = World::new();
    w.write("big.txt", &vec![b'a'; 1024 * 1024 - 2]);
    // Given whole, the target is named by its path in the root, as every refusal names it.
    let whole = w.path("big.txt").display().to_string();
    let r = one(
        &w,
        json!({"intent": "append_file", "path": whole, "content": "bcd"}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("size_exceeded"));
    assert_eq!(
        r.actions[0].reason.as_deref(),
        Some(
            "append_file would leave 1048577 bytes in 'big.txt'; its limit is 1048576 bytes (1 MiB)"
        )
    );
    let r = one(
        &w,
        json!({"intent": "append_file", "path": "big.txt", "content": "bc"}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(
        std::fs::metadata(w.path("big.txt")).unwrap().len(),
        1024 * 1024
    );
}

#[test]
fn wrong_payload_field_is_invalid_plan() {
    let w = World::new();
    let r = one(
        &w,
        json!({"intent": "create_file", "path": "a.txt", "data": {"x": 1}}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
    assert!(r.actions[0].reason.as_deref().unwrap().contains("'data'"));
    let r = one(
        &w,
        json!({"intent": "create_directory", "path": "d", "content": "x"}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
    let r = one(&w, json!({"intent": "write_json", "path": "d.json"}));
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
}

#[test]
fn later_actions_see_earlier_actions_of_the_plan() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "create_file", "path": "n/x.md", "content": "Hi"},
        {"intent": "sandbox_transform", "path": "n/x.md", "edits": [{"old": "Hi", "new": "Hello"}]},
        {"intent": "replace_file", "path": "n/x.md", "content": "Bye"}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    assert_eq!(w.read("n/x.md"), b"Bye");
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "create_file", "path": "m.md", "content": "1"},
        {"intent": "create_file", "path": "m.md", "content": "2"}]}),
    );
    assert_eq!(status(&r), "blocked");
    assert_eq!(code(&r, 1).as_deref(), Some("already_exists"));
    assert!(!w.path("m.md").exists(), "a blocked plan writes nothing");
}

/// The reason a plan gets for `path` when the tree already holds what an earlier action
/// of another plan left there: validation must answer the same within one plan.
fn refusal_on_disk(
    w: &World,
    setup: serde_json::Value,
    action: serde_json::Value,
) -> (String, String) {
    let sb = w.sandbox();
    assert_eq!(status(&run(&sb, json!({"actions": [setup]}))), "success");
    let r = run(&sb, json!({"actions": [action]}));
    assert_eq!(status(&r), "blocked", "{:?}", r.actions);
    (code(&r, 0).unwrap(), r.actions[0].reason.clone().unwrap())
}

#[test]
fn a_file_created_earlier_in_the_plan_is_no_parent_for_a_later_action() {
    for (second, refused_parent) in [
        (
            json!({"intent": "create_file", "path": "x.txt/y.txt", "content": "y"}),
            "x.txt",
        ),
        (
            json!({"intent": "append_file", "path": "x.txt/a/b.txt", "content": "y"}),
            "x.txt",
        ),
        (
            json!({"intent": "create_directory", "path": "x.txt/d"}),
            "x.txt",
        ),
        (
            json!({"intent": "create_file", "path": "n/x.txt/y.txt", "content": "y"}),
            "n/x.txt",
        ),
    ] {
        let first_path = refused_parent;
        let w = World::new();
        let sb = w.sandbox();
        let r = run(
            &sb,
            json!({"workflow_id": "wf_parent", "actions": [
                {"intent": "create_file", "path": first_path, "content": "x"}, second.clone()]}),
        );
        assert_eq!(status(&r), "blocked", "{second}: {:?}", r.actions);
        assert_eq!(action_status(&r, 0), "skipped");
        assert_eq!(code(&r, 1).as_deref(), Some("not_found"), "{second}");
        let reason = r.actions[1].reason.clone().unwrap();
        assert!(
            reason.contains(&format!("'{refused_parent}' is not a directory")),
            "{second}: {reason}"
        );
        assert!(w.tree().is_empty(), "nothing written: {:?}", w.tree());
        assert!(
            !w.root.join(".rollback/wf_parent").exists(),
            "no snapshot taken"
        );
        let audit = sb.audit_entries(10, Some("wf_parent")).unwrap();
        assert!(
            audit
                .iter()
                .all(|e| serde_json::to_value(e.status).unwrap() == json!("blocked")),
            "{audit:?}"
        );
        drop(sb);
        // The same answer as when the file is already on disk.
        let disk = World::new();
        let on_disk = refusal_on_disk(
            &disk,
            json!({"intent": "create_file", "path": first_path, "content": "x"}),
            second.clone(),
        );
        assert_eq!(on_disk, ("not_found".to_owned(), reason), "{second}");
    }
}

#[test]
fn a_directory_created_earlier_in_the_plan_is_no_place_for_a_later_file() {
    // create_file refuses whatever exists (SPEC §3), the others what is no file.
    for (first, second, wanted) in [
        (
            json!({"intent": "create_directory", "path": "a.txt/b"}),
            json!({"intent": "create_file", "path": "a.txt", "content": "x"}),
            "already_exists",
        ),
        (
            json!({"intent": "create_file", "path": "a.txt/b.md/c.txt", "content": "c"}),
            json!({"intent": "append_file", "path": "a.txt/b.md", "content": "x"}),
            "not_regular_file",
        ),
        (
            json!({"intent": "create_directory", "path": "d.json"}),
            json!({"intent": "write_json", "path": "d.json", "data": {"k": 1}}),
            "not_regular_file",
        ),
    ] {
        let w = World::new();
        let sb = w.sandbox();
        let r = run(&sb, json!({"actions": [first.clone(), second.clone()]}));
        assert_eq!(status(&r), "blocked", "{second}: {:?}", r.actions);
        assert_eq!(action_status(&r, 0), "skipped");
        assert_eq!(code(&r, 1).as_deref(), Some(wanted), "{second}");
        assert!(w.tree().is_empty(), "nothing written: {:?}", w.tree());
        drop(sb);
        let disk = World::new();
        let (on_disk, _) = refusal_on_disk(&disk, first, second.clone());
        assert_eq!(on_disk, wanted, "{second}");
    }
}

#[test]
fn a_rollback_folder_below_the_top_is_never_written() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "create_directory", "path": "inner"},
        {"intent": "create_file", "path": "inner/B/.Rollback/wf/a1/backup.txt", "content": "forged"},
        {"intent": "create_directory", "path": "notes/.rollback"}]}),
    );
    assert_eq!(status(&r), "blocked", "{:?}", r.actions);
    assert_eq!(code(&r, 1).as_deref(), Some("reserved_path"));
    assert_eq!(code(&r, 2).as_deref(), Some("reserved_path"));
    assert!(w.tree().is_empty(), "nothing written: {:?}", w.tree());
}

#[test]
fn artifact_and_audit_records_match_the_write() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_rec", "actions": [{"action_id": "a1", "intent": "create_file", "path": "r.txt", "content": "rec"}]}),
    );
    let id = r.actions[0].artifact_id.clone().unwrap();
    let (art, lineage) = sb.artifact_with_lineage(&id).unwrap().unwrap();
    assert_eq!(art.checksum_sha256, sha(b"rec"));
    assert_eq!(art.size_bytes, 3);
    assert_eq!(art.mutation_type, "create_file");
    assert_eq!(art.workflow_id, "wf_rec");
    assert_eq!(art.path, w.path("r.txt").display().to_string());
    assert!(lineage.is_empty());
    let audit = sb.audit_entries(10, Some("wf_rec")).unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        audit[0].after_checksum.as_deref(),
        Some(sha(b"rec").as_str())
    );
    assert_eq!(
        audit[0].rollback_path.as_deref(),
        Some(".rollback/wf_rec/a1")
    );
    assert!(audit[0].rollback_available);
}
