//! Crash consistency: a run that dies at any step of the pipeline leaves every target at
//! its old or new bytes, and the next start recovers: unfinished actions rolled back,
//! no temporary files, audit chain intact, and `rollback --force` gives back the original
//! tree byte for byte.

use crate::support::*;
use ailab_sandbox_core::sandbox::RollbackOptions;
use serde_json::json;
use std::panic::AssertUnwindSafe;

const POINTS: [&str; 5] = [
    "after_snapshot",
    "before_mutate",
    "after_mutate",
    "before_registry",
    "before_audit",
];

fn seed(w: &World) {
    w.write("a.txt", b"alpha\n");
    w.write("d/b.txt", b"beta\n");
}

type Tree = std::collections::BTreeMap<String, Option<Vec<u8>>>;

/// A seeded world, a writable configuration in `durability`, and the tree as seeded.
fn seeded(
    durability: ailab_sandbox_core::config::Durability,
) -> (World, ailab_sandbox_core::Config, Tree) {
    let w = World::new();
    seed(&w);
    let original = w.tree();
    let mut c = w.writable_config();
    c.durability = durability;
    (w, c, original)
}

fn plan_json() -> serde_json::Value {
    json!({"workflow_id": "wf_crash", "actions": [
        {"intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
        {"intent": "append_file", "path": "d/b.txt", "content": "more\n"},
        {"intent": "create_file", "path": "new/c.txt", "content": "gamma\n"}]})
}

/// Runs `plan_json` in `c` and makes it die just before the second action's registry
/// line: the first action is audited, the second is in doubt (written, not recorded).
fn die_before_the_second_record(w: &World, c: &ailab_sandbox_core::Config) {
    kill_before_the_second_record(&w.open(c.clone()));
}

/// A run record that cannot be read (a FIFO or folder in another workflow's record's
/// place) keeps only that one from recovery: the dead run beside it is recovered at the
/// next start, as ever (one such entry stopped the listing, and every dead run with it).
#[test]
fn an_unreadable_run_record_does_not_stop_the_others_recovery() {
    for kind in ["fifo", "folder"] {
        let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
        die_before_the_second_record(&w, &c);
        assert_eq!(run_record(&w, "wf_crash")["state"], "active");
        let planted = w.state.join("inflight/aaa.json");
        if kind == "fifo" {
            rustix::fs::mkfifoat(rustix::fs::CWD, &planted, 0o600.into()).unwrap();
        } else {
            std::fs::create_dir(&planted).unwrap();
        }
        let sb = w.open(c);
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains("recovered interrupted run") && n.contains("wf_crash")),
            "{kind}: {:?}",
            sb.notices()
        );
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{kind}");
        // Its unfinished action is undone; the finished one stays.
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{kind}");
    }
}

/// The same, in a sandbox that lives on (as another process would).
fn kill_before_the_second_record(sb: &ailab_sandbox_core::Sandbox) {
    sb.failpoints().arm_crash("before_registry", 2);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
    assert!(outcome.is_err(), "the run should die");
}

/// Puts the root's snapshots out of reach (a file where `.rollback` was); the returned
/// closure puts them back.
fn hide_snapshots(w: &World) -> impl FnOnce() {
    let rollback = w.root.join(".rollback");
    let aside = w.tmp.path().join("rollback-aside");
    std::fs::rename(&rollback, &aside).unwrap();
    std::fs::write(&rollback, b"in the way").unwrap();
    move || {
        std::fs::remove_file(&rollback).unwrap();
        std::fs::rename(&aside, &rollback).unwrap();
    }
}

#[test]
fn crash_at_every_step_of_every_action_is_recoverable() {
    use ailab_sandbox_core::config::Durability;
    let mut trials = 0;
    for (durability, point, nth) in [Durability::Relaxed, Durability::Batched]
        .into_iter()
        .flat_map(|d| POINTS.into_iter().map(move |p| (d, p)))
        .flat_map(|(d, p)| (1..=3).map(move |n| (d, p, n)))
    {
        {
            let (w, c, original) = seeded(durability);
            let sb = w.open(c.clone());
            sb.failpoints().arm_crash(point, nth);
            let outcome =
                std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
            assert!(outcome.is_err(), "{point}#{nth} should crash");
            drop(sb);
            // Each target is at its old or its new bytes.
            let a = w.read("a.txt");
            assert!(
                a == b"alpha\n" || a == b"ALPHA\n",
                "{point}#{nth}: a.txt torn"
            );
            let b = w.read("d/b.txt");
            assert!(
                b == b"beta\n" || b == b"beta\nmore\n",
                "{point}#{nth}: b.txt torn"
            );
            if let Ok(c) = std::fs::read(w.path("new/c.txt")) {
                assert_eq!(c, b"gamma\n", "{point}#{nth}");
            }
            let sb = w.open(c);
            assert!(
                sb.notices()
                    .iter()
                    .any(|n| n.contains("recovered interrupted run")),
                "{point}#{nth}: {:?}",
                sb.notices()
            );
            // The notice says what recovery did, not a list of zeros.
            assert!(
                !sb.notices()
                    .iter()
                    .any(|n| n.contains(": 0 ") || n.contains(", 0 ")),
                "{point}#{nth}: {:?}",
                sb.notices()
            );
            assert!(temp_files(&w.root).is_empty(), "{point}#{nth}");
            let v = sb.audit_verify().unwrap();
            assert!(v.ok, "{point}#{nth}: {v:?}");
            let rb = sb.rollback_workflow("wf_crash", &forced());
            assert!(
                rb.status == "rolled_back"
                    || rb.reason_code == Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
                "{point}#{nth}: {rb:?}"
            );
            assert_eq!(w.tree(), original, "{point}#{nth}: original tree restored");
            assert!(sb.audit_verify().unwrap().ok);
            trials += 1;
        }
    }
    assert_eq!(trials, 30);
}

fn batched(w: &World) -> ailab_sandbox_core::Config {
    let mut c = w.writable_config();
    c.durability = ailab_sandbox_core::config::Durability::Batched;
    c
}

/// Under `batched`, a large write is committed by a sync point, not the commit log. A run
/// that dies after that point, before its rename, in a folder this process may write in
/// but not read (mode 0300), is finished by recovery: the sync point that concludes
/// recovery covers the rename, where a sync of the folder itself, which must open it for
/// reading, would fail and have the write undone.
#[test]
fn batched_recovery_finishes_a_write_in_a_folder_it_may_not_read() {
    use std::os::unix::fs::DirBuilderExt;
    let w = World::new();
    std::fs::create_dir_all(&w.root).unwrap();
    std::fs::DirBuilder::new()
        .mode(0o300)
        .create(w.root.join("d"))
        .unwrap();
    w.write("d/a.txt", b"alpha\n");
    let big = "B".repeat(200 * 1024);
    let sb = w.open(batched(&w));
    sb.failpoints().arm_crash("before_mutate", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_big", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "d/a.txt", "content": big}]})))
    }));
    assert!(outcome.is_err(), "the run should crash");
    drop(sb);
    let notices = without_dac_override(|| w.open(batched(&w)).notices().to_vec());
    assert!(
        notices.iter().any(|n| n.contains(": 1 action finished")),
        "{notices:?}"
    );
    assert_eq!(w.read("d/a.txt"), big.as_bytes());
    let sb = w.open(batched(&w));
    assert!(sb.audit_verify().unwrap().ok);
    let rb = sb.rollback_workflow("wf_big", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("d/a.txt"), b"alpha\n");
}

/// A dead run's `action` in folder `d` (there at its snapshot, holding `keep.txt` and
/// `old.md`), killed at `point`, `then` done to the tree, and the next start: the error
/// its recovery's undo line gives.
fn dead_action_in_d_then(
    point: &str,
    action: serde_json::Value,
    then: impl FnOnce(&World),
) -> String {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    w.write("d/old.md", b"old");
    let sb = w.open(w.writable_config());
    sb.failpoints().arm_crash(point, 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_dead", "actions": [action]})))
    }));
    assert!(outcome.is_err(), "the run should crash");
    drop(sb);
    then(&w);
    let sb = w.open(w.writable_config());
    assert!(sb.audit_verify().unwrap().ok);
    rolled_back_line(&sb, "wf_dead").error.unwrap_or_default()
}

fn create_in_d() -> serde_json::Value {
    json!({"action_id": "a1", "intent": "create_file", "path": "d/f.md", "content": "one"})
}

/// Folder `dir` of the root moved to `away` beside it and an empty one made in its
/// place: what `away/name` holds then.
fn swap(w: &World, dir: &str, name: &str) -> Vec<u8> {
    let to = w.tmp.path().join("away");
    std::fs::rename(w.root.join(dir), &to).unwrap();
    std::fs::create_dir(w.root.join(dir)).unwrap();
    std::fs::read(to.join(name)).unwrap()
}

/// A dead run's `create_file` into a folder that stood when it was snapshotted, found
/// with that folder missing at the next start (moved away by another program, maybe
/// with the file in it), is not recorded as "not written", checked: its undo says it
/// could not be checked, naming the folder.
#[test]
fn recovery_does_not_call_unwritten_a_file_whose_folder_went_away() {
    let said = dead_action_in_d_then("before_mutate", create_in_d(), |w| {
        std::fs::rename(w.root.join("d"), w.tmp.path().join("away")).unwrap();
    });
    assert!(said.contains("nor the directory 'd' on the way"), "{said}");
}

/// Nor one whose folder, there at the snapshot, has another in its place (the first
/// moved away, the dead run's file in it): undone, not called checked, and said so. A
/// dead `replace_file` so found is left as it is (another program's change), its line
/// saying why.
#[test]
fn recovery_does_not_call_unwritten_a_file_whose_folder_was_replaced() {
    let mut away = Vec::new();
    // The recorded parent, and a folder the dead action made, by the mark it left once
    // it made it.
    let made =
        json!({"action_id": "a1", "intent": "create_file", "path": "d/n/f.md", "content": "one"});
    for (create, dir) in [(create_in_d(), "d"), (made, "d/n")] {
        let said = dead_action_in_d_then("before_audit", create, |w| away = swap(w, dir, "f.md"));
        assert!(
            said.contains(&format!(
                "not found in the directory '{dir}', which is not the one the action wrote in"
            )),
            "{said}"
        );
        assert_eq!(away, b"one", "the dead write lives on where it went");
    }
    let replace =
        json!({"action_id": "a1", "intent": "replace_file", "path": "d/old.md", "content": "new"});
    let said = dead_action_in_d_then("after_mutate", replace, |w| away = swap(w, "d", "old.md"));
    assert!(
        said.contains("the directory 'd' holding it is not the one the action wrote in"),
        "{said}"
    );
    assert!(
        said.contains("is kept in '.rollback/wf_dead/a1/backup'"),
        "{said}"
    );
    assert_eq!(away, b"new", "the dead write lives on where it went");
}

fn one_replace() -> serde_json::Value {
    json!({"workflow_id": "wf_commit", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]})
}

/// With batched syncs a file write is committed by its one sync point: the snapshot and
/// the staged new bytes are durable together. A run that dies after that point is
/// finished by recovery, never undone, whatever else it had written: the target holds
/// the new bytes, the registry and the audit trail hold exactly one line each for it.
#[test]
fn batched_crash_after_the_commit_point_is_finished_by_recovery() {
    // `after_snapshot` comes before the commit point.
    for point in POINTS.into_iter().filter(|p| *p != "after_snapshot") {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        let original = w.tree();
        let sb = w.open(batched(&w));
        sb.failpoints().arm_crash(point, 1);
        let outcome =
            std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(one_replace()))));
        assert!(outcome.is_err(), "{point} should crash");
        drop(sb);
        let registry = w.state.join("artifacts.jsonl");
        if point == "before_audit" {
            // The registry line was written but, say, never reached the disk.
            assert_eq!(
                std::fs::read_to_string(&registry).unwrap().lines().count(),
                1
            );
            std::fs::write(&registry, b"").unwrap();
        }
        let sb = w.open(batched(&w));
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains(": 1 action finished")),
            "{point}: {:?}",
            sb.notices()
        );
        assert_eq!(w.read("a.txt"), b"ALPHA\n", "{point}");
        assert!(temp_files(&w.root).is_empty(), "{point}");
        let arts = sb.registry().get_by_workflow("wf_commit").unwrap();
        assert_eq!(arts.len(), 1, "{point}");
        assert_eq!(arts[0].checksum_sha256, sha(b"ALPHA\n"), "{point}");
        assert_eq!(arts[0].action_id, "a1");
        let stats = sb.audit_stats().unwrap();
        assert_eq!((stats.total, stats.success), (1, 1), "{point}: {stats:?}");
        assert!(sb.audit_verify().unwrap().ok, "{point}");
        // The finished action rolls back like any other.
        let rb = sb.rollback_workflow("wf_commit", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{point}: {rb:?}");
        assert_eq!(w.tree(), original, "{point}");
        drop(sb);
        assert!(
            w.open(batched(&w))
                .notices()
                .iter()
                .all(|n| !n.contains("recovered")),
            "{point}: recovered once only"
        );
    }
}

/// Makes a batched run die at `point` (its second hit) replacing `a.txt` with `ALPHA`:
/// the workflow's second write, which commits by its log, the first by a sync point.
fn died_in_a_logged_write(w: &World, point: &str) {
    let sb = w.open(batched(w));
    sb.failpoints().arm_crash(point, 2);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_commit", "actions": [
            {"action_id": "a0", "intent": "create_file", "path": "first.txt", "content": "1"},
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]})))
    }));
    assert!(outcome.is_err(), "{point} should crash");
}

/// Appends `later` to `a.txt` in workflow `wf_later`, as another process would.
fn append_later(sb: &ailab_sandbox_core::Sandbox) {
    let r = run(
        sb,
        json!({"workflow_id": "wf_later", "actions": [
            {"action_id": "b1", "intent": "append_file", "path": "a.txt", "content": "later\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

/// A batched run that died after its commit point, before its rename, whose target
/// another process then wrote (the dead run's lock went with it, and that process read
/// the file as it found it): recovery keeps that later, acknowledged write, and never
/// puts the dead run's staged bytes over it (it did, once the log's replay had recorded
/// the dead write done, when both were timed alike).
#[test]
fn batched_recovery_never_puts_a_dead_runs_staged_bytes_over_a_later_write() {
    for point in ["before_mutate", "after_mutate"] {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        // Running before the other died, so its start recovered nothing.
        let live = w.open(batched(&w));
        died_in_a_logged_write(&w, point);
        let found: &[u8] = if point == "before_mutate" {
            b"alpha\n"
        } else {
            b"ALPHA\n"
        };
        append_later(&live);
        let later = [found, b"later\n"].concat();
        assert_eq!(w.read("a.txt"), later, "{point}");
        drop(live);
        let sb = w.open(batched(&w));
        assert_eq!(w.read("a.txt"), later, "{point}: {:?}", sb.notices());
        assert!(temp_files(&w.root).is_empty(), "{point}");
        assert!(sb.audit_verify().unwrap().ok, "{point}");
        // The later write rolls back to what it found.
        let rb = sb.rollback_workflow("wf_later", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{point}: {rb:?}");
        assert_eq!(w.read("a.txt"), found, "{point}");
    }
}

/// The same later write still under way (its process holding the target's lock) when
/// a start replays the dead run's log, and recorded only then: looked at again under the
/// lock, the dead write is found overtaken and recorded undone, not done, and the later
/// write stands.
#[test]
fn a_logged_write_overtaken_while_its_log_is_replayed_is_recorded_undone() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let live = std::sync::Arc::new(w.open(batched(&w)));
    died_in_a_logged_write(&w, "before_mutate");
    w.clock.advance(chrono::Duration::seconds(1));
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    let other = live.clone();
    armed.interleave(
        "lock_logged_target",
        std::sync::Arc::new(move || append_later(&other)),
    );
    let sb = ailab_sandbox_core::Sandbox::open_armed(
        batched(&w),
        std::sync::Arc::new(w.clock.clone()),
        armed,
    )
    .unwrap();
    assert_eq!(w.read("a.txt"), b"alpha\nlater\n", "{:?}", sb.notices());
    assert!(
        sb.notices()
            .iter()
            .all(|n| !n.contains("2 actions finished")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(
        action_statuses(&sb, "wf_commit", "a1"),
        [ailab_sandbox_core::audit::AuditStatus::RolledBack],
        "recorded undone, never done"
    );
    assert!(sb.registry().get_by_workflow("wf_commit").unwrap().len() == 1);
    assert!(temp_files(&w.root).is_empty());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A dead batched create whose target the disk will not read at one of recovery's looks
/// (whichever) is never recorded done while its file is missing: a failed look is no
/// change by another, for which its staged file was thrown away.
#[test]
fn a_failed_look_anywhere_in_recovery_never_records_a_missing_file_done() {
    use ailab_sandbox_core::audit::AuditStatus;
    // The workflow's first write, committed by a sync point (a logged one is put in
    // place by the log's replay first), then a logged one.
    for (crash, nth) in (1..=2).flat_map(|c| (1..=4).map(move |n| (c, n))) {
        let w = World::new();
        let sb = w.open(batched(&w));
        sb.failpoints().arm_crash("before_mutate", crash);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sb.run_plan(plan(json!({"workflow_id": "wf_new", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "new.txt", "content": "NEW\n"},
                {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "TWO\n"}]})))
        }));
        assert!(outcome.is_err());
        drop(sb);
        let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
        armed.arm_errno("read_target", nth, rustix::io::Errno::IO.raw_os_error());
        drop(
            ailab_sandbox_core::Sandbox::open_armed(
                batched(&w),
                std::sync::Arc::new(w.clock.clone()),
                armed,
            )
            .unwrap(),
        );
        let sb = w.open(batched(&w));
        for (action, path, bytes) in [("a1", "new.txt", b"NEW\n"), ("a2", "two.txt", b"TWO\n")] {
            let statuses = action_statuses(&sb, "wf_new", action);
            let done = statuses.last() == Some(&AuditStatus::Success);
            let file = std::fs::read(w.path(path)).ok();
            assert_eq!(
                file.is_some(),
                done,
                "crash {crash}, look {nth}, {action}: {file:?}, {statuses:?}"
            );
            if let Some(found) = file {
                assert_eq!(found, bytes, "crash {crash}, look {nth}");
            }
        }
        assert!(temp_files(&w.root).is_empty(), "crash {crash}, look {nth}");
        assert!(sb.audit_verify().unwrap().ok, "crash {crash}, look {nth}");
    }
}

/// A world whose `a.txt` a batched run of `one_replace` died replacing, at `point`, and
/// its tree as seeded.
fn batched_crash_at(point: &str) -> (World, Tree) {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let original = w.tree();
    let sb = w.open(batched(&w));
    sb.failpoints().arm_crash(point, 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(one_replace()))));
    assert!(outcome.is_err());
    drop(sb);
    (w, original)
}

/// The next start undoes the one action of a run that died before its commit point:
/// the tree as seeded, no artifact, the trail intact.
fn undone_at_start(w: &World, original: &Tree) -> ailab_sandbox_core::Sandbox {
    let sb = w.open(batched(w));
    assert_noticed(&sb, ": 1 unfinished action rolled back");
    assert!(!sb.notices().iter().any(|n| n.contains("0 finished")));
    assert_eq!(w.tree(), *original);
    assert!(
        sb.registry()
            .get_by_workflow("wf_commit")
            .unwrap()
            .is_empty()
    );
    assert!(sb.audit_verify().unwrap().ok);
    sb
}

/// The same crash, but the staged bytes never reached the disk (the commit point did
/// not complete): nothing can be finished, so the action is undone.
#[test]
fn batched_crash_before_the_commit_point_is_rolled_back() {
    let (w, original) = batched_crash_at("before_mutate");
    let staged = temp_files(&w.root);
    assert_eq!(staged.len(), 1, "the staged new bytes: {staged:?}");
    std::fs::remove_file(&staged[0]).unwrap();
    // A workflow's first commit is a sync point (it creates the commit log); had it
    // been logged, the entry would be gone too.
    std::fs::write(w.state.join("inflight/wf_commit.log"), b"").unwrap();
    undone_at_start(&w, &original);
}

/// A batched run that dies between its snapshot and the commit point (nothing staged
/// yet) is undone by the next start; the write runs again under a new action id (the
/// trail records the first one's undoing).
#[test]
fn batched_crash_right_after_the_snapshot_is_rolled_back() {
    let (w, original) = batched_crash_at("after_snapshot");
    assert!(temp_files(&w.root).is_empty(), "nothing staged yet");
    let sb = undone_at_start(&w, &original);
    let mut again = one_replace();
    again["actions"][0]["action_id"] = json!("a2");
    let r = run(&sb, again);
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
}

/// A batched run that ends normally leaves nothing for recovery: dropping the sandbox
/// syncs, marks the run idle and moves the audit head to the last line.
#[test]
fn batched_run_then_drop_leaves_an_idle_record_and_a_current_head() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.open(batched(&w));
    let r = run(&sb, one_replace());
    assert_eq!(status(&r), "success");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_commit", "actions": [
        {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "b\n"}]}),
    );
    assert_eq!(status(&r), "success");
    drop(sb);
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state.join("inflight/wf_commit.json")).unwrap())
            .unwrap();
    assert_eq!(rec["state"], "idle");
    assert_eq!(rec["execution_id"], r.execution_id.as_str());
    let head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state.join("sandbox_audit.head.json")).unwrap())
            .unwrap();
    assert_eq!(head["seq"], 2);
    let sb = w.open(batched(&w));
    assert!(
        sb.notices().iter().all(|n| !n.contains("recovered")),
        "{:?}",
        sb.notices()
    );
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(w.read("b.txt"), b"b\n");
}

#[test]
fn a_live_run_in_another_process_is_not_recovered() {
    let w = World::new();
    let sb = w.sandbox();
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let rec = json!({"state": "active", "execution_id": "ex_live", "workflow_id": "wf_live", "started_at": "2026-01-01T00:00:00Z"});
    state
        .inflight_write("wf_live", rec.to_string().as_bytes(), false)
        .unwrap();
    let held = state.lock_workflow("wf_live").unwrap();
    assert!(
        sb.recover().is_empty(),
        "the workflow lock is held: the run is alive"
    );
    drop(held);
    let r = sb.recover();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].workflow_id, "wf_live");
    assert!(sb.recover().is_empty(), "the record is gone once recovered");
}

/// A run that registered an artifact and died before its audit line (as one whose disk
/// filled up) leaves its record for recovery: until then `audit verify` says the trail
/// does not record the write yet, not that lines were cut from it; recovery records it.
#[test]
fn verify_tells_a_write_awaiting_recovery_from_a_cut_trail() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c.clone());
    sb.failpoints().arm_crash("before_audit", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
    assert!(outcome.is_err(), "the run should die");
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok && v.awaits_recovery(), "{v:?}");
    let why = v.reason.unwrap();
    assert!(why.contains("does not record yet"), "{why}");
    assert!(!why.contains("lines were removed"), "{why}");
    // Verified without opening the runtime (a read-only copy), alike.
    let v = ailab_sandbox_core::audit::verify_read_only(&w.state, true).unwrap();
    assert!(!v.ok && v.awaits_recovery(), "{v:?}");
    let why = v.reason.unwrap();
    assert!(why.contains("does not record yet"), "{why}");
    assert!(!why.contains("lines were removed"), "{why}");
    drop(sb);
    let sb = w.open(c);
    assert!(sb.audit_verify().unwrap().ok);
    assert!(
        ailab_sandbox_core::audit::verify_read_only(&w.state, true)
            .unwrap()
            .ok
    );
}

/// Recovery finishing a batched write from its commit record that cannot register the
/// artifact appends no audit line for it either (the trail would record a write the
/// registry lacks, which `audit verify` takes for tampering) and keeps the run's record:
/// the next recovery appends both.
#[test]
fn recovery_that_cannot_register_leaves_both_logs_for_the_next() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.open(batched(&w));
    sb.failpoints().arm_crash("before_registry", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(one_replace()))));
    assert!(outcome.is_err(), "the run should crash");
    sb.failpoints().arm("recovery_register", 1);
    let first = sb.recover();
    // What the start's notice says: the writes stand, only their record is missing.
    assert!(
        first.iter().any(|r| r.retry
            && r.why.as_deref().is_some_and(|w| w.contains(
                "its writes were judged done, but the artifact registry or the audit trail could not record them (injected failure"
            ))),
        "{first:?}"
    );
    assert_eq!(sb.registry().get_by_workflow("wf_commit").unwrap().len(), 0);
    assert_eq!(sb.audit_stats().unwrap().success, 0);
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    let again = sb.recover();
    assert_eq!(again.len(), 1, "the record was kept: {again:?}");
    let arts = sb.registry().get_by_workflow("wf_commit").unwrap();
    assert_eq!(arts.len(), 1);
    assert_eq!(arts[0].checksum_sha256, sha(b"ALPHA\n"));
    assert_eq!(sb.audit_stats().unwrap().success, 1);
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert!(sb.recover().is_empty(), "recovered once");
}

/// A dead run whose snapshot folder someone replaced by a link is not recovered, and the
/// rollback that meets it says what stands in the way (`reserved_path`), not that the
/// disk failed (`io_error`, a 500 over HTTP); once the link is gone it recovers.
#[test]
fn a_dead_run_behind_a_planted_link_is_refused_for_what_stands_there() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let original = w.tree();
    let sb = w.sandbox();
    sb.failpoints().arm_crash("before_audit", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(one_replace()))));
    assert!(outcome.is_err(), "the run should die");
    drop(sb);
    let folder = w.path(".rollback/wf_commit");
    let aside = w.tmp.path().join("wf-aside");
    std::fs::rename(&folder, &aside).unwrap();
    std::os::unix::fs::symlink(&aside, &folder).unwrap();
    let sb = w.sandbox();
    let rb = sb.rollback_workflow("wf_commit", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::ReservedPath),
        "{rb:?}"
    );
    assert!(rb.reason.unwrap().contains("symbolic link"));
    drop(sb);
    std::fs::remove_file(&folder).unwrap();
    std::fs::rename(&aside, &folder).unwrap();
    let sb = w.sandbox();
    assert_noticed(&sb, "recovered interrupted run");
    assert_eq!(
        w.read("a.txt"),
        b"ALPHA\n",
        "registered before it died: finished"
    );
    let rb = sb.rollback_workflow("wf_commit", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// A strict run of `actions` in workflow `wf_crash` killed right after its last
/// snapshot, whose `meta.json` is then taken away: what a kill while that snapshot was
/// written leaves. Returns the world as seeded, its configuration, the seeded tree and
/// that snapshot's folder.
fn killed_mid_snapshot(
    actions: serde_json::Value,
) -> (World, ailab_sandbox_core::Config, Tree, std::path::PathBuf) {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let last = actions.as_array().unwrap().len();
    let id = actions[last - 1]["action_id"].as_str().unwrap().to_owned();
    let sb = w.open(c.clone());
    sb.failpoints().arm_crash("after_snapshot", last as u32);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_crash", "actions": actions})))
    }));
    assert!(outcome.is_err(), "the run should die");
    drop(sb);
    let folder = w.path(&format!(".rollback/wf_crash/{id}"));
    std::fs::remove_file(folder.join("meta.json")).unwrap();
    (w, c, original, folder)
}

/// The one action `killed_mid_snapshot` runs in the tests after it.
fn replace_a() -> serde_json::Value {
    json!([{"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}])
}

/// A process killed while it takes a snapshot (the folder made, the backup perhaps
/// written, the metadata not yet) leaves a folder no trail line names: recovery removes
/// it, so the action's id is free for the plan sent again, as after a snapshot that
/// failed. A folder holding anything else is left alone.
#[test]
fn a_snapshot_its_process_never_finished_frees_its_action_id() {
    for case in [
        "backup only",
        "empty",
        "something else beside",
        "an action that ran lost its record",
    ] {
        let (w, c, original, folder) = killed_mid_snapshot(json!([
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
            {"action_id": "a2", "intent": "replace_file", "path": "d/b.txt", "content": "BETA\n"}]));
        match case {
            "empty" => std::fs::remove_file(folder.join("backup")).unwrap(),
            "something else beside" => std::fs::write(folder.join("notes.txt"), b"x").unwrap(),
            "an action that ran lost its record" => {
                std::fs::remove_file(w.path(".rollback/wf_crash/a1/meta.json")).unwrap()
            }
            _ => {}
        }
        let sb = w.open(c.clone());
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{case}");
        assert!(sb.audit_verify().unwrap().ok, "{case}");
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{case}: never touched");
        let again = sb.run_plan(plan(json!({"workflow_id": "wf_crash", "actions": [
            {"action_id": "a2", "intent": "replace_file", "path": "d/b.txt", "content": "BETA\n"}]})))
            .unwrap();
        if case == "something else beside" {
            assert!(folder.join("notes.txt").exists(), "{case}");
            assert!(!again.is_success(), "{case}");
            assert!(
                again.actions[0]
                    .reason
                    .as_deref()
                    .unwrap()
                    .contains(&format!("action_id 'a2' cannot be used in workflow 'wf_crash': the folder '{}' already stands, though the audit trail records no action of that id in that workflow", folder.display())),
                "{case}: {again:?}"
            );
            continue;
        }
        assert_noticed(&sb, "1 unfinished snapshot folder removed");
        assert!(again.is_success(), "{case}: {again:?}");
        if case == "an action that ran lost its record" {
            // The trail records a1's write: its backup, the only copy of what it
            // replaced, stays.
            let kept = std::fs::read(w.path(".rollback/wf_crash/a1/backup")).unwrap();
            assert_eq!(kept, b"alpha\n", "{case}");
            continue;
        }
        assert_eq!(w.read("d/b.txt"), b"BETA\n", "{case}");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
        assert_eq!(w.tree(), original, "{case}");
        assert!(sb.audit_verify().unwrap().ok, "{case}");
    }
}

/// A workflow whose only snapshot its process never finished leaves no folder behind:
/// recovery removes the workflow's folder it emptied, as it does one left empty by a
/// process killed before its first action's folder; the plan sent again runs and rolls
/// back as if the first had never been.
#[test]
fn a_workflow_folder_recovery_empties_goes_with_its_last_unfinished_snapshot() {
    for case in ["unfinished snapshot", "no snapshot yet"] {
        let (w, c, original, a1) = killed_mid_snapshot(replace_a());
        let store = a1.parent().unwrap().to_path_buf();
        if case == "no snapshot yet" {
            std::fs::remove_dir_all(&a1).unwrap();
        }
        let sb = w.open(c.clone());
        assert!(!store.exists(), "{case}: {:?}", sb.notices());
        assert!(w.path(".rollback").exists(), "{case}");
        assert!(sb.audit_verify().unwrap().ok, "{case}");
        let again = sb
            .run_plan(plan(
                json!({"workflow_id": "wf_crash", "actions": replace_a()}),
            ))
            .unwrap();
        assert!(again.is_success(), "{case}: {again:?}");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
        assert_eq!(w.tree(), original, "{case}");
    }
}

/// An unfinished snapshot folder recovery cannot remove (its backup may not be unlinked
/// there) stays alone: the dead run's own is removed all the same, and counted.
#[test]
fn an_unfinished_snapshot_folder_that_cannot_go_keeps_no_other() {
    use std::os::unix::fs::PermissionsExt;
    let (w, c, _, a1) = killed_mid_snapshot(replace_a());
    let folders = a1.parent().unwrap().to_path_buf();
    // Several, so that some are listed before the dead run's own folder.
    let stuck: Vec<_> = (0..6).map(|i| folders.join(format!("u{i}"))).collect();
    for f in &stuck {
        std::fs::create_dir(f).unwrap();
        std::fs::write(f.join("backup"), b"old").unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o500)).unwrap();
    }
    let notices = without_dac_override(|| w.open(c.clone()).notices().to_vec());
    for f in &stuck {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(std::fs::read(f.join("backup")).unwrap(), b"old");
    }
    assert!(!folders.join("a1").exists());
    assert!(
        notices
            .iter()
            .any(|n| n.contains("1 unfinished snapshot folder removed")),
        "{notices:?}"
    );
    assert_names_stuck_folders(&notices, &stuck);
    let sb = w.open(c);
    let again = sb
        .run_plan(plan(
            json!({"workflow_id": "wf_crash", "actions": replace_a()}),
        ))
        .unwrap();
    assert!(again.is_success(), "{again:?}");
}

/// When nothing can be removed from the workflow's snapshot folder, the unfinished
/// folders in it stay as they were, backups and all: none is emptied and left behind.
#[test]
fn unfinished_snapshot_folders_in_a_folder_that_keeps_them_stay_whole() {
    use std::os::unix::fs::PermissionsExt;
    let (w, c, _, a1) = killed_mid_snapshot(replace_a());
    let folders = a1.parent().unwrap().to_path_buf();
    for i in 0..3 {
        std::fs::create_dir(folders.join(format!("u{i}"))).unwrap();
        std::fs::write(folders.join(format!("u{i}/backup")), b"old").unwrap();
    }
    std::fs::set_permissions(&folders, std::fs::Permissions::from_mode(0o500)).unwrap();
    let notices = without_dac_override(|| w.open(c.clone()).notices().to_vec());
    std::fs::set_permissions(&folders, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(w.read(".rollback/wf_crash/a1/backup"), b"alpha\n");
    for i in 0..3 {
        assert_eq!(w.read(&format!(".rollback/wf_crash/u{i}/backup")), b"old");
    }
    assert!(
        notices.iter().all(|n| !n.contains("folder removed")),
        "{notices:?}"
    );
    let stuck: Vec<_> = ["a1", "u0", "u1", "u2"]
        .iter()
        .map(|a| folders.join(a))
        .collect();
    assert_names_stuck_folders(&notices, &stuck);
}

/// The start's notice names each unfinished snapshot folder recovery could not remove,
/// why, and what to do.
fn assert_names_stuck_folders(notices: &[String], stuck: &[std::path::PathBuf]) {
    let (folders, them) = if stuck.len() == 1 {
        (
            "could not remove the snapshot folder its process began and never finished (no meta.json; its action never ran)",
            "its action id stays used until it is gone; remove it by hand",
        )
    } else {
        (
            "could not remove the snapshot folders its process began and never finished (no meta.json; their actions never ran)",
            "their action ids stay used until they are gone; remove them by hand",
        )
    };
    let said = notices
        .iter()
        .find(|n| n.contains(folders))
        .unwrap_or_else(|| panic!("{notices:?}"));
    for f in stuck {
        assert!(
            said.contains(&format!("'{}' (permission denied", f.display())),
            "{said}"
        );
    }
    assert!(said.contains(them), "{said}");
}

/// One unfinished snapshot folder left is spoken of as one.
#[test]
fn one_unfinished_snapshot_folder_left_is_named_as_one() {
    use std::os::unix::fs::PermissionsExt;
    let (w, c, _, a1) = killed_mid_snapshot(replace_a());
    std::fs::set_permissions(&a1, std::fs::Permissions::from_mode(0o500)).unwrap();
    let notices = without_dac_override(|| w.open(c.clone()).notices().to_vec());
    std::fs::set_permissions(&a1, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(w.read(".rollback/wf_crash/a1/backup"), b"alpha\n");
    assert_names_stuck_folders(&notices, &[a1]);
}

/// A run record that cannot be read is removed, and with it any later try: an
/// unfinished snapshot folder of its workflow that recovery could not remove, whatever
/// refused it (the disk, or permissions), is named for the operator, and the record is
/// said removed (it was once said "could not be removed either", the folder unnamed).
#[test]
fn an_unreadable_records_unfinished_snapshot_that_stays_is_named() {
    use std::os::unix::fs::PermissionsExt;
    for cause in ["disk", "permissions"] {
        let (w, c, _, a1) = killed_mid_snapshot(replace_a());
        let record = w.state.join("inflight/wf_crash.json");
        std::fs::write(&record, b"{ torn").unwrap();
        let notices = if cause == "disk" {
            let sb = open_refusing_at("remove_unfinished_snapshot", &c, rustix::io::Errno::ROFS);
            sb.notices().to_vec()
        } else {
            std::fs::set_permissions(&a1, std::fs::Permissions::from_mode(0o500)).unwrap();
            let n = without_dac_override(|| w.open(c.clone()).notices().to_vec());
            std::fs::set_permissions(&a1, std::fs::Permissions::from_mode(0o700)).unwrap();
            assert_names_stuck_folders(&n, std::slice::from_ref(&a1));
            n
        };
        assert!(!record.exists(), "{cause}");
        assert_eq!(
            w.read(".rollback/wf_crash/a1/backup"),
            b"alpha\n",
            "{cause}"
        );
        assert!(
            notices
                .iter()
                .any(|n| n.contains("could not be read") && n.contains("and was removed;")),
            "{cause}: {notices:?}"
        );
        let left = notices
            .iter()
            .find(|n| {
                n.contains("recovery of workflow wf_crash could not remove the snapshot folder")
            })
            .unwrap_or_else(|| panic!("{cause}: {notices:?}"));
        assert!(left.contains(&format!("'{}' (", a1.display())), "{left}");
        assert!(
            notices.iter().all(|n| !n.contains("removed either")),
            "{cause}: {notices:?}"
        );
    }
}

/// A process killed while creating a run record leaves the record's temporary file:
/// recovery removes it once the workflow's lock is free, and never while a live run
/// holds it (it may be that run's own record being made).
#[test]
fn a_dead_runs_temporary_record_is_removed() {
    let w = World::new();
    let sb = w.sandbox();
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let inflight = w.state.join("inflight");
    let temp = |wf: &str| {
        inflight.join(format!(
            ".{wf}.json.ailab-tmp-0123456789abcdef0123456789abcdef"
        ))
    };
    std::fs::write(temp("wf_dead"), b"{").unwrap();
    std::fs::write(temp("wf_live"), b"{").unwrap();
    // An id may hold the marker's text: the lock checked is that workflow's.
    let odd = "a.json.ailab-tmp-b";
    std::fs::write(temp(odd), b"{").unwrap();
    let held = state.lock_workflow("wf_live").unwrap();
    let held_odd = state.lock_workflow(odd).unwrap();
    sb.recover();
    assert!(
        !temp("wf_dead").exists(),
        "a dead writer's temporary record stays"
    );
    assert!(temp(odd).exists(), "another workflow's lock was checked");
    drop(held_odd);
    assert!(
        temp("wf_live").exists(),
        "a live run's record was taken from under it"
    );
    drop(held);
    sb.recover();
    assert!(!temp("wf_live").exists());
}

/// With batched syncs the audit line may reach the disk while the target's new bytes do
/// not. Recovery must then treat the audited action as unfinished and restore it.
#[test]
fn audited_action_whose_target_did_not_persist_is_rolled_back() {
    let w = World::new();
    w.write("a.txt", b"old\n");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_lost", "actions": [
        {"intent": "replace_file", "path": "a.txt", "content": "new\n"},
        {"intent": "create_file", "path": "b.txt", "content": "b\n"}]}),
    );
    assert_eq!(status(&r), "success");
    drop(sb);
    // The power cut: a.txt's rename never reached the disk; the run's record is active.
    std::fs::write(w.path("a.txt"), b"old\n").unwrap();
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let rec = json!({"state": "active", "execution_id": r.execution_id, "workflow_id": "wf_lost", "started_at": "2026-01-01T00:00:00Z"});
    state
        .inflight_write("wf_lost", rec.to_string().as_bytes(), false)
        .unwrap();
    let sb = w.sandbox();
    assert_noticed(&sb, "1 unfinished action rolled back");
    assert_eq!(w.read("a.txt"), b"old\n");
    assert_eq!(w.read("b.txt"), b"b\n", "the action that did persist stays");
    let stats = sb.audit_stats().unwrap();
    assert_eq!(stats.rolled_back, 1);
    assert!(sb.audit_verify().unwrap().ok);
}

#[test]
fn strict_and_batched_durability_run_and_recover() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Strict, Durability::Batched] {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        let original = w.tree();
        let mut c = w.writable_config();
        c.durability = durability;
        die_before_the_second_record(&w, &c);
        let sb = w.open(c);
        assert!(sb.audit_verify().unwrap().ok, "{durability:?}");
        let rb = sb.rollback_workflow("wf_crash", &forced());
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// Threads on several workflows share the sync points: each run's idle mark and the audit
/// head are written only after a sync that covers them, whichever thread makes it, and
/// a run never marks idle a record a newer run of its workflow has taken over.
#[test]
fn batched_concurrent_runs_leave_every_record_idle_and_the_head_current() {
    let w = World::new();
    let mut c = batched(&w);
    c.limits.writes_per_minute = 1000;
    let sb = std::sync::Arc::new(w.open(c.clone()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let sb = sb.clone();
            std::thread::spawn(move || {
                for i in 0..6 {
                    let r = sb
                        .run_plan(plan(
                            json!({"workflow_id": format!("wf_t{}", t % 2), "actions": [
                            {"action_id": format!("a{t}_{i}"), "intent": "create_file",
                             "path": format!("t{t}/f{i}.txt"), "content": format!("{t}/{i}\n")}]}),
                        ))
                        .unwrap();
                    assert_eq!(
                        r.status,
                        ailab_sandbox_core::executor::RunStatus::Success,
                        "{r:?}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let sb = std::sync::Arc::into_inner(sb).unwrap();
    drop(sb);
    for wf in ["wf_t0", "wf_t1"] {
        let rec = run_record(&w, wf);
        assert_eq!(rec["state"], "idle", "{wf}: {rec}");
    }
    let head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state.join("sandbox_audit.head.json")).unwrap())
            .unwrap();
    assert_eq!(head["seq"], 24);
    let sb = w.open(c);
    assert!(
        sb.notices().iter().all(|n| !n.contains("recovered")),
        "{:?}",
        sb.notices()
    );
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(sb.registry().len().unwrap(), 24);
    for t in 0..4 {
        for i in 0..6 {
            assert_eq!(
                w.read(&format!("t{t}/f{i}.txt")),
                format!("{t}/{i}\n").as_bytes()
            );
        }
    }
}

/// Runs `plan_json` in `durability`, then a rollback of it that dies at the second hit
/// of `point`; returns the world, its configuration and the tree before the run.
fn rollback_killed_at(
    point: &str,
    durability: ailab_sandbox_core::config::Durability,
) -> (World, ailab_sandbox_core::Config, Tree) {
    let (w, c, original) = seeded(durability);
    let sb = w.open(c.clone());
    assert_eq!(status(&run(&sb, plan_json())), "success");
    sb.failpoints().arm_crash(point, 2);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.rollback_workflow("wf_crash", &RollbackOptions::default())
    }));
    assert!(
        outcome.is_err(),
        "{durability:?}: the rollback dies at {point}"
    );
    drop(sb);
    (w, c, original)
}

/// A rollback records each step (its "restored" mark and audit line) as soon as the
/// step's restore is durable, before the next step starts: when it dies in the middle,
/// the tree agrees with the audit trail, and the rollback run again finishes the rest.
#[test]
fn a_rollback_that_dies_leaves_its_finished_steps_recorded() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let (w, c, original) = rollback_killed_at("during_restore", durability);
        // Newest first: new/c.txt was removed, and that step is recorded.
        assert!(!w.path("new/c.txt").exists(), "{durability:?}");
        let marks: Vec<String> = paths_in(&w.root.join(".rollback"))
            .into_iter()
            .filter(|p| p.ends_with("restored.json"))
            .collect();
        assert_eq!(marks.len(), 1, "{durability:?}: {marks:?}");
        let sb = w.open(c);
        assert_noticed(&sb, "2 actions of the workflow not rolled back");
        assert_eq!(sb.audit_stats().unwrap().rolled_back, 1, "{durability:?}");
        assert_eq!(
            w.read("d/b.txt"),
            b"beta\nmore\n",
            "{durability:?}: not restored yet"
        );
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(rb.steps_rolled_back, 2, "{durability:?}");
        assert_eq!(w.tree(), original, "{durability:?}");
        assert!(sb.audit_verify().unwrap().ok);
        assert_eq!(sb.audit_stats().unwrap().rolled_back, 3, "{durability:?}");
    }
}

/// A rollback that died after its last restore, before that restore's line: recovery
/// records it, and the notice says nothing is left to roll back (it said that rolling
/// back again restores what the rollback had not reached, and that rollback is refused).
#[test]
fn a_rollback_that_died_after_its_last_restore_leaves_nothing_to_roll_back() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c.clone());
    assert_eq!(status(&run(&sb, plan_json())), "success");
    sb.failpoints().arm_crash("after_mark", 3);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.rollback_workflow("wf_crash", &RollbackOptions::default())
    }));
    assert!(outcome.is_err(), "the rollback dies before its last line");
    drop(sb);
    assert_eq!(w.tree(), original);
    let sb = w.open(c);
    assert_noticed(
        &sb,
        "1 restore it made recorded on the audit trail; none of the workflow's writes is left to roll back",
    );
    let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
        "{rb:?}"
    );
    assert_eq!(sb.audit_stats().unwrap().rolled_back, 3);
}

/// A prune right after a killed rollback (the start that recovers it is the prune's
/// own) keeps the workflow: the notice tells the operator to run the rollback again,
/// which needs its snapshots. The age counts from that recovery, so the workflow is
/// pruned later like any other if the rollback is never run again.
#[test]
fn a_prune_keeps_a_workflow_whose_interrupted_rollback_it_just_recovered() {
    use ailab_sandbox_core::config::Durability;
    let hour = chrono::Duration::hours(1);
    let an_hour = std::time::Duration::from_secs(3600);
    for durability in [Durability::Relaxed, Durability::Strict] {
        for run_again in [true, false] {
            let case = format!("{durability:?}, run again: {run_again}");
            let (w, c, original) = rollback_killed_at("during_restore", durability);
            w.clock.advance(hour * 2);
            let sb = w.open(c);
            assert!(
                sb.notices()
                    .iter()
                    .any(|n| n.contains("recovered interrupted rollback")),
                "{case}: {:?}",
                sb.notices()
            );
            let kept = sb.prune(an_hour).unwrap();
            assert!(kept.workflows_pruned.is_empty(), "{case}: {kept:?}");
            assert!(w.path(".rollback/wf_crash").is_dir(), "{case}");
            if run_again {
                let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
                assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
                assert_eq!(w.tree(), original, "{case}");
            }
            w.clock.advance(hour * 2);
            let later = sb.prune(an_hour).unwrap();
            assert_eq!(later.workflows_pruned, ["wf_crash"], "{case}: {later:?}");
            assert!(sb.audit_verify().unwrap().ok, "{case}");
        }
    }
}

/// A root whose path is long (past a disk sector, with the longest workflow id) is
/// named in every run record: runs and rollbacks write there, and those that die are
/// recovered by the next start (every run was refused "record longer than one block").
/// A plan writing into roots too long together for a record is refused, saying so, and
/// a root too long alone is refused at start.
#[test]
fn a_long_root_path_fits_the_run_record_and_too_long_ones_are_refused_at_start() {
    let w = World::new();
    let long = (0..6).fold(w.tmp.path().to_path_buf(), |p, i| {
        p.join(format!("{i}{}", "d".repeat(239)))
    });
    assert!(long.as_os_str().len() > 1440);
    let mut c = w.writable_config();
    c.roots = vec![long.clone()];
    let wf = "w".repeat(64);
    let plan = json!({"workflow_id": wf, "actions": [
        {"intent": "create_file", "path": "a.txt", "content": "alpha\n"},
        {"intent": "create_file", "path": "b.txt", "content": "beta\n"}]});
    let sb = w.open(c.clone());
    sb.failpoints().arm_crash("after_snapshot", 2);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| run(&sb, plan.clone())));
    assert!(died.is_err(), "the run dies at its second snapshot");
    drop(sb);
    let sb = w.open(c.clone());
    assert_noticed(&sb, "recovered interrupted run");
    // The first action was audited and stands; the second, in doubt, was undone.
    assert_eq!(std::fs::read(long.join("a.txt")).unwrap(), b"alpha\n");
    assert!(!long.join("b.txt").exists());
    let r = run(
        &sb,
        json!({"workflow_id": wf, "actions": [
            {"intent": "create_file", "path": "b.txt", "content": "beta\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(std::fs::read(long.join("b.txt")).unwrap(), b"beta\n");
    sb.failpoints().arm_crash("during_restore", 2);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.rollback_workflow(&wf, &RollbackOptions::default())
    }));
    assert!(died.is_err(), "the rollback dies at its second restore");
    drop(sb);
    let sb = w.open(c.clone());
    assert_noticed(&sb, "recovered interrupted rollback");
    let rb = sb.rollback_workflow(&wf, &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!long.join("a.txt").exists() && !long.join("b.txt").exists());
    assert!(sb.audit_verify().unwrap().ok);
    drop(sb);
    // Three such roots fit one record apart, not together: a plan writing into all
    // three is refused as such, nothing written; one writing into one of them runs.
    let mut c = w.writable_config();
    c.roots = (0..3).map(|i| long.join(format!("r{i}"))).collect();
    let sb = w.open(c.clone());
    let into = |i: usize| json!({"intent": "create_file", "root": c.roots[i], "path": format!("f{i}.txt"), "content": "x"});
    let r = run(
        &sb,
        json!({"workflow_id": "wf_three", "actions": [into(0), into(1), into(2)]}),
    );
    assert_eq!(status(&r), "blocked", "{:?}", r.actions[0].reason);
    let why = r.actions[0].reason.clone().unwrap_or_default();
    assert!(why.contains("split it into plans"), "{why}");
    assert!((0..3).all(|i| !c.roots[i].join(format!("f{i}.txt")).exists()));
    let r = run(&sb, json!({"workflow_id": "wf_one", "actions": [into(1)]}));
    assert_eq!(status(&r), "success", "{:?}", r.actions[0].reason);
    // A workflow that wrote into all three, a plan each, rolls back one action at a time;
    // a simulation (dry-run) says the same as the real thing.
    let mut ids = Vec::new();
    let spread = |i: usize| {
        json!({"workflow_id": "wf_spread", "actions": [{"intent": "create_file",
            "root": c.roots[i], "path": format!("s{i}.txt"), "content": "s"}]})
    };
    for i in 0..3 {
        let r = run(&sb, spread(i));
        assert_eq!(status(&r), "success", "{:?}", r.actions[0].reason);
        ids.push(r.actions[0].action_id.clone());
    }
    let mut dry = c.clone();
    dry.dry_run = true;
    let sim = w.open(dry);
    let fresh = (0..3)
        .map(|i| json!({"intent": "create_file", "root": c.roots[i], "path": format!("t{i}.txt"), "content": "t"}))
        .collect::<Vec<_>>();
    let r = run(&sim, json!({"workflow_id": "wf_sim", "actions": fresh}));
    assert_eq!(status(&r), "blocked", "{:?}", r.actions[0].reason);
    let why = r.actions[0].reason.clone().unwrap_or_default();
    assert!(why.contains("split it into plans"), "{why}");
    // Said first, as the preview says it, even where a file changed since (a conflict,
    // whose advice to force would then be refused all the same).
    std::fs::write(c.roots[0].join("s0.txt"), "changed").unwrap();
    for sandbox in [&sim, &sb] {
        let rb = sandbox.rollback_workflow("wf_spread", &RollbackOptions::default());
        let why = rb.reason.unwrap_or_default();
        assert!(why.contains("roll its actions back one at a time"), "{why}");
        let info = sandbox.rollback_info("wf_spread").unwrap();
        assert!(!info.rollback_available, "{info:?}");
    }
    drop(sim);
    std::fs::write(c.roots[0].join("s0.txt"), "s").unwrap();
    for id in ids.iter().rev() {
        let one = RollbackOptions {
            action_id: Some(id.clone()),
            ..RollbackOptions::default()
        };
        assert_eq!(
            sb.rollback_workflow("wf_spread", &one).status,
            "rolled_back"
        );
    }
    assert!((0..3).all(|i| !c.roots[i].join(format!("s{i}.txt")).exists()));
    // Its prune records the roots it prunes in, not every root the process has.
    w.clock.advance(chrono::Duration::days(2));
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(report.workflows_failed.is_empty(), "{report:?}");
    assert!(
        report.workflows_pruned.contains(&"wf_one".to_owned()),
        "{report:?}"
    );
    let rb = sb.rollback_workflow("wf_one", &RollbackOptions::default());
    assert!(rb.reason.unwrap_or_default().contains("pruned"));
    drop(sb);
    // A root that does not fit alone is refused at start, nothing made.
    let mut c = w.writable_config();
    let longest = (0..16).fold(w.tmp.path().join("l"), |p, i| {
        p.join(format!("{i}{}", "e".repeat(239)))
    });
    c.roots = vec![longest];
    let err = ailab_sandbox_core::Sandbox::open(c)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is too long a path"),
        "{}",
        &err[..200.min(err.len())]
    );
    assert!(!w.tmp.path().join("l").exists(), "nothing made");
}

/// A run record's or a prune mark's temporary file left by a process killed while it
/// made one is removed by the next start (a prune mark's stayed for good); a file of
/// another kind there is left alone.
#[test]
fn temporary_records_and_prune_marks_of_dead_processes_are_removed() {
    let w = World::new();
    drop(w.sandbox());
    let inflight = w.state.join("inflight");
    let names = [
        ".wf_a.pruned.ailab-tmp-18ed5fb9e589a5e10000000a21bb3041",
        ".wf_a.json.ailab-tmp-18ed5fb9e589a5e10000000b21bb3041",
        ".wf_a.other.ailab-tmp-18ed5fb9e589a5e10000000c21bb3041",
    ];
    for n in names {
        std::fs::write(inflight.join(n), b"1\n").unwrap();
    }
    drop(w.sandbox());
    let left: Vec<bool> = names.iter().map(|n| inflight.join(n).exists()).collect();
    assert_eq!(left, [false, false, true]);
}

/// A prune killed between its mark and the removal of the workflow's run record and
/// commit log left them beside the mark; the next prune, which finds no snapshots of the
/// workflow to visit, removes them all the same (they stayed for good).
#[test]
fn a_later_prune_removes_the_run_record_a_killed_prune_left() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Batched] {
        let w = World::new();
        let mut c = w.writable_config();
        c.durability = durability;
        let sb = w.open(c.clone());
        let r = run(
            &sb,
            json!({"workflow_id": "wf_cut", "actions": [
                {"intent": "create_file", "path": "one.txt", "content": "1"},
                {"intent": "create_file", "path": "two.txt", "content": "2"}]}),
        );
        assert_eq!(status(&r), "success");
        w.clock.advance(chrono::Duration::days(10));
        let week = std::time::Duration::from_secs(7 * 86_400);
        sb.failpoints().arm_crash("during_prune", 1);
        let died = std::panic::catch_unwind(AssertUnwindSafe(|| sb.prune(week)));
        assert!(died.is_err(), "the prune dies");
        drop(sb);
        let inflight = w.state.join("inflight");
        let has = |name: &str| inflight.join(name).exists();
        assert!(has("wf_cut.pruned") && has("wf_cut.json"), "{durability:?}");
        let sb = w.open(c);
        let report = sb.prune(week).unwrap();
        assert!(report.workflows_failed.is_empty(), "{report:?}");
        assert!(has("wf_cut.pruned"), "{durability:?}: the mark stays");
        assert!(
            !has("wf_cut.json") && !has("wf_cut.log"),
            "{durability:?}: {:?}",
            std::fs::read_dir(&inflight).unwrap().collect::<Vec<_>>()
        );
        let rb = sb.rollback_workflow("wf_cut", &RollbackOptions::default());
        assert_eq!(
            rb.reason_code,
            Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
            "{rb:?}"
        );
        assert!(w.path("one.txt").exists() && w.path("two.txt").exists());
    }
}

/// A run that dies between an action's registry line and its audit line left the
/// action's result in place and registered: recovery finishes it by auditing it, so the
/// registry never lists an artifact the trail does not (and a later rollback undoes it).
#[test]
fn a_registered_write_whose_run_died_before_its_audit_line_is_finished() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        for live in [false, true] {
            let (w, c, original) = seeded(durability);
            let sb = w.open(c.clone());
            sb.failpoints().arm_crash("before_audit", 2);
            let outcome =
                std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
            assert!(outcome.is_err());
            let sb = if live {
                // The next run of the workflow, in the same process, recovers it.
                let r = run(
                    &sb,
                    json!({"workflow_id": "wf_crash", "actions": [
                        {"intent": "create_file", "path": "later.txt", "content": "x"}]}),
                );
                assert_eq!(status(&r), "success", "{durability:?}");
                sb
            } else {
                drop(sb);
                w.open(c)
            };
            let at = format!("{durability:?} live={live}");
            assert_eq!(w.read("a.txt"), b"ALPHA\n", "{at}");
            assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{at}");
            assert!(!w.path("new/c.txt").exists(), "{at}");
            let audited: std::collections::HashSet<(String, String)> = sb
                .audit_entries(1000, Some("wf_crash"))
                .unwrap()
                .into_iter()
                .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::Success)
                .map(|e| (e.action_id, e.after_checksum.unwrap_or_default()))
                .collect();
            let registered = sb.registry().get_by_workflow("wf_crash").unwrap();
            assert_eq!(registered.len(), if live { 3 } else { 2 }, "{at}");
            for e in &registered {
                assert!(
                    audited.contains(&(e.action_id.clone(), e.checksum_sha256.clone())),
                    "{at}: {e:?} is registered but not audited as done"
                );
            }
            assert!(sb.audit_verify().unwrap().ok, "{at}");
            let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "{at}: {rb:?}");
            assert_eq!(w.tree(), original, "{at}");
        }
    }
}

/// The same death, with the registered write's snapshot record then replaced by another
/// action's (sealed, so read as not this folder's) or its folder removed: recovery
/// cannot judge from it, yet the write landed (it was registered after). It is recorded
/// as done with nothing to roll back, so the trail and the registry agree; the untrusted
/// folder is left and named, and refuses the workflow's rollback until it is moved away.
#[test]
fn a_registered_write_whose_snapshot_went_or_was_replaced_is_recorded_done() {
    for removed in [false, true] {
        let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
        let sb = w.open(c.clone());
        sb.failpoints().arm_crash("before_audit", 2);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
        assert!(outcome.is_err());
        drop(sb);
        let entries = std::fs::read_to_string(w.state.join("artifacts.jsonl")).unwrap();
        let second: serde_json::Value =
            serde_json::from_str(entries.lines().nth(1).unwrap()).unwrap();
        let (first_id, second_id) = {
            let first: serde_json::Value =
                serde_json::from_str(entries.lines().next().unwrap()).unwrap();
            (
                first["action_id"].as_str().unwrap().to_owned(),
                second["action_id"].as_str().unwrap().to_owned(),
            )
        };
        let folder = w.root.join(format!(".rollback/wf_crash/{second_id}"));
        if removed {
            std::fs::remove_dir_all(&folder).unwrap();
        } else {
            std::fs::copy(
                w.root
                    .join(format!(".rollback/wf_crash/{first_id}/meta.json")),
                folder.join("meta.json"),
            )
            .unwrap();
        }
        let sb = w.open(c);
        let at = format!("removed={removed}: {:?}", sb.notices());
        if !removed {
            assert_noticed(
                &sb,
                &format!(
                    "left 1 snapshot folder alone that could not be read or trusted (see the log); the action it belongs to was neither finished nor undone: inspect {}",
                    w.root.join(".rollback/wf_crash").display()
                ),
            );
        }
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{at}");
        let line = sb
            .audit_entries(1000, Some("wf_crash"))
            .unwrap()
            .into_iter()
            .find(|e| e.action_id == second_id)
            .unwrap_or_else(|| panic!("{at}: no line for the registered write"));
        assert_eq!(
            line.status,
            ailab_sandbox_core::audit::AuditStatus::Success,
            "{at}"
        );
        assert_eq!(
            line.after_checksum,
            second["checksum_sha256"].as_str().map(str::to_owned)
        );
        assert!(!line.rollback_available, "{at}");
        assert_eq!(
            line.error.as_deref(),
            Some(ailab_sandbox_core::audit::DONE_WITHOUT_SNAPSHOT)
        );
        assert!(sb.audit_verify().unwrap().ok, "{at}");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        if removed {
            assert_eq!(rb.status, "rolled_back", "{at}: {rb:?}");
            assert_eq!(w.read("a.txt"), b"alpha\n", "{at}");
            assert_eq!(
                w.read("d/b.txt"),
                b"beta\nmore\n",
                "{at}: nothing to roll it back with"
            );
        } else {
            assert_eq!(rb.status, "refused", "{at}: {rb:?}");
            assert!(folder.join("meta.json").exists());
        }
    }
}

/// A rollback that dies while a restore's bytes or mark are written aside leaves
/// temporary files beside a target and in a snapshot folder: the next start removes
/// them, so the tree can be restored exactly.
#[test]
fn a_dead_rollbacks_temporary_files_are_removed() {
    use ailab_sandbox_core::config::Durability;
    use ailab_sandbox_core::confine::root::temp_name;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let (w, c, original) = rollback_killed_at("during_restore", durability);
        // What the dead process would have left (its temporary names carry its seed).
        let beside_target = w.path(&format!("d/{}", temp_name()));
        std::fs::write(&beside_target, b"restoring").unwrap();
        let folder = paths_in(&w.root.join(".rollback"))
            .into_iter()
            .find(|p| p.ends_with("meta.json"))
            .map(|p| std::path::Path::new(&p).parent().unwrap().to_path_buf())
            .unwrap();
        let in_folder = folder.join(temp_name());
        std::fs::write(&in_folder, b"{}").unwrap();
        let sb = w.open(c);
        assert!(!beside_target.exists(), "{durability:?}");
        assert!(!in_folder.exists(), "{durability:?}");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// Two finished actions of a dead run on the same file: only the newer one's result can
/// be on disk, and it is; recovery must keep both, and undo only the unfinished action.
#[test]
fn recovery_keeps_finished_actions_that_share_a_target() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let w = World::new();
        w.write("a.txt", b"zero\n");
        let mut c = w.writable_config();
        c.durability = durability;
        let sb = w.open(c.clone());
        sb.failpoints().arm_crash("before_registry", 3);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sb.run_plan(plan(json!({"workflow_id": "wf_same", "actions": [
                {"intent": "replace_file", "path": "a.txt", "content": "one\n"},
                {"intent": "append_file", "path": "a.txt", "content": "two\n"},
                {"intent": "create_file", "path": "c.txt", "content": "gamma\n"}]})))
        }));
        assert!(outcome.is_err(), "{durability:?}");
        drop(sb);
        let sb = w.open(c);
        assert_eq!(
            w.read("a.txt"),
            b"one\ntwo\n",
            "{durability:?}: {:?}",
            sb.notices()
        );
        let stats = sb.audit_stats().unwrap();
        if durability == Durability::Batched {
            // The third action passed its commit point: finished, not undone.
            assert_eq!(w.read("c.txt"), b"gamma\n");
            assert_eq!((stats.success, stats.rolled_back), (3, 0), "{stats:?}");
        } else {
            assert!(!w.path("c.txt").exists(), "{durability:?}");
            assert_eq!(
                (stats.success, stats.rolled_back),
                (2, 1),
                "{durability:?}: {stats:?}"
            );
        }
        assert!(sb.audit_verify().unwrap().ok);
        let rb = sb.rollback_workflow(
            "wf_same",
            &RollbackOptions {
                action_id: None,
                force: false,
            },
        );
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(w.read("a.txt"), b"zero\n", "{durability:?}");
    }
}

/// Asserts that the start recovered an interrupted rollback by recording one restore.
fn assert_recorded_one_restore(sb: &ailab_sandbox_core::Sandbox, case: &str) {
    assert!(
        sb.notices()
            .iter()
            .any(|n| n.contains("interrupted rollback")
                && n.contains(": 1 restore it made recorded on the audit trail;")),
        "{case}: {:?}",
        sb.notices()
    );
}

/// A rollback killed after a restore but before that step's audit line (before or after
/// its "restored" mark): the next start finds the file restored (it holds the action's
/// `before` checksum, or its snapshot is marked) and records it, so the tree agrees with
/// the audit trail again.
#[test]
fn a_rollback_killed_before_recording_a_restore_is_recorded_at_the_next_start() {
    use ailab_sandbox_core::audit::AuditStatus;
    use ailab_sandbox_core::config::Durability;
    for point in ["after_restore", "after_mark"] {
        for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
            let (w, c, original) = rollback_killed_at(point, durability);
            let case = format!("{point}, {durability:?}");
            assert_eq!(w.read("d/b.txt"), b"beta\n", "{case}: restored, unrecorded");
            let sb = w.open(c);
            assert_recorded_one_restore(&sb, &case);
            assert_eq!(sb.audit_stats().unwrap().rolled_back, 2, "{case}");
            assert!(sb.audit_verify().unwrap().ok);
            let b = sb
                .audit_entries(100, Some("wf_crash"))
                .unwrap()
                .into_iter()
                .find(|e| e.target_path.ends_with("d/b.txt"))
                .unwrap();
            assert_eq!(
                b.status,
                AuditStatus::RolledBack,
                "{case}: newest of d/b.txt"
            );
            assert_eq!(b.after_checksum, Some(sha(b"beta\n")), "{case}");
            let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
            assert_eq!(rb.steps_rolled_back, 1, "{case}: only a.txt was left");
            assert_eq!(w.tree(), original, "{case}");
            drop(sb);
            assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{case}");
        }
    }
}

/// A forced rollback over another workflow's change, killed after a restore and before
/// its audit line: the line the next start writes says what the file held before the
/// restore (it said the action's own result, which another rollback or write had
/// replaced, so the trail claimed content the file never held then).
#[test]
fn a_recorded_restore_says_what_the_file_held_before_it() {
    // Killed after the mark: wf_a's forced rollback put v0 back over wf_b's v2 first,
    // so wf_b's restore replaced v0 (it said wf_b's own v2).
    let (w, sb) = two_writes_to_one_file();
    assert_eq!(
        sb.rollback_workflow("wf_a", &forced()).status,
        "rolled_back"
    );
    let line = forced_rollback_killed_at(&w, sb, "wf_b", "after_mark");
    assert_eq!(w.read("f.txt"), b"v1");
    assert_eq!(line.before_checksum, Some(sha(b"v0")), "{line:?}");
    assert_eq!(line.after_checksum, Some(sha(b"v1")), "{line:?}");
    // Killed before the mark: the trail's last word on the file says what it held
    // (wf_b's v2, which the forced restore overwrote; it said wf_a's own v1).
    let (w, sb) = two_writes_to_one_file();
    let line = forced_rollback_killed_at(&w, sb, "wf_a", "after_restore");
    assert_eq!(w.read("f.txt"), b"v0");
    assert_eq!(line.before_checksum, Some(sha(b"v2")), "{line:?}");
    assert_eq!(line.after_checksum, Some(sha(b"v0")), "{line:?}");
}

/// f.txt holding v0, replaced by wf_a (v1), then wf_b (v2).
fn two_writes_to_one_file() -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    w.write("f.txt", b"v0");
    let sb = w.sandbox();
    for (wf, v) in [("wf_a", "v1"), ("wf_b", "v2")] {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"intent": "replace_file", "path": "f.txt", "content": v}]}),
        );
        assert_eq!(status(&r), "success");
    }
    (w, sb)
}

/// `wf`'s forced rollback killed at `point`'s first hit; the restore line the next start
/// records, its trail verified.
fn forced_rollback_killed_at(
    w: &World,
    sb: ailab_sandbox_core::Sandbox,
    wf: &str,
    point: &str,
) -> ailab_sandbox_core::audit::SandboxAuditEntry {
    sb.failpoints().arm_crash(point, 1);
    let outcome =
        std::panic::catch_unwind(AssertUnwindSafe(|| sb.rollback_workflow(wf, &forced())));
    assert!(outcome.is_err(), "the rollback dies at {point}");
    drop(sb);
    let sb = w.sandbox();
    assert!(sb.audit_verify().unwrap().ok);
    rolled_back_line(&sb, wf)
}

/// The seeded plan run with `on_failure: rollback`, its third action failing at its
/// audit line (and undoing itself: the first restore), the run's rollback killed at
/// `point`'s second hit; the world, and a sandbox started on it since (which recovered
/// it), whose trail verifies and whose d/b.txt is given back.
fn failure_rollback_killed_at(
    point: &str,
    durability: ailab_sandbox_core::config::Durability,
) -> (World, ailab_sandbox_core::Sandbox) {
    let (w, c, _) = seeded(durability);
    let sb = w.open(c.clone());
    sb.failpoints().arm("before_audit", 3);
    sb.failpoints().arm_crash(point, 2);
    let mut p = plan_json();
    p["on_failure"] = json!("rollback");
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(p))));
    assert!(outcome.is_err(), "{point} {durability:?}");
    drop(sb);
    let sb = w.open(c);
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(w.read("d/b.txt"), b"beta\n", "{point} {durability:?}");
    (w, sb)
}

/// A run that fails and rolls itself back, killed between a restore's mark and its audit
/// line: the next start records that restore too, so the audit trail's newest record of
/// every file says what the file holds.
#[test]
fn a_run_killed_while_rolling_back_its_failure_is_recorded_at_the_next_start() {
    use ailab_sandbox_core::audit::AuditStatus;
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        // The run's rollback dies after marking its first step, d/b.txt.
        let (w, sb) = failure_rollback_killed_at("after_mark", durability);
        assert!(!w.path("new/c.txt").exists(), "{durability:?}");
        let entries = sb.audit_entries(100, Some("wf_crash")).unwrap();
        for (file, holds) in [("a.txt", &b"ALPHA\n"[..]), ("d/b.txt", &b"beta\n"[..])] {
            let newest = entries
                .iter()
                .find(|e| e.target_path.ends_with(file) && e.status != AuditStatus::Failed)
                .unwrap();
            assert_eq!(
                newest.after_checksum.as_deref(),
                Some(sha(holds).as_str()),
                "{durability:?}: {file}: {newest:?}"
            );
            assert_eq!(w.read(file), holds, "{durability:?}: {file}");
        }
        let stats = sb.audit_stats().unwrap();
        assert_eq!(
            (stats.success, stats.rolled_back),
            (2, 2),
            "{durability:?}: {stats:?}"
        );
    }
}

/// A run killed while rolling back its failure, after a restore and before its mark:
/// the next start records that restore as replacing what the action left (its line said
/// the file went from the restored bytes to themselves, a gap in the file's record).
#[test]
fn a_failure_rollback_killed_before_its_mark_is_recorded_with_what_it_replaced() {
    use ailab_sandbox_core::audit::AuditStatus;
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let (_w, sb) = failure_rollback_killed_at("after_restore", durability);
        let undo = sb
            .audit_entries(100, Some("wf_crash"))
            .unwrap()
            .into_iter()
            .find(|e| e.target_path.ends_with("d/b.txt") && e.status == AuditStatus::RolledBack)
            .unwrap();
        assert_eq!(
            undo.before_checksum,
            Some(sha(b"beta\nmore\n")),
            "{durability:?}: {undo:?}"
        );
        assert_eq!(undo.after_checksum, Some(sha(b"beta\n")), "{durability:?}");
    }
}

/// A run killed before its write landed, on a file edited by hand since its last
/// audited line: recovery's line says the file held what it holds (the hand edit), not
/// the trail's older word on it (which blamed the runtime for the edit).
#[test]
fn a_run_killed_before_its_write_keeps_what_the_file_held() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_old", "actions": [{"intent": "create_file", "path": "f.txt", "content": "v0"}]}),
    );
    assert_eq!(status(&r), "success");
    w.write("f.txt", b"vU");
    sb.failpoints().arm_crash("before_mutate", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_x", "actions": [
            {"intent": "replace_file", "path": "f.txt", "content": "new"}]})))
    }));
    assert!(outcome.is_err());
    drop(sb);
    let sb = w.sandbox();
    assert_eq!(w.read("f.txt"), b"vU");
    let undo = sb
        .audit_entries(100, Some("wf_x"))
        .unwrap()
        .into_iter()
        .find(|e| e.status == AuditStatus::RolledBack)
        .unwrap();
    assert_eq!(undo.before_checksum, Some(sha(b"vU")), "{undo:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same for directories: a run killed while rolling back its failure, after it
/// removed a `create_directory`'s directory and before recording it, is recorded at the
/// next start (the trail said the directory stood, and a plain rollback was then refused
/// as a conflict with a change nobody made).
#[test]
fn a_run_killed_while_undoing_its_directories_is_recorded_at_the_next_start() {
    use ailab_sandbox_core::audit::AuditStatus;
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let (w, c, original) = seeded(durability);
        let sb = w.open(c.clone());
        // The third action fails at its audit line and undoes itself (the first
        // restore); the run's rollback then dies right after removing k/n2/a/b.
        sb.failpoints().arm("before_audit", 3);
        sb.failpoints().arm_crash("after_restore", 2);
        let p = json!({"workflow_id": "wf_crash", "on_failure": "rollback", "actions": [
            {"action_id": "n1", "intent": "create_directory", "path": "k/n1/a/b"},
            {"action_id": "n2", "intent": "create_directory", "path": "k/n2/a/b"},
            {"action_id": "c", "intent": "create_file", "path": "k/c.txt", "content": "c\n"}]});
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(p))));
        assert!(outcome.is_err(), "{durability:?}");
        drop(sb);
        assert!(
            !w.path("k/n2").exists(),
            "{durability:?}: removed, unrecorded"
        );
        let sb = w.open(c);
        assert!(sb.audit_verify().unwrap().ok);
        let newest = sb
            .audit_entries(100, Some("wf_crash"))
            .unwrap()
            .into_iter()
            .find(|e| e.action_id == "n2")
            .unwrap();
        assert_eq!(newest.status, AuditStatus::RolledBack, "{durability:?}");
        assert!(w.path("k/n1/a/b").is_dir(), "{durability:?}: not reached");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(rb.steps_rolled_back, 1, "{durability:?}: only n1 was left");
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// Something that is not a snapshot folder in the workflow's `.rollback` folder (a stray
/// file here) does not blind recovery: the genuine in-doubt action is still undone and
/// the start says what was left alone. The run is recovered once: a later start does not
/// judge it again (which would undo later changes to its files).
#[test]
fn a_stray_entry_beside_the_snapshots_does_not_blind_recovery() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Relaxed);
    die_before_the_second_record(&w, &c);
    let stray = w.root.join(".rollback/wf_crash/zz");
    std::fs::write(&stray, b"not a snapshot").unwrap();
    let record = || run_record(&w, "wf_crash");
    let sb = w.open(c.clone());
    assert_noticed(&sb, "1 unfinished action rolled back");
    assert_noticed(&sb, "left 1 snapshot folder alone");
    assert_eq!(
        w.read("d/b.txt"),
        b"beta\n",
        "the in-doubt append was undone"
    );
    assert_eq!(w.read("a.txt"), b"ALPHA\n", "the audited replace stays");
    assert_eq!(record()["state"], "idle");
    drop(sb);
    // Someone changes the audited file; the next start leaves it alone.
    w.write("a.txt", b"edited later\n");
    let sb = w.open(c.clone());
    assert!(
        sb.notices().iter().all(|n| !n.contains("recovered")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(w.read("a.txt"), b"edited later\n");
    drop(sb);
    std::fs::remove_file(&stray).unwrap();
    w.write("a.txt", b"ALPHA\n");
    let sb = w.open(c);
    assert!(sb.audit_verify().unwrap().ok);
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// When a workflow's snapshots cannot be read at all, nothing of its dead run is judged:
/// the run stays recorded as unfinished, and the start that can read them recovers it.
#[test]
fn a_run_whose_snapshots_cannot_be_read_is_recovered_later() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Relaxed);
    die_before_the_second_record(&w, &c);
    let put_back = hide_snapshots(&w);
    let record = || run_record(&w, "wf_crash");
    let sb = w.open(c.clone());
    assert_noticed(&sb, "runs again at the next start");
    // Why, in the notice itself.
    assert_noticed(
        &sb,
        "could not be settled now (its snapshots could not be read (",
    );
    assert_eq!(record()["state"], "active");
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "not judged yet");
    drop(sb);
    put_back();
    let sb = w.open(c);
    assert_noticed(&sb, "1 unfinished action rolled back");
    assert_eq!(w.read("d/b.txt"), b"beta\n");
    assert_eq!(record()["state"], "idle");
}

/// What someone may leave at a dead run's target before the next start, which the runtime
/// never looks through: a second hard link to the file, or a symbolic link where its
/// folder was. Returns the closure that takes it away again.
fn interfere_at(w: &World, rel: &str, how: &str) -> Box<dyn FnOnce()> {
    let file = w.path(rel);
    let outside = w.tmp.path().join("interference");
    if how == "hard link" {
        std::fs::hard_link(&file, &outside).unwrap();
        return Box::new(move || std::fs::remove_file(outside).unwrap());
    }
    let folder = file.parent().unwrap().to_path_buf();
    let aside = w.tmp.path().join("folder-aside");
    std::fs::rename(&folder, &aside).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, &folder).unwrap();
    Box::new(move || {
        std::fs::remove_file(&folder).unwrap();
        std::fs::rename(aside, folder).unwrap();
    })
}

/// A dead run's target that the runtime may not look at when recovery comes is not
/// judged: any verdict would be a guess (the run's write had landed, yet recovery audited
/// it rolled back, registered nothing and left it in place, and a forced rollback was
/// refused as already done). The run waits, its record active, the notice and a new run
/// of the workflow naming the path and why; once the path is put back, the next start
/// recovers it.
#[test]
fn a_run_whose_target_cannot_be_looked_at_waits_until_it_can() {
    for how in ["hard link", "symlinked folder"] {
        let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
        die_before_the_second_record(&w, &c);
        let put_back = interfere_at(&w, "d/b.txt", how);
        let sb = w.open(c.clone());
        assert_noticed(&sb, "neither finished nor undone: 'd");
        assert_eq!(run_record(&w, "wf_crash")["state"], "active", "{how}");
        let r = run(&sb, plan_json());
        assert_eq!(status(&r), "blocked", "{how}: {r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{how}");
        assert!(
            r.actions[0]
                .reason
                .as_deref()
                .is_some_and(|why| why.contains("cannot be judged yet: 'd")),
            "{how}: {r:?}"
        );
        drop(sb);
        put_back();
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{how}: untouched");
        let sb = w.open(c);
        assert_noticed(&sb, "1 unfinished action rolled back");
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{how}");
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{how}");
        let rb = sb.rollback_workflow("wf_crash", &forced());
        assert_eq!(rb.status, "rolled_back", "{how}: {rb:?}");
        assert_eq!(w.tree(), original, "{how}");
        assert!(sb.audit_verify().unwrap().ok, "{how}");
    }
}

/// Only what the runtime refuses to look at makes recovery wait, and only at a target
/// whose verdict depends on it: a file standing where a dead action's folder was is
/// someone else's change (judged), a second link to an audited action's target does not
/// hold up the undo of an unaudited one, and a second link that is the dead run's own
/// temporary name (a kill between linking a file into place and unlinking the temporary
/// name) is removed like its other temporary files.
#[test]
fn recovery_waits_only_for_what_it_cannot_judge() {
    use ailab_sandbox_core::confine::path::TEMP_MARKER;
    for case in [
        "file for folder",
        "link to an audited target",
        "own temporary link",
        "own temporary link to a snapshot",
    ] {
        let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
        die_before_the_second_record(&w, &c);
        let execution = run_record(&w, "wf_crash")["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let seed = &execution[execution.len() - 8..];
        match case {
            "file for folder" => {
                std::fs::rename(w.path("d"), w.tmp.path().join("d-aside")).unwrap();
                std::fs::write(w.path("d"), b"theirs").unwrap();
            }
            "link to an audited target" => {
                std::fs::hard_link(w.path("a.txt"), w.tmp.path().join("backup")).unwrap();
            }
            "own temporary link" => std::fs::hard_link(
                w.path("d/b.txt"),
                w.path(&format!("d/{TEMP_MARKER}left{seed}")),
            )
            .unwrap(),
            _ => {
                for folder in std::fs::read_dir(w.path(".rollback/wf_crash")).unwrap() {
                    let folder = folder.unwrap().path();
                    std::fs::hard_link(
                        folder.join("meta.json"),
                        folder.join(format!("{TEMP_MARKER}meta{seed}")),
                    )
                    .unwrap();
                }
            }
        }
        let sb = w.open(c.clone());
        assert!(
            sb.notices()
                .iter()
                .all(|n| !n.contains("neither finished nor undone")),
            "{case}: {:?}",
            sb.notices()
        );
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{case}");
        assert!(sb.audit_verify().unwrap().ok, "{case}");
        match case {
            "file for folder" => assert_eq!(w.read("d"), b"theirs", "{case}"),
            "link to an audited target" => {
                assert_eq!(w.read("d/b.txt"), b"beta\n", "{case}: undone");
                assert_eq!(w.read("a.txt"), b"ALPHA\n", "{case}: done");
            }
            _ => {
                assert_eq!(w.read("d/b.txt"), b"beta\n", "{case}: undone");
                assert_eq!(temp_files(&w.root), Vec::<String>::new(), "{case}");
                assert!(
                    sb.notices().iter().all(|n| !n.contains("alone")),
                    "{case}: every snapshot trusted: {:?}",
                    sb.notices()
                );
                if case == "own temporary link" {
                    assert_noticed(&sb, "1 temporary file removed");
                }
            }
        }
    }
}

/// The same for a dead rollback: a step it had restored is recorded only once its target
/// can be looked at (it stayed audited as the run left it, and a plain rollback was then
/// refused as a conflict with the very bytes it had put back).
#[test]
fn a_rollback_whose_target_cannot_be_looked_at_waits_until_it_can() {
    for how in ["hard link", "symlinked folder"] {
        let (w, c, original) = rollback_killed_at(
            "after_restore",
            ailab_sandbox_core::config::Durability::Strict,
        );
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{how}: restored, unrecorded");
        let put_back = interfere_at(&w, "d/b.txt", how);
        let sb = w.open(c.clone());
        assert_noticed(&sb, "neither finished nor undone: 'd");
        drop(sb);
        put_back();
        let sb = w.open(c);
        assert_recorded_one_restore(&sb, how);
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{how}: {rb:?}");
        assert_eq!(rb.steps_rolled_back, 1, "{how}: only a.txt was left");
        assert_eq!(w.tree(), original, "{how}");
        assert_eq!(sb.audit_stats().unwrap().rolled_back, 3, "{how}");
        assert!(sb.audit_verify().unwrap().ok, "{how}");
    }
}

/// A dead run whose recovery finds the audit trail held by another process past the wait
/// is not judged on an empty view of it (which would take its audited actions for
/// unaudited and undo them): the new run of its workflow is refused with `conflict`
/// saying why, nothing is undone, and once the trail is free the next run recovers it.
#[test]
fn a_recovery_that_finds_the_trail_busy_judges_nothing() {
    let (w, mut c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    c.limits.lock_wait_seconds = 1;
    // Opened first: what the dead run audits is new to it, to be read from the trail.
    let sb = w.open(c.clone());
    kill_before_the_second_record(&w.open(c));
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(w.state.join("sandbox_audit.jsonl"))
        .unwrap();
    log.lock().unwrap();
    let r = run(&sb, plan_json());
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{r:?}");
    let why = r.actions[0].reason.as_deref().unwrap();
    assert!(why.contains("cannot be recovered now"), "{why}");
    assert_eq!(
        w.read("a.txt"),
        b"ALPHA\n",
        "the audited first action stands"
    );
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "nothing judged yet");
    log.unlock().unwrap();
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run that dies while the process (or another one) lives on is recovered by the next
/// run or rollback of its workflow, before that one takes the workflow's record over:
/// otherwise the dead run's unfinished write would stay, and no start would find it.
#[test]
fn a_run_that_dies_in_a_live_process_is_recovered_by_the_next_run_of_its_workflow() {
    use ailab_sandbox_core::config::Durability;
    for d in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        let (w, c, original) = seeded(d);
        let sb = w.open(c.clone());
        kill_before_the_second_record(&sb);
        let dead = run_record(&w, "wf_crash")["execution_id"].clone();
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{d:?}: in doubt");
        let r = run(
            &sb,
            json!({"workflow_id": "wf_crash", "actions": [
                {"intent": "create_file", "path": "z.txt", "content": "z\n"}]}),
        );
        assert_eq!(status(&r), "success", "{d:?}: {r:?}");
        // Past its commit point (batched) the dead write is finished, else undone.
        let b: &[u8] = if d == Durability::Batched {
            b"beta\nmore\n"
        } else {
            b"beta\n"
        };
        assert_eq!(w.read("d/b.txt"), b, "{d:?}: the dead run's write judged");
        let judged: Vec<_> = sb
            .audit_log()
            .by_workflow("wf_crash")
            .unwrap()
            .into_iter()
            .filter(|e| e.target_path.ends_with("d/b.txt"))
            .map(|e| e.status)
            .collect();
        let verdict = if d == Durability::Batched {
            ailab_sandbox_core::audit::AuditStatus::Success
        } else {
            ailab_sandbox_core::audit::AuditStatus::RolledBack
        };
        assert_eq!(judged, [verdict], "{d:?}: judged once, and audited");
        assert_eq!(w.read("a.txt"), b"ALPHA\n", "{d:?}: its audited write kept");
        assert_eq!(w.read("z.txt"), b"z\n");
        assert_ne!(run_record(&w, "wf_crash")["execution_id"], dead);
        assert!(sb.audit_verify().unwrap().ok);
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{d:?}: {rb:?}");
        assert_eq!(w.tree(), original, "{d:?}");
        drop(sb);
        let sb = w.open(c);
        assert!(
            !sb.notices().iter().any(|n| n.contains("interrupted")),
            "{d:?}: nothing left for a start to recover: {:?}",
            sb.notices()
        );
    }
}

/// What a rollback would do, asked of a process that lives on after a run of the
/// workflow died in it (a server), recovers that run first, as the rollback would: it
/// listed the run's unfinished action among the rollback's steps, which the rollback then
/// found undone by that recovery.
#[test]
fn what_a_rollback_would_do_counts_the_recovery_of_a_dead_run() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c);
    kill_before_the_second_record(&sb);
    let info = sb.rollback_info("wf_crash").unwrap();
    let pending: Vec<&str> = info
        .actions
        .iter()
        .filter(|a| !a.restored)
        .map(|a| a.action_id.as_str())
        .collect();
    assert_eq!(pending.len(), 1, "only the audited first action: {info:?}");
    let rb = sb.rollback_workflow("wf_crash", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let done: Vec<&str> = rb.steps.iter().map(|s| s.action_id.as_str()).collect();
    assert_eq!(done, pending);
    assert_eq!(w.tree(), original);
}

/// With writing off too, a process that writes nothing more after a failed sync says so
/// in the rollback preview, as the (simulated) rollback refuses: it offered a rollback
/// the POST then refused.
#[test]
fn a_simulating_process_after_a_failed_sync_previews_the_refusal() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let r = run(&w.open(c.clone()), plan_json());
    assert_eq!(status(&r), "success", "{r:?}");
    let mut simulating = c;
    simulating.enable_write = false;
    let sb = w.open(simulating);
    sb.failpoints().arm("audit_sync", 1);
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "s.txt", "content": "s"}]}),
    );
    // The simulation's lines could not be made durable: refused, as a simulation the
    // trail cannot take is (SPEC §4: simulations are audited).
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(
        r.actions[0].reason_code,
        Some(ailab_sandbox_core::ReasonCode::IoError),
        "{r:?}"
    );
    assert_refused_as_previewed(&sb, "wf_crash", ailab_sandbox_core::ReasonCode::IoError);
}

/// A refused plan whose refusal the trail cannot take (its sync fails) runs nothing, and
/// its result says that the trail lacks the refusal, as the log does.
#[test]
fn a_refusal_the_trail_cannot_take_is_said_in_the_result() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c);
    let before = w.tree();
    sb.failpoints().arm("audit_sync", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_probe", "actions": [
            {"intent": "delete_file", "path": "a.txt"},
            {"intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 0).as_deref(), Some("forbidden_intent"), "{r:?}");
    let said = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        said.contains("this refusal's audit line could not be written or made durable"),
        "{said}"
    );
    assert!(
        r.timeline.iter().any(|e| e.event == "audit_failed"),
        "{r:?}"
    );
    assert_eq!(w.tree(), before);
}

/// A failed sync is said (`write_failure`, what `/healthz` asks) even while another
/// thread holds the trail's in-process lock, waiting for another process's file lock.
#[test]
fn a_failed_sync_is_said_while_another_thread_waits_on_the_trail() {
    let (w, mut c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    c.limits.lock_wait_seconds = 2;
    let sb = std::sync::Arc::new(w.open(c.clone()));
    sb.failpoints().arm("audit_sync", 1);
    let r = run(&sb, plan_json());
    assert_ne!(status(&r), "success", "{r:?}");
    assert!(sb.write_failure().is_some());
    // Another process's lines, which the reader below must take the file's lock to read.
    let r = run(
        &w.open(c),
        json!({"workflow_id": "wf_other", "actions": [
            {"intent": "create_file", "path": "o.txt", "content": "o"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let held = TrailHeld::take(&w);
    let reader = std::sync::Arc::clone(&sb);
    let waiting = std::thread::spawn(move || reader.audit_entries(1, None).is_err());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(sb.write_failure().is_some(), "said while the trail is busy");
    assert!(waiting.join().unwrap(), "the reader gave up its wait");
    drop(held);
}

/// A dead run the preview cannot recover (a target it cannot judge yet) makes the preview
/// say so, as the rollback would refuse: it was an error (HTTP 500), not the description.
#[test]
fn a_preview_whose_recovery_must_wait_says_why() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    die_before_the_second_record(&w, &c);
    let put_back = interfere_at(&w, "d/b.txt", "hard link");
    let sb = w.open(c);
    let why =
        assert_refused_as_previewed(&sb, "wf_crash", ailab_sandbox_core::ReasonCode::Conflict);
    assert!(why.contains("cannot be judged yet"), "{why}");
    drop(sb);
    put_back();
}

/// A recovery names its process in the run record so that, should it die, the next
/// recovery removes its temporary files. When it cannot make its result durable, the
/// record stays for a later recovery in another process, and must no longer name this
/// one, which lives on and may have writes under way in the same folders.
#[test]
fn a_recovery_that_cannot_sync_does_not_leave_its_process_named() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Batched);
    let sb = w.open(c.clone());
    kill_before_the_second_record(&sb);
    let dead = run_record(&w, "wf_crash")["execution_id"].clone();
    let next = json!({"workflow_id": "wf_crash", "actions": [
        {"intent": "create_file", "path": "z.txt", "content": "z\n"}]});
    sb.failpoints().arm("recovery_sync", 1);
    let r = run(&sb, next.clone());
    assert_eq!(code(&r, 0), Some("io_error".to_owned()), "{r:?}");
    let rec = run_record(&w, "wf_crash");
    assert_eq!(
        rec["execution_id"], dead,
        "still the dead run's, for a later try"
    );
    assert_eq!(rec["recovered_by"], serde_json::Value::Null, "{rec}");
    let r = run(&sb, next);
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// A start whose recovery cannot make what it did durable keeps the dead run's record,
/// and its notice says so: not "recovered", which a server's state would show as settled.
/// The next start settles it.
#[test]
fn a_start_that_cannot_sync_its_recovery_does_not_say_recovered() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    die_before_the_second_record(&w, &c);
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm("recovery_sync", 1);
    let sb = ailab_sandbox_core::Sandbox::open_armed(
        c.clone(),
        std::sync::Arc::new(w.clock.clone()),
        armed,
    )
    .unwrap();
    assert!(
        sb.notices()
            .iter()
            .all(|n| !n.contains("recovered interrupted run"))
            && sb.notices().iter().any(|n| n.contains(
                "could not be settled now (what its recovery did could not be made durable: "
            ) && n.contains("its record is kept")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(run_record(&w, "wf_crash")["state"], "active");
    drop(sb);
    let sb = w.open(c);
    assert_noticed(&sb, "recovered interrupted run");
    assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// A `batched` rollback whose last sync fails has restored and recorded its files, none
/// of it durable: it says so (`io_error`), not `rolled_back`, which a client would take
/// for done while this process now takes no more changes. Every earlier sync failing
/// fails it too; the next start settles what reached the disk, and a rollback run again
/// gives back the original tree.
#[test]
fn a_rollback_whose_last_sync_fails_is_not_said_rolled_back() {
    let mut last_sync_seen = false;
    for n in 1..=16 {
        let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Batched);
        let sb = w.open(c.clone());
        assert_eq!(status(&run(&sb, plan_json())), "success");
        sb.failpoints().arm("batch_sync", n);
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        if rb.status == "rolled_back" {
            // Past the rollback's last sync: nothing failed.
            assert!(last_sync_seen, "n = {n}: {rb:?}");
            return;
        }
        assert_eq!(
            rb.reason_code,
            Some(ailab_sandbox_core::ReasonCode::IoError),
            "n = {n}: {rb:?}"
        );
        if !rb.steps.is_empty() && rb.steps.iter().all(|s| s.restored) {
            last_sync_seen = true;
            assert!(
                rb.reason.as_deref().is_some_and(|r| r.starts_with(
                    "the files were restored and the rollback recorded, but neither could be made durable: "
                )),
                "n = {n}: {rb:?}"
            );
        }
        drop(sb);
        let sb = w.open(c);
        let again = sb.rollback_workflow("wf_crash", &forced());
        assert!(
            again.status == "rolled_back"
                || again.reason_code == Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
            "n = {n}: {again:?}"
        );
        assert_eq!(w.tree(), original, "n = {n}");
        assert!(sb.audit_verify().unwrap().ok, "n = {n}");
    }
    panic!("the rollback never went through");
}

/// Another process that starts while a run is under way may find the run's record
/// unreadable (caught while being written, say). The run holds its workflow's lock, so
/// the record is its own and stays: removed, a `kill -9` of the run would leave its
/// in-doubt write for no recovery to find.
#[test]
fn a_start_leaves_the_record_of_a_live_run_alone() {
    let w = World::new();
    let c = w.writable_config();
    let sb = w.open(c.clone());
    let record = w.state.join("inflight/wf_live.json");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (seen2, record2) = (seen.clone(), record.clone());
    sb.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let held = std::fs::read(&record2).unwrap();
            std::fs::write(&record2, b"").unwrap();
            drop(ailab_sandbox_core::Sandbox::open(c.clone()).unwrap());
            *seen2.lock().unwrap() = Some(record2.exists());
            if record2.exists() {
                std::fs::write(&record2, held).unwrap();
            }
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_live", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    assert_eq!(
        *seen.lock().unwrap(),
        Some(true),
        "the live run's record was removed"
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(run_record(&w, "wf_live")["state"], "idle");
}

/// When the dead run cannot be judged (its snapshots cannot be read), a new run of its
/// workflow is refused, naming it, rather than taking its record over; once they can be
/// read again the next run recovers it first.
#[test]
fn a_new_run_waits_for_a_dead_run_that_cannot_be_recovered_yet() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Relaxed);
    let sb = w.open(c);
    kill_before_the_second_record(&sb);
    let dead = run_record(&w, "wf_crash")["execution_id"].clone();
    let put_back = hide_snapshots(&w);
    let next = json!({"workflow_id": "wf_crash", "actions": [
        {"intent": "create_file", "path": "z.txt", "content": "z\n"}]});
    let r = run(&sb, next.clone());
    assert_eq!(status(&r), "blocked", "{r:?}");
    // A file stands where the snapshot store was: named as such, not as a disk failure.
    assert_eq!(code(&r, 0).as_deref(), Some("reserved_path"));
    let reason = r.actions[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("interrupted run") && reason.contains(dead.as_str().unwrap()),
        "{reason}"
    );
    assert!(!w.path("z.txt").exists());
    assert_eq!(run_record(&w, "wf_crash")["execution_id"], dead);
    let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(run_record(&w, "wf_crash")["execution_id"], dead);

    put_back();
    assert_eq!(status(&run(&sb, next)), "success");
    assert_eq!(w.read("d/b.txt"), b"beta\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A `batched` run that ended is marked finished at once, although its record waits for
/// a sync point to be idle: a run of the workflow in another live process does not take
/// it for dead, and so does not undo its write when someone else changed the file since.
/// (The write creates a directory, so it has no commit record to be finished from.)
#[test]
fn a_finished_batched_run_in_a_live_process_is_left_alone() {
    let w = World::new();
    let first = w.open(batched(&w));
    // Open before the run: a start recovers every record whose workflow is free.
    let second = w.open(batched(&w));
    let r = run(
        &first,
        json!({"workflow_id": "wf_commit", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "n/a.txt", "content": "A\n"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(run_record(&w, "wf_commit")["finished"], true);
    let r = run(
        &second,
        json!({"workflow_id": "wf_other", "actions": [
            {"intent": "replace_file", "path": "n/a.txt", "content": "OTHER\n"}]}),
    );
    assert_eq!(status(&r), "success");
    let r = run(
        &second,
        json!({"workflow_id": "wf_commit", "actions": [
            {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "b\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(
        w.read("n/a.txt"),
        b"OTHER\n",
        "the finished run is not judged"
    );
    drop(first);
    drop(second);
    assert_eq!(run_record(&w, "wf_commit")["state"], "idle");
}

/// A start recovers every record whose workflow is free, which includes a `batched` run
/// that ended in a process still running (its record waits for a sync point). A write
/// such a run reported done, whose file someone changed since, is left as it is: only a
/// target back at what it held before the write is taken for a lost write.
#[test]
fn a_start_keeps_later_changes_to_what_a_finished_run_wrote() {
    for d in [
        ailab_sandbox_core::config::Durability::Batched,
        ailab_sandbox_core::config::Durability::Strict,
    ] {
        let w = World::new();
        let mut c = w.writable_config();
        c.durability = d;
        let sb = w.open(c.clone());
        let r = run(
            &sb,
            json!({"workflow_id": "wf_one", "actions": [
                {"intent": "create_file", "path": "n/a.txt", "content": "A\n"},
                {"intent": "create_file", "path": "n/b.txt", "content": "B\n"}]}),
        );
        assert_eq!(status(&r), "success");
        if d == ailab_sandbox_core::config::Durability::Strict {
            // A strict run marks its record idle as it ends: make it one that died
            // after its writes.
            let rec = json!({"state": "active", "execution_id": r.execution_id, "workflow_id": "wf_one", "started_at": "2026-01-01T00:00:00Z"});
            ailab_sandbox_core::confine::state::StateDir::open(&w.state)
                .unwrap()
                .inflight_write("wf_one", rec.to_string().as_bytes(), false)
                .unwrap();
        }
        let r = run(
            &sb,
            json!({"workflow_id": "wf_two", "actions": [
                {"intent": "replace_file", "path": "n/a.txt", "content": "TWO\n"}]}),
        );
        assert_eq!(status(&r), "success");
        let other = w.open(c);
        assert_eq!(w.read("n/a.txt"), b"TWO\n", "{d:?}");
        assert_eq!(w.read("n/b.txt"), b"B\n", "{d:?}");
        assert!(other.audit_verify().unwrap().ok);
    }
}

/// A dead run's audited `create_directory` stays: a new directory is not "back to what
/// it held before" (nothing), whatever durability, at the next start or in a live process.
#[test]
fn a_dead_runs_audited_directory_stays() {
    use ailab_sandbox_core::config::Durability;
    for d in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        for live in [false, true] {
            let (w, c, _) = seeded(d);
            let sb = w.open(c.clone());
            sb.failpoints().arm_crash("before_audit", 2);
            let plan_json = json!({"workflow_id": "wf_dir", "actions": [
                {"action_id": "a1", "intent": "create_directory", "path": "newdir"},
                {"action_id": "a2", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]});
            let outcome =
                std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json.clone()))));
            assert!(outcome.is_err());
            let sb = if live {
                let r = run(
                    &sb,
                    json!({"workflow_id": "wf_dir", "actions": [
                        {"action_id": "a3", "intent": "create_file", "path": "z.txt", "content": "z"}]}),
                );
                assert_eq!(status(&r), "success", "{r:?}");
                sb
            } else {
                drop(sb);
                w.open(c)
            };
            assert!(
                w.path("newdir").is_dir(),
                "{d:?} live={live} {:?} {:?}",
                sb.notices(),
                sb.audit_log()
                    .by_workflow("wf_dir")
                    .unwrap()
                    .iter()
                    .map(|e| (e.action_id.clone(), e.status, e.after_checksum.clone()))
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                action_statuses(&sb, "wf_dir", "a1"),
                [ailab_sandbox_core::audit::AuditStatus::Success],
                "{d:?} live={live}"
            );
        }
    }
}

/// A dead run's unaudited write is undone only while its target holds what the action
/// wrote (or still what it held before): a file another workflow wrote or created there
/// after the run died is theirs, and recovery leaves it, at the next start or in a live
/// process.
#[test]
fn recovery_leaves_what_others_wrote_after_the_run_died() {
    use ailab_sandbox_core::config::Durability;
    for d in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        for live in [false, true] {
            let (w, c, _) = seeded(d);
            let sb = w.open(c.clone());
            // Dies before the second action's audit line (its write is made), or before
            // the third action's write (`new/c.txt` never written).
            kill_before_the_second_record(&sb);
            let other = run(
                &sb,
                json!({"workflow_id": "wf_other", "actions": [
                    {"intent": "replace_file", "path": "d/b.txt", "content": "OTHER\n"}]}),
            );
            assert_eq!(status(&other), "success", "{other:?}");
            let sb = if live {
                let r = run(
                    &sb,
                    json!({"workflow_id": "wf_crash", "actions": [
                        {"intent": "create_file", "path": "z.txt", "content": "z"}]}),
                );
                assert_eq!(status(&r), "success", "{r:?}");
                sb
            } else {
                drop(sb);
                w.open(c.clone())
            };
            assert_eq!(w.read("d/b.txt"), b"OTHER\n", "{d:?} live={live}");
            assert!(sb.audit_verify().unwrap().ok);
        }
        let (w, c, _) = seeded(d);
        let sb = w.open(c.clone());
        sb.failpoints().arm_crash("before_mutate", 3);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
        assert!(outcome.is_err());
        let other = run(
            &sb,
            json!({"workflow_id": "wf_other", "actions": [
                {"intent": "create_file", "path": "new/c.txt", "content": "theirs\n"}]}),
        );
        assert_eq!(status(&other), "success", "{other:?}");
        drop(sb);
        let _sb = w.open(c);
        assert_eq!(w.read("new/c.txt"), b"theirs\n", "{d:?}");
    }
}

/// A failed sync of the audit log (an I/O error of the disk) fails the action, which is
/// undone. The process then writes nothing more — no
/// later sync could vouch for the pages the kernel failed to write — and its run record
/// stays active, so that the next start checks the run against the disk.
#[test]
fn after_a_failed_log_sync_the_process_writes_nothing_more() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c.clone());
    sb.failpoints().arm("audit_sync", 1);
    let r = run(&sb, plan_json());
    assert_ne!(status(&r), "success", "{r:?}");
    assert_eq!(w.tree(), original);
    assert_eq!(run_record(&w, "wf_crash")["state"], "active");
    let other = json!({"workflow_id": "wf_other", "actions": [
        {"intent": "create_file", "path": "z.txt", "content": "z"}]});
    let r = serde_json::to_value(run(&sb, other.clone())).unwrap();
    assert_eq!(r["actions"][0]["reason_code"], "io_error", "{r}");
    let reason = r["actions"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("an earlier sync failed"), "{reason}");
    assert!(!w.path("z.txt").exists());
    // Refused, and the preview says the same (it offered the rollback the POST refused).
    assert_refused_as_previewed(&sb, "wf_crash", ailab_sandbox_core::ReasonCode::IoError);
    drop(sb);
    let sb = w.open(c);
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(w.tree(), original);
    // The success line whose sync failed may have reached the disk: recovery then
    // records the action's undoing after it, so the trail ends saying what the file holds.
    let entries = sb.audit_entries(100, Some("wf_crash")).unwrap();
    let newest = |id: &str| entries.iter().find(|e| e.action_id == id).map(|e| e.status);
    for e in &entries {
        assert_ne!(
            newest(&e.action_id),
            Some(ailab_sandbox_core::audit::AuditStatus::Success),
            "{entries:?}"
        );
    }
    assert_eq!(status(&run(&sb, other)), "success");
    assert_eq!(w.read("z.txt"), b"z");
}

/// A run dies with an action unaudited, and another run (a process that lives on) writes
/// the same file before recovery: the dead run's locks went with it. Recovery never puts
/// the dead action over that later write. It records the action as what it was: done
/// (written, as the later write's starting point or its registry line shows) or undone
/// (it never reached the file). The trail verifies, and rolling both workflows back gives
/// the original file.
#[test]
fn recovery_never_puts_a_dead_action_over_a_later_write() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Strict, Durability::Batched] {
        for (point, landed) in [
            ("before_mutate", false),
            ("after_mutate", true),
            ("before_registry", true),
            ("before_audit", true),
        ] {
            let case = format!("{durability:?} {point}");
            let w = World::new();
            w.write("a.txt", b"alpha\n");
            let original = w.tree();
            let mut c = w.writable_config();
            c.durability = durability;
            let sb = overtaken(
                &w,
                &c,
                point,
                ("replace_file", "DEAD\n"),
                ("append_file", "live\n"),
            );
            let expected: &[u8] = if landed {
                b"DEAD\nlive\n"
            } else {
                b"alpha\nlive\n"
            };
            assert_eq!(w.read("a.txt"), expected, "{case}: the later write is kept");
            let verified = sb.audit_verify().unwrap();
            assert!(verified.ok, "{case}: {verified:?}");
            let trail = sb.audit_entries(10, Some("wf_dead")).unwrap();
            let statuses: Vec<_> = trail.iter().map(|e| format!("{:?}", e.status)).collect();
            let want = if landed { "Success" } else { "RolledBack" };
            assert_eq!(statuses, [want], "{case}: {trail:?}");
            // A write that landed and died before its registry line has no artifact, and
            // its line says so (`audit verify` then expects none); a commit record's
            // (batched) is registered by recovery, and one that reached the registry is.
            let registered = sb.artifacts(10, Some("wf_dead")).unwrap();
            let unregistered = landed
                && durability == Durability::Strict
                && matches!(point, "after_mutate" | "before_registry");
            assert_eq!(
                registered.len(),
                usize::from(landed && !unregistered),
                "{case}"
            );
            assert_eq!(
                trail[0].error.as_deref(),
                unregistered.then_some(ailab_sandbox_core::audit::UNREGISTERED_DONE),
                "{case}"
            );
            assert!(temp_files(&w.root).is_empty(), "{case}");
            let force = forced();
            let rb = sb.rollback_workflow("wf_live", &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
            let rb = sb.rollback_workflow("wf_dead", &force);
            if landed {
                assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
            } else {
                assert!(
                    rb.reason
                        .as_deref()
                        .unwrap_or_default()
                        .contains("already rolled back"),
                    "{case}: {rb:?}"
                );
            }
            assert_eq!(w.tree(), original, "{case}");
            assert!(sb.audit_verify().unwrap().ok, "{case}");
        }
    }
}

/// Runs `wf_m` (two creations) so that its second action fails and the audit line of
/// the `nth` restore that undoes it cannot be appended: 1 the failed action's own undo
/// (which the plan's rollback of the action before it then records first), 2 that
/// rollback's.
fn lose_restore_line(sb: &ailab_sandbox_core::Sandbox, nth: u32) {
    sb.failpoints().arm("after_mutate", 2);
    sb.failpoints().arm("after_mark", nth);
    let r = run(
        sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
}

/// A failed run undoes its actions; when the audit line of a restore cannot be appended
/// (a full disk), the restore's mark is on disk and the run's record stays active, so
/// the next run of the workflow audits the restore from its mark: the trail's newest
/// record of each file says what it holds.
#[test]
fn a_restore_whose_audit_line_was_lost_is_audited_by_the_next_run() {
    // The plan's rollback of an earlier action too: its record was marked idle, and the
    // trail said for good that the action's file stood.
    for nth in [1, 2] {
        a_restore_line_lost_then_audited(nth);
    }
}

fn a_restore_line_lost_then_audited(nth: u32) {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    let sb = w.sandbox();
    lose_restore_line(&sb, nth);
    assert!(!w.path("one.txt").exists() && !w.path("two.txt").exists());
    let undone = |sb: &ailab_sandbox_core::Sandbox| {
        let mut ids = rolled_back_ids(sb, "wf_m");
        ids.sort();
        ids
    };
    if nth == 1 {
        // The failed action's own restore line is recorded by the plan's undo, first.
        assert_eq!(undone(&sb), ["a1", "a2"]);
        let lines = sb.audit_entries(50, Some("wf_m")).unwrap();
        let order: Vec<_> = lines
            .iter()
            .rev()
            .filter(|e| e.status == AuditStatus::RolledBack)
            .map(|e| e.action_id.as_str())
            .collect();
        assert_eq!(order, ["a2", "a1"], "{lines:?}");
        assert_eq!(run_record(&w, "wf_m")["state"], "idle");
    } else {
        assert_eq!(undone(&sb).len(), 1, "one restore's line was lost");
        assert_eq!(run_record(&w, "wf_m")["state"], "restores_unaudited");
    }
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a3", "intent": "create_file", "path": "three.txt", "content": "3"}]}),
    );
    assert_eq!(status(&r), "success", "{nth}: {r:?}");
    assert_eq!(undone(&sb), ["a1", "a2"], "{nth}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback whose trail refuses a restore's line (a full disk) holds back the lines of
/// the restores after it, and the next start writes them all in the order the restores
/// were made: the trail's newest line of a file restored twice says what the file holds.
#[test]
fn a_rollback_holds_back_the_lines_after_one_the_trail_refused() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    w.write("a.txt", b"original");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
            {"action_id": "r1", "intent": "replace_file", "path": "a.txt", "content": "replaced"},
            {"action_id": "t1", "intent": "sandbox_transform", "path": "a.txt",
             "edits": [{"old": "replaced", "new": "transformed"}]}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("after_mark", 1);
    let rb = sb.rollback_workflow("wf_o", &RollbackOptions::default());
    assert!(!rb.is_success(), "{rb:?}");
    assert!(
        rb.steps
            .iter()
            .all(|s| s.restored && s.unrecorded.is_some()),
        "{rb:?}"
    );
    assert_eq!(w.read("a.txt"), b"original");
    drop(sb);
    let sb = w.sandbox();
    let newest = sb
        .audit_entries(50, Some("wf_o"))
        .unwrap()
        .into_iter()
        .filter(|e| e.status == AuditStatus::RolledBack)
        .max_by_key(|e| e.seq)
        .unwrap();
    assert_eq!(newest.action_id, "r1");
    assert_eq!(
        newest.after_checksum.as_deref(),
        Some(sha(b"original").as_str())
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// `a.txt` replaced by workflow `wf_o`, whose rollback is to find the trail refusing
/// its line.
fn replaced_for_a_refused_rollback(w: &World) -> ailab_sandbox_core::Sandbox {
    w.write("a.txt", b"original");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
            {"action_id": "r1", "intent": "replace_file", "path": "a.txt", "content": "replaced"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("after_mark", 1);
    sb
}

type Line = (
    String,
    ailab_sandbox_core::audit::AuditStatus,
    Option<String>,
);

fn lines_of_a(sb: &ailab_sandbox_core::Sandbox) -> Vec<Line> {
    let mut lines: Vec<_> = sb
        .audit_entries(50, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.target_path.ends_with("/a.txt"))
        .collect();
    lines.sort_by_key(|e| e.seq);
    lines
        .into_iter()
        .map(|e| (e.workflow_id, e.status, e.after_checksum))
        .collect()
}

/// What the trail says of `a.txt` once `wf_o`'s rollback and then `wf_p`'s write of
/// "other" are recorded in the order they were made.
fn replaced_restored_then_other() -> Vec<Line> {
    use ailab_sandbox_core::audit::AuditStatus;
    vec![
        (
            "wf_o".to_owned(),
            AuditStatus::Success,
            Some(sha(b"replaced")),
        ),
        (
            "wf_o".to_owned(),
            AuditStatus::RolledBack,
            Some(sha(b"original")),
        ),
        ("wf_p".to_owned(), AuditStatus::Success, Some(sha(b"other"))),
    ]
}

fn write_other(sb: &ailab_sandbox_core::Sandbox) {
    let r = run(
        sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"action_id": "p1", "intent": "replace_file", "path": "a.txt", "content": "other"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

fn assert_held(rb: &ailab_sandbox_core::sandbox::RollbackReport) {
    assert!(
        rb.steps
            .iter()
            .all(|s| s.restored && s.unrecorded.is_some()),
        "{rb:?}"
    );
}

/// Restores whose lines the trail refused are recorded before another workflow's next
/// change in the same process: recorded at their own workflow's next use, they followed
/// that change's line, and the trail's newest line of the file named what the rollback
/// had replaced.
#[test]
fn restores_the_trail_refused_are_recorded_before_another_workflows_change() {
    let w = World::new();
    let sb = replaced_for_a_refused_rollback(&w);
    assert_held(&sb.rollback_workflow("wf_o", &RollbackOptions::default()));
    assert_eq!(w.read("a.txt"), b"original");
    write_other(&sb);
    assert_eq!(lines_of_a(&sb), replaced_restored_then_other());
    // The workflow's own next use finds nothing left to record.
    let again = sb.rollback_workflow("wf_o", &RollbackOptions::default());
    assert_eq!(
        again.reason_code,
        Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
        "{again:?}"
    );
    assert_eq!(lines_of_a(&sb), replaced_restored_then_other());
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same for a change that waited for the file's lock while the rollback held it:
/// the rollback lets its workflow go before the files, and the change, once it holds its
/// file, records the restores the trail refused meanwhile before its own line.
#[test]
fn restores_the_trail_refused_are_recorded_before_a_change_that_waited_for_them() {
    let w = World::new();
    let sb = replaced_for_a_refused_rollback(&w);
    let (restoring, wait) = std::sync::mpsc::channel::<()>();
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || {
            restoring.send(()).unwrap();
            // Time for the other writer to reach the file's lock; reached later, it finds
            // the restores held by then, and the test passes all the same.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }),
    );
    std::thread::scope(|s| {
        let sb = &sb;
        let writer = s.spawn(move || {
            wait.recv().unwrap();
            write_other(sb);
        });
        assert_held(&sb.rollback_workflow("wf_o", &RollbackOptions::default()));
        writer.join().unwrap();
    });
    assert_eq!(w.read("a.txt"), b"other");
    assert_eq!(lines_of_a(&sb), replaced_restored_then_other());
    assert!(sb.audit_verify().unwrap().ok);
}

/// Holds the audit trail's lock as another process of the runtime would (a stopped
/// one, say) until the guard is dropped.
struct TrailHeld(std::fs::File);

impl TrailHeld {
    fn take(w: &World) -> Self {
        Self::at(&w.state)
    }

    fn at(state: &std::path::Path) -> Self {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(state.join("sandbox_audit.jsonl"))
            .unwrap();
        log.lock().unwrap();
        Self(log)
    }
}

impl Drop for TrailHeld {
    fn drop(&mut self) {
        self.0.unlock().unwrap();
    }
}

/// `w`'s sandbox waiting 1 s for a held log.
fn waiting_a_second(w: &World) -> ailab_sandbox_core::Sandbox {
    let mut c = w.writable_config();
    c.limits.lock_wait_seconds = 1;
    w.open(c)
}

/// While the trail cannot take the restores a rollback held back, a change of another
/// workflow is refused (`conflict`, naming whose restores wait) rather than made: even a
/// second rollback of the same file, whose own lines would then be recorded in the wrong
/// order (they were recorded by workflow name, the trail's newest line naming a version
/// the file no longer held). Once the trail is free, the next change records them first.
#[test]
fn no_change_passes_restores_the_trail_could_not_take() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    w.write("a.txt", b"original");
    let sb = waiting_a_second(&w);
    for (wf, content) in [("wf_z", "first"), ("wf_a", "second")] {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [
                {"action_id": "x", "intent": "replace_file", "path": "a.txt", "content": content}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    let held = TrailHeld::take(&w);
    assert_held(&sb.rollback_workflow("wf_a", &RollbackOptions::default()));
    assert_eq!(w.read("a.txt"), b"first");
    let refused = sb.rollback_workflow("wf_z", &RollbackOptions::default());
    assert_eq!(refused.status, "refused", "{refused:?}");
    assert_eq!(
        refused.reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict)
    );
    let why = refused.reason.unwrap_or_default();
    assert!(
        why.contains("restores made by workflow wf_a could not be recorded on the audit trail first: another process held the trail"),
        "{why}"
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [
            {"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"));
    assert_eq!(w.read("a.txt"), b"first", "nothing changed meanwhile");
    assert!(!w.path("b.txt").exists());
    drop(held);
    let rb = sb.rollback_workflow("wf_z", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("a.txt"), b"original");
    let lines: Vec<_> = lines_of_a(&sb)
        .into_iter()
        .filter(|(_, s, _)| *s != AuditStatus::Blocked)
        .collect();
    let line = |wf: &str, status, bytes: &[u8]| (wf.to_owned(), status, Some(sha(bytes)));
    assert_eq!(
        lines,
        [
            line("wf_z", AuditStatus::Success, b"first"),
            line("wf_a", AuditStatus::Success, b"second"),
            line("wf_a", AuditStatus::RolledBack, b"first"),
            line("wf_z", AuditStatus::RolledBack, b"original"),
        ]
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// Threads of one process take turns to record held restores, and one waits for its
/// turn as for a lock: a change that finds another thread recording them past
/// `limits.lock_wait_seconds` is refused `conflict` (it waited behind each thread in
/// line, each up to twice the wait, the last many times the wait).
#[test]
fn a_change_waits_for_another_threads_recording_no_longer_than_a_lock() {
    use std::sync::{Arc, Mutex};
    let w = World::new();
    w.write("a.txt", b"original");
    let sb = Arc::new(waiting_a_second(&w));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
            {"intent": "replace_file", "path": "a.txt", "content": "replaced"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("after_mark", 1);
    assert_held(&sb.rollback_workflow("wf_o", &RollbackOptions::default()));
    // While this thread records them, another thread's change comes, and is answered
    // before this thread goes on.
    let answered = Arc::new(Mutex::new(None));
    let (other, got) = (sb.clone(), answered.clone());
    sb.failpoints().interleave(
        "record_held",
        Arc::new(move || {
            let sb = other.clone();
            let change = std::thread::spawn(move || {
                run(
                    &sb,
                    json!({"workflow_id": "wf_q", "actions": [
                        {"intent": "create_file", "path": "q.txt", "content": "q"}]}),
                )
            });
            for _ in 0..600 {
                if change.is_finished() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if change.is_finished() {
                *got.lock().unwrap() = Some(change.join().unwrap());
            }
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"intent": "create_file", "path": "p.txt", "content": "p"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let other = answered
        .lock()
        .unwrap()
        .take()
        .expect("the other thread's change was answered while this one recorded");
    assert_eq!(status(&other), "blocked", "{other:?}");
    assert_eq!(code(&other, 0).as_deref(), Some("conflict"));
    let why = other.actions[0].reason.clone().unwrap_or_default();
    assert!(
        why.contains("restores made by workflow wf_o could not be recorded on the audit trail first: another thread of this process was recording them for longer than limits.lock_wait_seconds"),
        "{why}"
    );
    assert!(!w.path("q.txt").exists());
    assert_eq!(w.read("p.txt"), b"p");
    assert_eq!(run_record(&w, "wf_o")["state"], "idle");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run that fails while the trail is held still undoes itself: its undo waits for no
/// restore held back before it (it was refused, and left the run's earlier writes in
/// place), and its own lines are held back after them, recorded in order once the trail
/// is free.
#[test]
fn a_run_undoes_itself_while_the_trail_is_held() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.lock_wait_seconds = 1;
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    let sb = ailab_sandbox_core::Sandbox::open_armed(
        c,
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        std::sync::Arc::clone(&armed),
    )
    .unwrap();
    // The trail is taken just before the second action's line.
    let slot: std::sync::Arc<std::sync::Mutex<Option<TrailHeld>>> = std::sync::Arc::default();
    let (again, taken, state) = (
        std::sync::Arc::clone(&armed),
        std::sync::Arc::clone(&slot),
        w.state.clone(),
    );
    armed.interleave(
        "before_audit",
        std::sync::Arc::new(move || {
            let (taken, state) = (std::sync::Arc::clone(&taken), state.clone());
            again.interleave(
                "before_audit",
                std::sync::Arc::new(move || {
                    *taken.lock().unwrap() = Some(TrailHeld::at(&state));
                }),
            );
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [
            {"action_id": "b1", "intent": "create_file", "path": "x1.txt", "content": "1"},
            {"action_id": "b2", "intent": "create_file", "path": "x2.txt", "content": "2"}]}),
    );
    assert_eq!(action_status(&r, 1), "failed", "{r:?}");
    assert!(
        !w.path("x1.txt").exists() && !w.path("x2.txt").exists(),
        "undone: {r:?}"
    );
    drop(slot.lock().unwrap().take());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_c", "actions": [
            {"intent": "create_file", "path": "c.txt", "content": "c"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(rolled_back_ids(&sb, "wf_b"), ["b1", "b2"]);
    assert_eq!(run_record(&w, "wf_b")["state"], "idle");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A held restore whose mark cannot be read when the process records the held lines
/// (its snapshot folder moved away for the moment) keeps its rollback's record: the next
/// start records it once the folder is back (the record was closed, nothing recorded, and
/// the trail said for good that the file held what the rollback had replaced).
#[test]
fn a_held_restore_whose_mark_is_away_is_recorded_once_it_is_back() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    let sb = replaced_for_a_refused_rollback(&w);
    assert_held(&sb.rollback_workflow("wf_o", &RollbackOptions::default()));
    let (folder, aside) = (w.path(".rollback/wf_o"), w.tmp.path().join("wf_o.aside"));
    std::fs::rename(&folder, &aside).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(run_record(&w, "wf_o")["state"], "rolling_back");
    std::fs::rename(&aside, &folder).unwrap();
    drop(sb);
    let sb = w.sandbox();
    let restored = lines_of_a(&sb).into_iter().any(|(wf, s, after)| {
        wf == "wf_o" && s == AuditStatus::RolledBack && after == Some(sha(b"original"))
    });
    assert!(restored, "{:?}", lines_of_a(&sb));
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start whose recovery of a dead rollback cannot record its restores (the trail
/// refused them) keeps its record, and records them before the process's first change:
/// that change's line came first, and the trail named a version the file no longer held
/// until the next start.
#[test]
fn restores_a_start_could_not_record_come_before_its_first_change() {
    use ailab_sandbox_core::audit::AuditStatus;
    let (w, c, _) =
        rollback_killed_at("after_mark", ailab_sandbox_core::config::Durability::Strict);
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm("recovery_audit", 1);
    let sb = ailab_sandbox_core::Sandbox::open_armed(
        c,
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        armed,
    )
    .unwrap();
    assert_noticed(&sb, "its record is kept");
    assert_eq!(run_record(&w, "wf_crash")["state"], "rolling_back");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_next", "actions": [
            {"intent": "create_file", "path": "next.txt", "content": "n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let trail = sb.audit_entries(100, None).unwrap();
    let restored = trail
        .iter()
        .filter(|e| e.workflow_id == "wf_crash" && e.status == AuditStatus::RolledBack)
        .map(|e| e.seq)
        .collect::<Vec<_>>();
    let next = trail
        .iter()
        .find(|e| e.workflow_id == "wf_next")
        .map(|e| e.seq)
        .unwrap();
    assert_eq!(restored.len(), 2, "{trail:?}");
    assert!(restored.iter().all(|s| *s < next), "{trail:?}");
    let rec = run_record(&w, "wf_crash");
    assert_eq!(rec["state"], "idle", "{rec}");
    assert!(rec["rollback_recovered_at"].is_string(), "{rec}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start that finds a dead rollback's restore made but cannot mark it, or cannot read
/// its target, keeps the rollback's record (it said "recovered", and no later start recorded that restore:
/// the trail went on naming the workflow's bytes), and the next start records it.
#[test]
fn a_restore_recovery_cannot_mark_or_judge_is_recorded_by_the_next_start() {
    use ailab_sandbox_core::audit::AuditStatus;
    for fails in ["mark_restored", "read_target"] {
        let (w, c, _) = rollback_killed_at(
            "after_restore",
            ailab_sandbox_core::config::Durability::Strict,
        );
        let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
        armed.arm(fails, 1);
        let sb = ailab_sandbox_core::Sandbox::open_armed(
            c.clone(),
            std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
            armed,
        )
        .unwrap();
        assert_noticed(&sb, "its record is kept");
        assert_eq!(
            run_record(&w, "wf_crash")["state"],
            "rolling_back",
            "{fails}"
        );
        drop(sb);
        let sb = w.open(c);
        let restored = sb
            .audit_entries(100, None)
            .unwrap()
            .iter()
            .filter(|e| e.workflow_id == "wf_crash" && e.status == AuditStatus::RolledBack)
            .count();
        assert_eq!(restored, 2, "{fails}: {:?}", sb.notices());
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{fails}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A rollback whose sync of the trail fails after its first step restores nothing
/// after it: the process writes nothing more (as it would have refused to start the
/// rollback), and says so in each step left, rather than restoring files it then says
/// were not restored.
#[test]
fn a_rollback_stops_at_a_failed_sync() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c);
    assert_eq!(status(&run(&sb, plan_json())), "success");
    sb.failpoints().arm("audit_sync", 1);
    let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    let failed_at = rb
        .steps
        .iter()
        .position(|s| !s.restored)
        .unwrap_or_else(|| panic!("a step not restored: {rb:?}"));
    assert!(
        rb.steps[failed_at..].iter().all(|s| !s.restored),
        "{:?}",
        rb.steps
    );
    assert!(
        rb.steps[failed_at + 1..].iter().all(|s| s
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("writes nothing more"))),
        "{:?}",
        rb.steps
    );
    // Not rolled back: the files the later steps would restore hold the workflow's bytes.
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
}

/// Recording the restores a rollback held back reads only their marks: a link on
/// another file of the workflow, which a recovery of a dead run would refuse to judge,
/// does not keep them off the trail.
#[test]
fn held_restores_are_recorded_whatever_the_workflows_other_files_are() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    let sb = waiting_a_second(&w);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "f1.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "f2.txt", "content": "2"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let one = RollbackOptions {
        action_id: Some("a2".to_owned()),
        ..RollbackOptions::default()
    };
    let held = TrailHeld::take(&w);
    assert_held(&sb.rollback_workflow("wf_a", &one));
    drop(held);
    std::fs::hard_link(w.path("f1.txt"), w.path("other.txt")).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [
            {"intent": "create_file", "path": "f2.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let lines: Vec<_> = sb
        .audit_entries(50, None)
        .unwrap()
        .into_iter()
        .rev()
        .filter(|e| e.target_path.ends_with("/f2.txt"))
        .map(|e| (e.workflow_id, e.status))
        .collect();
    assert_eq!(
        lines,
        [
            ("wf_a".to_owned(), AuditStatus::Success),
            ("wf_a".to_owned(), AuditStatus::RolledBack),
            ("wf_b".to_owned(), AuditStatus::Success),
        ]
    );
    assert_eq!(run_record(&w, "wf_a")["state"], "idle");
}

/// Two processes' rollbacks of one file, each killed after its restore's mark: the next
/// start records both in the order their marks were made, not by execution id (a
/// rollback that took its id first may reach the file second, once the other lets it
/// go): the trail's newest line of the file then says what it holds.
#[test]
fn a_start_records_dead_restores_of_one_file_in_the_order_made() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    w.write("a.txt", b"original");
    let sb = w.sandbox();
    for (wf, content) in [("wf_x", "x"), ("wf_y", "y")] {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [
                {"intent": "replace_file", "path": "a.txt", "content": content}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    drop(sb);
    // Both open before either dies, as two processes would be: neither start sees a
    // dead rollback.
    let (first, second) = (w.sandbox(), w.sandbox());
    for (sb, wf, force) in [(first, "wf_y", false), (second, "wf_x", true)] {
        sb.failpoints().arm_crash("after_mark", 1);
        let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sb.rollback_workflow(
                wf,
                &RollbackOptions {
                    force,
                    ..RollbackOptions::default()
                },
            )
        }));
        assert!(died.is_err(), "{wf}'s rollback dies after its mark");
        w.clock.advance(chrono::Duration::seconds(1));
    }
    assert_eq!(w.read("a.txt"), b"original");
    // wf_x's rollback had taken its id before wf_y's.
    let mut rec = run_record(&w, "wf_x");
    let y = run_record(&w, "wf_y")["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(rec["state"], "rolling_back", "{rec}");
    rec["execution_id"] = json!(format!("ex_{}", "0".repeat(32)));
    assert!(rec["execution_id"].as_str().unwrap() < y.as_str());
    ailab_sandbox_core::confine::state::StateDir::open(&w.state)
        .unwrap()
        .inflight_write("wf_x", rec.to_string().as_bytes(), false)
        .unwrap();
    let sb = w.sandbox();
    let lines = lines_of_a(&sb);
    assert_eq!(
        lines,
        [
            ("wf_x".to_owned(), AuditStatus::Success, Some(sha(b"x"))),
            ("wf_y".to_owned(), AuditStatus::Success, Some(sha(b"y"))),
            ("wf_y".to_owned(), AuditStatus::RolledBack, Some(sha(b"x"))),
            (
                "wf_x".to_owned(),
                AuditStatus::RolledBack,
                Some(sha(b"original"))
            ),
        ],
        "{lines:?}"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// Workflow `wf_b`'s `create_file` of `big/blob.txt` killed before its write, its
/// folder made as the action did on its way; returns a sandbox opened before it died
/// (as another process would be).
fn died_making_big_blob(w: &World) -> ailab_sandbox_core::Sandbox {
    let (dead, other) = (w.sandbox(), w.sandbox());
    dead.failpoints().arm_crash("before_mutate", 1);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        run(
            &dead,
            json!({"workflow_id": "wf_b", "actions": [
                {"intent": "create_file", "path": "big/blob.txt", "content": "b"}]}),
        )
    }));
    assert!(died.is_err(), "the run dies before its write");
    drop(dead);
    std::fs::create_dir(w.path("big")).unwrap();
    other
}

/// A run's action that made a folder and died before its file went in, another
/// workflow's file put in that folder since: recovery records the action undone, leaves
/// the folder with the later file in it, and puts it on the ledger, so that the rollback
/// of the later write removes it once empty, as after a live rollback.
#[test]
fn a_folder_a_dead_action_made_goes_with_the_later_file_put_in_it() {
    let w = World::new();
    let other = died_making_big_blob(&w);
    let r = run(
        &other,
        json!({"workflow_id": "wf_a", "actions": [
            {"intent": "create_file", "path": "big/blob.txt", "content": "a"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(other);
    let sb = w.sandbox();
    assert_eq!(w.read("big/blob.txt"), b"a", "the later write stands");
    let rb = sb.rollback_workflow("wf_a", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("big").exists(), "{:?}", w.tree());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run's action that made a folder and died with its temporary file in it, another
/// workflow's write of the same file made and rolled back since: recovery removes the
/// temporary file, then the folder, now empty, rather than leaving it for good on the
/// ledger.
#[test]
fn a_folder_a_superseded_dead_action_made_goes_once_its_temporary_file_is_gone() {
    let w = World::new();
    let other = died_making_big_blob(&w);
    // And its temporary file there (a name of this process's, which the dead run's was).
    let temp = w.path(&format!(
        "big/{}",
        ailab_sandbox_core::confine::root::temp_name()
    ));
    std::fs::write(&temp, b"b").unwrap();
    // The later write's lines timed after the dead action's snapshot, as they would be.
    w.clock.advance(chrono::Duration::seconds(1));
    let r = run(
        &other,
        json!({"workflow_id": "wf_a", "actions": [
            {"intent": "create_file", "path": "big/blob.txt", "content": "a"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = other.rollback_workflow("wf_a", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    drop(other);
    let sb = w.sandbox();
    assert!(!w.path("big").exists(), "{:?}", w.tree());
    let lines: Vec<_> = sb
        .audit_entries(50, Some("wf_b"))
        .unwrap()
        .into_iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(
        lines,
        [ailab_sandbox_core::audit::AuditStatus::RolledBack],
        "the dead action recorded undone"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// A dead run's append recovered as undone under a later writer's line (a line that
/// changed nothing, dated after it) is not taken for the change the file holds: a
/// rollback's conflict names the later writer.
#[test]
fn a_conflict_names_the_write_not_a_recovery_that_changed_nothing() {
    use ailab_sandbox_core::sandbox::ChangedBy;
    let w = World::new();
    w.write("f.txt", b"orig\n");
    let append = |wf: &str, line: &str| {
        json!({"workflow_id": wf, "actions": [
            {"action_id": "a1", "intent": "append_file", "path": "f.txt", "content": line}]})
    };
    assert_eq!(status(&run(&w.sandbox(), append("wf_c", "c\n"))), "success");
    let (dead, other) = (w.sandbox(), w.sandbox());
    dead.failpoints().arm_crash("before_mutate", 1);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| run(&dead, append("wf_d", "d\n"))));
    assert!(died.is_err(), "the run dies before its write");
    drop(dead);
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(status(&run(&other, append("wf_e", "e\n"))), "success");
    drop(other);
    w.clock.advance(chrono::Duration::seconds(1));
    let sb = w.sandbox();
    let rb = sb.rollback_workflow("wf_c", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(
        rb.conflicts[0].changed_by,
        Some(ChangedBy {
            action: "wf_e/a1".to_owned(),
            rollback: false
        }),
        "{rb:?}"
    );
}

/// A run made with its process's clock an hour behind the previous run's (a clock set
/// back between them) dies after its second write, never audited: the next start
/// judges the dead run's actions newest first in the order the run made them, and
/// undoes that write, whatever the ids of the earlier run say.
#[test]
fn a_run_made_after_the_clock_went_back_is_recovered_in_its_own_order() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_k", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "f.txt", "content": "a1"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    ailab_sandbox_core::ids::as_if_clock_behind(Some(std::time::Duration::from_secs(3600)));
    sb.failpoints().arm_crash("after_mutate", 2);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        run(
            &sb,
            json!({"workflow_id": "wf_k", "actions": [
                {"action_id": "b1", "intent": "create_file", "path": "g.txt", "content": "b1"},
                {"action_id": "b2", "intent": "replace_file", "path": "g.txt", "content": "b2"}]}),
        )
    }));
    ailab_sandbox_core::ids::as_if_clock_behind(None);
    assert!(died.is_err(), "the run dies after b2's write");
    assert_eq!(w.read("g.txt"), b"b2");
    drop(sb);
    let sb = w.sandbox();
    assert_eq!(w.read("g.txt"), b"b1", "b2's write undone");
    assert_undone_to(&sb, "wf_k", "b2", b"b1");
}

/// The trail's only line of `action` in `wf` records it rolled back, the file left
/// holding `bytes`, and the trail is sound.
#[track_caller]
fn assert_undone_to(sb: &ailab_sandbox_core::Sandbox, wf: &str, action: &str, bytes: &[u8]) {
    let lines = sb
        .audit_entries(50, Some(wf))
        .unwrap()
        .into_iter()
        .filter(|e| e.action_id == action)
        .map(|e| (e.status, e.after_checksum))
        .collect::<Vec<_>>();
    assert_eq!(
        lines,
        [(
            ailab_sandbox_core::audit::AuditStatus::RolledBack,
            Some(sha(bytes))
        )]
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// The clock set back an hour between two runs of a workflow, the second dying after
/// its write, never audited: the first run's line, timed after the dead write's
/// snapshot, is no later change by another run (none of the workflow can follow a dead
/// run before its recovery), so the start undoes the write.
#[test]
fn an_earlier_run_of_the_workflow_timed_later_is_no_change_since() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_t", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "g.txt", "content": "a1"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    w.clock.advance(chrono::Duration::hours(-1));
    run_killed(
        &sb,
        json!({"workflow_id": "wf_t", "actions": [
            {"action_id": "b2", "intent": "replace_file", "path": "g.txt", "content": "b2"}]}),
        "after_mutate",
        1,
    );
    drop(sb);
    let sb = w.sandbox();
    assert_eq!(w.read("g.txt"), b"a1", "b2's write undone");
    assert_undone_to(&sb, "wf_t", "b2", b"a1");
}

/// A run of `wf_crash` that died, and a recovery of it that died too, leaving a
/// temporary file in the root (returned).
fn died_leaving_a_recovery_temp_file(
    w: &World,
    c: &ailab_sandbox_core::Config,
) -> std::path::PathBuf {
    die_before_the_second_record(w, c);
    let mut rec = run_record(w, "wf_crash");
    rec["recovered_by"] = json!(["00000000000000000000000a0badcafe"]);
    std::fs::write(
        w.state.join("inflight/wf_crash.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    let left = w.path(".ailab-tmp-1111111111111111000000010badcafe");
    std::fs::write(&left, b"restore bytes").unwrap();
    left
}

/// A recovery stopped after it settled the run but before it closed the run's record
/// leaves the next start nothing to do: its notice says an earlier start settled it,
/// not that the run was found settled.
#[test]
fn a_recovery_after_one_that_was_stopped_says_so() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    die_before_the_second_record(&w, &c);
    let mut rec = run_record(&w, "wf_crash");
    let sb = w.open(c.clone());
    assert_noticed(&sb, "1 unfinished action rolled back");
    drop(sb);
    rec["recovered_by"] = json!(["00000000000000000000000a0badcafe"]);
    std::fs::write(
        w.state.join("inflight/wf_crash.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    let sb = w.open(c);
    assert_noticed(
        &sb,
        "no unfinished action was left to undo or finish (an earlier start began recovering it before and did not finish: what it settled, if anything, is on the workflow's lines of the audit trail, not counted here)",
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// A recovery writes temporary files too (a restore's bytes go aside first). One that
/// died names its process in the run record before it starts, so the next recovery of
/// the run removes what it left; another process's temporary files stay.
#[test]
fn temporary_files_of_a_recovery_that_died_are_removed_by_the_next() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let left = died_leaving_a_recovery_temp_file(&w, &c);
    let other = w.path(".ailab-tmp-11111111111111110000000100c0ffee");
    std::fs::write(&other, b"x").unwrap();
    let sb = w.open(c);
    assert_noticed(&sb, "recovered interrupted run");
    assert!(!left.exists(), "left by the recovery that died");
    assert!(
        other.exists(),
        "not made by a process that recovered this run"
    );
    std::fs::remove_file(&other).unwrap();
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// A sandbox over `c` whose start-up recovery meets `errno` at its first removal of a
/// dead process's temporary files.
fn open_refusing_temp_removal(
    c: &ailab_sandbox_core::Config,
    errno: rustix::io::Errno,
) -> ailab_sandbox_core::Sandbox {
    open_refusing_at("remove_dead_temp", c, errno)
}

/// A start whose first step at `point` is refused with `errno`.
fn open_refusing_at(
    point: &str,
    c: &ailab_sandbox_core::Config,
    errno: rustix::io::Errno,
) -> ailab_sandbox_core::Sandbox {
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm_errno(point, 1, errno.raw_os_error());
    ailab_sandbox_core::Sandbox::open_armed(
        c.clone(),
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        armed,
    )
    .unwrap()
}

/// After a start `sb` the disk refused the removal of the dead run's temporary file
/// `left`: the run's record is kept, and the next start removes the file and closes it.
fn kept_until_the_disk_lets_go(
    w: &World,
    c: &ailab_sandbox_core::Config,
    sb: ailab_sandbox_core::Sandbox,
    left: &std::path::Path,
) {
    assert_noticed(&sb, "its record is kept");
    assert!(left.exists(), "the disk refused its removal");
    assert_eq!(run_record(w, "wf_crash")["state"], "active");
    drop(sb);
    let sb = w.open(c.clone());
    assert_noticed(&sb, "recovered interrupted run");
    assert!(!left.exists(), "removed once the disk takes writes");
    assert_eq!(run_record(w, "wf_crash")["state"], "idle");
}

/// A dead run's temporary files that the disk will not let go (the root mounted
/// read-only, failing) keep its record: the start says so, and the first start that finds
/// the disk taking writes again removes them (closed, the record left them in the user's
/// tree for good). A folder that refuses for another cause (another user's) is named and
/// the record closed, as before.
#[test]
fn temporary_files_the_disk_will_not_let_go_keep_the_dead_runs_record() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let left = died_leaving_a_recovery_temp_file(&w, &c);
    let sb = open_refusing_temp_removal(&c, rustix::io::Errno::ROFS);
    assert_noticed(&sb, "could not be settled now (its temporary files in");
    kept_until_the_disk_lets_go(&w, &c, sb, &left);
    // So are a full disk and an interrupted call, which may pass too.
    for errno in [
        rustix::io::Errno::NOSPC,
        rustix::io::Errno::INTR,
        rustix::io::Errno::MFILE,
    ] {
        let left = died_leaving_a_recovery_temp_file(&w, &c);
        let sb = open_refusing_temp_removal(&c, errno);
        kept_until_the_disk_lets_go(&w, &c, sb, &left);
    }
    // The first removal refused stops the rest: a second file of the dead process's
    // in the same folder is left for the start that finds the disk taking writes.
    let left = died_leaving_a_recovery_temp_file(&w, &c);
    let second = w.path(".ailab-tmp-2222222222222222000000020badcafe");
    std::fs::write(&second, b"more restore bytes").unwrap();
    let sb = open_refusing_at("remove_dead_temp_file", &c, rustix::io::Errno::ROFS);
    assert!(second.exists() && left.exists(), "{:?}", sb.notices());
    kept_until_the_disk_lets_go(&w, &c, sb, &left);
    assert!(!second.exists());
    // And a folder the disk would not open to look for them in (they were left there
    // for good, the run said settled).
    let left = died_leaving_a_recovery_temp_file(&w, &c);
    let sb = open_refusing_at("open_dead_temp_folder", &c, rustix::io::Errno::IO);
    assert_noticed(&sb, "could not be looked for");
    kept_until_the_disk_lets_go(&w, &c, sb, &left);
    // Another cause names the folder and closes the record.
    died_leaving_a_recovery_temp_file(&w, &c);
    let sb = open_refusing_temp_removal(&c, rustix::io::Errno::PERM);
    assert_noticed(&sb, "could not remove the dead process's temporary files");
    assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
    drop(sb);
    // A folder this process may write in but not list (a user other than root's) has
    // its files known by name removed (see below); one of a name recovery cannot know,
    // as this planted one, may stay there: the operator is told to look (in whichever
    // folder was refused first), and the record is closed.
    died_leaving_a_recovery_temp_file(&w, &c);
    let sb = open_refusing_temp_removal(&c, rustix::io::Errno::ACCESS);
    told_unlisted(&sb, None);
    assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
    // Refused in whichever folder came first: this one's may have gone all the same.
    let _ = std::fs::remove_file(&left);
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// A dead run's target the disk will not read is no change by anyone: the run is left
/// for a start that can read it (it was judged overwritten by another run, its change
/// left in place for good and its record closed), and that start undoes it.
#[test]
fn a_target_the_disk_will_not_read_leaves_the_dead_run_for_later() {
    for durability in [
        ailab_sandbox_core::config::Durability::Strict,
        ailab_sandbox_core::config::Durability::Batched,
    ] {
        let (w, c, original) = seeded(durability);
        die_before_the_second_record(&w, &c);
        let sb = open_refusing_at("read_target", &c, rustix::io::Errno::IO);
        // Under `batched`, met by the commit log's replay, which keeps the log.
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains("could not be read (") || n.contains("replayed in full")),
            "{:?}",
            sb.notices()
        );
        assert!(
            !sb.notices()
                .iter()
                .any(|n| n.contains("another run or program")),
            "{:?}",
            sb.notices()
        );
        assert_eq!(run_record(&w, "wf_crash")["state"], "active");
        drop(sb);
        let sb = w.open(c.clone());
        assert_noticed(&sb, "recovered interrupted run");
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
        let rb = sb.rollback_workflow("wf_crash", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// The same for the dead process's temporary files in the workflow's snapshot folders,
/// which recovery removes before it reads them: kept for a start the disk lets remove
/// them when it refuses writes, named when another cause does (they used to be passed
/// over in silence, and a snapshot folder holding one kept its action's id used).
#[test]
fn snapshot_temporary_files_the_disk_will_not_let_go_keep_the_dead_runs_record() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let store = w.path(".rollback/wf_crash");
    let plant = || {
        died_leaving_a_recovery_temp_file(&w, &c);
        let folder = std::fs::read_dir(&store)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        // Made by the dead run's own process, the first whose files are removed.
        let execution = run_record(&w, "wf_crash")["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let seed = &execution[execution.len() - 8..];
        let left = folder.join(format!(
            "{}meta{seed}",
            ailab_sandbox_core::confine::path::TEMP_MARKER
        ));
        std::fs::write(&left, b"meta bytes").unwrap();
        left
    };
    let left = plant();
    let sb = open_refusing_at("remove_dead_snapshot_temp", &c, rustix::io::Errno::ROFS);
    assert_noticed(
        &sb,
        &format!(
            "its temporary files in '{}' could not be removed",
            store.display()
        ),
    );
    kept_until_the_disk_lets_go(&w, &c, sb, &left);
    let left = plant();
    let sb = open_refusing_at("remove_dead_snapshot_temp", &c, rustix::io::Errno::ACCESS);
    assert_noticed(
        &sb,
        &format!(
            "could not remove the dead process's temporary files (named .ailab-tmp-…) in '{}' (permission denied)",
            store.display()
        ),
    );
    assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
    assert!(left.exists());
}

/// The proof that a dead action reached its file is the first change another run made
/// to it after the action's snapshot: an older write that happened to start from the
/// same bytes proves nothing.
#[test]
fn an_older_write_from_the_same_bytes_does_not_make_a_dead_action_done() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let c = w.writable_config();
    let live = w.open(c.clone());
    for (wf, content) in [("wf_past", "DEAD\n"), ("wf_past2", "alpha\n")] {
        let r = run(
            &live,
            json!({"workflow_id": wf, "actions": [
                {"intent": "replace_file", "path": "a.txt", "content": content}]}),
        );
        assert_eq!(status(&r), "success");
    }
    w.clock.advance(chrono::Duration::seconds(60));
    let dying = w.open(c.clone());
    dying.failpoints().arm_crash("before_mutate", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        dying.run_plan(plan(json!({"workflow_id": "wf_dead", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "DEAD\n"}]})))
    }));
    assert!(outcome.is_err());
    drop(dying);
    w.clock.advance(chrono::Duration::seconds(60));
    let r = run(
        &live,
        json!({"workflow_id": "wf_live", "actions": [
            {"intent": "append_file", "path": "a.txt", "content": "live\n"}]}),
    );
    assert_eq!(status(&r), "success");
    drop(live);
    let sb = w.open(c);
    assert_eq!(w.read("a.txt"), b"alpha\nlive\n");
    let trail = sb.audit_entries(10, Some("wf_dead")).unwrap();
    let statuses: Vec<_> = trail.iter().map(|e| format!("{:?}", e.status)).collect();
    assert_eq!(statuses, ["RolledBack"], "{trail:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Runs `plan` in a fresh sandbox over `c` armed to crash at `point`; drops it.
fn die_with(w: &World, c: &ailab_sandbox_core::Config, point: &str, p: serde_json::Value) {
    let dying = w.open(c.clone());
    dying.failpoints().arm_crash(point, 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| dying.run_plan(plan(p))));
    assert!(outcome.is_err(), "the run should die");
    drop(dying);
    // Anything written later is timestamped later.
    w.clock.advance(chrono::Duration::seconds(1));
}

/// `wf_dead`'s action `a1` (`dead`: intent and content) on `a.txt` dies at `point`, then
/// a process that was already running writes the file in `wf_live` (`live`); returns the
/// sandbox of the next start, which recovers the dead run.
fn overtaken(
    w: &World,
    c: &ailab_sandbox_core::Config,
    point: &str,
    dead: (&str, &str),
    live: (&str, &str),
) -> ailab_sandbox_core::Sandbox {
    overtaken_by(w, c, c, point, dead, live)
}

/// [`overtaken`], the process that lives on opened with `live_config`.
fn overtaken_by(
    w: &World,
    c: &ailab_sandbox_core::Config,
    live_config: &ailab_sandbox_core::Config,
    point: &str,
    dead: (&str, &str),
    live: (&str, &str),
) -> ailab_sandbox_core::Sandbox {
    let running = w.open(live_config.clone());
    die_with(
        w,
        c,
        point,
        json!({"workflow_id": "wf_dead", "actions": [
            {"action_id": "a1", "intent": dead.0, "path": "a.txt", "content": dead.1}]}),
    );
    let r = run(
        &running,
        json!({"workflow_id": "wf_live", "actions": [
            {"intent": live.0, "path": "a.txt", "content": live.1}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(running);
    w.open(c.clone())
}

/// A run of `wf_dead` (creating `x.txt`) under `c`, batched: the workflow's commit log
/// then exists, and a later commit of the workflow is one log append.
fn dead_workflow_logged(w: &World, c: &ailab_sandbox_core::Config) {
    let first = w.open(c.clone());
    let r = run(
        &first,
        json!({"workflow_id": "wf_dead", "actions": [
            {"intent": "create_file", "path": "x.txt", "content": "x\n"}]}),
    );
    assert_eq!(status(&r), "success");
}

/// A dead action that never landed, whose target another process then wrote: the next
/// start neither puts the dead bytes over that write nor records the action done (no
/// artifact, no success line), and its undo line says it changed nothing (before = after
/// = what the file holds), in run recovery and in the commit-log replay alike: a line
/// with no `before` would read as a change, and a rollback's conflict would name it.
#[test]
fn an_overtaken_dead_write_is_kept_out_and_its_undo_changed_nothing() {
    use ailab_sandbox_core::audit::AuditStatus;
    use ailab_sandbox_core::config::Durability;
    let mut wrong = Vec::new();
    for d in [Durability::Strict, Durability::Relaxed, Durability::Batched] {
        let (w, c) = alpha_world(d);
        if d == Durability::Batched {
            // The dead commit is then a log append, which the log replay judges.
            dead_workflow_logged(&w, &c);
        }
        let sb = overtaken(
            &w,
            &c,
            "before_mutate",
            ("replace_file", "DEAD\n"),
            ("append_file", "live\n"),
        );
        assert_eq!(
            w.read("a.txt"),
            b"alpha\nlive\n",
            "{d:?}: {:?}",
            sb.notices()
        );
        let registered = sb
            .registry()
            .get_by_workflow("wf_dead")
            .unwrap()
            .into_iter()
            .any(|a| a.action_id == "a1");
        let trail = statuses_of(&sb, "wf_dead");
        if registered || trail.contains(&"a1:Success".to_owned()) {
            wrong.push(format!(
                "{d:?}: recorded done: registered {registered}, trail {trail:?}"
            ));
        }
        let undo: Vec<_> = sb
            .audit_entries(50, Some("wf_dead"))
            .unwrap()
            .into_iter()
            .filter(|e| e.action_id == "a1" && e.status == AuditStatus::RolledBack)
            .map(|e| (e.before_checksum, e.after_checksum))
            .collect();
        let now = Some(sha(b"alpha\nlive\n"));
        if undo != [(now.clone(), now)] {
            wrong.push(format!("{d:?}: a1's undo lines {undo:?}"));
        }
        assert!(sb.audit_verify().unwrap().ok, "{d:?}");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A world whose `a.txt` holds `alpha`, written with `durability`.
fn alpha_world(
    durability: ailab_sandbox_core::config::Durability,
) -> (World, ailab_sandbox_core::Config) {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let mut c = w.writable_config();
    c.durability = durability;
    (w, c)
}

/// The process that lives on was given the root through a symlink, so the trail names
/// its write by another path. Recovery must still see that the dead action's result was
/// its starting point (the action landed) and keep its write, not restore the old bytes
/// over it.
#[test]
fn a_later_write_through_another_spelling_of_the_root_is_kept() {
    use ailab_sandbox_core::config::Durability;
    let mut wrong = Vec::new();
    for d in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        let (w, c) = alpha_world(d);
        let link = w.tmp.path().join("link");
        std::os::unix::fs::symlink(w.tmp.path(), &link).unwrap();
        let mut live = c.clone();
        live.roots = vec![link.join("root")];
        let sb = overtaken_by(
            &w,
            &c,
            &live,
            "after_mutate",
            ("replace_file", "DEAD\n"),
            ("append_file", "live\n"),
        );
        let dead = statuses_of(&sb, "wf_dead");
        if w.read("a.txt") != b"DEAD\nlive\n" || dead != ["a1:Success"] {
            wrong.push(format!(
                "{d:?}: a.txt = {:?}; wf_dead {dead:?}, wf_live {:?}",
                String::from_utf8_lossy(&w.read("a.txt")),
                statuses_of(&sb, "wf_live")
            ));
        }
        assert!(sb.audit_verify().unwrap().ok, "{d:?}");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Another run writes the very bytes the dead action would have written (it never
/// landed): recovery must not take them for the dead action's result and restore the
/// old bytes over that audited write.
#[test]
fn a_later_write_of_the_same_bytes_is_kept() {
    use ailab_sandbox_core::config::Durability;
    let mut wrong = Vec::new();
    for d in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        let (w, c) = alpha_world(d);
        let sb = overtaken(
            &w,
            &c,
            "before_mutate",
            ("replace_file", "SAME\n"),
            ("replace_file", "SAME\n"),
        );
        if w.read("a.txt") != b"SAME\n" {
            wrong.push(format!(
                "{d:?}: wf_live's audited write undone, a.txt = {:?}; wf_dead {:?}, wf_live {:?}",
                String::from_utf8_lossy(&w.read("a.txt")),
                statuses_of(&sb, "wf_dead"),
                statuses_of(&sb, "wf_live")
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A run whose restore could not be audited leaves its record for a later recovery in a
/// process that lives on. Another process that starts then records the restore, and
/// must not remove that live process's temporary files beside the run's targets: here
/// the staged bytes of a write it has under way in the same folder.
#[test]
fn recovering_a_run_whose_restores_went_unaudited_spares_writes_under_way() {
    let w = World::new();
    w.write("b.txt", b"beta\n");
    let c = batched(&w);
    let sb = w.open(c.clone());
    // Left by a process that lives on (its own next change would record the restore).
    let lost = w.open(c.clone());
    lose_restore_line(&lost, 2);
    assert_eq!(run_record(&w, "wf_m")["state"], "restores_unaudited");
    // A process goes on with another workflow in the same folder; while its staged
    // bytes wait beside b.txt, another process starts (its start-up recovery).
    let c2 = c.clone();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = std::sync::Arc::clone(&seen);
    let root = w.root.clone();
    sb.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            seen2
                .lock()
                .unwrap()
                .push(format!("before: {:?}", temp_files(&root)));
            let other = ailab_sandbox_core::Sandbox::open(c2.clone()).unwrap();
            seen2
                .lock()
                .unwrap()
                .push(format!("notices: {:?}", other.notices()));
            seen2
                .lock()
                .unwrap()
                .push(format!("after: {:?}", temp_files(&root)));
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_live", "actions": [
            {"intent": "replace_file", "path": "b.txt", "content": "BETA\n"}]}),
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(status(&r), "success", "{r:?}\n{seen:#?}");
    assert_eq!(w.read("b.txt"), b"BETA\n");
    drop(lost);
}

/// A prune that waited for a run's workflow lock may find that run dead: its in-doubt
/// write is judged from its snapshots (undone, or finished) before they go, so no target
/// is left changed without an audit line and nothing of the run stays behind.
#[test]
fn a_prune_recovers_a_run_that_died_while_it_waited() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        let mut c = w.writable_config();
        c.durability = durability;
        let pruner = w.open(c.clone());
        die_with(
            &w,
            &c,
            "before_registry",
            json!({"workflow_id": "wf_dead", "actions": [
                {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "DEAD\n"}]}),
        );
        let first = pruner.prune(std::time::Duration::ZERO).unwrap();
        let done = statuses_of(&pruner, "wf_dead");
        let expected = if w.read("a.txt") == b"DEAD\n" {
            "a1:Success"
        } else {
            assert_eq!(w.read("a.txt"), b"alpha\n", "{durability:?}");
            "a1:RolledBack"
        };
        assert_eq!(
            done,
            [expected],
            "{durability:?}: the trail does not vouch for a.txt"
        );
        assert_eq!(temp_files(&w.root), Vec::<String>::new(), "{durability:?}");
        assert!(pruner.audit_verify().unwrap().ok, "{durability:?}");
        // An undo is audited now, so that prune kept the workflow; a finished write is
        // audited at its own time.
        w.clock.advance(chrono::Duration::seconds(1));
        let second = pruner.prune(std::time::Duration::ZERO).unwrap();
        let pruned = [first.workflows_pruned, second.workflows_pruned].concat();
        assert_eq!(pruned, ["wf_dead"], "{durability:?}");
        drop(pruner);
        let sb = w.open(c);
        assert!(sb.audit_verify().unwrap().ok, "{durability:?}");
        assert_eq!(statuses_of(&sb, "wf_dead"), [expected], "{durability:?}");
    }
}

/// An action whose write fails is undone at once: its failure line, the last word on
/// it, offers no rollback, since its snapshot is already restored.
#[test]
fn a_failed_action_undone_at_once_offers_no_rollback() {
    use ailab_sandbox_core::audit::AuditStatus;
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.sandbox();
    sb.failpoints().arm("after_mutate", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_f", "on_failure": "stop", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
    );
    assert_eq!(status(&r), "failed", "{r:?}");
    assert_eq!(w.read("a.txt"), b"alpha\n");
    assert_eq!(r.actions[0].rollback_path, None, "{r:?}");
    let trail = sb.audit_entries(10, Some("wf_f")).unwrap();
    let failed = trail
        .iter()
        .find(|e| e.status == AuditStatus::Failed)
        .unwrap();
    assert!(!failed.rollback_available, "{failed:?}");
    assert_eq!(failed.rollback_path, None);
}

/// A world of two roots where workflow `wf_r2` died writing `x.txt` into the second
/// (its file written, not yet registered); the second root and the two-root config.
fn died_writing_into_a_second_root() -> (World, std::path::PathBuf, ailab_sandbox_core::Config) {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &w.writable_config());
    die_with(
        &w,
        &both,
        "before_registry",
        json!({"workflow_id": "wf_r2", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "x.txt", "content": "x",
             "root": root2.display().to_string()}]}),
    );
    (w, root2, both)
}

/// A run that died while writing into a second root is left for a start that has that
/// root: one without it can judge none of the run's writes there, so it neither marks
/// the run recovered nor lets a new run of the workflow take its record over.
#[test]
fn a_start_without_a_dead_runs_root_leaves_the_run_to_one_with_it() {
    let (w, root2, both) = died_writing_into_a_second_root();
    assert!(root2.join("x.txt").exists());
    let one = w.open(w.writable_config());
    assert_noticed(&one, "wrote into a root this start is not configured with");
    // Notices reach clients: the root outside this process's roots is not named.
    assert!(
        one.notices()
            .iter()
            .all(|n| !n.contains(&root2.display().to_string())),
        "{:?}",
        one.notices()
    );
    assert_eq!(run_record(&w, "wf_r2")["state"], "active");
    assert_run_blocked_for_a_root_it_lacks(&one, "wf_r2", &root2);
    // A setting to change, not a failing disk (it was `io_error`, HTTP 500).
    let rb = one.rollback_workflow("wf_r2", &RollbackOptions::default());
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::OutsideSandbox),
        "{rb:?}"
    );
    drop(one);
    let sb = w.open(both);
    assert!(!root2.join("x.txt").exists(), "{:?}", sb.notices());
    let trail = statuses_of(&sb, "wf_r2");
    // The blocked run and the refused rollback are on the trail too.
    assert_eq!(trail.len(), 3, "{trail:?}");
    assert_eq!(
        trail[0], "a1:RolledBack",
        "the new run was blocked: {trail:?}"
    );
    assert_eq!(run_record(&w, "wf_r2")["state"], "idle");
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same death, then starts that find that root missing (moved away for a moment):
/// none makes it (made empty, it would be taken for what the run left there, the write
/// for never made and left unrecorded when the folder comes back); each leaves the run,
/// and once the folder is back the next start rolls the unfinished action back.
#[test]
fn a_dead_runs_missing_root_is_not_made_and_the_run_waits_for_it() {
    let (w, root2, both) = died_writing_into_a_second_root();
    let away = w.outside.join("root2-away");
    std::fs::rename(&root2, &away).unwrap();
    for _ in 0..2 {
        let sb = w.open(both.clone());
        assert!(!root2.exists(), "not made: {:?}", sb.notices());
        assert_noticed(&sb, "or skipped (missing, say");
        assert_eq!(run_record(&w, "wf_r2")["state"], "active");
        assert_run_blocked_for_a_root_it_lacks(&sb, "wf_r2", &root2);
    }
    // Nor is it made on the way to a root configured inside it.
    let mut nested = both.clone();
    nested.roots = vec![w.root.clone(), root2.join("sub")];
    drop(w.open(nested));
    assert!(!root2.exists(), "not made as a parent");
    std::fs::rename(&away, &root2).unwrap();
    let sb = w.open(both);
    assert!(!root2.join("x.txt").exists(), "{:?}", sb.notices());
    assert_eq!(statuses_of(&sb, "wf_r2")[0], "a1:RolledBack");
    assert_eq!(run_record(&w, "wf_r2")["state"], "idle");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run record naming a missing root whose run is alive (its workflow's lock held: a
/// process started at the same moment, making that root as it runs) is no dead run's:
/// the root is made, as any missing root.
#[test]
fn a_live_runs_record_does_not_keep_a_missing_root_from_being_made() {
    let (w, root2, both) = died_writing_into_a_second_root();
    std::fs::rename(&root2, w.outside.join("root2-away")).unwrap();
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let live = state.lock_workflow("wf_r2").unwrap();
    let sb = w.open(both);
    assert!(root2.is_dir(), "made: {:?}", sb.notices());
    assert!(
        !sb.notices()
            .iter()
            .any(|n| n.contains("was missing at start")),
        "{:?}",
        sb.notices()
    );
    drop(live);
}

/// A rollback killed just after removing a directory a `create_directory` made, before
/// recording that step: the next start finds the directory gone (as the action found
/// it) and records the step, so the rollback run again finishes without `force`.
#[test]
fn a_rollback_killed_after_removing_a_made_directory_is_recorded_at_the_next_start() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let (w, c, original) = seeded(durability);
        let sb = w.open(c.clone());
        let p = json!({"workflow_id": "wf_dirs", "actions": [
            {"intent": "create_file", "path": "notes/n.txt", "content": "n\n"},
            {"intent": "create_directory", "path": "made/here"}]});
        assert_eq!(status(&run(&sb, p)), "success", "{durability:?}");
        sb.failpoints().arm_crash("after_restore", 1);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sb.rollback_workflow("wf_dirs", &RollbackOptions::default())
        }));
        assert!(outcome.is_err(), "{durability:?}: the rollback dies");
        drop(sb);
        assert!(
            !w.path("made").exists(),
            "{durability:?}: removed, unrecorded"
        );
        let sb = w.open(c);
        assert_recorded_one_restore(&sb, &format!("{durability:?}"));
        assert!(sb.audit_verify().unwrap().ok);
        let rb = sb.rollback_workflow("wf_dirs", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{durability:?}: {rb:?}");
        assert_eq!(
            rb.steps_rolled_back, 1,
            "{durability:?}: only the file was left"
        );
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// A run dies after a create was audited; meanwhile the created file's folder became
/// someone else's file (the folder moved away, the file in it). What is beneath that
/// place cannot be seen, so the audited create stands: recovery records no undo for it,
/// and once the folder is back a rollback removes the file.
#[test]
fn an_audited_write_beneath_a_folder_now_a_file_stands_at_recovery() {
    let w = World::new();
    let c = w.writable_config();
    let sb = w.open(c.clone());
    sb.failpoints().arm_crash("before_mutate", 2);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_swap", "actions": [
            {"action_id": "n0", "intent": "create_file", "path": "d2/sub/new.txt", "content": "n"},
            {"action_id": "a1", "intent": "create_file", "path": "c2.txt", "content": "c"}]})))
    }));
    assert!(outcome.is_err(), "the run should die");
    drop(sb);
    std::fs::rename(w.path("d2"), w.path("d2.moved")).unwrap();
    w.write("d2", b"theirs");
    // Lines about n0 after its success: an undo, failed or done.
    let rolled_back = |sb: &ailab_sandbox_core::Sandbox| {
        sb.audit_entries(20, Some("wf_swap"))
            .unwrap()
            .into_iter()
            .filter(|e| {
                e.action_id == "n0" && e.status != ailab_sandbox_core::audit::AuditStatus::Success
            })
            .count()
    };
    let sb = w.open(c.clone());
    // The unfinished a1 is undone, as always.
    assert!(
        sb.notices()
            .iter()
            .any(|n| n.contains("1 unfinished action rolled back")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(rolled_back(&sb), 0);
    assert_eq!(w.read("d2"), b"theirs");
    drop(sb);
    std::fs::remove_file(w.path("d2")).unwrap();
    std::fs::rename(w.path("d2.moved"), w.path("d2")).unwrap();
    let sb = w.open(c);
    assert_eq!(rolled_back(&sb), 0, "the audited create stands");
    assert_eq!(w.read("d2/sub/new.txt"), b"n");
    let rb = sb.rollback_workflow("wf_swap", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("d2/sub/new.txt").exists());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback that died after a restore and its mark, whose recovery cannot write the
/// restore's audit line (another process holds the trail past the wait; a full state
/// directory alike), keeps its record: once the trail takes lines, the restore is
/// recorded. Closed, the trail would name the workflow's write for good as what the file
/// holds.
#[test]
fn a_dead_rollback_whose_restore_lines_cannot_be_written_is_recovered_later() {
    use ailab_sandbox_core::audit::AuditStatus;
    use rustix::fs::{FlockOperation, flock};
    let (w, mut c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c.clone());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let dying = w.open(c.clone());
    dying.failpoints().arm_crash("after_mark", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        dying.rollback_workflow("wf_r", &RollbackOptions::default())
    }));
    assert!(outcome.is_err(), "the rollback should die");
    drop(dying);
    assert_eq!(w.tree(), original, "restored, not recorded");
    assert_eq!(run_record(&w, "wf_r")["state"], "rolling_back");
    let rolled_back = |sb: &ailab_sandbox_core::Sandbox| {
        sb.audit_entries(50, Some("wf_r"))
            .unwrap()
            .into_iter()
            .filter(|e| e.status == AuditStatus::RolledBack)
            .count()
    };
    assert_eq!(rolled_back(&sb), 0);
    let log = std::fs::File::open(w.state.join("sandbox_audit.jsonl")).unwrap();
    flock(&log, FlockOperation::LockExclusive).unwrap();
    let rb = sb.rollback_workflow("wf_r", &RollbackOptions::default());
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict),
        "{rb:?}"
    );
    assert!(
        rb.reason.as_deref().unwrap().contains(
            "its files were restored, but their restores could not be recorded on the audit trail (another process"
        ),
        "{rb:?}"
    );
    assert_eq!(
        run_record(&w, "wf_r")["state"],
        "rolling_back",
        "kept for a later try: {rb:?}"
    );
    drop(log);
    let rb = sb.rollback_workflow("wf_r", &RollbackOptions::default());
    assert_eq!(rolled_back(&sb), 1, "{rb:?}");
    assert_eq!(w.tree(), original);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A dead run whose unfinished action recovery cannot undo because the disk refuses it
/// (full, read-only: an injected I/O error here) keeps its record, and a later recovery
/// undoes it. Closed, the dead run's write would stand for good, its only line saying
/// that its undo failed.
#[test]
fn a_dead_run_whose_undo_the_disk_refuses_is_undone_by_a_later_recovery() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c);
    kill_before_the_second_record(&sb);
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "in doubt");
    sb.failpoints().arm("during_restore", 1);
    let next = json!({"workflow_id": "wf_crash", "actions": [
        {"intent": "create_file", "path": "z.txt", "content": "z\n"}]});
    let r = run(&sb, next.clone());
    assert_eq!(status(&r), "blocked", "{r:?}");
    let why = r.actions[0].reason.as_deref().unwrap();
    assert!(
        why.contains("an unfinished action could not be undone"),
        "{why}"
    );
    assert_eq!(run_record(&w, "wf_crash")["state"], "active", "kept");
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "not undone yet");
    // Each try would otherwise leave a line: one failure, told at each start, is not
    // written again and again.
    assert_eq!(sb.audit_stats().unwrap().failed, 0);
    let r = run(&sb, next);
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("d/b.txt"), b"beta\n", "undone by the later recovery");
    let rb = sb.rollback_workflow("wf_crash", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A dead run whose unfinished action cannot be undone for a cause that does not pass
/// by itself (its backup damaged) is recorded as recovered, not kept for retries that
/// could never succeed, and the start says which action stays as the dead run left it
/// and what to do.
#[test]
fn a_dead_run_whose_backup_is_damaged_is_told_not_kept() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    die_before_the_second_record(&w, &c);
    let store = w.root.join(".rollback/wf_crash");
    let backup = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path().join("backup"))
        .find(|b| std::fs::read(b).is_ok_and(|bytes| bytes == b"beta\n"))
        .expect("the in-doubt append's backup");
    std::fs::write(&backup, b"BETA\n").unwrap();
    let sb = w.open(c);
    assert!(
        sb.notices()
            .iter()
            .any(|n| n.contains("recovered interrupted run")
                && n.contains(": 1 unfinished action not undone, left as the dead run wrote it (")
                && !n.contains("no unfinished action was left")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(run_record(&w, "wf_crash")["state"], "idle");
    assert_eq!(
        w.read("d/b.txt"),
        b"beta\nmore\n",
        "left as the dead run left it"
    );
}

/// A dead run whose in-doubt snapshot this process may not read (its mode, another
/// user's), or whose target's folder it may not write in when the undo comes, is kept for
/// the operator to put right: closed, no start would ever undo its write. Once access is
/// given back, the next start undoes it.
#[test]
fn a_dead_run_shut_out_of_its_snapshot_or_target_waits_for_access() {
    use std::os::unix::fs::PermissionsExt as _;
    for (what, said) in [
        ("snapshot", "cannot be read by this process"),
        ("target folder", "an unfinished action could not be undone"),
        (
            "target",
            "d/b.txt' could not be read (could not read 'd/b.txt': permission denied",
        ),
    ] {
        let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
        die_before_the_second_record(&w, &c);
        let in_doubt = std::fs::read_dir(w.root.join(".rollback/wf_crash"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|f| std::fs::read(f.join("backup")).is_ok_and(|b| b == b"beta\n"))
            .expect("the in-doubt append's snapshot");
        let (closed, mode) = match what {
            "snapshot" => (in_doubt.join("meta.json"), 0o000),
            "target" => (w.path("d/b.txt"), 0o000),
            _ => (w.path("d"), 0o500),
        };
        let was = std::fs::metadata(&closed).unwrap().permissions().mode();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(mode)).unwrap();
        let notices = without_dac_override(|| w.open(c.clone()).notices().to_vec());
        assert!(
            notices.iter().any(|n| n.contains(said)),
            "{what}: {notices:?}"
        );
        assert_eq!(run_record(&w, "wf_crash")["state"], "active", "{what}");
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{what}: not undone yet");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(was)).unwrap();
        let sb = w.open(c.clone());
        assert_noticed(&sb, "1 unfinished action rolled back");
        assert_eq!(
            w.read("d/b.txt"),
            b"beta\n",
            "{what}: undone once access is back"
        );
        assert_eq!(run_record(&w, "wf_crash")["state"], "idle", "{what}");
        let rb = sb.rollback_workflow("wf_crash", &forced());
        assert_eq!(rb.status, "rolled_back", "{what}: {rb:?}");
        assert_eq!(w.tree(), original, "{what}");
    }
}

/// A dead action that never reached its file (killed after its snapshot) is undone
/// without its backup: the file holds what the action found. A backup damaged since
/// does not make it a failed undo that leaves the file "as the dead run wrote it" and
/// refuses the workflow's rollbacks for good.
#[test]
fn a_dead_action_that_never_reached_its_file_needs_no_backup_to_undo() {
    let (w, c, original) = seeded(ailab_sandbox_core::config::Durability::Strict);
    die_with(
        &w,
        &c,
        "before_mutate",
        json!({"workflow_id": "wf_nr", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "NEW\n"}]}),
    );
    assert_eq!(w.read("a.txt"), b"alpha\n", "never reached");
    std::fs::write(w.root.join(".rollback/wf_nr/a1/backup"), b"damaged").unwrap();
    let sb = w.open(c);
    assert!(
        sb.notices()
            .iter()
            .any(|n| n.contains("recovered interrupted run")
                && n.contains("1 unfinished action rolled back")),
        "{:?}",
        sb.notices()
    );
    assert!(
        !sb.notices().iter().any(|n| n.contains("not undone")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(sb.audit_stats().unwrap().failed, 0);
    assert_eq!(sb.audit_stats().unwrap().rolled_back, 1);
    assert_eq!(w.tree(), original);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A `create_directory` that dies once its folder is made (before its record) is undone
/// by the next start: the folder, and those made on the way, are removed, and the trail
/// says `rolled_back` only of what was done. (A folder has no checksum, as no file had
/// been there: recovery took the action for one that never reached its target.)
#[test]
fn a_folder_made_by_a_dead_create_directory_is_removed_by_recovery() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Strict, Durability::Relaxed, Durability::Batched] {
        let (w, c, original) = seeded(durability);
        let sb = w.open(c.clone());
        sb.failpoints().arm_crash("after_mutate", 1);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sb.run_plan(plan(json!({"workflow_id": "wf_dir", "actions": [
                {"action_id": "a1", "intent": "create_directory", "path": "dd/w/x"}]})))
        }));
        assert!(outcome.is_err(), "{durability:?}: the run should die");
        drop(sb);
        assert!(w.path("dd/w/x").is_dir(), "{durability:?}");
        let sb = w.open(c);
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains("recovered interrupted run") && n.contains("wf_dir")),
            "{durability:?}: {:?}",
            sb.notices()
        );
        assert_eq!(w.tree(), original, "{durability:?}: the folders are gone");
        assert!(sb.audit_verify().unwrap().ok, "{durability:?}");
    }
}

/// `wf_dead`'s `a1` (replace with `dead`) dies at `point` while a process that lives on
/// then writes `a.txt` in each of `later` (workflow, action, content); the next start,
/// a second later (as in life), recovers the dead run and records its write after them.
fn overtaken_by_live_writes(
    w: &World,
    c: &ailab_sandbox_core::Config,
    point: &str,
    dead: &str,
    later: &[(&str, &str, &str)],
) -> ailab_sandbox_core::Sandbox {
    let running = w.open(c.clone());
    die_with(
        w,
        c,
        point,
        json!({"workflow_id": "wf_dead", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": dead}]}),
    );
    for (wf, id, text) in later {
        w.clock.advance(chrono::Duration::seconds(1));
        let r = run(
            &running,
            json!({"workflow_id": wf, "actions": [
                {"action_id": id, "intent": "replace_file", "path": "a.txt", "content": text}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    drop(running);
    w.clock.advance(chrono::Duration::seconds(1));
    w.open(c.clone())
}

/// For `strict` and `batched` and each point a write may die at: `wf_dead`'s write of
/// `dead` overtaken by `later` (see [`overtaken_by_live_writes`]), then `check` on the
/// world and the next start, which says what is wrong, if anything.
fn over_each_crash(
    dead: &str,
    later: &[(&str, &str, &str)],
    check: impl Fn(&World, &ailab_sandbox_core::Sandbox) -> Option<String>,
) {
    use ailab_sandbox_core::config::Durability;
    let mut wrong = Vec::new();
    for d in [Durability::Strict, Durability::Batched] {
        for point in ["after_mutate", "before_registry", "before_audit"] {
            let w = World::new();
            w.write("a.txt", b"alpha\n");
            let mut c = w.writable_config();
            c.durability = d;
            let sb = overtaken_by_live_writes(&w, &c, point, dead, later);
            if let Some(why) = check(&w, &sb) {
                wrong.push(format!("{d:?} {point}: {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A dead write recorded after a later writer's line came before that writer's
/// snapshot: the later writer's own rollback (the file holds just what it left) has
/// nothing to fear from it, and gives the file back the dead run's bytes.
#[test]
fn a_dead_write_recorded_after_a_later_one_is_no_write_back() {
    over_each_crash("DEAD\n", &[("wf_live", "b1", "X\n")], |w, sb| {
        assert_eq!(w.read("a.txt"), b"X\n");
        let rb = sb.rollback_workflow("wf_live", &RollbackOptions::default());
        (rb.status != "rolled_back" || w.read("a.txt") != b"DEAD\n").then(|| format!("{rb:?}"))
    });
}

/// The dead run's write is recorded after the writes of other workflows that came after
/// it (X, then Y, then X again). Its rollback would undo wf_3's write unseen: a conflict,
/// as for any workflow.
#[test]
fn writes_back_over_a_recovered_write_are_a_conflict() {
    let later = [("wf_2", "b1", "Y\n"), ("wf_3", "c1", "X\n")];
    over_each_crash("X\n", &later, |w, sb| {
        assert_eq!(w.read("a.txt"), b"X\n");
        let rb = sb.rollback_workflow("wf_dead", &RollbackOptions::default());
        (rb.status != "refused" || w.read("a.txt") != b"X\n").then(|| {
            format!(
                "file={:?} {rb:?}",
                String::from_utf8_lossy(&w.read("a.txt"))
            )
        })
    });
}

/// The dead run's write recovered after a later write that changed the file: the
/// conflict names that write (`changed_by`), as the trail says who left the bytes.
#[test]
fn a_change_over_a_recovered_write_is_named() {
    over_each_crash("X\n", &[("wf_2", "b1", "Y\n")], |_, sb| {
        let rb = sb.rollback_workflow("wf_dead", &RollbackOptions::default());
        let by = rb.conflicts.first().and_then(|c| c.changed_by.clone());
        (by.as_ref().map(|b| b.action.as_str()) != Some("wf_2/b1")).then(|| format!("{rb:?}"))
    });
}

/// A test arming a misspelt point would pass for the wrong reason: arming one not listed
/// panics, and every point the code passes is listed.
#[test]
fn failure_points_are_the_listed_ones() {
    let armed = std::panic::catch_unwind(|| {
        let w = World::new();
        w.sandbox().failpoints().arm("befor_audit", 1);
    });
    assert_eq!(
        armed.is_err(),
        cfg!(debug_assertions),
        "a misspelt point was armed"
    );
    let mut passed = std::collections::BTreeSet::new();
    let mut todo = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            // Calls are split over lines as rustfmt likes: read without white space.
            let text: String = std::fs::read_to_string(&path)
                .unwrap()
                .split_whitespace()
                .collect();
            for call in ["failpoints.check(\"", "failpoints.hit(\"", "fail_at(\""] {
                for (at, _) in text.match_indices(call) {
                    let rest = &text[at + call.len()..];
                    passed.insert(rest[..rest.find('"').unwrap()].to_owned());
                }
            }
        }
    }
    let listed: std::collections::BTreeSet<String> = ailab_sandbox_core::failpoint::POINTS
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
    assert_eq!(passed, listed);
}

/// A `create_directory` that failed and undid itself with its restore's mark and lines
/// lost (a full state directory and root) leaves a snapshot the trail says nothing of:
/// the workflow rolls back, its directory being gone as before the action, as a file
/// would (it was refused as a directory "changed after the workflow wrote it", for good
/// unless forced). One the trail records as made, then removed by another program, is
/// still a change.
#[test]
fn a_made_directory_the_trail_never_recorded_and_that_is_gone_rolls_back() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    sb.failpoints().arm("before_audit", 1);
    sb.failpoints().arm("after_mark", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_d", "on_failure": "rollback", "actions": [
            {"action_id": "x6", "intent": "create_directory", "path": "nd"}]}),
    );
    assert_ne!(status(&r), "success", "{r:?}");
    assert!(!w.path("nd").exists());
    drop(sb);
    std::fs::remove_file(w.path(".rollback/wf_d/x6/restored.json")).unwrap();
    let sb = w.sandbox();
    assert!(
        sb.audit_entries(50, Some("wf_d"))
            .unwrap()
            .iter()
            .all(|e| e.status != ailab_sandbox_core::audit::AuditStatus::Success),
        "no success line"
    );
    let rb = sb.rollback_workflow("wf_d", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), before);
    assert!(sb.audit_verify().unwrap().ok);
    // Made and recorded, then removed by hand: a change, to force.
    let r = run(
        &sb,
        json!({"workflow_id": "wf_e", "actions": [
            {"action_id": "y1", "intent": "create_directory", "path": "ne"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::remove_dir(w.path("ne")).unwrap();
    let rb = sb.rollback_workflow("wf_e", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict),
        "{rb:?}"
    );
}

/// Runs `plan_json` in `sb` with `on_failure: rollback` and its actions as `edit` leaves
/// them, `sb` armed to die in the plan's own rollback; the process dies without the last
/// sync point that would empty its commit log, and the next start's sandbox is returned.
fn die_in_its_own_rollback(
    w: &World,
    c: ailab_sandbox_core::Config,
    sb: ailab_sandbox_core::Sandbox,
    edit: impl FnOnce(&mut Vec<serde_json::Value>),
) -> ailab_sandbox_core::Sandbox {
    let mut p = plan_json();
    p["on_failure"] = json!("rollback");
    edit(p["actions"].as_array_mut().unwrap());
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(p))));
    assert!(outcome.is_err(), "{:?}", c.durability);
    sb.failpoints().arm("batch_sync", 1);
    drop(sb);
    w.open(c)
}

/// A run that failed, killed while its plan's rollback was under way: the next start
/// records the restores made, redoes none of what they undid (under `batched` the
/// commit log held the undone actions' entries, and a replay put their bytes back), and
/// says what is left for a rollback run again, which restores it all.
#[test]
fn a_failed_run_killed_in_its_own_rollback_is_left_as_a_rollback_cut_short() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Batched, Durability::Strict, Durability::Relaxed] {
        let (w, c, original) = seeded(durability);
        let sb = w.open(c.clone());
        // The fourth action fails before its commit and leaves its target untouched (the
        // first restore); the plan's rollback, newest first, removes new/c.txt, then dies
        // right after restoring d/b.txt, before its mark.
        sb.failpoints().arm("before_commit", 4);
        sb.failpoints().arm_crash("after_restore", 3);
        let sb = die_in_its_own_rollback(&w, c, sb, |a| {
            a.push(json!({"intent": "create_file", "path": "z.txt", "content": "z\n"}))
        });
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{durability:?}");
        assert!(!w.path("new/c.txt").exists(), "{durability:?}");
        assert!(sb.audit_verify().unwrap().ok, "{durability:?}");
        let told = sb.notices().join("\n");
        // Said as the run's own rollback, by the run's id, and of the run's actions.
        let run_id = sb
            .audit_entries(100, Some("wf_crash"))
            .unwrap()
            .into_iter()
            .find(|e| e.target_path.ends_with("new/c.txt"))
            .unwrap()
            .execution_id;
        assert!(
            told.contains(&format!(
                "recovered interrupted on_failure rollback of run {run_id} of workflow wf_crash: "
            )) && told.contains(
                "1 action of the run not rolled back, which a rollback of the workflow restores (with the workflow's other runs)"
            ),
            "{durability:?}: {told}"
        );
        let again = sb.rollback_workflow("wf_crash", &Default::default());
        assert_eq!(again.status, "rolled_back", "{durability:?}: {again:?}");
        assert_eq!(w.tree(), original, "{durability:?}");
    }
}

/// The same when the failed action's own undo failed too (its record stays active, for
/// recovery to check that action): the commit log is emptied before the plan's rollback
/// all the same, so that a start after it dies redoes none of what it undid.
#[test]
fn a_failed_run_whose_undo_failed_killed_in_its_own_rollback_redoes_nothing() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Batched, Durability::Strict, Durability::Relaxed] {
        let (w, c, _) = seeded(durability);
        let sb = w.open(c.clone());
        // The third action (logged: it makes no folder) fails at its audit line, its own
        // undo fails, and the plan's rollback dies right after restoring d/b.txt, before
        // its mark.
        sb.failpoints().arm("before_audit", 3);
        sb.failpoints().arm("during_restore", 1);
        sb.failpoints().arm_crash("after_restore", 1);
        let sb = die_in_its_own_rollback(&w, c, sb, |a| {
            a[2] = json!({"intent": "create_file", "path": "z.txt", "content": "z\n"})
        });
        assert_eq!(w.read("d/b.txt"), b"beta\n", "{durability:?}");
        assert!(sb.audit_verify().unwrap().ok, "{durability:?}");
    }
}

/// A failed run's rollback cut short is judged by the run's own actions: an earlier run
/// of the workflow is neither counted as left to roll back nor recorded as restored
/// (its file removed by hand looked like a restore made).
#[test]
fn a_failed_run_killed_in_its_own_rollback_leaves_earlier_runs_out_of_it() {
    let (w, c, _) = seeded(ailab_sandbox_core::config::Durability::Strict);
    let sb = w.open(c.clone());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_crash", "actions": [
            {"action_id": "e1", "intent": "create_file", "path": "e.txt", "content": "e\n"},
            {"action_id": "e2", "intent": "create_file", "path": "gone.txt", "content": "g\n"}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    std::fs::remove_file(w.path("gone.txt")).unwrap();
    // The fourth action fails before its commit (its undo, the first mark); the plan's
    // rollback dies after marking its last restore (a.txt), before that line.
    sb.failpoints().arm("before_commit", 4);
    sb.failpoints().arm_crash("after_mark", 4);
    let sb = die_in_its_own_rollback(&w, c, sb, |a| {
        a.push(json!({"intent": "create_file", "path": "z.txt", "content": "z\n"}))
    });
    let told = sb.notices().join("\n");
    assert!(!told.contains("not rolled back"), "{told}");
    assert!(told.contains("1 restore it made recorded"), "{told}");
    assert_eq!(w.read("e.txt"), b"e\n");
    let undone = rolled_back_ids(&sb, "wf_crash");
    assert!(!undone.iter().any(|a| a == "e1" || a == "e2"), "{undone:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback killed before its first restore changed anything is said to have restored
/// nothing (it was said to have had every restore "already on the audit trail"); one
/// killed after a restore it recorded itself says that one is on the trail.
#[test]
fn a_rollback_killed_before_any_restore_is_said_to_have_restored_nothing() {
    for (nth, said) in [
        (1, "it had restored nothing"),
        (2, "every restore it made was already on the audit trail"),
    ] {
        let w = wf_k_rollback_killed_at(two_created(), "during_restore", nth);
        assert!(w.path("a.txt").exists(), "restore {nth}");
        assert_eq!(w.path("b.txt").exists(), nth == 1, "restore {nth}");
        let sb = w.open(w.writable_config());
        assert_noticed(&sb, "recovered interrupted rollback");
        assert_noticed(&sb, said);
        let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert!(!w.path("a.txt").exists() && !w.path("b.txt").exists());
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// Workflow `wf_k` of a new world, run with `actions` (each a success), then rolled
/// back with a crash at the `nth` hit of `point`.
fn wf_k_rollback_killed_at(actions: serde_json::Value, point: &str, nth: u32) -> World {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let r = run(&sb, json!({"workflow_id": "wf_k", "actions": actions}));
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm_crash(point, nth);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.rollback_workflow("wf_k", &RollbackOptions::default())
    }));
    assert!(died.is_err(), "the rollback dies at {point} {nth}");
    w
}

/// Two created files, `a.txt` then `b.txt`.
fn two_created() -> serde_json::Value {
    json!([
        {"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "alpha\n"},
        {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "beta\n"}])
}

/// A snapshot whose metadata a power cut emptied before the sync point that was to make
/// it durable (its name kept, its bytes lost) is of an action that never touched its
/// target: the next start removes it as unfinished, and the workflow rolls back. It
/// stayed, "damaged", and refused every rollback of the workflow, forced too. So when
/// the same cut tore the run's new record to nothing: the start that removes the record
/// removes such folders with it (one stayed, and refused every rollback and prune).
#[test]
fn a_snapshot_whose_metadata_a_power_cut_emptied_is_removed_as_unfinished() {
    for torn_record in [false, true] {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        let original = w.tree();
        let sb = w.open(w.writable_config());
        run_killed(
            &sb,
            json!({"workflow_id": "wf_e", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "b.txt", "content": "beta\n"},
                {"action_id": "a2", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
            "before_mutate",
            2,
        );
        drop(sb);
        let mut emptied = vec![w.path(".rollback/wf_e/a2/meta.json")];
        if torn_record {
            emptied.push(w.state.join("inflight/wf_e.json"));
        }
        for path in emptied {
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(0).unwrap();
        }
        let sb = w.open(w.writable_config());
        assert_noticed(
            &sb,
            if torn_record {
                "1 snapshot folder its run never finished removed"
            } else {
                "recovered interrupted run"
            },
        );
        assert!(!w.path(".rollback/wf_e/a2").exists(), "{:?}", sb.notices());
        assert_eq!(w.read("a.txt"), b"alpha\n");
        let rb = sb.rollback_workflow("wf_e", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{torn_record}: {rb:?}");
        assert_eq!(w.tree(), original);
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A rollback killed after it removed a created file and before it removed the folders
/// the file's action made on the way: the start records the restore and removes the
/// folders left empty, as the restore would have, and says so (it did so silently).
#[test]
fn a_rollback_killed_before_removing_made_folders_has_them_removed_and_said() {
    let w = wf_k_rollback_killed_at(
        json!([{"action_id": "a1", "intent": "create_file", "path": "d1/d2/x.txt", "content": "x\n"}]),
        "restore_verify",
        1,
    );
    assert!(!w.path("d1/d2/x.txt").exists());
    assert!(w.path("d1/d2").is_dir(), "the folders are still there");
    let sb = w.open(w.writable_config());
    assert_noticed(
        &sb,
        "1 restore it made recorded on the audit trail, and 2 folders the restored actions had made on the way removed",
    );
    assert!(!w.path("d1").exists());
    assert!(w.tree().is_empty(), "{:?}", w.tree());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start after one that began recovering a dead rollback and did not finish says so,
/// as it does for a run: the restores that start recorded are on the trail, and "already
/// on the audit trail" alone would credit the rollback with lines it never wrote.
#[test]
fn a_rollback_recovery_after_one_that_was_stopped_says_so() {
    let w = wf_k_rollback_killed_at(two_created(), "during_restore", 2);
    let mut rec = run_record(&w, "wf_k");
    rec["recovered_by"] = json!(["00000000000000000000000a0badcafe"]);
    std::fs::write(
        w.state.join("inflight/wf_k.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    let sb = w.open(w.writable_config());
    assert_noticed(
        &sb,
        "every restore it made was already on the audit trail (an earlier start began recovering it before and did not finish: what it settled, if anything, is on the workflow's lines of the audit trail, not counted here); ",
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback killed before it reached a step: a file someone changed while the process
/// was down to what that step's action found (a created file removed) is theirs, not a
/// restore the rollback made (it was recorded as one, the trail crediting the runtime
/// with the removal). After a crash of the machine the record, whose step under way is
/// not synced, may be older than the last step: a start in a later boot judges by the
/// file, as before.
#[test]
fn a_file_changed_by_hand_after_a_killed_rollback_is_not_taken_for_its_restore() {
    for earlier_boot in [false, true] {
        let w = wf_k_rollback_killed_at(two_created(), "during_restore", 1);
        // The rollback died on b.txt's restore (newest first), before a.txt's began.
        assert_eq!(w.read("b.txt"), b"beta\n");
        std::fs::remove_file(w.path("a.txt")).unwrap();
        if earlier_boot {
            from_an_earlier_boot(&w, "wf_k");
        }
        let sb = w.open(w.writable_config());
        assert_noticed(&sb, "recovered interrupted rollback");
        let undone = rolled_back_ids(&sb, "wf_k");
        let told = sb.notices().join("\n");
        if earlier_boot {
            assert_eq!(undone, ["a1"], "{told}");
            assert!(told.contains("1 restore it made recorded"), "{told}");
        } else {
            assert!(undone.is_empty(), "{undone:?} {told}");
            assert!(told.contains("it had restored nothing"), "{told}");
            assert!(
                told.contains("2 actions of the workflow not rolled back"),
                "{told}"
            );
        }
        assert_eq!(w.read("b.txt"), b"beta\n", "earlier boot: {earlier_boot}");
        // Run again, the rollback sees the removal for someone's change, and is told
        // so; forced, it finishes.
        let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
        if earlier_boot {
            assert_eq!(rb.status, "rolled_back", "{rb:?}");
        } else {
            assert_eq!(rb.status, "refused", "{rb:?}");
            assert_eq!(
                rb.reason_code,
                Some(ailab_sandbox_core::ReasonCode::Conflict),
                "{rb:?}"
            );
            assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
            assert_eq!(rb.conflicts[0].action_id, "a1", "{rb:?}");
            let forced = RollbackOptions {
                force: true,
                ..RollbackOptions::default()
            };
            let rb = sb.rollback_workflow("wf_k", &forced);
            assert_eq!(rb.status, "rolled_back", "{rb:?}");
        }
        assert!(!w.path("a.txt").exists() && !w.path("b.txt").exists());
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// The action ids of the workflow's `rolled_back` trail lines, newest first.
fn rolled_back_ids(sb: &ailab_sandbox_core::Sandbox, wf: &str) -> Vec<String> {
    sb.audit_entries(100, Some(wf))
        .unwrap()
        .into_iter()
        .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
        .map(|e| e.action_id)
        .collect()
}

/// A rollback whose record cannot be read back restores nothing: the record names each
/// step before its file is touched, and a step made unnamed, were the process to die
/// before its mark, would be taken by the next start for someone's change.
#[test]
fn a_rollback_that_cannot_read_its_record_restores_nothing() {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_k", "actions": two_created()}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("open_rollback_record", 1);
    let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::IoError),
        "{rb:?}"
    );
    let why = rb.reason.unwrap_or_default();
    assert!(
        why.contains("could not read the rollback's record"),
        "{why}"
    );
    assert_eq!(w.read("a.txt"), b"alpha\n");
    assert_eq!(w.read("b.txt"), b"beta\n");
    let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("a.txt").exists() && !w.path("b.txt").exists());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A plan of one write (u1, `d/a.txt` of workflow `wf_u`) whose sync after its success
/// line will fail (the second sync point under `batched`): its run then undoes an action
/// the trail calls done.
fn undone_after_its_line(sb: &ailab_sandbox_core::Sandbox) -> serde_json::Value {
    sb.failpoints().arm("batch_sync", 2);
    json!({"workflow_id": "wf_u", "actions": [
        {"action_id": "u1", "intent": "create_file", "path": "d/a.txt", "content": "alpha\n"}]})
}

/// A failed action whose run's record cannot be read is not undone, and says so: a
/// restore made unnamed, the process dying before its mark, would be taken by the next
/// start for someone's change, the action's success line left standing over its file
/// removed. Its change stays until a rollback, which then goes through unforced.
#[test]
fn a_failed_actions_undo_that_cannot_name_itself_leaves_its_change() {
    let w = World::new();
    let sb = w.open(batched(&w));
    let p = undone_after_its_line(&sb);
    // Its record cannot be opened then; a death right after an undo's restore, were
    // one made.
    sb.failpoints().arm("open_rollback_record", 1);
    sb.failpoints().arm_crash("after_restore", 1);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sb.run_plan(plan(p))))
        .expect("no restore is made, so none dies after one")
        .unwrap();
    let a = &r.actions[0];
    assert_eq!(a.status.as_str(), "failed", "{r:?}");
    let why = a.reason.clone().unwrap_or_default();
    assert!(
        why.contains("could not read the rollback's record"),
        "{why}"
    );
    // The sync that failed is named as such, not as the audit append before it.
    assert!(
        why.contains("could not sync to stable storage") && !why.contains("audit log"),
        "{why}"
    );
    assert_eq!(w.read("d/a.txt"), b"alpha\n");
    drop(sb);
    let sb = w.open(batched(&w));
    let rb = sb.rollback_workflow("wf_u", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?} {:?}", sb.notices());
    assert!(!w.path("d/a.txt").exists());
    assert_eq!(rolled_back_ids(&sb, "wf_u"), ["u1"]);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run killed after a finished action: the action's file removed by hand while the
/// process was down is someone's change, not the run's undo (it was recorded rolled
/// back, the trail crediting the runtime with the removal). In a later boot the
/// record's step under way may be older than the last: judged by the file, as before.
#[test]
fn a_finished_actions_file_removed_by_hand_after_a_kill_is_not_taken_for_an_undo() {
    for earlier_boot in [false, true] {
        let w = World::new();
        let sb = w.open(w.writable_config());
        run_killed(
            &sb,
            json!({"workflow_id": "wf_k", "actions": two_created()}),
            "before_mutate",
            2,
        );
        drop(sb);
        std::fs::remove_file(w.path("a.txt")).unwrap();
        if earlier_boot {
            from_an_earlier_boot(&w, "wf_k");
        }
        let sb = w.open(w.writable_config());
        let told = sb.notices().join("\n");
        let mut undone = rolled_back_ids(&sb, "wf_k");
        undone.sort();
        // a2, never written, is undone either way.
        if earlier_boot {
            assert_eq!(undone, ["a1", "a2"], "{told}");
            assert!(told.contains("2 unfinished actions rolled back"), "{told}");
        } else {
            assert_eq!(undone, ["a2"], "{told}");
            assert!(told.contains("1 unfinished action rolled back"), "{told}");
        }
        assert!(!w.path("a.txt").exists() && !w.path("b.txt").exists());
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A run killed while undoing an action whose success line it had written (its sync
/// failed) names that action on its record first: the next start in the same boot
/// takes the file put back for the run's own undo and records it, as it did before
/// files found put back were told from someone's change.
#[test]
fn a_run_killed_undoing_an_audited_action_has_the_undo_recorded() {
    let w = World::new();
    let sb = w.open(batched(&w));
    run_killed(&sb, undone_after_its_line(&sb), "after_restore", 1);
    drop(sb);
    assert!(!w.path("d/a.txt").exists());
    let sb = w.open(batched(&w));
    let told = sb.notices().join("\n");
    assert_eq!(rolled_back_ids(&sb, "wf_u"), ["u1"], "{told}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// `sb`'s start, refused the list of `folder` (of any, `None`), says that it could not
/// look there for the dead process's temporary files (not that files could not be
/// removed).
fn told_unlisted(sb: &ailab_sandbox_core::Sandbox, folder: Option<&std::path::Path>) {
    let told = sb.notices().join("\n");
    assert!(!told.contains("could not remove"), "{told}");
    let said = "to look for the dead process's temporary files (permission denied; those whose names it knew are dealt with)";
    assert!(
        told.contains(said)
            && folder
                .is_none_or(|f| told.contains(&format!("may not list '{}' {said}", f.display()))),
        "{told}"
    );
}

/// A batched run that dies between staging a write's new bytes beside its target and
/// the rename leaves them under the name its snapshot records; the next start finishes
/// the write from its commit record, and what still stands under that name goes by the
/// name, also where recovery cannot list the folder to find its dead processes'
/// temporary files (a folder the runtime may write in but not read, as a user other than
/// root; the list is refused here): it stayed there for good, as large as the write.
#[test]
fn staged_bytes_of_a_dead_run_go_where_their_folder_cannot_be_listed() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.open(batched(&w));
    sb.failpoints().arm_crash("before_mutate", 2);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_staged", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
            {"action_id": "a2", "intent": "create_file", "path": "b.txt", "content": "beta\n"}]})))
    }));
    assert!(outcome.is_err());
    drop(sb);
    assert_eq!(temp_files(&w.root).len(), 1, "b.txt's bytes staged");
    let sb = open_refusing_at("remove_dead_temp", &batched(&w), rustix::io::Errno::ACCESS);
    assert_noticed(&sb, "1 action finished, 1 temporary file removed");
    told_unlisted(&sb, Some(&w.root));
    assert!(temp_files(&w.root).is_empty(), "{:?}", sb.notices());
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("b.txt"), b"beta\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A restore writes the file's bytes under a temporary name first, one the next start
/// knows without listing the folder (`action_temp_name`: the action and the restoring
/// process). One a dead rollback left goes, also where the folder cannot be listed (a
/// folder the runtime may write in but not read, as a user other than root; the list
/// is refused here): it stayed there for good, as large as the file.
#[test]
fn a_dead_rollbacks_restore_file_goes_where_its_folder_cannot_be_listed() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    w.write("b.txt", b"beta\n");
    let c = w.writable_config();
    let sb = w.open(c.clone());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_rb", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
            {"action_id": "a2", "intent": "replace_file", "path": "b.txt", "content": "BETA\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm_crash("during_restore", 2);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.rollback_workflow("wf_rb", &RollbackOptions::default())
    }));
    assert!(died.is_err(), "the rollback dies at its second restore");
    drop(sb);
    assert_eq!(w.read("b.txt"), b"beta\n", "restored first, newest first");
    // What the second restore had written aside when it died.
    let seed = ailab_sandbox_core::ids::own_seed();
    let left = w.path(&ailab_sandbox_core::confine::root::action_temp_name(
        "wf_rb", "a1", &seed,
    ));
    std::fs::write(&left, b"alpha\n").unwrap();
    let sb = open_refusing_at("remove_dead_temp", &c, rustix::io::Errno::ACCESS);
    assert_noticed(&sb, "recovered interrupted rollback");
    told_unlisted(&sb, Some(&w.root));
    assert!(!left.exists(), "{:?}", sb.notices());
    let rb = sb.rollback_workflow("wf_rb", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("a.txt"), b"alpha\n");
    assert!(temp_files(&w.root).is_empty());
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same for a write's temporary file (under `relaxed` or `strict`, a write in no
/// commit log): its name is known ahead too, so a run that died with it aside leaves
/// nothing where the folder cannot be listed.
#[test]
fn a_dead_runs_write_file_goes_where_its_folder_cannot_be_listed() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let mut c = w.writable_config();
    c.durability = ailab_sandbox_core::config::Durability::Relaxed;
    let sb = w.open(c.clone());
    sb.failpoints().arm_crash("before_mutate", 1);
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_w", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]})))
    }));
    assert!(died.is_err(), "the run dies at its write");
    drop(sb);
    // What the write had written aside when it died.
    let seed = ailab_sandbox_core::ids::own_seed();
    let left = w.path(&ailab_sandbox_core::confine::root::action_temp_name(
        "wf_w", "a1", &seed,
    ));
    std::fs::write(&left, b"ALPHA\n").unwrap();
    let sb = open_refusing_at("remove_dead_temp", &c, rustix::io::Errno::ACCESS);
    assert_noticed(&sb, "recovered interrupted run");
    told_unlisted(&sb, Some(&w.root));
    assert!(!left.exists(), "{:?}", sb.notices());
    assert_eq!(w.read("a.txt"), b"alpha\n");
    assert!(temp_files(&w.root).is_empty());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A name known ahead can be taken by someone else first (or by a write of this process
/// that could not clean up): the write that needs it takes it back, and succeeds.
#[test]
fn a_file_under_a_writes_known_temporary_name_is_taken_back() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.open(w.writable_config());
    let seed = ailab_sandbox_core::ids::own_seed();
    let name = ailab_sandbox_core::confine::root::action_temp_name("wf_k", "a1", &seed);
    std::fs::write(w.path(&name), b"planted").unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_k", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert!(temp_files(&w.root).is_empty());
    std::fs::write(w.path(&name), b"planted").unwrap();
    let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("a.txt"), b"alpha\n");
    assert!(temp_files(&w.root).is_empty());
}
