//! read_file, list_directory, get_file_info, list_artifacts, get_artifact, get_state.

use super::support::{Mode, Session, sha256_of, structured, text};
use serde_json::json;

#[tokio::test]
async fn read_tools_are_confined_and_exact() {
    let s = Session::start(Mode::Write).await;
    let content = "line one\nline two — ünïcode\n";
    s.ok(
        "create_file",
        json!({"path": "notes/r.md", "content": content}),
    )
    .await;
    s.ok("create_directory", json!({"path": "notes/sub"})).await;

    let r = s.ok("read_file", json!({"path": "notes/r.md"})).await;
    assert_eq!(text(&r), content, "text content is exactly the file's text");
    let st = structured(&r);
    assert_eq!(st["content"], content);
    assert_eq!(st["size_bytes"], content.len() as u64);
    assert_eq!(st["sha256"], sha256_of(&s.path("notes/r.md")).as_str());

    let r = s.ok("list_directory", json!({"path": "notes"})).await;
    let entries = structured(&r)["entries"].as_array().unwrap().clone();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r.md", "sub"]);
    assert!(text(&r).contains(": 2 entries"), "{}", text(&r));
    // One entry a line, its kind in a column of its own.
    assert!(
        text(&r).contains("\nfile      r.md  (") && text(&r).contains("\ndirectory sub/"),
        "{}",
        text(&r)
    );
    let r = s.ok("list_directory", json!({"path": "notes/sub"})).await;
    assert!(text(&r).contains("is empty"), "{}", text(&r));
    s.ok(
        "create_file",
        json!({"path": "notes/sub/one.md", "content": "1"}),
    )
    .await;
    let r = s.ok("list_directory", json!({"path": "notes/sub"})).await;
    assert!(
        text(&r).contains(": 1 entry\n") || text(&r).ends_with(": 1 entry"),
        "{}",
        text(&r)
    );
    let r = s.ok("list_directory", json!({})).await;
    assert!(text(&r).contains("notes/"), "{}", text(&r));
    // `/` is the root's top as no path is, and said so: not the filesystem's.
    let r = s.ok("list_directory", json!({"path": "/"})).await;
    assert!(
        text(&r).starts_with("Directory / (the root):") && text(&r).contains("notes/"),
        "{}",
        text(&r)
    );

    // Looked at, the root's top is the root's, not the filesystem's `/`.
    let r = s.ok("get_file_info", json!({"path": "/"})).await;
    assert_eq!(text(&r), "/ (the root): directory");
    let r = s.ok("list_directory", json!({"path": "."})).await;
    assert!(
        text(&r).starts_with("Directory / (the root):"),
        "{}",
        text(&r)
    );

    let r = s.ok("get_file_info", json!({"path": "notes/r.md"})).await;
    let st = structured(&r);
    assert_eq!(st["kind"], "file");
    assert_eq!(st["size_bytes"], content.len() as u64);
    assert_eq!(st["sha256"], sha256_of(&s.path("notes/r.md")).as_str());
    assert!(st["artifact_id"].as_str().unwrap().starts_with("art_"));
    let r = s
        .ok("get_file_info", json!({"path": "notes/none.md"}))
        .await;
    assert_eq!(structured(&r)["kind"], "missing");

    let r = s.err("read_file", json!({"path": "../outside.txt"})).await;
    assert!(text(&r).contains("path_traversal"), "{}", text(&r));
    let r = s.err("read_file", json!({"path": "/etc/passwd"})).await;
    assert!(text(&r).contains("outside_sandbox"), "{}", text(&r));
    let r = s.err("read_file", json!({"path": "notes/none.md"})).await;
    assert!(text(&r).contains("not_found"), "{}", text(&r));
    let r = s.err("list_directory", json!({"path": "../"})).await;
    assert!(text(&r).contains("path_traversal"), "{}", text(&r));
    let r = s.err("list_directory", json!({"path": "notes/r.md"})).await;
    assert!(
        text(&r).contains("'notes/r.md' is a file, not a directory"),
        "{}",
        text(&r)
    );
    // The advice is a reader's, and does not contradict the reason.
    assert!(
        !text(&r).contains("does not exist") && !text(&r).contains("create the file"),
        "{}",
        text(&r)
    );
    std::fs::write(s.path("big.txt"), vec![b'x'; 5 * 1024 * 1024 + 1]).unwrap();
    let r = s.err("read_file", json!({"path": "big.txt"})).await;
    assert!(
        text(&r).contains("size_exceeded") && text(&r).contains("get_file_info"),
        "{}",
        text(&r)
    );
    assert!(!text(&r).contains("split the content"), "{}", text(&r));
    s.finish().await;
}

/// get_file_info hashes a file up to 1 GiB; a larger one (here sparse, 20 GiB) is
/// described without reading it.
#[tokio::test]
async fn a_huge_file_is_described_without_being_read() {
    let s = Session::start(Mode::Write).await;
    std::fs::write(s.path("small.txt"), b"s").unwrap();
    std::fs::File::create(s.path("huge.txt"))
        .unwrap()
        .set_len(20 << 30)
        .unwrap();
    let r = s.ok("get_file_info", json!({"path": "huge.txt"})).await;
    let st = structured(&r);
    assert_eq!(st["size_bytes"], 20u64 << 30);
    assert!(st["sha256"].is_null(), "{st}");
    assert!(text(&r).contains("not hashed"), "{}", text(&r));
    let r = s.ok("get_file_info", json!({"path": "small.txt"})).await;
    assert_eq!(
        structured(&r)["sha256"],
        sha256_of(&s.path("small.txt")).as_str()
    );
    s.finish().await;
}

/// A file with other hard links may be one outside the root: a listing does not tell
/// its size, which the reading tools refuse to tell too.
#[tokio::test]
async fn a_hard_linked_file_is_listed_without_its_size() {
    let s = Session::start(Mode::Write).await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.md");
    std::fs::write(&secret, b"twenty-three bytes long").unwrap();
    std::fs::hard_link(&secret, s.path("linked.md")).unwrap();
    std::fs::write(s.path("own.md"), b"own").unwrap();
    std::fs::write(s.path("one.md"), b"1").unwrap();
    std::fs::create_dir(s.path("sub")).unwrap();
    let r = s.ok("list_directory", json!({})).await;
    let t = text(&r);
    assert!(!t.contains("23 bytes"), "{t}");
    let linked = t.lines().find(|l| l.contains("linked.md")).unwrap();
    assert!(linked.contains("other hard links"), "{t}");
    assert!(t.contains("own.md  (3 bytes)"), "{t}");
    assert!(t.contains("one.md  (1 byte)\n"), "{t}");
    let entries = structured(&r)["entries"].as_array().unwrap().clone();
    let entry = |name: &str| entries.iter().find(|e| e["name"] == name).unwrap().clone();
    // Not given is null, as `get_file_info` says it: a 0 would read as an empty file.
    assert_eq!(entry("linked.md")["size_bytes"], json!(null), "{entries:?}");
    assert_eq!(entry("sub")["size_bytes"], json!(null), "{entries:?}");
    assert_eq!(entry("linked.md")["other_links"], true, "{entries:?}");
    assert_eq!(entry("own.md")["size_bytes"], 3, "{entries:?}");
    assert!(entry("own.md").get("other_links").is_none(), "{entries:?}");
    let refused = s.err("get_file_info", json!({"path": "linked.md"})).await;
    assert!(
        text(&refused).contains("hardlink_refused"),
        "{}",
        text(&refused)
    );
    s.finish().await;
}

/// A name placed in the root by something else cannot forge lines of the listing.
#[tokio::test]
async fn a_listed_name_is_one_line() {
    let s = Session::start(Mode::Write).await;
    s.ok("create_directory", json!({"path": "d"})).await;
    std::fs::write(s.path("d/x.md\nfile      FAKE.md  (1 bytes)"), b"x").unwrap();
    let r = s.ok("list_directory", json!({"path": "d"})).await;
    let t = text(&r);
    assert_eq!(t.lines().count(), 2, "{t}");
    assert!(t.contains("'x.md\\nfile      FAKE.md  (1 bytes)'"), "{t}");
    s.finish().await;
}

/// A name that would read otherwise than it is written (a right-to-left override) is
/// listed escaped and said to be unaddressable; writing one is refused.
#[tokio::test]
async fn a_name_with_a_direction_override_is_listed_escaped() {
    let s = Session::start(Mode::Write).await;
    s.ok("create_directory", json!({"path": "d"})).await;
    std::fs::write(s.path("d/invoice\u{202E}txt.sh"), b"x").unwrap();
    let r = s.ok("list_directory", json!({"path": "d"})).await;
    let t = text(&r);
    assert!(!t.contains('\u{202E}'), "{t}");
    assert!(
        t.contains("'invoice\\u{202e}txt.sh'  (1 byte)  (control, bidirectional, invisible, slash-like or dot-like characters in the name: no tool can address it)"),
        "{t}"
    );
    // A line separator cannot make two lines of one name, nor a zero-width space hide.
    std::fs::write(s.path("d/b.md\u{2028}file      secret.md"), b"x").unwrap();
    std::fs::write(s.path("d/c\u{200B}.md"), b"x").unwrap();
    let t = text(&s.ok("list_directory", json!({"path": "d"})).await);
    assert_eq!(t.lines().count(), 4, "{t}");
    assert!(!t.contains('\u{2028}') && !t.contains('\u{200B}'), "{t}");
    for shown in ["'c\\u{200b}.md'", "'b.md\\u{2028}file      secret.md'"] {
        assert!(
            t.contains(&format!("{shown}  (1 byte)  (control, bidirectional, invisible, slash-like or dot-like characters in the name: no tool can address it)")),
            "{t}"
        );
    }
    // A slash or dot look-alike would show a name as folders (`..\u{2215}x.md` as
    // `../x.md`): escaped too, and refused as a path.
    std::fs::create_dir(s.path("f")).unwrap();
    std::fs::write(s.path("f/..\u{2215}x.md"), b"x").unwrap();
    std::fs::create_dir(s.path("f/\u{2024}\u{2024}")).unwrap();
    let t = text(&s.ok("list_directory", json!({"path": "f"})).await);
    assert!(!t.contains('\u{2215}') && !t.contains('\u{2024}'), "{t}");
    for shown in ["'..\\u{2215}x.md'  (1 byte)", "'\\u{2024}\\u{2024}'/"] {
        assert!(
            t.contains(&format!("{shown}  (control, bidirectional, invisible, slash-like or dot-like characters in the name: no tool can address it)")),
            "{shown}: {t}"
        );
    }
    for path in ["f/..\u{2215}y.md", "f/\u{2024}\u{2024}/y.md"] {
        let r = s
            .err("create_file", json!({"path": path, "content": "x"}))
            .await;
        assert!(text(&r).contains("path_traversal"), "{}", text(&r));
    }
    assert!(!s.path("f/..\u{2215}y.md").exists());
    assert!(!s.path("f/\u{2024}\u{2024}/y.md").exists());
    // What is said to be escaped is, a filler and a variation selector too, and a long
    // name is shown whole.
    std::fs::create_dir(s.path("e")).unwrap();
    let long = format!("{}\u{200B}.md", "z".repeat(150));
    for name in ["h\u{3164}.md", "vs\u{FE0F}.md", long.as_str()] {
        std::fs::write(s.path(&format!("e/{name}")), b"x").unwrap();
    }
    let t = text(&s.ok("list_directory", json!({"path": "e"})).await);
    let long_shown = format!("'{}\\u{{200b}}.md'", "z".repeat(150));
    for shown in ["'h\\u{3164}.md'", "'vs\\u{fe0f}.md'", long_shown.as_str()] {
        assert!(t.contains(shown), "{shown}: {t}");
    }
    assert!(!t.contains('\u{3164}') && !t.contains('\u{FE0F}'), "{t}");
    // A path written with a joiner where an emoji needs it is shown escaped wherever a
    // result names it, and said to be addressable as written.
    let written = s
        .ok(
            "create_file",
            json!({"path": "e/\u{1F468}\u{200D}\u{1F469}.md", "content": "x"}),
        )
        .await;
    let listed = s.ok("list_artifacts", json!({})).await;
    let in_dir = s.ok("list_directory", json!({"path": "e"})).await;
    for t in [text(&written), text(&listed), text(&in_dir)] {
        assert!(!t.contains('\u{200D}'), "{t}");
        assert!(t.contains("\u{1F468}\\u{200d}\u{1F469}.md'"), "{t}");
    }
    assert!(
        text(&in_dir).contains("(shown escaped: the name holds characters readers do not show, or that look like a slash or a dot; give them as they are to address it)"),
        "{}",
        text(&in_dir)
    );
    // One with an invisible character where it has no use is refused, named escaped.
    let r = s
        .err(
            "create_file",
            json!({"path": "e/x\u{2028}y\u{200B}.md", "content": "x"}),
        )
        .await;
    assert!(
        text(&r).contains("path_traversal") && text(&r).contains("U+2028"),
        "{}",
        text(&r)
    );
    assert!(!text(&r).contains('\u{2028}'), "{}", text(&r));
    let r = s
        .err(
            "create_file",
            json!({"path": "d/report\u{202E}dm.sh", "content": "x"}),
        )
        .await;
    assert!(
        text(&r).contains("path_traversal") && text(&r).contains("U+202E"),
        "{}",
        text(&r)
    );
    assert!(!s.path("d/report\u{202E}dm.sh").exists());
    s.finish().await;
}

/// A name that is not UTF-8 is listed as a likeness (U+FFFD for its stray bytes), and
/// said to be one; a file really named with U+FFFD, which would look the same, is said to
/// be out of reach too: no path may hold U+FFFD, so a read of the likeness is refused
/// rather than reading that other file.
#[tokio::test]
async fn a_name_that_is_not_utf8_is_said_to_be_unaddressable() {
    use std::os::unix::ffi::OsStrExt;
    let s = Session::start(Mode::Write).await;
    s.ok("create_directory", json!({"path": "d"})).await;
    let bad = s
        .path("d")
        .join(std::ffi::OsStr::from_bytes(b"bad\xff.txt"));
    std::fs::write(bad, b"x").unwrap();
    std::fs::write(s.path("d/bad\u{fffd}.txt"), b"real\n").unwrap();
    std::fs::create_dir(s.path("d").join(std::ffi::OsStr::from_bytes(b"dir\xc3"))).unwrap();
    let r = s.ok("list_directory", json!({"path": "d"})).await;
    let t = text(&r);
    let flagged: Vec<&str> = t.lines().filter(|l| l.contains("not UTF-8")).collect();
    assert_eq!(flagged.len(), 2, "{t}");
    assert!(
        flagged.iter().any(|l| l.contains(".txt  (1 byte)")),
        "the stray file: {t}"
    );
    // The slash marks the directory's name, before the note.
    assert!(flagged.iter().any(|l| l.contains("dir\u{fffd}/  (")), "{t}");
    assert!(
        t.lines()
            .any(|l| l.contains(".txt  (5 bytes)  (the name holds U+FFFD")),
        "the file really so named: {t}"
    );
    let read = s
        .call("read_file", json!({"path": "d/bad\u{fffd}.txt"}))
        .await;
    assert!(text(&read).contains("path_traversal"), "{}", text(&read));
    let entries = structured(&r)["entries"].as_array().unwrap().clone();
    let marked: Vec<_> = entries.iter().filter(|e| e["not_utf8"] == true).collect();
    assert_eq!(marked.len(), 2, "{entries:?}");
    s.finish().await;
}

#[tokio::test]
async fn artifacts_and_state_are_reported() {
    let s = Session::start(Mode::Write).await;
    let first = s
        .ok("create_file", json!({"path": "a.md", "content": "a\n"}))
        .await;
    let first_id = structured(&first)["actions"][0]["artifact_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = s
        .ok("append_file", json!({"path": "a.md", "content": "b\n"}))
        .await;
    let second_id = structured(&second)["actions"][0]["artifact_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let r = s.ok("list_artifacts", json!({"limit": 1})).await;
    let list = structured(&r)["artifacts"].as_array().unwrap().clone();
    assert_eq!(list.len(), 1);
    // 1.0 is an integer to JSON Schema, as the tool's schema says.
    let r = s.ok("list_artifacts", json!({"limit": 1.0})).await;
    assert_eq!(structured(&r)["artifacts"].as_array().unwrap().len(), 1);
    assert_eq!(list[0]["artifact_id"], second_id.as_str());

    let r = s
        .ok("get_artifact", json!({"artifact_id": second_id}))
        .await;
    let st = structured(&r);
    assert_eq!(st["artifact"]["parent_artifact_id"], first_id.as_str());
    assert_eq!(st["lineage"][0]["artifact_id"], first_id.as_str());
    assert!(text(&r).contains(&first_id));
    let r = s
        .err("get_artifact", json!({"artifact_id": "art_nope"}))
        .await;
    assert!(text(&r).contains("not_found"), "{}", text(&r));
    assert!(text(&r).contains("list_artifacts lists"), "{}", text(&r));

    let r = s.ok("get_state", json!({})).await;
    let st = structured(&r);
    assert_eq!(st["execution_mode"], "sandbox_write");
    assert_eq!(st["session_workflow_id"], s.workflow_id.as_str());
    assert_eq!(st["sandbox_roots"][0], s.root.display().to_string());
    assert!(text(&r).contains(&s.workflow_id));
    // No path outside the roots reaches the agent: the state directory is the operator's.
    let state = s.state_dir.path().display().to_string();
    assert!(!st.to_string().contains(&state), "{st}");
    assert!(!text(&r).contains(&state), "{}", text(&r));
    s.finish().await;
}

/// A root refused at start is named, with the folders above it, to the operator only:
/// `get_state` shows the agent neither it nor the state directory.
#[tokio::test]
async fn get_state_names_no_refused_root_to_the_agent() {
    use std::os::unix::fs::PermissionsExt;
    let s = Session::start_with(Mode::Write, |c| {
        let open = c.state_dir.with_file_name("open-to-all");
        std::fs::create_dir_all(open.join("inner/r2")).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        c.roots.push(open.join("inner/r2"));
    })
    .await;
    let r = s.ok("get_state", json!({})).await;
    let said = format!("{} {}", structured(&r), text(&r));
    assert!(!said.contains("open-to-all"), "{said}");
    assert!(
        !said.contains(&s.state_dir.path().display().to_string()),
        "{said}"
    );
    assert_eq!(structured(&r)["sandbox_roots"].as_array().unwrap().len(), 1);
    s.finish().await;
}

/// A root another runtime's state directory claims while the session runs: the write
/// is refused without naming either state directory, and the agent is told that
/// calling again will not help.
#[tokio::test]
async fn a_root_another_state_directory_owns_is_refused_naming_no_state_directory() {
    let s = Session::start(Mode::Write).await;
    let theirs = tempfile::tempdir().unwrap();
    let config = ailab_sandbox_core::Config {
        roots: vec![s.root.clone()],
        state_dir: theirs.path().join("state"),
        enable_write: true,
        dry_run: false,
        ..ailab_sandbox_core::Config::default()
    };
    let other = ailab_sandbox_core::Sandbox::open(config).unwrap();
    let r = other
        .run_plan_json(br#"{"workflow_id": "wf_theirs", "actions": [{"intent": "create_file", "path": "t.md", "content": "t"}]}"#)
        .unwrap();
    assert_eq!(r.status.as_str(), "success", "{r:?}");
    let r = s
        .err("create_file", json!({"path": "mine.md", "content": "m"}))
        .await;
    let said = format!("{} {}", text(&r), structured(&r));
    assert!(
        said.contains("belongs to another runtime's state directory"),
        "{said}"
    );
    for state in [s.state_dir.path(), theirs.path()] {
        assert!(!said.contains(&state.display().to_string()), "{said}");
    }
    assert!(
        text(&r)
            .contains("belongs to another runtime's state directory, calling again will not help"),
        "{}",
        text(&r)
    );
    assert!(!s.root.join("mine.md").exists());
    s.finish().await;
}

/// A state directory shared with the operator's runtime of another root records that
/// root's writes too: the agent is shown none of them, listed or looked up by id.
#[tokio::test]
async fn artifacts_in_roots_the_server_lacks_are_not_shown() {
    let elsewhere = tempfile::tempdir().unwrap();
    let other_root = elsewhere.path().join("operator-root");
    let mut other_id = String::new();
    let s = Session::start_with(Mode::Write, |c| {
        let mut theirs = c.clone();
        theirs.roots = vec![other_root.clone()];
        let sb = ailab_sandbox_core::Sandbox::open(theirs).unwrap();
        let r = sb
            .run_plan_json(
                br#"{"workflow_id": "wf_operator", "actions": [{"intent": "create_file", "path": "secret-name.md", "content": "x"}]}"#,
            )
            .unwrap();
        other_id = r.actions[0].artifact_id.clone().unwrap();
    })
    .await;
    let mine = s
        .ok("create_file", json!({"path": "mine.md", "content": "m"}))
        .await;
    let mine = structured(&mine)["actions"][0]["artifact_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s.ok("list_artifacts", json!({"limit": 1})).await;
    assert_eq!(structured(&r)["artifacts"][0]["artifact_id"], mine.as_str());
    let r = s.ok("list_artifacts", json!({})).await;
    let listed = structured(&r)["artifacts"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(!text(&r).contains("operator-root"), "{}", text(&r));
    let r = s
        .ok("list_artifacts", json!({"workflow_id": "wf_operator"}))
        .await;
    assert_eq!(structured(&r)["artifacts"], json!([]));
    let r = s
        .err("get_artifact", json!({"artifact_id": other_id}))
        .await;
    assert!(text(&r).contains("not_found"), "{}", text(&r));
    assert!(!format!("{r:?}").contains("operator-root"), "{r:?}");
    s.ok("get_artifact", json!({"artifact_id": mine})).await;
    s.finish().await;
}

/// A file that is not valid UTF-8 cannot be shown as exact text: the result says so and
/// where, and its size and checksum are of the bytes on disk.
#[tokio::test]
async fn read_file_says_when_the_text_is_not_the_files_bytes() {
    let s = Session::start(Mode::Write).await;
    s.ok("create_file", json!({"path": "notes/b.md", "content": "x"}))
        .await;
    let bytes = b"caf\xe9 ok\n";
    std::fs::write(s.path("notes/b.md"), bytes).unwrap();

    let r = s.ok("read_file", json!({"path": "notes/b.md"})).await;
    let st = structured(&r);
    assert_eq!(st["content"], "caf\u{fffd} ok\n");
    assert_eq!(st["invalid_utf8_at"], 3);
    assert_eq!(st["size_bytes"], bytes.len() as u64);
    assert_eq!(st["sha256"], sha256_of(&s.path("notes/b.md")).as_str());
    assert_eq!(r.content.len(), 2, "the text, then a note");
    assert_eq!(r.content[0].as_text().unwrap().text, "caf\u{fffd} ok\n");
    let note = &r.content[1].as_text().unwrap().text;
    assert!(
        note.contains("not valid UTF-8") && note.contains("offset 3"),
        "{note}"
    );

    std::fs::write(s.path("notes/b.md"), b"fine\n").unwrap();
    let r = s.ok("read_file", json!({"path": "notes/b.md"})).await;
    assert_eq!(r.content.len(), 1, "valid text has no note");
    assert!(structured(&r)["invalid_utf8_at"].is_null());
    s.finish().await;
}

#[tokio::test]
async fn many_calls_at_once_are_all_answered() {
    use rmcp::model::CallToolRequestParams;
    let s = Session::start(Mode::Write).await;
    let n = 5 * ailab_sandbox_mcp::MAX_CONCURRENT_CALLS;
    std::fs::create_dir_all(s.path("")).unwrap();
    for i in 0..n {
        std::fs::write(s.path(&format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    // Far more calls than run at once: the rest wait their turn, none is lost.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let peer = s.client.peer().clone();
        calls.spawn(async move {
            let args = json!({"path": format!("f{i}.txt")});
            let r = peer
                .call_tool(
                    CallToolRequestParams::new("get_file_info")
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            (i, r)
        });
    }
    let mut answered = 0;
    while let Some(done) = calls.join_next().await {
        let (i, r) = done.unwrap();
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        let st = structured(&r);
        assert_eq!(st["size_bytes"], format!("file {i}\n").len() as u64);
        assert_eq!(
            st["sha256"],
            sha256_of(&s.path(&format!("f{i}.txt"))).as_str()
        );
        answered += 1;
    }
    assert_eq!(answered, n);
    s.finish().await;
}

/// A large directory is listed in pages of 500, in name order, each saying where the next
/// one starts, so that one call never answers with the whole directory.
#[tokio::test]
async fn a_large_directory_is_listed_in_pages() {
    let s = Session::start(Mode::Write).await;
    let dir = s.path("many");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..1203 {
        std::fs::write(dir.join(format!("f{i:04}.txt")), "x").unwrap();
    }
    let mut names = Vec::new();
    let mut offset = Some(0);
    let mut pages = 0;
    while let Some(at) = offset {
        let r = s
            .ok("list_directory", json!({"path": "many", "offset": at}))
            .await;
        let st = structured(&r);
        assert_eq!(st["total"], 1203);
        assert_eq!(st["offset"], at);
        let entries = st["entries"].as_array().unwrap();
        assert!(entries.len() <= 500);
        names.extend(
            entries
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_owned()),
        );
        offset = st["next_offset"].as_u64();
        if let Some(next) = offset {
            assert!(text(&r).contains(&format!("offset {next}")), "{}", text(&r));
        }
        pages += 1;
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..1203).map(|i| format!("f{i:04}.txt")).collect();
    assert_eq!(names, expected);
    let r = s
        .ok("list_directory", json!({"path": "many", "offset": 5000}))
        .await;
    assert_eq!(structured(&r)["entries"], json!([]));
    assert_eq!(structured(&r)["offset"], 5000, "the offset asked for");
    assert!(text(&r).contains("none from offset 5000"), "{}", text(&r));
}

/// With several roots, a listing says which root it is of (both read "Directory / (the
/// root)").
#[tokio::test]
async fn a_listing_names_its_root_when_there_are_several() {
    let second = tempfile::tempdir().unwrap();
    let other = second.path().join("other");
    let extra = other.clone();
    let s = Session::start_with(Mode::Write, move |c| c.roots.push(extra)).await;
    let r = s.ok("list_directory", json!({})).await;
    assert!(
        text(&r).starts_with(&format!(
            "Directory / (the root) in root {}",
            s.root.display()
        )),
        "{}",
        text(&r)
    );
    let r = s
        .ok(
            "list_directory",
            json!({"root": other.display().to_string()}),
        )
        .await;
    assert!(
        text(&r).starts_with(&format!(
            "Directory / (the root) in root {}",
            other.display()
        )),
        "{}",
        text(&r)
    );
    // An absolute path names its root itself (it was said to be in the first).
    std::fs::create_dir(other.join("sub")).unwrap();
    let sub = other.join("sub").display().to_string();
    let r = s.ok("list_directory", json!({"path": sub})).await;
    assert!(
        text(&r).starts_with(&format!("Directory {sub} is empty")),
        "{}",
        text(&r)
    );
    // So does a look at the root's top, however named.
    for top in ["/", ".", ""] {
        let r = s
            .ok(
                "get_file_info",
                json!({"path": top, "root": other.display().to_string()}),
            )
            .await;
        assert_eq!(
            text(&r),
            format!("/ (the root) in root {}: directory", other.display())
        );
    }
    s.finish().await;
}
