//! `batched` durability commits a small file write by appending it to the workflow's
//! commit log and syncing that one file. These tests model a power cut: after a crash,
//! every file goes back to what it was at the last sync point, except the commit log
//! (the only thing synced since). The next start must redo what the log committed.

use crate::support::*;
use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::audit::AuditStatus;
use ailab_sandbox_core::sandbox::RollbackOptions;
use serde_json::json;

type Tree = std::collections::BTreeMap<String, Option<Vec<u8>>>;

fn batched(w: &World) -> ailab_sandbox_core::Config {
    let mut c = w.writable_config();
    c.durability = ailab_sandbox_core::config::Durability::Batched;
    c.limits.writes_per_minute = 1000;
    c
}

/// How many entries a workflow's commit log holds.
fn log_len(w: &World, wf: &str) -> usize {
    match log_file(w, wf) {
        Some(f) => ailab_sandbox_core::commit_log::read(&f).unwrap().len(),
        None => 0,
    }
}

fn log_file(w: &World, wf: &str) -> Option<ailab_sandbox_core::confine::state::CommitLogFile> {
    ailab_sandbox_core::confine::state::StateDir::open(&w.state)
        .unwrap()
        .commit_log_file(wf)
        .unwrap()
}

/// Opens `w` batched with the replay's first write of a target's bytes failing (as on a
/// full or read-only root).
fn open_failing_a_replayed_write(w: &World) -> ailab_sandbox_core::Sandbox {
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm("replay_staged", 1);
    ailab_sandbox_core::Sandbox::open_armed(
        batched(w),
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        armed,
    )
    .unwrap()
}

/// Opens `w` batched with the first step at `point` refused with `errno` (a read-only
/// or failing disk).
fn open_batched_refusing(
    w: &World,
    point: &str,
    errno: rustix::io::Errno,
) -> ailab_sandbox_core::Sandbox {
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm_errno(point, 1, errno.raw_os_error());
    ailab_sandbox_core::Sandbox::open_armed(
        batched(w),
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        armed,
    )
    .unwrap()
}

fn three_writes() -> serde_json::Value {
    json!({"workflow_id": "wf_log", "actions": [
        {"intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
        {"intent": "append_file", "path": "d/b.txt", "content": "more\n"},
        {"intent": "create_file", "path": "c.txt", "content": "gamma\n"}]})
}

/// A workflow's first commit creates its log and makes a sync point (which also makes
/// the new log durable); this one, `seed.txt` in `wf_log`, comes before the sync point a
/// power cut goes back to. Then the sandbox is dropped (another sync point).
fn prime(w: &World) {
    let sb = w.open(batched(w));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "create_file", "path": "seed.txt", "content": "seed\n"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(log_len(w, "wf_log"), 0, "a first commit syncs instead");
}

/// `three_writes` on a seeded world, killed before the third's audit line, then a power
/// cut that keeps only the commit log; returns the world, its tree as seeded (before
/// `prime`, so that a rollback of the whole workflow gives it back) and as primed.
fn three_writes_then_a_power_cut() -> (World, Tree, Tree) {
    power_cut_after(three_writes())
}

/// [`three_writes_then_a_power_cut`] with another plan of three writes.
fn power_cut_after(writes: serde_json::Value) -> (World, Tree, Tree) {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    w.write("d/b.txt", b"beta\n");
    let original = w.tree();
    prime(&w);
    let primed = w.tree();
    let durable = Durable::take(&w);
    let sb = w.open(batched(&w));
    run_killed(&sb, writes, "before_audit", 3);
    // A power cut: no drop, so no last sync point.
    std::mem::forget(sb);
    assert_eq!(log_len(&w, "wf_log"), 3);
    durable.restore_except_commit_logs(&w);
    assert_eq!(w.tree(), primed, "the cut lost every change");
    (w, original, primed)
}

/// Three logged writes, then a power cut before the third's audit line: the snapshots,
/// the new bytes, the registry and audit lines, the run record are all lost; only the
/// commit log remains. The next start (batched, or strict after a change of durability)
/// puts everything back, and a rollback then restores the original tree from the
/// snapshots it rebuilt.
#[test]
fn logged_writes_survive_a_power_cut() {
    use ailab_sandbox_core::config::Durability;
    for reopen in [Durability::Batched, Durability::Strict] {
        let (w, original, _) = three_writes_then_a_power_cut();

        let mut c = batched(&w);
        c.durability = reopen;
        let sb = w.open(c);
        assert!(
            sb.notices()
                .iter()
                .any(|n| n.contains(": 3 actions finished")),
            "{reopen:?}: {:?}",
            sb.notices()
        );
        assert_eq!(w.read("a.txt"), b"ALPHA\n");
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n");
        assert_eq!(w.read("c.txt"), b"gamma\n");
        let stats = sb.audit_stats().unwrap();
        assert_eq!(
            (stats.success, stats.failed),
            (4, 0),
            "{stats:?} (with the seed)"
        );
        assert!(sb.audit_verify().unwrap().ok);
        let registered = sb.registry().get_by_workflow("wf_log").unwrap();
        assert_eq!(registered.len(), 4);
        for (file, bytes) in [("a.txt", &b"ALPHA\n"[..]), ("c.txt", b"gamma\n")] {
            assert!(
                registered
                    .iter()
                    .any(|e| e.path.ends_with(file) && e.checksum_sha256 == sha(bytes)),
                "{file}: {registered:?}"
            );
        }
        assert_eq!(log_len(&w, "wf_log"), 0, "replayed, then emptied");
        let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert_eq!(rb.steps_rolled_back, 4);
        assert_eq!(w.tree(), original, "{reopen:?}");
    }
}

/// A power cut that keeps the names a batched run put in place but not their data (a
/// new file's, say, on a filesystem that delays allocation): each target is the very
/// file the run staged, its modification time as the write left it, emptied. The next
/// start writes the logged bytes in again; they were taken for another program's change
/// and left empty, the trail saying the writes had succeeded. A file another program
/// put in the target's place, or wrote in place (a new modification time), keeps its
/// bytes.
#[test]
fn logged_writes_whose_data_a_power_cut_lost_are_written_again() {
    for by_hand in ["nothing", "replaced", "edited"] {
        let w = World::new();
        w.write("a.txt", b"alpha\n");
        w.write("d/b.txt", b"beta\n");
        let original = w.tree();
        prime(&w);
        let sb = w.open(batched(&w));
        run_killed(&sb, three_writes(), "before_audit", 3);
        std::mem::forget(sb);
        for f in ["a.txt", "d/b.txt", "c.txt"] {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(w.path(f))
                .unwrap();
            let written = file.metadata().unwrap().modified().unwrap();
            file.set_len(0).unwrap();
            file.set_modified(written).unwrap();
        }
        match by_hand {
            // Made while the emptied file still stands: another inode.
            "replaced" => {
                w.write("c.new", b"by hand\n");
                std::fs::rename(w.path("c.new"), w.path("c.txt")).unwrap();
            }
            "edited" => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(w.path("c.txt"))
                    .unwrap();
                let written = file.metadata().unwrap().modified().unwrap();
                std::io::Write::write_all(&mut &file, b"by hand\n").unwrap();
                file.set_modified(written + std::time::Duration::from_secs(1))
                    .unwrap();
            }
            _ => {}
        }
        let sb = w.open(batched(&w));
        assert_eq!(w.read("a.txt"), b"ALPHA\n", "{by_hand}");
        assert_eq!(w.read("d/b.txt"), b"beta\nmore\n", "{by_hand}");
        let c: &[u8] = if by_hand == "nothing" {
            b"gamma\n"
        } else {
            b"by hand\n"
        };
        assert_eq!(w.read("c.txt"), c, "{by_hand}");
        let said = "1 target of its logged writes found changed since by another run or program and left as found ('c.txt')";
        assert_eq!(
            sb.notices().iter().any(|n| n.contains(said)),
            by_hand != "nothing",
            "{by_hand}: {:?}",
            sb.notices()
        );
        assert!(sb.audit_verify().unwrap().ok);
        if by_hand == "nothing" {
            let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "{rb:?}");
            assert_eq!(w.tree(), original);
        }
    }
}

/// A start that dies while it replays a commit log, between writing a target's bytes
/// under a temporary name and renaming them into place, leaves that file; the next
/// start removes it with the dead run's own (it stayed in the root for good: the run's
/// record did not name the replaying process).
#[test]
fn a_replay_that_dies_leaves_no_temporary_file_behind() {
    let (w, original, _) = died_replaying(false);
    let temps = |w: &World| -> Vec<String> {
        w.tree()
            .into_keys()
            .filter(|k| k.rsplit('/').next().unwrap().starts_with(".ailab-tmp"))
            .collect()
    };
    let sb = w.open(batched(&w));
    assert_eq!(temps(&w), Vec::<String>::new());
    assert_noticed(&sb, "1 temporary file removed");
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert!(sb.audit_verify().unwrap().ok);
    let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// [`three_writes_then_a_power_cut`], then a start that dies replaying the log with
/// one write's bytes staged under a temporary name, its process moved to another seed
/// (this process is no dead one); the run's record `active` when asked (a run not
/// finished), else as the replay left it. Gives the world, the tree before the writes
/// and the staged file's path in the root.
fn died_replaying(active: bool) -> (World, Tree, String) {
    died_replaying_after(three_writes(), active)
}

/// [`died_replaying`] after the plan `writes` (of workflow `wf_log`).
fn died_replaying_after(writes: serde_json::Value, active: bool) -> (World, Tree, String) {
    let (w, original, _) = power_cut_after(writes);
    let temps = |w: &World| -> Vec<String> {
        w.tree()
            .into_keys()
            .filter(|k| k.rsplit('/').next().unwrap().starts_with(".ailab-tmp"))
            .collect()
    };
    let armed = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    armed.arm_crash("replay_staged", 1);
    let c = batched(&w);
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ailab_sandbox_core::Sandbox::open_armed(
            c,
            std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
            armed,
        )
    }));
    assert!(died.is_err(), "the replay died");
    let left = temps(&w);
    assert_eq!(left.len(), 1, "{:?}", w.tree().keys());
    // The run's record names the process that made it: the next start, in another
    // process, removes it. That process is this one, which no recovery treats as dead:
    // both names are moved to a process of another seed.
    let seed = ailab_sandbox_core::ids::process_seed(&left[0]).to_owned();
    let record = w.state.join("inflight/wf_log.json");
    let text = std::fs::read_to_string(&record).unwrap();
    let rec: serde_json::Value = serde_json::from_str(text.trim_end_matches('\0')).unwrap();
    let named = rec["recovered_by"].as_array().unwrap();
    assert!(
        named.iter().any(|id| id.as_str().unwrap().ends_with(&seed)),
        "{rec}"
    );
    std::fs::write(&record, text.replace(&seed, "0badcafe")).unwrap();
    std::fs::rename(
        w.path(&left[0]),
        w.path(&left[0].replace(&seed, "0badcafe")),
    )
    .unwrap();
    if active {
        let mut rec = run_record(&w, "wf_log");
        rec["state"] = json!("active");
        std::fs::write(&record, rec.to_string()).unwrap();
    }
    (w, original, left[0].replace(&seed, "0badcafe"))
}

/// A replay stages each entry's bytes under a name known ahead (its action's and its
/// process's): one a dead replay left goes by that name, also from a folder the start
/// may not list (as a user other than root; the list is refused here), where it stayed
/// for good.
#[test]
fn a_dead_replays_staged_bytes_go_where_their_folder_cannot_be_listed() {
    // Every write in the root, the one folder there is to list.
    let (w, _, left) = died_replaying_after(
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
            {"intent": "create_file", "path": "c.txt", "content": "gamma\n"},
            {"intent": "create_file", "path": "e.txt", "content": "epsilon\n"}]}),
        false,
    );
    let sb = open_batched_refusing(&w, "remove_dead_temp", rustix::io::Errno::ACCESS);
    assert!(!w.path(&left).exists(), "{:?}", sb.notices());
    assert_noticed(&sb, &format!("may not list '{}' ", w.root.display()));
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start whose look for a dead replay's temporary files the disk refuses (read-only,
/// failing) names the folder for the operator: only that look (before a replay) finds
/// a replay's staged bytes, so nothing would look again (they were left unsaid, for
/// good). The run's record is closed, or no longer names this process, which lives on
/// (a later recovery would take its files for a dead one's).
#[test]
fn a_dead_replays_files_the_disk_will_not_let_go_are_said() {
    for active in [true, false] {
        let (w, _, left) = died_replaying(active);
        let sb = open_batched_refusing(&w, "remove_dead_temp_file", rustix::io::Errno::ROFS);
        let told = sb.notices().join("\n");
        assert!(
            told.contains(&format!(
                "could not remove the dead process's temporary files (named .ailab-tmp-…) in '{}",
                w.root.display()
            )),
            "{active}: {told}"
        );
        assert!(told.contains("(read-only filesystem"), "{told}");
        assert!(w.path(&left).exists());
        let rec = run_record(&w, "wf_log");
        assert!(
            rec["state"] == "idle"
                || rec["recovered_by"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|id| !ailab_sandbox_core::ids::made_here(id.as_str().unwrap())),
            "{active}: {rec}"
        );
    }
}

/// A run marked finished in an earlier boot of the machine may have lost its writes to
/// the crash that ended that boot: its log is replayed as any other.
#[test]
fn a_run_finished_in_an_earlier_boot_is_replayed() {
    let (w, _, _) = three_writes_then_a_power_cut();
    let mut rec = run_record(&w, "wf_log");
    rec["state"] = json!("active");
    rec["finished"] = json!(true);
    rec["boot"] = json!("an-earlier-boot");
    std::fs::write(w.state.join("inflight/wf_log.json"), rec.to_string()).unwrap();
    let sb = w.open(batched(&w));
    assert_noticed(&sb, ": 3 actions finished");
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(log_len(&w, "wf_log"), 0);
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same cut, with the log's last entry torn: that write never committed, so it is
/// not redone, and the two before it are.
#[test]
fn a_torn_last_entry_is_not_redone() {
    let (w, _, _) = three_writes_then_a_power_cut();
    // The last entry's final bytes never reached the disk.
    let log = log_file(&w, "wf_log").unwrap();
    let end = ailab_sandbox_core::commit_log::position(&log)
        .unwrap()
        .unwrap()
        .end;
    log.write_all_at(&[0; 3], end - 3).unwrap();
    assert_eq!(log_len(&w, "wf_log"), 2);

    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n");
    assert!(!w.path("c.txt").exists());
    assert_eq!(sb.audit_stats().unwrap().success, 3, "two and the seed");
    assert_eq!(sb.registry().get_by_workflow("wf_log").unwrap().len(), 3);
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same cut, and a replay that cannot put a target's bytes in place (a read-only
/// root, say): the log is kept and the run left for the start that can replay it all,
/// said once and not as finished; that start puts everything back.
#[test]
fn a_replay_that_cannot_write_a_target_keeps_the_log_for_the_next_start() {
    let (w, original, _) = three_writes_then_a_power_cut();
    let sb = open_failing_a_replayed_write(&w);
    let notices = sb.notices().to_vec();
    let about: Vec<&String> = notices.iter().filter(|n| n.contains("wf_log")).collect();
    assert_eq!(about.len(), 1, "{notices:?}");
    assert!(
        about[0].contains("inflight/wf_log.log could not be replayed in full")
            && !about[0].contains("finished"),
        "{notices:?}"
    );
    assert!(log_len(&w, "wf_log") > 0, "the log is kept");
    // Nothing judged: no write the replay could not put back is taken for undone.
    let statuses: Vec<_> = sb
        .audit_entries(100, Some("wf_log"))
        .unwrap()
        .into_iter()
        .map(|e| e.status)
        .collect();
    assert!(!statuses.contains(&AuditStatus::RolledBack), "{statuses:?}");
    // Nor recorded as written while a file lacks its bytes; the writes the replay did
    // put in place are (the seed's line and two of the three).
    let written: Vec<_> = sb
        .audit_entries(100, Some("wf_log"))
        .unwrap()
        .into_iter()
        .filter(|e| e.status == AuditStatus::Success)
        .collect();
    assert_eq!(written.len(), 3, "{written:?}");
    for e in &written {
        let held = std::fs::read(&e.target_path).ok().map(|b| sha(&b));
        assert_eq!(
            held, e.after_checksum,
            "{} holds what its line says",
            e.target_path
        );
    }
    let holds = |f: &str, b: &[u8]| std::fs::read(w.path(f)).is_ok_and(|x| x == b);
    assert!(
        !(holds("a.txt", b"ALPHA\n")
            && holds("d/b.txt", b"beta\nmore\n")
            && holds("c.txt", b"gamma\n")),
        "one target is without its bytes"
    );
    drop(sb);

    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\n", "{:?}", sb.notices());
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(log_len(&w, "wf_log"), 0);
    assert!(sb.audit_verify().unwrap().ok);
    let stats = sb.audit_stats().unwrap();
    assert_eq!((stats.success, stats.failed), (4, 0), "{stats:?}");
    let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), original);
}

/// The same partial replay, then another workflow's write to a file the replay did put
/// back, in the same process: the replayed write is on the trail before it, so each
/// file's newest line names what the file holds.
#[test]
fn a_partial_replay_records_the_writes_it_put_back_before_later_writers() {
    let (w, _, _) = three_writes_then_a_power_cut();
    let sb = open_failing_a_replayed_write(&w);
    assert_eq!(w.read("a.txt"), b"ALPHA\n", "{:?}", sb.notices());
    w.clock.advance(chrono::Duration::seconds(5));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_other", "actions": [
            {"action_id": "o1", "intent": "replace_file", "path": "a.txt", "content": "OTHER\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(sb);
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"OTHER\n");
    assert!(sb.audit_verify().unwrap().ok);
    let mut on_a: Vec<_> = sb
        .audit_entries(1000, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.target_path.ends_with("/a.txt") && e.status == AuditStatus::Success)
        .collect();
    on_a.sort_by_key(|e| e.seq);
    let chain: Vec<_> = on_a
        .iter()
        .map(|e| (e.seq, e.workflow_id.clone(), e.after_checksum.clone()))
        .collect();
    assert_eq!(
        on_a.last().and_then(|e| e.after_checksum.clone()),
        Some(sha(b"OTHER\n")),
        "{chain:?}"
    );
    assert_eq!(on_a.len(), 2, "{chain:?}");
}

/// For each file, its newest `success` line and what the file holds, where they differ.
fn newest_lines_not_held(sb: &ailab_sandbox_core::Sandbox) -> Vec<String> {
    let mut all: Vec<_> = sb
        .audit_entries(1000, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.status == AuditStatus::Success)
        .collect();
    all.sort_by_key(|e| e.seq);
    let newest: std::collections::BTreeMap<_, _> = all
        .into_iter()
        .map(|e| (e.target_path.clone(), e))
        .collect();
    newest
        .into_iter()
        .filter_map(|(p, e)| {
            let held = std::fs::read(&p).ok().map(|b| sha(&b));
            (held != e.after_checksum)
                .then(|| format!("{p}: {} says {:?}", e.action_id, e.after_checksum))
        })
        .collect()
}

/// Two logged writes to one file, the newer one's snapshot not rewritable at the next
/// start (its folder's place taken, as by a full store) while the file kept its bytes:
/// the replay neither writes that file nor records the older write, whose bytes the
/// file no longer holds; the other file's write is recorded.
#[test]
fn a_replay_records_nothing_of_a_file_whose_newer_entry_it_could_not_settle() {
    let (w, _, _) = power_cut_after(json!({"workflow_id": "wf_log", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
        {"action_id": "c1", "intent": "create_file", "path": "c.txt", "content": "gamma\n"},
        {"action_id": "a2", "intent": "append_file", "path": "a.txt", "content": "more\n"}]}));
    w.write("a.txt", b"ALPHA\nmore\n");
    std::fs::create_dir_all(w.path(".rollback/wf_log")).unwrap();
    std::fs::write(w.path(".rollback/wf_log/a2"), b"x").unwrap();
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\nmore\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(newest_lines_not_held(&sb), Vec::<String>::new());
    let recorded: Vec<_> = sb
        .audit_entries(100, Some("wf_log"))
        .unwrap()
        .into_iter()
        .filter(|e| e.status == AuditStatus::Success)
        .map(|e| e.action_id)
        .collect();
    assert!(
        recorded.contains(&"c1".to_owned()) && !recorded.contains(&"a1".to_owned()),
        "{recorded:?}"
    );
    drop(sb);
    std::fs::remove_file(w.path(".rollback/wf_log/a2")).unwrap();
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\nmore\n");
    assert_eq!(newest_lines_not_held(&sb), Vec::<String>::new());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A run killed (no power cut) after two audited writes, the first of which a crash
/// took back from its file, and a replay that cannot put it in place: the audited write
/// is not judged undone (its log entry would then be skipped for good) but put back by
/// the next start that can.
#[test]
fn an_audited_write_the_replay_cannot_put_back_is_not_taken_for_undone() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    w.write("d/b.txt", b"beta\n");
    prime(&w);
    let sb = w.open(batched(&w));
    run_killed(&sb, three_writes(), "before_audit", 3);
    std::mem::forget(sb);
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    // The rename the crash lost.
    std::fs::write(w.path("a.txt"), b"alpha\n").unwrap();
    let sb = open_failing_a_replayed_write(&w);
    let undone: Vec<_> = sb
        .audit_entries(100, Some("wf_log"))
        .unwrap()
        .into_iter()
        .filter(|e| e.status == AuditStatus::RolledBack)
        .collect();
    assert!(undone.is_empty(), "{undone:?} {:?}", sb.notices());
    drop(sb);

    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\n", "{:?}", sb.notices());
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// The same cut, with the log's first entry damaged and two sound ones after it: not
/// a tear (a crash only tears the last entry), so nothing is replayed, nothing is
/// judged, the log is kept and the workflow refused, naming it. Moved away, the log
/// lets the next start recover the run from what the files hold.
#[test]
fn a_damaged_entry_before_sound_ones_stops_the_replay_and_is_named() {
    let (w, _, primed) = three_writes_then_a_power_cut();
    let log = log_file(&w, "wf_log").unwrap();
    let start = ailab_sandbox_core::commit_log::position(&log)
        .unwrap()
        .unwrap()
        .start;
    let mut b = [0u8; 1];
    log.read_exact_at(&mut b, start + 100).unwrap();
    log.write_all_at(&[b[0] ^ 1], start + 100).unwrap();
    drop(log);

    let sb = w.open(batched(&w));
    assert_eq!(w.tree(), primed, "nothing replayed: {:?}", sb.notices());
    assert_noticed(&sb, "inflight/wf_log.log could not be read");
    assert_noticed(&sb, "does not check out while a later one does");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "create_file", "path": "n.txt", "content": "n\n"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert!(
        format!("{r:?}").contains("move it away to go on without the writes it holds"),
        "{r:?}"
    );
    assert!(!w.path("n.txt").exists());
    drop(sb);
    assert!(
        w.state.join("inflight/wf_log.log").exists(),
        "the log is kept"
    );

    std::fs::rename(
        w.state.join("inflight/wf_log.log"),
        w.outside.join("wf_log.log"),
    )
    .unwrap();
    let sb = w.open(batched(&w));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "create_file", "path": "n.txt", "content": "n\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?} {:?}", sb.notices());
    assert!(sb.audit_verify().unwrap().ok);
}

/// Two finished runs rewrote one file, then a third run died before its commit point;
/// the cut lost all three. The file must end as the second run left it, with both runs
/// audited and registered, and a rollback gives back the first bytes.
#[test]
fn runs_on_one_file_are_redone_in_order() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    prime(&w);
    let durable = Durable::take(&w);
    let sb = w.open(batched(&w));
    for text in ["one\n", "two\n"] {
        let r = run(
            &sb,
            json!({"workflow_id": "wf_log", "actions": [
                {"intent": "replace_file", "path": "a.txt", "content": text}]}),
        );
        assert_eq!(status(&r), "success");
    }
    run_killed(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "replace_file", "path": "a.txt", "content": "three\n"}]}),
        "before_commit",
        1,
    );
    // A power cut: no drop, so no last sync point.
    std::mem::forget(sb);
    durable.restore_except_commit_logs(&w);
    assert_eq!(w.read("a.txt"), b"alpha\n");

    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"two\n", "{:?}", sb.notices());
    let entries = sb.audit_entries(10, Some("wf_log")).unwrap();
    let successes: Vec<_> = entries
        .iter()
        .filter(|e| e.status == AuditStatus::Success)
        .collect();
    assert_eq!(successes.len(), 3, "two and the seed: {entries:?}");
    assert_eq!(sb.registry().get_by_workflow("wf_log").unwrap().len(), 3);
    assert!(sb.audit_verify().unwrap().ok);
    let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("a.txt"), b"alpha\n");
}

/// A logged write that failed after its commit point undid itself (its snapshot is
/// marked restored, durably, before the run returns): a later start must not redo it.
/// Nor when the mark is missing (a full root refuses it): the trail records the undo.
#[test]
fn an_undone_write_is_not_redone() {
    for without_mark in [false, true] {
        an_undone_write_stays_undone(without_mark);
    }
}

fn an_undone_write_stays_undone(without_mark: bool) {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    prime(&w);
    let sb = w.open(batched(&w));
    sb.failpoints().arm("before_audit", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"action_id": "undone", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
    if without_mark {
        std::fs::remove_file(w.root.join(".rollback/wf_log/undone/restored.json")).unwrap();
    }
    assert!(
        log_len(&w, "wf_log") > 0,
        "the commit entry stays until a sync point"
    );
    // Dies before any later sync point could empty the log.
    std::mem::forget(sb);
    let sb = w.open(batched(&w));
    assert_eq!(
        w.read("a.txt"),
        b"alpha\n",
        "{without_mark}: {:?}",
        sb.notices()
    );
    let stats = sb.audit_stats().unwrap();
    assert_eq!(
        (stats.success, stats.failed),
        (1, 1),
        "{stats:?} (the seed)"
    );
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(log_len(&w, "wf_log"), 0);
}

/// Logs stay short: a sync point every few dozen commits empties them, and so do the
/// sandbox's drop and a rollback; a clean start then finds nothing to replay.
#[test]
fn sync_points_rollbacks_and_drops_empty_the_logs() {
    let w = World::new();
    let sb = w.open(batched(&w));
    let write = |i: usize| {
        run(
            &sb,
            json!({"workflow_id": "wf_log", "actions": [
                {"intent": "create_file", "path": format!("f{i}.txt"), "content": format!("{i}\n")}]}),
        )
    };
    // The first commit creates the log with a sync point; 32 logged ones make the next.
    assert_eq!(status(&write(0)), "success");
    assert_eq!(log_len(&w, "wf_log"), 0);
    for i in 1..32 {
        assert_eq!(status(&write(i)), "success");
    }
    assert_eq!(log_len(&w, "wf_log"), 31);
    let syncs = sb.batched_syncs().unwrap();
    assert_eq!(status(&write(32)), "success");
    assert_eq!(
        sb.batched_syncs().unwrap(),
        syncs + 1,
        "one sync point for 32 commits"
    );
    assert_eq!(log_len(&w, "wf_log"), 0);
    for i in 33..36 {
        assert_eq!(status(&write(i)), "success");
    }
    assert!(log_len(&w, "wf_log") > 0);
    let rb = sb.rollback_workflow(
        "wf_log",
        &RollbackOptions {
            action_id: None,
            force: false,
        },
    );
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(log_len(&w, "wf_log"), 0, "a rollback empties the log first");
    assert!(!w.path("f0.txt").exists());
    assert_eq!(status(&write(100)), "success");
    assert!(log_len(&w, "wf_log") > 0);
    drop(sb);
    assert_eq!(log_len(&w, "wf_log"), 0, "the drop's sync point empties it");
    let sb = w.open(batched(&w));
    assert!(
        sb.notices().iter().all(|n| !n.contains("recovered")),
        "{:?}",
        sb.notices()
    );
    assert_eq!(w.read("f100.txt"), b"100\n");
    // Pruning the workflow removes its log file too.
    w.clock.advance(chrono::Duration::days(30));
    let pruned = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(pruned.workflows_pruned, vec!["wf_log".to_owned()]);
    assert!(!w.state.join("inflight/wf_log.log").exists());
}

/// A replay that cannot rebuild an entry's snapshot (here the root's `.rollback` has
/// become a file) keeps the log, so a later start, once the obstacle is gone, finishes
/// the job.
#[test]
fn a_replay_that_fails_keeps_the_log_for_the_next_start() {
    let (w, _, primed) = three_writes_then_a_power_cut();
    let rollback = w.root.join(".rollback");
    if rollback.exists() {
        std::fs::remove_dir_all(&rollback).unwrap();
    }
    std::fs::write(&rollback, b"in the way\n").unwrap();

    let sb = w.open(batched(&w));
    assert_eq!(
        log_len(&w, "wf_log"),
        3,
        "the log is kept: {:?}",
        sb.notices()
    );
    assert_eq!(w.tree(), primed, "nothing redone without its snapshot");
    drop(sb);

    std::fs::remove_file(&rollback).unwrap();
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("d/b.txt"), b"beta\nmore\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(log_len(&w, "wf_log"), 0);
    let stats = sb.audit_stats().unwrap();
    assert_eq!(stats.success, 4, "{stats:?} (with the seed)");
    assert_eq!(sb.registry().get_by_workflow("wf_log").unwrap().len(), 4);
    assert!(sb.audit_verify().unwrap().ok);
    // The seed's snapshot went with the `.rollback` the test replaced: the workflow's
    // rollback says so instead of leaving the seed behind in silence, and the three
    // logged writes roll back one at a time, newest first.
    let rb = sb.rollback_workflow("wf_log", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    assert!(rb.reason.as_deref().unwrap().contains("seed.txt"), "{rb:?}");
    let mut logged = sb.registry().get_by_workflow("wf_log").unwrap();
    logged.retain(|a| !a.path.ends_with("seed.txt"));
    for a in logged.iter().rev() {
        let one = sb.rollback_workflow(
            "wf_log",
            &RollbackOptions {
                action_id: Some(a.action_id.clone()),
                ..RollbackOptions::default()
            },
        );
        assert_eq!(one.status, "rolled_back", "{one:?}");
    }
    assert_eq!(w.tree(), primed);
}

/// The root is the same root however its path is spelled: a start that names it with a
/// trailing slash replays what the log holds for it.
#[test]
fn a_root_spelled_differently_still_gets_its_logged_writes() {
    let (w, _, _) = three_writes_then_a_power_cut();
    let mut c = batched(&w);
    c.roots = vec![std::path::PathBuf::from(format!("{}/", w.root.display()))];
    let sb = w.open(c);
    assert_noticed(&sb, ": 3 actions finished");
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(log_len(&w, "wf_log"), 0);
}

/// A start without the root a commit log's writes went to keeps the log (those writes
/// were acknowledged); the next start with the root replays them.
#[test]
fn a_log_for_a_root_not_configured_now_is_kept() {
    let (w, _, primed) = three_writes_then_a_power_cut();
    let other = w.tmp.path().join("other-root");
    let mut c = batched(&w);
    c.roots = vec![other];
    drop(w.open(c));
    assert_eq!(log_len(&w, "wf_log"), 3, "kept for the root");
    assert_eq!(w.tree(), primed);
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"ALPHA\n");
    assert_eq!(w.read("c.txt"), b"gamma\n");
    assert_eq!(log_len(&w, "wf_log"), 0);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start that replays a commit log puts a target's logged bytes in place under the
/// target's lock, as every writer does: while another holder has it, the target waits.
#[test]
fn a_replay_waits_for_the_targets_lock() {
    use rustix::fs::{FlockOperation, flock};
    let (w, _, _) = three_writes_then_a_power_cut();
    let locks = w.state.join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    // Every stripe, so that the test does not depend on which one serves `a.txt`.
    let held: Vec<std::fs::File> = (0..64)
        .map(|i| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(locks.join(format!("target-{i:02}.lock")))
                .unwrap();
            flock(&f, FlockOperation::LockExclusive).unwrap();
            f
        })
        .collect();
    let config = batched(&w);
    std::thread::scope(|s| {
        // Owned here, so that a failing assertion releases the locks before the scope
        // waits for the start.
        let held = held;
        let opening = s.spawn(|| w.open(config));
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(!opening.is_finished(), "the start waits for the locks");
        assert_eq!(
            w.read("a.txt"),
            b"alpha\n",
            "not replayed under another's lock"
        );
        drop(held);
        let sb = opening.join().unwrap();
        assert_eq!(w.read("a.txt"), b"ALPHA\n");
        assert_eq!(w.read("c.txt"), b"gamma\n");
        drop(sb);
    });
}

/// Two workflows rewrote one file in turn, and a power cut lost both writes but not the
/// logs: the file must end as the later write left it, whatever order the workflows'
/// names sort in (the logs are replayed in the order their writes were made).
#[test]
fn two_workflows_on_one_file_are_redone_in_the_order_they_wrote() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let sb = w.open(batched(&w));
    // A first commit syncs instead of logging.
    run_each(
        &w,
        &sb,
        &[
            ("wf_b", &[["s1", "create_file", "wf_b.txt", "seed\n"]]),
            ("wf_a", &[["s2", "create_file", "wf_a.txt", "seed\n"]]),
        ],
    );
    drop(sb);
    let durable = Durable::take(&w);
    let sb = w.open(batched(&w));
    run_each(
        &w,
        &sb,
        &[
            ("wf_b", &[["one", "replace_file", "a.txt", "one\n"]]),
            ("wf_a", &[["two", "replace_file", "a.txt", "two\n"]]),
        ],
    );
    assert_eq!((log_len(&w, "wf_a"), log_len(&w, "wf_b")), (1, 1));
    // A power cut: no drop, so no last sync point.
    std::mem::forget(sb);
    durable.restore_except_commit_logs(&w);
    assert_eq!(w.read("a.txt"), b"alpha\n");

    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"two\n", "{:?}", sb.notices());
    assert!(sb.audit_verify().unwrap().ok);
    for wf in ["wf_a", "wf_b"] {
        let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{wf}: {rb:?}");
    }
    assert_eq!(w.read("a.txt"), b"alpha\n");
}

/// Runs each `(workflow, actions)` as a plan in `sb`, each action `(id, intent, path,
/// content)`.
fn run_each(w: &World, sb: &ailab_sandbox_core::Sandbox, plans: &[(&str, &[[&str; 4]])]) {
    for (wf, actions) in plans {
        w.clock.advance(chrono::Duration::seconds(1));
        let actions: Vec<_> = actions
            .iter()
            .map(|[id, intent, path, content]| {
                json!({"action_id": id, "intent": intent, "path": path, "content": content})
            })
            .collect();
        let r = run(sb, json!({"workflow_id": wf, "actions": actions}));
        assert_eq!(status(&r), "success", "{wf}: {r:?}");
    }
}

/// A process that lives on has finished runs whose logs wait for its next sync point.
/// Another process starting meanwhile replays those logs: their writes are audited done,
/// so it leaves every one of them done, whatever other runs wrote to the file since.
#[test]
fn a_start_leaves_the_audited_writes_of_a_live_process_done() {
    let w = World::new();
    w.write("f.txt", b"original\n");
    let live = w.open(batched(&w));
    run_each(
        &w,
        &live,
        &[
            ("w1", &[["g0", "create_file", "g.txt", "g\n"]]),
            ("w0", &[["x0", "append_file", "f.txt", "w0-first\n"]]),
            (
                "w1",
                &[
                    ["a", "append_file", "f.txt", "w1-a\n"],
                    ["b", "append_file", "f.txt", "w1-b\n"],
                ],
            ),
            ("w0", &[["x1", "append_file", "f.txt", "w0-second\n"]]),
        ],
    );
    assert!(
        log_len(&w, "w1") + log_len(&w, "w0") > 0,
        "logs still to empty"
    );
    let text = b"original\nw0-first\nw1-a\nw1-b\nw0-second\n";
    let other = w.open(batched(&w));
    assert_eq!(w.read("f.txt"), text);
    for (wf, done) in [
        ("w0", ["x1:Success", "x0:Success"]),
        ("w1", ["b:Success", "a:Success"]),
    ] {
        let mut got = statuses_of(&other, wf);
        got.retain(|s| !s.starts_with("g0"));
        assert_eq!(got, done, "{wf}: {:?}", other.notices());
    }
    assert!(other.audit_verify().unwrap().ok);
    assert_eq!(
        other.notices(),
        Vec::<String>::new(),
        "nothing was interrupted"
    );
    // Each write is undone, newest first, without force: every snapshot is still there.
    let x1 = RollbackOptions {
        action_id: Some("x1".to_owned()),
        ..RollbackOptions::default()
    };
    for (wf, opts) in [
        ("w0", &x1),
        ("w1", &RollbackOptions::default()),
        ("w0", &RollbackOptions::default()),
    ] {
        let rb = other.rollback_workflow(wf, opts);
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
    }
    assert_eq!(w.read("f.txt"), b"original\n");
    drop(live);
}

/// A live process's finished run replaced a file, and a later run of another workflow
/// put the file's old bytes back. Another process's start must not put the first run's
/// logged bytes over that later, audited write.
#[test]
fn a_start_does_not_redo_a_logged_write_a_later_run_replaced() {
    let w = World::new();
    w.write("f.txt", b"original\n");
    let live = w.open(batched(&w));
    run_each(
        &w,
        &live,
        &[
            ("w1", &[["g0", "create_file", "g.txt", "g\n"]]),
            ("w0", &[["h0", "create_file", "h.txt", "h\n"]]),
            ("w0", &[["h1", "append_file", "h.txt", "more\n"]]),
            ("w1", &[["a", "replace_file", "f.txt", "A\n"]]),
            ("w0", &[["x", "replace_file", "f.txt", "original\n"]]),
        ],
    );
    assert_eq!((log_len(&w, "w0"), log_len(&w, "w1")), (2, 1));
    let other = w.open(batched(&w));
    assert_eq!(w.read("f.txt"), b"original\n", "{:?}", other.notices());
    assert!(other.audit_verify().unwrap().ok);
    drop(live);
}

/// The same when the later write is a run of the same workflow in another process: a
/// logged write of a finished run is judged against every later line, its own
/// workflow's too (a run of it may follow a finished one).
#[test]
fn a_start_does_not_redo_a_logged_write_the_same_workflow_replaced_since() {
    let w = World::new();
    w.write("f.txt", b"original\n");
    // Started first, as a server would be.
    let strict = w.sandbox();
    let live = w.open(batched(&w));
    run_each(
        &w,
        &live,
        &[
            ("w1", &[["g0", "create_file", "g.txt", "g\n"]]),
            ("w1", &[["a", "replace_file", "f.txt", "A\n"]]),
        ],
    );
    assert_eq!(log_len(&w, "w1"), 1);
    w.clock.advance(chrono::Duration::seconds(1));
    let r = run(
        &strict,
        json!({"workflow_id": "w1", "actions": [
            {"action_id": "x", "intent": "replace_file", "path": "f.txt", "content": "original\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(strict);
    assert_eq!(log_len(&w, "w1"), 1, "the live process's entry waits");
    let other = w.open(batched(&w));
    assert_eq!(w.read("f.txt"), b"original\n", "{:?}", other.notices());
    assert!(other.audit_verify().unwrap().ok);
    drop(live);
}

/// The clock set back a minute between two runs of a workflow, the second killed after
/// its logged write landed, before its line: the next start's replay takes the first
/// run's line, timed after the write, for no later change (the dead record's own run
/// can have no follower of its workflow), and records the write done.
#[test]
fn a_replay_after_the_clock_went_back_keeps_the_dead_runs_write() {
    let w = World::new();
    w.write("f.txt", b"O\n");
    prime(&w);
    let sb = w.open(batched(&w));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"action_id": "r1", "intent": "replace_file", "path": "f.txt", "content": "A\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    w.clock.advance(chrono::Duration::seconds(-60));
    run_killed(
        &sb,
        json!({"workflow_id": "wf_log", "actions": [
            {"action_id": "r2", "intent": "replace_file", "path": "f.txt", "content": "B\n"}]}),
        "before_audit",
        1,
    );
    // Killed: no drop, so no last sync point.
    std::mem::forget(sb);
    assert_eq!(w.read("f.txt"), b"B\n");
    let sb = w.open(batched(&w));
    assert_eq!(w.read("f.txt"), b"B\n", "{:?}", sb.notices());
    let r2: Vec<_> = statuses_of(&sb, "wf_log")
        .into_iter()
        .filter(|s| s.starts_with("r2:"))
        .collect();
    assert_eq!(r2, ["r2:Success"], "{:?}", sb.notices());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A sandbox in which `w1` (action `y`) replaced `f.txt`'s `O` with `A`, and then `w2`
/// (action `b`) wrote `O` back; each workflow's first run created its commit log.
fn written_back() -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    w.write("f.txt", b"O\n");
    let sb = w.open(batched(&w));
    run_each(
        &w,
        &sb,
        &[
            ("w1", &[["g1", "create_file", "g1.txt", "g\n"]]),
            ("w2", &[["g2", "create_file", "g2.txt", "g\n"]]),
            ("w1", &[["y", "replace_file", "f.txt", "A\n"]]),
            ("w2", &[["b", "replace_file", "f.txt", "O\n"]]),
        ],
    );
    (w, sb)
}

/// A live process's finished run (its record waits for the next sync point) wrote a
/// file, and another workflow wrote the file's old bytes back. A start meanwhile finds
/// the file as it was before the run, yet the run was not undone: it is left done, so
/// that rolling back both workflows gives the old bytes back.
#[test]
fn a_start_does_not_take_a_write_back_for_a_finished_runs_undo() {
    for partial_rollback in [false, true] {
        let (w, live) = written_back();
        if partial_rollback {
            run_each(
                &w,
                &live,
                &[("w1", &[["x", "replace_file", "g1.txt", "x\n"]])],
            );
            // A rollback's record also waits for the sync point.
            let x = RollbackOptions {
                action_id: Some("x".to_owned()),
                ..RollbackOptions::default()
            };
            let rb = live.rollback_workflow("w1", &x);
            assert_eq!(rb.status, "rolled_back", "{rb:?}");
        }
        let other = w.open(batched(&w));
        assert_eq!(other.notices(), Vec::<String>::new(), "{partial_rollback}");
        let y: Vec<_> = statuses_of(&other, "w1")
            .into_iter()
            .filter(|s| s.starts_with("y:"))
            .collect();
        assert_eq!(y, ["y:Success"], "{partial_rollback}");
        for wf in ["w2", "w1"] {
            let rb = other.rollback_workflow(wf, &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "{partial_rollback} {wf}: {rb:?}");
        }
        assert_eq!(w.read("f.txt"), b"O\n", "{partial_rollback}");
        assert!(other.audit_verify().unwrap().ok);
        drop(live);
    }
}

/// A power cut lost a logged write into a second root. A start configured without that
/// root keeps the entry, and until a start that has the root replays it, nothing here
/// empties the log: a new run, a rollback and a prune of the workflow are refused.
#[test]
fn a_logged_write_into_a_root_not_configured_survives_until_it_is_replayed() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &batched(&w));
    std::fs::write(root2.join("f.txt"), b"O\n").unwrap();
    let only = batched(&w);
    let sb = w.open(both.clone());
    run_each(&w, &sb, &[("w1", &[["g0", "create_file", "g.txt", "g\n"]])]);
    drop(sb);
    let durable = Durable::take(&w);
    let sb = w.open(both.clone());
    w.clock.advance(chrono::Duration::seconds(1));
    let r = run(
        &sb,
        json!({"workflow_id": "w1", "actions": [{"action_id": "a", "intent": "replace_file",
            "path": "f.txt", "content": "A\n", "root": root2.display().to_string()}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(log_len(&w, "w1"), 1);
    // A power cut: no drop; the second root loses the write and its snapshot too.
    std::mem::forget(sb);
    durable.restore_except_commit_logs(&w);
    std::fs::write(root2.join("f.txt"), b"O\n").unwrap();
    std::fs::remove_dir_all(root2.join(".rollback")).unwrap();

    let one = w.open(only);
    assert_noticed(&one, "not configured with");
    assert_run_blocked_for_a_root_it_lacks(&one, "w1", &root2);
    let rb = one.rollback_workflow("w1", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    let pruned = one.prune(std::time::Duration::ZERO).unwrap();
    assert!(pruned.workflows_pruned.is_empty(), "{pruned:?}");
    assert_eq!(
        log_len(&w, "w1"),
        1,
        "the acknowledged write is still logged"
    );
    drop(one);

    let sb = w.open(both);
    assert_eq!(
        std::fs::read(root2.join("f.txt")).unwrap(),
        b"A\n",
        "{:?}",
        sb.notices()
    );
    assert!(statuses_of(&sb, "w1").contains(&"a:Success".to_owned()));
    assert_eq!(log_len(&w, "w1"), 0);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A process killed after its runs finished leaves their records `finished`. A start in
/// the same boot makes their writes durable and marks them idle; after a restart of the
/// machine, a start that still finds one does not take another workflow's write-back of
/// the old bytes for an undo of the run's audited write.
#[test]
fn finished_runs_of_a_killed_process_are_settled_and_never_misjudged() {
    for reboot in [false, true] {
        let (w, killed) = written_back();
        // Killed: no last sync point.
        std::mem::forget(killed);
        for wf in ["w1", "w2"] {
            let rec = run_record(&w, wf);
            assert_eq!(rec["finished"], true, "{wf}: {rec}");
            if reboot {
                from_an_earlier_boot(&w, wf);
            }
        }
        let sb = w.open(batched(&w));
        assert_eq!(sb.notices(), Vec::<String>::new(), "reboot {reboot}");
        if !reboot {
            for wf in ["w1", "w2"] {
                assert_eq!(run_record(&w, wf)["state"], "idle", "{wf}");
            }
        }
        let y: Vec<_> = statuses_of(&sb, "w1")
            .into_iter()
            .filter(|s| s.starts_with("y:"))
            .collect();
        assert_eq!(y, ["y:Success"], "reboot {reboot}");
        for wf in ["w2", "w1"] {
            let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
            assert_eq!(rb.status, "rolled_back", "reboot {reboot}, {wf}: {rb:?}");
        }
        assert_eq!(w.read("f.txt"), b"O\n", "reboot {reboot}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A live process with two roots has a logged write into the second waiting for its
/// next sync point. A process configured with the first root only neither runs the
/// workflow (its sync point would empty the log, entry and all) nor marks the run idle;
/// a later start with both roots, in the same boot, empties the log without replaying
/// it over what the file holds by then.
#[test]
fn a_process_without_a_root_leaves_a_live_processs_log_for_it_alone() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &batched(&w));
    std::fs::write(root2.join("f.txt"), b"O\n").unwrap();
    let live = w.open(both.clone());
    run_each(
        &w,
        &live,
        &[("w1", &[["g0", "create_file", "g.txt", "g\n"]])],
    );
    let r = run(
        &live,
        json!({"workflow_id": "w1", "actions": [{"action_id": "a", "intent": "replace_file",
            "path": "f.txt", "content": "A\n", "root": root2.display().to_string()}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(log_len(&w, "w1"), 1);

    let one = w.open(batched(&w));
    assert_run_blocked_for_a_root_it_lacks(&one, "w1", &root2);
    drop(one);
    assert_eq!(
        log_len(&w, "w1"),
        1,
        "the acknowledged write is still logged"
    );
    assert_eq!(run_record(&w, "w1")["finished"], true);

    // Put back by hand: a start in this boot must not replay the log over it.
    std::fs::write(root2.join("f.txt"), b"O\n").unwrap();
    let sb = w.open(both);
    assert_eq!(
        std::fs::read(root2.join("f.txt")).unwrap(),
        b"O\n",
        "{:?}",
        sb.notices()
    );
    assert_eq!(log_len(&w, "w1"), 0);
    assert_eq!(run_record(&w, "w1")["state"], "idle");
    drop(sb);
    drop(live);
}

/// A sync point that fails may leave finished runs' writes lost by the kernel: their
/// records go back to under way, so that the next start checks them against the disk
/// and replays their logs instead of taking them for finished in this boot.
#[test]
fn a_failed_sync_point_leaves_its_runs_to_recovery() {
    let w = World::new();
    let sb = w.open(batched(&w));
    run_each(
        &w,
        &sb,
        &[
            ("w1", &[["g0", "create_file", "g.txt", "g\n"]]),
            ("w1", &[["a", "create_file", "a.txt", "a\n"]]),
        ],
    );
    assert_eq!(log_len(&w, "w1"), 1);
    assert_eq!(run_record(&w, "w1")["finished"], true);
    sb.failpoints().arm("batch_sync", 1);
    drop(sb);
    let rec = run_record(&w, "w1");
    assert_eq!(rec["state"], "active", "{rec}");
    assert!(rec.get("finished").is_none(), "{rec}");
    assert_eq!(log_len(&w, "w1"), 1, "not emptied by a failed sync");
    let sb = w.open(batched(&w));
    assert_eq!(w.read("a.txt"), b"a\n");
    assert!(statuses_of(&sb, "w1").contains(&"a:Success".to_owned()));
    assert_eq!(log_len(&w, "w1"), 0);
    assert_eq!(run_record(&w, "w1")["state"], "idle");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A power cut that emptied a write's snapshot metadata (not yet synced) kept the staged
/// file beside its target: the start removes the snapshot as unfinished, and with it,
/// when the run began in an earlier boot, the staged file that nothing else names, in
/// whatever folder of the root it is; also when the first start was stopped by the disk
/// (the snapshot gone by then; that case without a second run, whose recovery would
/// remove the file first). A run of the same process still awaiting recovery keeps its
/// staged file, its committed write's only copy (its own recovery puts it in place);
/// another process's stays. In this boot the process may be alive: nothing is looked
/// for beyond the run's known folders.
#[test]
fn a_staged_file_whose_snapshot_a_power_cut_emptied_goes_with_it() {
    for (earlier_boot, retried) in [(true, false), (true, true), (false, false)] {
        let w = World::new();
        w.write("d/e/a.txt", b"alpha\n");
        w.write("f/big.txt", b"small\n");
        let others = format!(".ailab-tmp-{}0badf00d", "0".repeat(24));
        w.write(&format!("d/e/{others}"), b"another process's\n");
        let sb = w.open(batched(&w));
        run_killed(
            &sb,
            json!({"workflow_id": "wf_a", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "b.txt", "content": "beta\n"},
                {"action_id": "a2", "intent": "replace_file", "path": "d/e/a.txt", "content": "ALPHA\n"}]}),
            "before_commit",
            2,
        );
        let big = "x".repeat(100_000);
        let workflows: &[&str] = if retried {
            &["wf_a"]
        } else {
            run_killed(
                &sb,
                json!({"workflow_id": "wf_b", "actions": [
                    {"action_id": "b1", "intent": "replace_file", "path": "f/big.txt", "content": big}]}),
                "before_mutate",
                1,
            );
            &["wf_a", "wf_b"]
        };
        std::mem::forget(sb);
        let staged = |dir: &str| -> Vec<String> {
            std::fs::read_dir(w.path(dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with(".ailab-tmp-") && *n != others)
                .collect()
        };
        assert_eq!(staged("d/e").len(), 1, "a2's staged file");
        assert_eq!(staged("f").len(), usize::from(!retried), "b1's staged file");
        // The cut: a2's metadata never reached the disk.
        std::fs::OpenOptions::new()
            .write(true)
            .open(w.path(".rollback/wf_a/a2/meta.json"))
            .unwrap()
            .set_len(0)
            .unwrap();
        if earlier_boot {
            for wf in workflows {
                from_an_earlier_boot(&w, wf);
            }
        }
        if retried {
            let sb = open_batched_refusing(&w, "remove_dead_temp", rustix::io::Errno::ROFS);
            assert_noticed(&sb, "could not be settled now");
            assert!(!w.path(".rollback/wf_a/a2").exists());
            assert_eq!(staged("d/e").len(), 1);
        }
        let sb = w.open(batched(&w));
        if !retried {
            assert_noticed(&sb, "1 unfinished snapshot folder removed");
        }
        assert!(!w.path(".rollback/wf_a/a2").exists());
        assert_eq!(
            staged("d/e").len(),
            usize::from(!earlier_boot),
            "{earlier_boot}: {:?}",
            sb.notices()
        );
        assert_eq!(w.read(&format!("d/e/{others}")), b"another process's\n");
        assert_eq!(w.read("d/e/a.txt"), b"alpha\n");
        if !retried {
            assert_eq!(
                w.read("f/big.txt"),
                big.as_bytes(),
                "{earlier_boot}: wf_b's committed write finished"
            );
        }
        assert!(staged("f").is_empty(), "{earlier_boot}");
        assert!(sb.audit_verify().unwrap().ok);
        let rb = sb.rollback_workflow("wf_a", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert!(!w.path("b.txt").exists());
    }
}

/// Under batched syncs a rollback's records of a step wait for the next sync point: a
/// later step on the same file is made only after one, or its restore, synced on its
/// own, reaches the disk ahead of them (a power cut then left the file as neither step
/// left it, unrecorded). Steps on other files need no extra sync.
#[test]
fn a_rollback_syncs_its_records_before_a_second_step_on_the_same_file() {
    let w = World::new();
    let sb = w.open(batched(&w));
    for (wf, intent, second) in [
        ("wf_same", "replace_file", "a.txt"),
        ("wf_other", "create_file", "b.txt"),
    ] {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [
                {"intent": "create_file", "path": format!("{wf}/a.txt"), "content": "one\n"},
                {"intent": intent, "path": format!("{wf}/{second}"), "content": "two\n"}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    let syncs_of = |wf: &str| {
        let before = sb.batched_syncs().unwrap();
        let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        sb.batched_syncs().unwrap() - before
    };
    let other = syncs_of("wf_other");
    assert_eq!(syncs_of("wf_same"), other + 1);
    assert!(!w.path("wf_same/a.txt").exists() && !w.path("wf_other/b.txt").exists());
}

/// Three writes of one file in a new workflow: the first committed by a sync point (a
/// workflow's first commit makes its log), the two after it by the log, each of those
/// built on the one before.
fn one_file_three_times() -> serde_json::Value {
    json!({"workflow_id": "wf_m", "actions": [
        {"action_id": "a1", "intent": "append_file", "path": "m.md", "content": "one\n"},
        {"action_id": "a2", "intent": "append_file", "path": "m.md", "content": "two\n"},
        {"action_id": "a3", "intent": "replace_file", "path": "m.md", "content": "three\n"}]})
}

/// The start after the cut: `one_file_three_times` is whole again (the file's last
/// bytes, a success line and an artifact per write, nothing said changed by another),
/// and rolls back to the file as it was.
fn redone_then_rolled_back(w: &World) {
    let sb = w.open(batched(w));
    assert_eq!(w.read("m.md"), b"three\n", "{:?}", sb.notices());
    assert!(
        !sb.notices().iter().any(|n| n.contains("changed since")),
        "{:?}",
        sb.notices()
    );
    assert!(sb.audit_verify().unwrap().ok);
    assert_eq!(
        audit_statuses(&sb, "wf_m"),
        ["success", "success", "success"]
    );
    assert_eq!(sb.registry().get_by_workflow("wf_m").unwrap().len(), 3);
    let rb = sb.rollback_workflow("wf_m", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("m.md"), b"before\n");
}

/// A sandbox on `w`, batched, whose sync points record in `last` what they make durable.
fn recording_sync_points(
    w: &World,
) -> (
    ailab_sandbox_core::Sandbox,
    std::sync::Arc<std::sync::Mutex<Option<Durable>>>,
) {
    let points = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    let last = std::sync::Arc::new(std::sync::Mutex::new(None));
    Durable::record_sync_points(&points, w, &last);
    let sb = ailab_sandbox_core::Sandbox::open_armed(
        batched(w),
        std::sync::Arc::new(ailab_sandbox_core::clock::SystemClock),
        points,
    )
    .unwrap();
    (sb, last)
}

/// A run that reported success, then a power cut before any later sync point: what the
/// last sync point made durable stays, and the commit log. The next start gives the file
/// the run's last bytes, and the trail and the registry every write. (The first write's
/// rename was left to a later sync point: the log's writes found the file as before the
/// run, were taken for overtaken by another program, and the whole run was lost.)
#[test]
fn a_power_cut_after_a_run_keeps_the_writes_built_on_its_first() {
    let w = World::new();
    w.write("m.md", b"before\n");
    let (sb, last) = recording_sync_points(&w);
    let r = run(&sb, one_file_three_times());
    assert_eq!(status(&r), "success");
    // A power cut: no drop, so no last sync point.
    std::mem::forget(sb);
    let durable = last.lock().unwrap().take().expect("a sync point was made");
    durable.restore_except_commit_logs(&w);
    redone_then_rolled_back(&w);
}

/// A power cut that kept the name of one of a log's older writes to a file but not its
/// data, nor the newer write's name: the file is the older write's, emptied. The next
/// start writes the newest logged bytes; it took the emptied file for another program's
/// change, left it empty, and the trail said the writes had succeeded.
#[test]
fn a_file_an_older_logged_write_left_emptied_is_written_again() {
    let w = World::new();
    w.write("m.md", b"before\n");
    let sb = w.open(batched(&w));
    // Dies once the third write is committed, before it takes the file's place.
    run_killed(&sb, one_file_three_times(), "before_mutate", 3);
    std::mem::forget(sb);
    assert_eq!(w.read("m.md"), b"before\none\ntwo\n");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(w.path("m.md"))
        .unwrap();
    let written = file.metadata().unwrap().modified().unwrap();
    file.set_len(0).unwrap();
    file.set_modified(written).unwrap();
    drop(file);
    redone_then_rolled_back(&w);
}
