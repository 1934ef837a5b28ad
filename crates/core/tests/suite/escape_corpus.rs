//! The escape corpus: one named case per attack. Each asserts the refusal's reason code
//! and that nothing outside the root changed (the whole temporary directory, minus the
//! root and the state directory, is compared before and after).

use crate::support::*;
use serde_json::{Value, json};
use std::os::unix::fs::symlink;

struct Case {
    name: &'static str,
    setup: fn(&World),
    action: fn(&World) -> Value,
    /// `Some(code)`: refused with it; `None`: allowed, and the write stays inside.
    expect: Option<&'static str>,
}

fn nothing(_: &World) {}

fn create(path: &str) -> Value {
    json!({"intent": "create_file", "path": path, "content": "pwned"})
}

fn world_outside(w: &World) -> std::collections::BTreeMap<String, Option<Vec<u8>>> {
    let mut t = tree(w.tmp.path());
    t.retain(|k, _| !k.starts_with("root") && !k.starts_with("state"));
    t
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "dotdot_first",
            setup: nothing,
            action: |_| create("../x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "dotdot_middle",
            setup: nothing,
            action: |_| create("a/../../x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "dotdot_last",
            setup: nothing,
            action: |_| json!({"intent": "create_directory", "path": "a/.."}),
            expect: Some("path_traversal"),
        },
        Case {
            name: "dotdot_many",
            setup: nothing,
            action: |_| create("../../../../../../../../tmp/x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "backslash_dotdot",
            setup: nothing,
            action: |_| create("..\\..\\x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "dot_component",
            setup: nothing,
            action: |_| create("./x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "empty_component",
            setup: nothing,
            action: |_| create("a//x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "tilde_home",
            setup: nothing,
            action: |_| create("~/x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "tilde_user",
            setup: nothing,
            action: |_| create("~root/.bashrc.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "nul_byte",
            setup: nothing,
            action: |_| create("a\u{0}b.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "control_char",
            setup: nothing,
            action: |_| create("a\u{7}b.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "newline",
            setup: nothing,
            action: |_| create("a\nb.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "absolute_outside_etc",
            setup: nothing,
            action: |_| create("/etc/ailab-escape.txt"),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "absolute_outside_sibling",
            setup: nothing,
            action: |w| create(&w.outside.join("x.txt").display().to_string()),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "sibling_prefix_dir",
            setup: |w| std::fs::create_dir_all(format!("{}_evil", w.root.display())).unwrap(),
            action: |w| create(&format!("{}_evil/x.txt", w.root.display())),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "absolute_root_itself",
            setup: nothing,
            action: |w| json!({"intent": "create_directory", "path": w.root.display().to_string()}),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "absolute_dotdot_from_root",
            setup: nothing,
            action: |w| create(&format!("{}/../outside/x.txt", w.root.display())),
            expect: Some("path_traversal"),
        },
        Case {
            name: "slash_alone",
            setup: nothing,
            action: |_| json!({"intent": "create_directory", "path": "/"}),
            expect: Some("path_traversal"),
        },
        Case {
            name: "empty_path",
            setup: nothing,
            action: |_| create(""),
            expect: Some("path_traversal"),
        },
        Case {
            name: "root_hint_outside",
            setup: nothing,
            action: |w| json!({"intent": "create_file", "path": "x.txt", "content": "p", "root": w.outside.display().to_string()}),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "state_dir_absolute",
            setup: nothing,
            action: |w| create(&w.state.join("artifacts.jsonl.txt").display().to_string()),
            expect: Some("outside_sandbox"),
        },
        Case {
            name: "depth_300",
            setup: nothing,
            action: |_| create(&format!("{}x.txt", "a/".repeat(299))),
            expect: Some("depth_exceeded"),
        },
        Case {
            name: "depth_9",
            setup: nothing,
            action: |_| create("1/2/3/4/5/6/7/8/x.txt"),
            expect: Some("depth_exceeded"),
        },
        Case {
            name: "name_5000_bytes",
            setup: nothing,
            action: |_| create(&format!("{}.txt", "n".repeat(5000))),
            expect: Some("path_traversal"),
        },
        Case {
            name: "rollback_dir",
            setup: nothing,
            action: |_| create(".rollback/wf/a1/backup.txt"),
            expect: Some("reserved_path"),
        },
        Case {
            name: "rollback_dir_case",
            setup: nothing,
            action: |_| create(".RollBack/x.txt"),
            expect: Some("reserved_path"),
        },
        Case {
            name: "rollback_dir_itself",
            setup: nothing,
            action: |_| json!({"intent": "create_directory", "path": ".rollback"}),
            expect: Some("reserved_path"),
        },
        Case {
            name: "temp_marker_name",
            setup: nothing,
            action: |_| create(".ailab-tmp-0123.txt"),
            expect: Some("reserved_path"),
        },
        Case {
            name: "symlink_file_outside",
            setup: |w| symlink(w.outside.join("secret.txt"), w.path("link.txt")).unwrap(),
            action: |_| json!({"intent": "replace_file", "path": "link.txt", "content": "pwned"}),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_file_outside_append",
            setup: |w| symlink(w.outside.join("secret.txt"), w.path("link.txt")).unwrap(),
            action: |_| json!({"intent": "append_file", "path": "link.txt", "content": "pwned"}),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_file_relative_outside",
            setup: |w| symlink("../outside/secret.txt", w.path("rel.txt")).unwrap(),
            action: |_| json!({"intent": "sandbox_transform", "path": "rel.txt", "edits": [{"old": "outside", "new": "pwned"}]}),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_parent_outside",
            setup: |w| symlink(&w.outside, w.path("lnk")).unwrap(),
            action: |_| create("lnk/x.txt"),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_grandparent_outside",
            setup: |w| {
                std::fs::create_dir_all(w.outside.join("sub")).unwrap();
                symlink(&w.outside, w.path("glnk")).unwrap()
            },
            action: |_| create("glnk/sub/x.txt"),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_chain_outside",
            setup: |w| {
                symlink(w.outside.join("secret.txt"), w.path("l1.txt")).unwrap();
                symlink("l1.txt", w.path("l2.txt")).unwrap()
            },
            action: |_| json!({"intent": "replace_file", "path": "l2.txt", "content": "pwned"}),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "dangling_symlink_outside",
            setup: |w| symlink(w.outside.join("new.txt"), w.path("dangle.txt")).unwrap(),
            action: |_| json!({"intent": "append_file", "path": "dangle.txt", "content": "pwned"}),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "dangling_symlink_create",
            setup: |w| symlink("../outside/created.txt", w.path("dangle2.txt")).unwrap(),
            action: |_| create("dangle2.txt"),
            expect: Some("symlink_escape"),
        },
        Case {
            name: "symlink_loop",
            setup: |w| {
                symlink("loop_b.txt", w.path("loop_a.txt")).unwrap();
                symlink("loop_a.txt", w.path("loop_b.txt")).unwrap()
            },
            action: |_| json!({"intent": "append_file", "path": "loop_a.txt", "content": "x"}),
            expect: Some("symlink_refused"),
        },
        Case {
            name: "symlink_inside",
            setup: |w| {
                w.write("real.txt", b"r");
                symlink("real.txt", w.path("alias.txt")).unwrap()
            },
            action: |_| json!({"intent": "replace_file", "path": "alias.txt", "content": "x"}),
            expect: Some("symlink_refused"),
        },
        Case {
            name: "symlink_dir_inside",
            setup: |w| {
                std::fs::create_dir_all(w.path("realdir")).unwrap();
                symlink("realdir", w.path("aliasdir")).unwrap()
            },
            action: |_| create("aliasdir/x.txt"),
            expect: Some("symlink_refused"),
        },
        Case {
            name: "hardlink_outside_append",
            setup: |w| {
                std::fs::hard_link(w.outside.join("secret.txt"), w.path("hard.txt")).unwrap()
            },
            action: |_| json!({"intent": "append_file", "path": "hard.txt", "content": "pwned"}),
            expect: Some("hardlink_refused"),
        },
        Case {
            name: "hardlink_outside_replace",
            setup: |w| {
                std::fs::hard_link(w.outside.join("secret.txt"), w.path("hard.txt")).unwrap()
            },
            action: |_| json!({"intent": "replace_file", "path": "hard.txt", "content": "pwned"}),
            expect: Some("hardlink_refused"),
        },
        Case {
            name: "fifo",
            setup: |w| {
                std::fs::create_dir_all(&w.root).unwrap();
                assert!(
                    std::process::Command::new("mkfifo")
                        .arg(w.path("pipe.txt"))
                        .status()
                        .unwrap()
                        .success()
                )
            },
            action: |_| json!({"intent": "append_file", "path": "pipe.txt", "content": "x"}),
            expect: Some("not_regular_file"),
        },
        Case {
            name: "socket",
            setup: |w| {
                std::fs::create_dir_all(&w.root).unwrap();
                std::mem::forget(
                    std::os::unix::net::UnixListener::bind(w.path("sock.txt")).unwrap(),
                )
            },
            action: |_| json!({"intent": "replace_file", "path": "sock.txt", "content": "x"}),
            expect: Some("not_regular_file"),
        },
        Case {
            name: "directory_as_file",
            setup: |w| std::fs::create_dir_all(w.path("adir.txt")).unwrap(),
            action: |_| json!({"intent": "replace_file", "path": "adir.txt", "content": "x"}),
            expect: Some("not_regular_file"),
        },
        Case {
            name: "blocked_ext_trailing_dot",
            setup: nothing,
            action: |_| create("unit.service."),
            expect: Some("blocked_extension"),
        },
        Case {
            name: "blocked_ext_upper",
            setup: nothing,
            action: |_| create("UNIT.SERVICE"),
            expect: Some("blocked_extension"),
        },
        Case {
            name: "blocked_ext_shared_object",
            setup: nothing,
            action: |_| create("lib.so"),
            expect: Some("blocked_extension"),
        },
        Case {
            name: "lookalike_fullwidth_dots",
            setup: nothing,
            action: |_| create("\u{ff0e}\u{ff0e}/x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "lookalike_one_dot_leader",
            setup: nothing,
            action: |_| create("\u{2024}\u{2024}/x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "lookalike_slash",
            setup: nothing,
            action: |_| create("a\u{2215}..\u{2215}x.txt"),
            expect: Some("path_traversal"),
        },
        Case {
            name: "url_encoded_dotdot",
            setup: nothing,
            action: |_| create("%2e%2e/x.txt"),
            expect: None,
        },
        Case {
            name: "dollar_var_literal",
            setup: nothing,
            action: |_| create("$HOME/x.txt"),
            expect: None,
        },
    ]
}

#[test]
fn every_attack_is_refused_and_nothing_outside_changes() {
    let mut ran = 0;
    for case in cases() {
        let w = World::new();
        std::fs::create_dir_all(&w.root).unwrap();
        (case.setup)(&w);
        let sb = w.sandbox();
        let before = world_outside(&w);
        let r = run(&sb, json!({"actions": [(case.action)(&w)]}));
        match case.expect {
            Some(expected) => {
                assert_eq!(status(&r), "blocked", "{}: {:?}", case.name, r.actions[0]);
                assert_eq!(
                    code(&r, 0).as_deref(),
                    Some(expected),
                    "{}: {:?}",
                    case.name,
                    r.actions[0].reason
                );
            }
            None => {
                assert_eq!(status(&r), "success", "{}: {:?}", case.name, r.actions[0]);
                let written = w
                    .tree()
                    .into_iter()
                    .filter(|(_, v)| v.as_deref() == Some(b"pwned".as_slice()))
                    .count();
                assert_eq!(
                    written, 1,
                    "{}: the literal name is written inside the root",
                    case.name
                );
            }
        }
        assert_eq!(
            world_outside(&w),
            before,
            "{}: something outside the root changed",
            case.name
        );
        assert_eq!(
            std::fs::read(w.outside.join("secret.txt")).unwrap(),
            b"outside-secret",
            "{}",
            case.name
        );
        assert!(
            !w.outside.join("new.txt").exists() && !w.outside.join("created.txt").exists(),
            "{}",
            case.name
        );
        ran += 1;
    }
    assert_eq!(ran, cases().len());
    assert!(ran >= 50, "{ran} cases");
}

#[test]
fn device_node_is_not_regular_file() {
    let w = World::new();
    std::fs::create_dir_all(&w.root).unwrap();
    let made = std::process::Command::new("mknod")
        .arg(w.path("null.txt"))
        .args(["c", "1", "3"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        // Only root can make device nodes; the FIFO and socket cases cover the refusal.
        return;
    }
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "append_file", "path": "null.txt", "content": "x"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("not_regular_file"));
}

#[test]
fn bad_ids_never_become_folders_outside() {
    let w = World::new();
    let sb = w.sandbox();
    let before = world_outside(&w);
    for id in ["../../outside/evil", "..", "a/b", "/abs", "x\0y", ""] {
        let err = sb
            .run_plan(plan(
                json!({"workflow_id": id, "actions": [create("a.txt")]}),
            ))
            .unwrap_err();
        assert_eq!(err.reason_code.as_str(), "invalid_id");
        let rb = sb.rollback_workflow(id, &Default::default());
        assert_eq!(rb.reason_code.map(|c| c.as_str()), Some("invalid_id"));
    }
    assert_eq!(world_outside(&w), before);
}
