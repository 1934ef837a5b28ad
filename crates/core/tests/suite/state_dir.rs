//! The state directory holds the audit trail, the registry and the seal key: one another
//! user could change is refused, and nothing planted in it sends a write elsewhere.

use crate::support::*;
use ailab_sandbox_core::Sandbox;
use ailab_sandbox_core::confine::state::StateDir;
use serde_json::json;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};

/// Why opening a sandbox with `config` fails.
fn open_err(config: ailab_sandbox_core::Config) -> String {
    let state = config.state_dir.clone();
    match Sandbox::open(config) {
        Ok(_) => panic!(
            "the configuration with state directory {} was accepted",
            state.display()
        ),
        Err(e) => e.to_string(),
    }
}

/// A state after one write, with `name` of its state directory moved outside and `kind`
/// (a link to it, a FIFO, a folder or a file) put in its place.
fn planted(name: &str, kind: &str) -> (World, std::path::PathBuf) {
    let w = World::new();
    write_one(&w.sandbox());
    let planted = w.state.join(name);
    let kept = w.outside.join("kept");
    fs::rename(&planted, &kept).unwrap();
    match kind {
        "link" => symlink(&kept, &planted).unwrap(),
        "fifo" => rustix::fs::mkfifoat(rustix::fs::CWD, &planted, 0o600.into()).unwrap(),
        "folder" => fs::create_dir(&planted).unwrap(),
        _ => fs::write(&planted, b"x").unwrap(),
    }
    (w, planted)
}

/// One successful write, so that the logs, the head and the key exist.
fn write_one(sb: &Sandbox) {
    let r = run(
        sb,
        json!({"actions": [{"intent": "create_file", "path": "a.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success");
}

#[test]
fn a_state_directory_others_can_write_is_refused() {
    for mode in [0o777, 0o1777, 0o722] {
        let w = World::new();
        fs::DirBuilder::new().mode(0o700).create(&w.state).unwrap();
        fs::set_permissions(&w.state, fs::Permissions::from_mode(mode)).unwrap();
        let err = open_err(w.writable_config());
        assert!(err.contains("writable by other users"), "{mode:o}: {err}");
        assert_eq!(
            err.matches(&*w.state.display().to_string()).count(),
            1,
            "named once: {err}"
        );
        assert!(
            !w.state.join("sandbox_audit.jsonl").exists(),
            "{mode:o}: nothing is written there"
        );
    }
}

#[test]
fn a_state_directory_folder_others_can_write_is_refused() {
    let w = World::new();
    drop(w.sandbox());
    fs::set_permissions(w.state.join("inflight"), fs::Permissions::from_mode(0o777)).unwrap();
    let err = open_err(w.writable_config());
    assert!(
        err.contains("inflight") && err.contains("writable by other users"),
        "{err}"
    );
}

/// A state directory named through a symlink is followed like a directory above a root:
/// the files land in the directory it leads to, which must be private all the same, and
/// a link another user owns is refused.
#[test]
fn a_state_directory_named_through_a_symlink() {
    let w = World::new();
    let real = w.state.with_file_name("real-state");
    fs::DirBuilder::new().mode(0o700).create(&real).unwrap();
    symlink(&real, &w.state).unwrap();
    let sb = Sandbox::open(w.writable_config()).unwrap();
    write_one(&sb);
    drop(sb);
    assert!(real.join("sandbox_audit.jsonl").exists());

    fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).unwrap();
    let err = open_err(w.writable_config());
    assert!(err.contains("writable by other users"), "{err}");
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();

    if rustix::process::geteuid().as_raw() == 0 {
        std::os::unix::fs::lchown(&w.state, Some(65534), None).unwrap();
        let err = open_err(w.writable_config());
        assert!(err.contains("symbolic link owned by uid 65534"), "{err}");
    }
}

#[test]
fn a_state_directory_owned_by_another_user_is_refused() {
    let w = World::new();
    fs::DirBuilder::new().mode(0o700).create(&w.state).unwrap();
    if std::os::unix::fs::chown(&w.state, Some(65534), None).is_err()
        || rustix::process::geteuid().as_raw() == 65534
    {
        // Not privileged: the directory cannot be given away.
        return;
    }
    let err = open_err(w.writable_config());
    assert!(err.contains("owned by uid 65534"), "{err}");
    assert!(
        err.contains("give a state directory of this user's own, or run as uid 65534"),
        "{err}"
    );
}

/// A symlink planted under a name the runtime uses is never followed: the file it
/// points to (outside every root and the state directory) keeps its bytes, whether the
/// runtime only reads its state or writes.
#[test]
fn a_symlink_planted_in_the_state_directory_is_not_followed() {
    for name in [
        "sandbox_audit.jsonl",
        "artifacts.jsonl",
        "sandbox_audit.head.json",
        "seal.key",
    ] {
        let w = World::new();
        drop(w.sandbox());
        let victim = w.outside.join("victim.txt");
        fs::write(&victim, b"line1\nimportant data").unwrap();
        let planted = w.state.join(name);
        fs::remove_file(&planted).unwrap();
        symlink(&victim, &planted).unwrap();
        if let Ok(sb) = Sandbox::open(w.writable_config()) {
            let _ = sb.run_plan(plan(json!({"actions": [
                {"intent": "create_file", "path": "a.txt", "content": "x"}]})));
        }
        assert_eq!(
            fs::read(&victim).unwrap(),
            b"line1\nimportant data",
            "{name}"
        );
    }
}

/// A state file replaced by something that is not a file stops the start and says
/// which file and what stands there: a FIFO in the registry's place was read as an empty
/// registry (every artifact, budget and lineage gone without a word), and a link or
/// folder in the head's place was "open the audit log: Too many levels of symbolic links".
#[test]
fn a_state_file_that_is_not_a_regular_file_is_named_at_start() {
    for name in [
        "sandbox_audit.jsonl",
        "artifacts.jsonl",
        "sandbox_audit.head.json",
        "left_dirs.jsonl",
        "seal.key",
    ] {
        for (kind, said) in [
            ("link", "a symbolic link"),
            ("fifo", "FIFO"),
            ("folder", "a folder"),
        ] {
            let (w, planted) = planted(name, kind);
            let err = open_err(w.writable_config());
            assert!(planted.ends_with(name), "{planted:?}");
            assert!(
                err.contains(&format!("the state directory's {name} is "))
                    && err.contains(said)
                    && err.contains("not a regular file")
                    && err.contains("move it away"),
                "{name} {kind}: {err}"
            );
        }
    }
}

/// A state directory folder (`locks`, `inflight`) with something else in its place is
/// named with what stands there, not with the system's "Not a directory".
#[test]
fn a_state_folder_that_is_not_a_folder_is_named_at_start() {
    for name in ["locks", "inflight"] {
        for (kind, said) in [("link", "a symbolic link"), ("file", "a file")] {
            let (w, planted) = planted(name, kind);
            let err = open_err(w.writable_config());
            assert!(
                err.contains(&format!("{} is {said}, not a folder", planted.display()))
                    && err.contains("put the folder it stands for back in its place"),
                "{name} {kind}: {err}"
            );
        }
    }
}

/// A workflow's run record of the wrong kind is named in the refusal of a run of that
/// workflow, and a log of the wrong kind in a read-only verification: both said only
/// "invalid data" or the system's "Too many levels of symbolic links".
#[test]
fn a_run_record_or_log_of_the_wrong_kind_is_named_where_it_is_met() {
    let w = World::new();
    let sb = w.sandbox();
    let wf = |id: &str| json!({"workflow_id": id, "actions": [{"intent": "create_file", "path": format!("{id}.txt"), "content": "x"}]});
    assert_eq!(status(&run(&sb, wf("wf_k"))), "success");
    let record = w.state.join("inflight/wf_k.json");
    fs::remove_file(&record).unwrap();
    fs::create_dir(&record).unwrap();
    let r = run(&sb, wf("wf_k"));
    let said = r.actions[0].reason.clone().unwrap_or_default();
    // Named within the state directory: a client is shown no path outside the roots.
    assert!(
        said.contains("the state directory's inflight/wf_k.json is a folder, not a regular file")
            && !said.contains(&*w.state.display().to_string()),
        "{said}"
    );
    drop(sb);
    fs::remove_dir(&record).unwrap();
    let log = w.state.join("sandbox_audit.jsonl");
    let kept = w.outside.join("kept");
    fs::rename(&log, &kept).unwrap();
    symlink(&kept, &log).unwrap();
    let err = ailab_sandbox_core::audit::verify_read_only(&w.state, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the state directory's sandbox_audit.jsonl is a symbolic link"),
        "{err}"
    );
}

#[test]
fn state_files_are_opened_by_name_only() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    for bad in ["../x", "inflight/../x", "other/x", "inflight/", ""] {
        let err = state.read_optional(bad).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
    }
    assert!(state.read_optional("inflight/none.json").unwrap().is_none());
}

/// A root reached through a symlink into the state directory is refused at start-up
/// (its actions could never write: the state directory is reserved).
#[test]
fn a_root_inside_the_state_directory_through_a_symlink_is_refused() {
    let w = World::new();
    drop(w.sandbox());
    let alias = w.state.with_file_name("alias");
    symlink(&w.state, &alias).unwrap();
    let mut c = w.writable_config();
    c.roots = vec![alias.join("inner")];
    let err = open_err(c);
    assert!(err.contains("inside the state directory"), "{err}");
}

/// A state directory that reaches into a root through a symlink — itself one, or below
/// one — is refused before anything is made in it, so nothing lands in the sandbox.
#[test]
fn a_state_directory_inside_a_root_through_a_symlink_makes_nothing_there() {
    let w = World::new();
    drop(w.sandbox());
    let before = w.tree();
    fs::create_dir(w.root.join("st")).unwrap();
    let to_root = w.tmp.path().join("to-root");
    symlink(&w.root, &to_root).unwrap();
    let to_st = w.tmp.path().join("to-st");
    symlink(w.root.join("st"), &to_st).unwrap();
    for state in [
        to_st.clone(),
        to_root.join("st"),
        to_root.join("new/deeper"),
    ] {
        let mut c = w.writable_config();
        c.state_dir = state.clone();
        let err = open_err(c);
        assert!(
            err.contains("must be outside every root"),
            "{}: {err}",
            state.display()
        );
        let mut made: Vec<_> = fs::read_dir(w.root.join("st"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        made.sort();
        assert!(made.is_empty(), "{}: {made:?}", state.display());
        assert!(!w.root.join("new").exists(), "{}", state.display());
    }
    fs::remove_dir(w.root.join("st")).unwrap();
    assert_eq!(w.tree(), before);
}

/// The key and the audit head are put in place by linking a temporary file, then
/// removing it: a crash between the two leaves them with a second link, which must not
/// stop the runtime (nor a concurrent start that reads them in between).
#[test]
fn state_files_left_with_a_second_link_are_read() {
    let w = World::new();
    let sb = w.sandbox();
    write_one(&sb);
    drop(sb);
    for name in ["seal.key", "sandbox_audit.head.json"] {
        fs::hard_link(
            w.state.join(name),
            w.state.join(format!(".{name}.ailab-tmp-left")),
        )
        .unwrap();
    }
    let sb = Sandbox::open(w.writable_config()).unwrap();
    assert!(sb.audit_verify().unwrap().ok);
}

/// A root that lies inside the state directory once a symbolic link on its path is
/// followed is refused before anything is made: neither the root nor the state
/// directory's own folders.
#[test]
fn a_root_inside_the_state_directory_is_refused_before_anything_is_made() {
    let w = World::new();
    fs::create_dir(&w.state).unwrap();
    symlink(w.tmp.path(), w.tmp.path().join("lnk")).unwrap();
    // The second through a link that leads to a folder not made yet.
    symlink(w.state.join("sub"), w.tmp.path().join("dangling")).unwrap();
    for root in ["lnk/state/r", "dangling/r"] {
        let mut c = w.writable_config();
        c.roots = vec![w.tmp.path().join(root)];
        let err = open_err(c);
        assert!(
            err.contains("lies inside the state directory"),
            "{root}: {err}"
        );
        let made: Vec<_> = fs::read_dir(&w.state)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            made.is_empty(),
            "{root}: nothing made in the state directory: {made:?}"
        );
    }
}

/// A start refused for its state directory makes nothing: no root (nor the folders on
/// the way to one) is left behind, whatever the state directory's fault.
#[test]
fn a_refused_state_directory_leaves_no_root_behind() {
    let w = World::new();
    let tmp = w.tmp.path();
    fs::write(tmp.join("afile"), b"x").unwrap();
    symlink(tmp, tmp.join("lnk")).unwrap();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(tmp.join("open"))
        .unwrap();
    fs::set_permissions(tmp.join("open"), fs::Permissions::from_mode(0o777)).unwrap();
    for (state, says) in [
        ("afile", "is not a directory"),
        ("afile/below", "above it is not a directory"),
        ("lnk/new-root/deep/st", "must be outside every root"),
        ("open", "writable by other users"),
        ("open/below/st", "writable by other users"),
    ] {
        let mut c = w.writable_config();
        c.roots = vec![tmp.join("new-root/deep")];
        c.state_dir = tmp.join(state);
        let err = open_err(c.clone());
        assert!(err.contains(says), "{state}: {err}");
        // A setting to correct, every one (a file in the state directory's place was
        // `io_error`, as a failing disk is).
        let code = Sandbox::open(c).err().map(|e| e.reason_code());
        assert_eq!(code, Some("invalid_config"), "{state}");
        assert!(!tmp.join("new-root").exists(), "{state}: a root was made");
        assert!(!tmp.join("open/below").exists(), "{state}");
    }
}

/// A start refused because no root can be made makes nothing either: no state
/// directory is left behind for a root below a file or a folder other users may change
/// (both made one, then refused, `inflight/` and `locks/` in it).
#[test]
fn a_root_that_cannot_be_made_leaves_no_state_directory_behind() {
    let w = World::new();
    let tmp = w.tmp.path();
    fs::write(tmp.join("afile"), b"x").unwrap();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(tmp.join("open"))
        .unwrap();
    fs::set_permissions(tmp.join("open"), fs::Permissions::from_mode(0o777)).unwrap();
    for (root, says) in [
        ("afile/below", "above it is not a directory"),
        ("open/below/root", "writable by other users"),
    ] {
        let mut c = w.writable_config();
        c.roots = vec![tmp.join(root)];
        c.state_dir = tmp.join("new-state/st");
        let err = open_err(c);
        assert!(
            err.contains("no sandbox root is usable") && err.contains(says),
            "{root}: {err}"
        );
        assert!(
            !tmp.join("new-state").exists(),
            "{root}: a state directory was made"
        );
        assert!(!tmp.join("open/below").exists(), "{root}");
    }
}

/// A start killed while it made the state directory's key or the trail's head leaves a
/// temporary file beside it; a later start removes it once it is old enough that no
/// living process can still be making it, and leaves a fresh one, and every other file,
/// alone.
#[test]
fn temporary_files_a_killed_start_left_in_the_state_directory_are_removed_later() {
    let w = World::new();
    write_one(&w.sandbox());
    let marker = ailab_sandbox_core::confine::path::TEMP_MARKER;
    let old = [
        w.state
            .join(format!(".seal.key{marker}0123456789abcdef0000000100000001")),
        w.state.join(format!(
            ".sandbox_audit.head.json{marker}0123456789abcdef0000000200000001"
        )),
    ];
    let fresh = w.state.join(format!(".seal.key{marker}fresh"));
    let other = w.state.join(".kept-by-the-operator");
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for p in old.iter().chain([&fresh, &other]) {
        fs::write(p, b"x").unwrap();
    }
    for p in old.iter().chain([&other]) {
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
    }
    let sb = w.sandbox();
    for p in &old {
        assert!(!p.exists(), "{} stayed", p.display());
    }
    assert!(fresh.exists() && other.exists());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run record that cannot be read is removed, and the start says so: the run it stood
/// for was not judged, which the operator must know.
#[test]
fn an_unreadable_run_record_is_removed_and_said() {
    let w = World::new();
    write_one(&w.sandbox());
    for (n, bytes) in [&b"garbage"[..], br#"{"state":"active"}"#]
        .into_iter()
        .enumerate()
    {
        let record = w.state.join(format!("inflight/wf_torn{n}.json"));
        fs::write(&record, bytes).unwrap();
        let sb = w.sandbox();
        assert!(!record.exists());
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains("could not be read") && n.contains("wf_torn")),
            "{:?}",
            sb.notices()
        );
    }
}

/// An access control list giving another user write makes a root or the state directory
/// one others could change, whatever the mode bits say (they show only its mask).
#[test]
fn an_access_control_list_giving_others_write_is_refused() {
    let acl = |dir: &std::path::Path| acl_giving_write(dir, 65534, true);
    if rustix::process::geteuid().as_raw() == 65534 {
        return;
    }
    for which in ["root", "state"] {
        let w = World::new();
        let dir = if which == "root" { &w.root } else { &w.state };
        fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir)
            .unwrap();
        if acl(dir).is_err() {
            eprintln!("no access control lists on this filesystem: skipped");
            return;
        }
        let err = open_err(w.writable_config());
        assert!(err.contains("access control list"), "{which}: {err}");
    }
}

/// The workflow locks' files (`locks/wf-ID.lock`).
fn workflow_lock_files(w: &World) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(w.state.join("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("wf-"))
        .collect();
    names.sort();
    names
}

/// Any client may name any workflow id: plans only simulated or refused, and rollbacks of
/// ids that never ran, leave no lock file behind (one each would fill the state
/// directory), while a workflow that wrote is still locked, rolled back and run again.
#[test]
fn workflows_that_keep_nothing_leave_no_lock_file() {
    let w = World::new();
    let simulating = w.open(w.config());
    for i in 0..3 {
        let r = run(
            &simulating,
            json!({"workflow_id": format!("wf_sim_{i}"), "actions": [
                {"intent": "create_file", "path": format!("s{i}.txt"), "content": "s"}]}),
        );
        assert_eq!(status(&r), "simulated_success");
    }
    drop(simulating);
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_refused", "actions": [
            {"intent": "create_file", "path": "../escape.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "blocked");
    for i in 0..3 {
        let rb = sb.rollback_workflow(&format!("wf_unknown_{i}"), &Default::default());
        assert_eq!(
            rb.reason_code,
            Some(ailab_sandbox_core::ReasonCode::NoRollbackData)
        );
    }
    assert_eq!(workflow_lock_files(&w), Vec::<String>::new());

    let wrote = json!({"workflow_id": "wf_wrote", "actions": [
        {"intent": "create_file", "path": "kept.txt", "content": "k"}]});
    assert_eq!(status(&run(&sb, wrote.clone())), "success");
    assert!(
        workflow_lock_files(&w)
            .iter()
            .all(|n| n == "wf-wf_wrote.lock"),
        "{:?}",
        workflow_lock_files(&w)
    );
    let rb = sb.rollback_workflow("wf_wrote", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("kept.txt").exists());
    assert_eq!(status(&run(&sb, wrote)), "success");
    assert_eq!(w.read("kept.txt"), b"k");
}

/// A waiter that opened a workflow lock's file before its holder removed it gets the
/// lock of a file no longer under the name: it must lock the name's file instead, or a
/// third taker would make a new file and hold the workflow at the same time.
#[test]
fn a_lock_whose_file_was_removed_meanwhile_is_taken_on_the_new_file() {
    let w = World::new();
    drop(w.sandbox());
    let state = StateDir::open(&w.state).unwrap();
    let first = state.lock_workflow("wf_turns").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let waiter = {
        let state = state.clone();
        std::thread::spawn(move || {
            let second = state.lock_workflow("wf_turns").unwrap();
            tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(second);
        })
    };
    // The waiter has opened the file and polls its lock (a slower start only makes it
    // open the next file, which the check below passes as well).
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(first);
    rx.recv().unwrap();
    assert!(
        state.try_lock_workflow("wf_turns").unwrap().is_none(),
        "two holders of one workflow at once"
    );
    assert!(
        state
            .try_lock_workflow_if_used("wf_turns")
            .unwrap()
            .is_none(),
        "two holders of one workflow at once"
    );
    release_tx.send(()).unwrap();
    waiter.join().unwrap();
    let third = state.try_lock_workflow("wf_turns").unwrap();
    assert!(third.is_some(), "the lock is free once both let go");
    drop(third);
    assert_eq!(workflow_lock_files(&w), Vec::<String>::new());
}

/// Lock files an earlier version left for every id it was given go at the next prune,
/// but for a workflow that keeps a record or that someone holds now; a simulated prune
/// removes none.
#[test]
fn a_prune_removes_lock_files_of_workflows_that_keep_nothing() {
    use rustix::fs::{FlockOperation, flock};
    let w = World::new();
    let sb = w.sandbox();
    let wrote = json!({"workflow_id": "wf_wrote", "actions": [
        {"intent": "create_file", "path": "kept.txt", "content": "k"}]});
    assert_eq!(status(&run(&sb, wrote)), "success");
    let locks = w.state.join("locks");
    for id in ["wf_old_1", "wf_old_2", "wf_held"] {
        fs::write(locks.join(format!("wf-{id}.lock")), b"").unwrap();
    }
    fs::write(locks.join("wf-not an id.lock"), b"").unwrap();
    let held = fs::File::open(locks.join("wf-wf_held.lock")).unwrap();
    flock(&held, FlockOperation::LockExclusive).unwrap();
    let all = [
        "wf-wf_held.lock",
        "wf-wf_old_1.lock",
        "wf-wf_old_2.lock",
        "wf-wf_wrote.lock",
    ];

    let simulating = w.open(w.config());
    assert!(
        simulating
            .prune(std::time::Duration::from_secs(3600))
            .unwrap()
            .simulated
    );
    drop(simulating);
    assert_eq!(
        workflow_lock_files(&w),
        [&["wf-not an id.lock"][..], &all].concat()
    );

    let report = sb.prune(std::time::Duration::from_secs(3600)).unwrap();
    assert!(report.workflows_pruned.is_empty(), "{report:?}");
    assert_eq!(
        workflow_lock_files(&w),
        ["wf-not an id.lock", "wf-wf_held.lock", "wf-wf_wrote.lock"]
    );
    drop(held);
    let rb = sb.rollback_workflow("wf_wrote", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
}

/// A holder whose lock's file someone else removed (an operator clearing `locks/` by
/// hand) does not, letting go, remove the file a new holder took under the name: a third
/// taker would otherwise make another and hold the workflow at the same time.
#[test]
fn a_holder_whose_file_was_removed_leaves_the_new_holders_file() {
    let w = World::new();
    drop(w.sandbox());
    let state = StateDir::open(&w.state).unwrap();
    let stale = state.lock_workflow("wf_cleared").unwrap();
    fs::remove_file(w.state.join("locks/wf-wf_cleared.lock")).unwrap();
    let current = state.lock_workflow("wf_cleared").unwrap();
    drop(stale);
    assert_eq!(workflow_lock_files(&w), ["wf-wf_cleared.lock"]);
    assert!(
        state.try_lock_workflow("wf_cleared").unwrap().is_none(),
        "two holders of one workflow at once"
    );
    drop(current);
    assert_eq!(workflow_lock_files(&w), Vec::<String>::new());
}

/// A state file another user owns is refused even when its mode lets this process in
/// (or this process is root): its owner could change it at will. Named where it is met.
#[test]
fn a_state_file_another_user_owns_is_refused_whatever_its_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let w = World::new();
    let sb = w.sandbox();
    write_one(&sb);
    let lock = w.state.join("locks/wf-wf_planted.lock");
    fs::write(&lock, b"").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
    if std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).is_err() {
        eprintln!("skipped: changing a file's owner needs root");
        return;
    }
    let r = run(
        &sb,
        json!({"workflow_id": "wf_planted", "actions": [
            {"intent": "create_file", "path": "p.txt", "content": "p"}]}),
    );
    assert_eq!(status(&r), "blocked");
    let reason = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains(
            "the state directory's locks/wf-wf_planted.lock: permission denied: another user owns it (uid 65534)"
        ),
        "{reason}"
    );
    assert!(!w.path("p.txt").exists());
    assert_eq!(
        fs::metadata(&lock)
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap(),
        65534,
        "left where it was"
    );
    fs::remove_file(&lock).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_planted", "actions": [
            {"intent": "create_file", "path": "p.txt", "content": "p"}]}),
    );
    assert_eq!(status(&r), "success");
}

/// Many threads (each its own open file, as processes are) taking one workflow's lock in
/// every way a caller does, each letting go of a workflow that keeps nothing (so each
/// release removes the file): never two holders at once, and nothing left at the end.
#[test]
fn workflow_locks_taken_and_removed_by_many_threads_never_have_two_holders() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let w = World::new();
    drop(w.sandbox());
    let state = StateDir::open(&w.state).unwrap();
    let holders = std::sync::Arc::new(AtomicUsize::new(0));
    let taken = std::sync::Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (state, holders, taken) = (state.clone(), holders.clone(), taken.clone());
            std::thread::spawn(move || {
                for i in 0..150 {
                    let lock = match (t + i) % 3 {
                        0 => Some(state.lock_workflow("wf_many").unwrap()),
                        1 => state.try_lock_workflow("wf_many").unwrap(),
                        _ => state.try_lock_workflow_if_used("wf_many").unwrap(),
                    };
                    if let Some(lock) = lock {
                        assert_eq!(
                            holders.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two holders of one workflow at once"
                        );
                        taken.fetch_add(1, Ordering::SeqCst);
                        std::thread::yield_now();
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(lock);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every waiting taker gets it in the end: at least those 300 took it.
    assert!(taken.load(Ordering::SeqCst) >= 300);
    assert_eq!(workflow_lock_files(&w), Vec::<String>::new());
}
