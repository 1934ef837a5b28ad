//! A directory inside the root flips between a real directory and a symlink to outside
//! while plans write into it: no write may ever land outside.

use crate::support::*;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[test]
fn symlink_flip_race_never_writes_outside() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.writes_per_minute = 1_000_000;
    c.limits.max_artifacts_per_workflow = 1_000_000;
    c.limits.max_workflow_bytes = u64::MAX / 2;
    let sb = w.open(c);
    std::fs::create_dir_all(w.path("d")).unwrap();
    let outside_before = w.outside_tree();
    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipper = {
        let stop = stop.clone();
        let flips = flips.clone();
        let d = w.path("d");
        let real = w.path("d_link");
        let outside = w.outside.clone();
        std::thread::spawn(move || {
            // RENAME_EXCHANGE swaps the real directory and a symlink to outside in one
            // step: `d` is never missing, so the writers cannot recreate it and wedge the
            // flipping.
            std::os::unix::fs::symlink(&outside, &real).unwrap();
            let swap = || {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &d,
                    rustix::fs::CWD,
                    &real,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .is_ok()
            };
            while !stop.load(Ordering::Relaxed) {
                if swap() {
                    flips.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
                swap();
                std::thread::yield_now();
            }
        })
    };
    // At least 3000 attempts, and on for as long (within a minute) as it takes a busy
    // machine to schedule 100 flips during them.
    let attempts = 3000;
    let started = std::time::Instant::now();
    let mut succeeded = 0;
    let mut i = 0;
    while i < attempts || (flips.load(Ordering::Relaxed) < 100 && started.elapsed().as_secs() < 60)
    {
        i += 1;
        let r = run(
            &sb,
            json!({"workflow_id": "wf_race", "actions": [
            {"intent": "create_file", "path": format!("d/f{i}.txt"), "content": "payload"}]}),
        );
        if r.is_success() {
            succeeded += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    let flips = flips.load(Ordering::Relaxed);
    assert!(
        flips >= 100,
        "the race must really happen ({flips} flips in {i} attempts)"
    );
    assert_eq!(
        w.outside_tree(),
        outside_before,
        "zero files written outside in {i} attempts"
    );
    assert!(
        succeeded > 0,
        "some writes land inside while the directory is real"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// Eight agents at once, `job(sandbox, agent)` each, over two sandboxes on one root and
/// state directory (as two processes would be); their results in agent order, and one
/// of the sandboxes.
fn eight_agents<T: Send + 'static>(
    w: &World,
    job: fn(&ailab_sandbox_core::Sandbox, usize) -> T,
) -> (Vec<T>, Arc<ailab_sandbox_core::Sandbox>) {
    let mut c = w.writable_config();
    c.limits.writes_per_minute = 1_000_000;
    let sandboxes = [Arc::new(w.open(c.clone())), Arc::new(w.open(c))];
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let sb = sandboxes[t % 2].clone();
            std::thread::spawn(move || job(&sb, t))
        })
        .collect();
    let results = workers.into_iter().map(|h| h.join().unwrap()).collect();
    (results, sandboxes[0].clone())
}

/// Workflows appending to one file at once, from threads and from two sandboxes (as two
/// processes would): every line lands, and each audited write starts from the bytes the
/// previous one left.
#[test]
fn concurrent_writes_to_one_file_lose_nothing() {
    let w = World::new();
    w.write("log.txt", b"");
    let (_, sb) = eight_agents(&w, |sb, t| {
        for i in 0..5 {
            let r = run(
                sb,
                json!({"workflow_id": format!("wf_{t}"), "actions": [
                    {"intent": "append_file", "path": "log.txt", "content": format!("{t}-{i}\n")}]}),
            );
            assert_eq!(status(&r), "success", "{r:?}");
        }
    });
    let text = String::from_utf8(w.read("log.txt")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut expected: Vec<String> = (0..8)
        .flat_map(|t| (0..5).map(move |i| format!("{t}-{i}")))
        .collect();
    expected.sort();
    assert_eq!(lines, expected);
    let entries = sb.audit_entries(1000, None).unwrap();
    let befores: std::collections::HashSet<_> =
        entries.iter().map(|e| e.before_checksum.clone()).collect();
    assert_eq!(befores.len(), 40, "each write saw the one before it");
}

/// Plans that each transform their own word of a shared file and then collide on a
/// created file: one succeeds, the others fail and roll back. A rollback never undoes
/// another workflow's change: a failed workflow's own edit is undone only while the file
/// still holds exactly what that edit left, else the step is refused as a conflict. So
/// the winner's edit is always there, and each loser's edit is there exactly when its
/// rollback was refused.
#[test]
fn a_failed_plan_never_rolls_back_over_another_workflows_write() {
    let w = World::new();
    w.write("t.txt", b"k0 k1 k2 k3 k4 k5 k6 k7\n");
    let (results, sb) = eight_agents(&w, |sb, t| {
        run(
            sb,
            json!({"workflow_id": format!("wt{t}"), "on_failure": "rollback", "actions": [
                {"action_id": "a", "intent": "sandbox_transform", "path": "t.txt", "edits": [{"old": format!("k{t}"), "new": format!("K{t}")}]},
                {"action_id": "b", "intent": "create_file", "path": "c.txt", "content": format!("{t}")}]}),
        )
    });
    let text = String::from_utf8(w.read("t.txt")).unwrap();
    let winner: usize = String::from_utf8(w.read("c.txt")).unwrap().parse().unwrap();
    for (t, r) in results.iter().enumerate() {
        let edited = text.contains(&format!("K{t}"));
        match status(r).as_str() {
            "success" => {
                assert_eq!(t, winner);
                assert!(edited, "the winner's edit stays: {text}");
            }
            "rolled_back" | "blocked" => assert!(!edited, "wt{t} left no edit: {text}"),
            "failed" => {
                assert!(
                    edited,
                    "wt{t}: a refused rollback leaves its edit: {text} {r:?}"
                );
                // Its write stands, and says why: another workflow wrote the file since.
                assert_eq!(code(r, 0).as_deref(), Some("conflict"), "{r:?}");
            }
            other => panic!("wt{t}: {other}: {r:?}"),
        }
    }
    assert!(sb.audit_verify().unwrap().ok);
}

/// A file reached through the roots of two processes, one root inside the other, takes
/// one target lock: a write through the inner root waits for one under way through the
/// outer root, rather than have the outer write's bytes land over its own.
#[test]
fn a_file_reached_through_nested_roots_takes_one_lock() {
    let w = World::new();
    w.write("sub/log.txt", b"v0\n");
    let mut c = w.writable_config();
    c.roots = vec![w.root.join("sub")];
    c.limits.lock_wait_seconds = 1;
    let inner = w.open(c);
    assert_one_lock(&w.sandbox(), inner, "sub/log.txt", "log.txt");
    assert_eq!(w.read("sub/log.txt"), b"v0\nouter\ninner\n");
}

/// So does a file reached through one root whose real path changed between two starts
/// (a folder above it renamed, the configured path led to it again by a link).
#[test]
fn a_file_reached_through_a_root_moved_since_takes_one_lock() {
    let w = World::new();
    let top = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(top.path().join("d1/root")).unwrap();
    std::os::unix::fs::symlink("d1", top.path().join("cur")).unwrap();
    std::fs::write(top.path().join("d1/root/log.txt"), b"v0\n").unwrap();
    let mut c = w.writable_config();
    c.roots = vec![top.path().join("cur/root")];
    c.limits.lock_wait_seconds = 1;
    let first = w.open(c.clone());
    std::fs::rename(top.path().join("d1"), top.path().join("d2")).unwrap();
    std::fs::remove_file(top.path().join("cur")).unwrap();
    std::os::unix::fs::symlink("d2", top.path().join("cur")).unwrap();
    assert_one_lock(&first, w.open(c), "log.txt", "log.txt");
    assert_eq!(
        std::fs::read(top.path().join("d2/root/log.txt")).unwrap(),
        b"v0\nouter\ninner\n"
    );
}

/// Appends `outer` to `first_path` through `first` while `second` tries to append
/// `inner` to its own path of the same file: it waits for the lock, in vain (`conflict`,
/// its wait being 1 s), and goes through once `first` is done.
fn assert_one_lock(
    first: &ailab_sandbox_core::Sandbox,
    second: ailab_sandbox_core::Sandbox,
    first_path: &str,
    second_path: &'static str,
) {
    let second = Arc::new(second);
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (second2, seen2) = (second.clone(), seen.clone());
    first.failpoints().interleave(
        "before_mutate",
        Arc::new(move || {
            let r = run(
                &second2,
                json!({"workflow_id": "wf_in", "actions": [
                    {"action_id": "a1", "intent": "append_file", "path": second_path, "content": "inner\n"}]}),
            );
            *seen2.lock().unwrap() = Some(code(&r, 0).unwrap_or_else(|| status(&r)));
        }),
    );
    let r = run(
        first,
        json!({"workflow_id": "wf_out", "actions": [
            {"intent": "append_file", "path": first_path, "content": "outer\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(seen.lock().unwrap().as_deref(), Some("conflict"));
    let r = run(
        &second,
        json!({"workflow_id": "wf_in", "actions": [
            {"action_id": "a2", "intent": "append_file", "path": second_path, "content": "inner\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

/// A file that comes and goes under get_file_info is described as a file or as missing,
/// or said to be changing (`conflict`, moved while it was hashed), never refused
/// `not_found` (met between the look and the open twice running: 2 in 8,000 calls
/// against a fast renamer, which a look would have called missing).
#[test]
fn get_file_info_of_a_file_that_comes_and_goes_is_a_file_or_missing() {
    let w = World::new();
    let sb = w.sandbox();
    w.write("spare.md", b"here");
    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipper = {
        let (stop, flips) = (stop.clone(), flips.clone());
        let (spare, name) = (w.path("spare.md"), w.path("f.md"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if std::fs::rename(&spare, &name).is_ok() && std::fs::rename(&name, &spare).is_ok()
                {
                    flips.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let (mut files, mut missing, mut i) = (0u32, 0u32, 0u32);
    let started = std::time::Instant::now();
    while i < 20_000 || (flips.load(Ordering::Relaxed) < 10_000 && started.elapsed().as_secs() < 60)
    {
        i += 1;
        match sb.get_file_info("f.md", None) {
            Ok(info) if info.kind.as_str() == "file" => {
                assert_eq!(info.size_bytes, Some(4));
                files += 1;
            }
            Ok(info) if info.kind.as_str() == "missing" => missing += 1,
            Err(r) if r.reason_code == ailab_sandbox_core::ReasonCode::Conflict => {}
            other => panic!("call {i}: {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    let flips = flips.load(Ordering::Relaxed);
    assert!(
        flips >= 10_000,
        "the race must really happen ({flips} flips)"
    );
    assert!(files > 0 && missing > 0, "{files} files, {missing} missing");
}
