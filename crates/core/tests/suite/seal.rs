//! Snapshot records live inside the roots, where agents and other programs may write
//! directly: only records sealed with the state directory's key are restored, finished
//! or audited.

use crate::support::*;
use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::sandbox::RollbackOptions;
use serde_json::{Value, json};
use std::panic::AssertUnwindSafe;

fn meta_path(w: &World, wf: &str, action: &str) -> std::path::PathBuf {
    w.root.join(format!(".rollback/{wf}/{action}/meta.json"))
}

fn read_meta(w: &World, wf: &str, action: &str) -> Value {
    serde_json::from_slice(&std::fs::read(meta_path(w, wf, action)).unwrap()).unwrap()
}

fn plant(w: &World, wf: &str, action: &str, meta: &Value, backup: Option<&[u8]>) {
    let dir = w.root.join(format!(".rollback/{wf}/{action}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("meta.json"),
        serde_json::to_vec_pretty(meta).unwrap(),
    )
    .unwrap();
    if let Some(b) = backup {
        std::fs::write(dir.join("backup"), b).unwrap();
    }
}

/// A world whose `m.txt` ("mark") workflow `wf` replaced with "x" in action `a1`.
fn mark_replaced(wf: &str) -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    w.write("m.txt", b"mark");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": wf, "actions": [{"action_id": "a1", "intent": "replace_file", "path": "m.txt", "content": "x"}]}),
    );
    (w, sb)
}

/// The world's seal key, as whoever may read the state directory has it.
fn seal_key(w: &World) -> ailab_sandbox_core::seal::SealKey {
    let bytes = std::fs::read(w.state.join("seal.key")).unwrap();
    ailab_sandbox_core::seal::SealKey::new(bytes.try_into().unwrap())
}

fn refused_as_untrusted(sb: &ailab_sandbox_core::Sandbox, wf: &str, file: &str) {
    // What GET /agentic/rollback/{id} says: a description, the refusal inside it.
    let info = sb.rollback_info(wf).unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(
        info.reason_code,
        Some(ReasonCode::ChecksumMismatch),
        "{info:?}"
    );
    assert!(info.reason.as_deref().unwrap().contains(file), "{info:?}");
    let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
    let reason = rb.reason.unwrap();
    assert!(reason.contains(file), "{reason}");
    // Counted, and on the trail as a blocked rollback.
    let counted = |sb: &ailab_sandbox_core::Sandbox| {
        let text = sb.metrics().encode();
        text.lines()
            .find_map(|l| l.strip_prefix("ailab_sandbox_checksum_mismatch_total "))
            .map(|n| n.parse::<u64>().unwrap())
            .unwrap()
    };
    assert!(counted(sb) >= 1);
    let last = &sb.audit_entries(1, Some(wf)).unwrap()[0];
    assert_eq!(last.status, ailab_sandbox_core::audit::AuditStatus::Blocked);
    assert_eq!(last.reason_code, Some(ReasonCode::ChecksumMismatch));
    let before = counted(sb);
    let forced = sb.rollback_workflow(wf, &forced());
    assert_eq!(forced.status, "refused", "force does not trust it either");
    assert_eq!(counted(sb), before + 1);
}

/// Rolls a workflow back and checks that it was.
fn rolls_back(sb: &ailab_sandbox_core::Sandbox, wf: &str) {
    let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
}

/// A configuration with the world's root and a second one, `root2`, beside it.
fn two_roots(w: &World) -> (std::path::PathBuf, ailab_sandbox_core::Config) {
    let root2 = w.tmp.path().join("root2");
    let mut config = w.writable_config();
    config.roots = vec![w.root.clone(), root2.clone()];
    (root2, config)
}

/// A snapshot written into `.rollback/` by hand — a copy of a genuine one with its
/// target changed to a blocked unit file, and one with no seal at all — is refused, and
/// nothing is written.
#[test]
fn planted_snapshots_are_never_restored() {
    let (w, sb) = mark_replaced("wf_ok");
    let unit = b"[Service]\nExecStart=/bin/sh -c id\n";
    let mut copied = read_meta(&w, "wf_ok", "a1");
    copied["workflow_id"] = json!("wf_evil");
    copied["original_path"] = json!("evil.service");
    copied["sha256"] = json!(sha(unit));
    copied["size_bytes"] = json!(unit.len());
    plant(&w, "wf_evil", "a1", &copied, Some(unit));
    refused_as_untrusted(&sb, "wf_evil", ".rollback/wf_evil/a1/meta.json");

    let mut unsealed = copied.clone();
    unsealed.as_object_mut().unwrap().remove("seal");
    unsealed["workflow_id"] = json!("wf_bare");
    plant(&w, "wf_bare", "a1", &unsealed, Some(unit));
    refused_as_untrusted(&sb, "wf_bare", ".rollback/wf_bare/a1/meta.json");

    assert!(!w.path("evil.service").exists());
    assert_eq!(w.read("m.txt"), b"x");
    // The genuine workflow still rolls back.
    rolls_back(&sb, "wf_ok");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// A record sealed with the key itself (someone who read it) still sends a restore only
/// where an action could have written: not into the snapshot store, not past the depth
/// limit, not to a blocked name or folder, not to an absolute path.
#[test]
fn a_record_sealed_by_hand_restores_only_where_a_write_could_go() {
    use ailab_sandbox_core::snapshot::SnapshotMeta;
    let (w, sb) = mark_replaced("wf_ok");
    let key = seal_key(&w);
    let genuine = read_meta(&w, "wf_ok", "a1");
    let genuine_record = std::fs::read(meta_path(&w, "wf_ok", "a1")).unwrap();
    for (n, path) in [
        ".rollback/wf_ok/a1/meta.json",
        "a/b/c/d/e/f/g/h/i/k.md",
        "evil.service",
        "x.service.d/o.conf",
        "/abs.txt",
    ]
    .into_iter()
    .enumerate()
    {
        let wf = format!("wf_f{n}");
        let mut forged = genuine.clone();
        forged.as_object_mut().unwrap().remove("seal");
        forged["workflow_id"] = json!(wf);
        forged["original_path"] = json!(path);
        let meta: SnapshotMeta = serde_json::from_value(forged).unwrap();
        let sealed: Value = serde_json::from_slice(&key.seal(&meta).unwrap()).unwrap();
        plant(&w, &wf, "a1", &sealed, Some(b"mark"));
        refused_as_untrusted(&sb, &wf, &format!(".rollback/{wf}/a1/meta.json"));
        let rb = sb.rollback_workflow(&wf, &forced());
        assert_eq!(rb.status, "refused", "{path}: {rb:?}");
        assert!(
            rb.reason.unwrap().contains("which no action may write"),
            "{path}"
        );
    }
    assert!(!w.path("a").exists() && !w.path("evil.service").exists());
    assert!(!w.path("x.service.d").exists() && !w.tmp.path().join("abs.txt").exists());
    assert_eq!(
        std::fs::read(meta_path(&w, "wf_ok", "a1")).unwrap(),
        genuine_record
    );
    rolls_back(&sb, "wf_ok");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// A write an earlier version made to a name this one refuses (a bidirectional
/// formatting character in it) still rolls back: its sealed record is the runtime's own,
/// judged for where a write could go, not for how the name reads.
#[test]
fn a_write_to_a_name_refused_since_still_rolls_back() {
    use ailab_sandbox_core::snapshot::SnapshotMeta;
    let (w, sb) = mark_replaced("wf_up");
    let key = seal_key(&w);
    let name = "m\u{202E}.txt";
    let mut record = read_meta(&w, "wf_up", "a1");
    record.as_object_mut().unwrap().remove("seal");
    record["original_path"] = json!(name);
    let meta: SnapshotMeta = serde_json::from_value(record).unwrap();
    std::fs::write(meta_path(&w, "wf_up", "a1"), key.seal(&meta).unwrap()).unwrap();
    std::fs::rename(w.path("m.txt"), w.path(name)).unwrap();
    rolls_back(&sb, "wf_up");
    assert_eq!(w.read(name), b"mark");
}

/// A symbolic link, a FIFO or a file with another link in the place of a snapshot's folder
/// or record (even one leading to a faithful copy) is no record of the runtime's: the
/// rollback is refused as for a forged one (`checksum_mismatch`), not failed as if the
/// disk had (`io_error`, a 500 over HTTP); put back, it rolls back.
#[test]
fn a_link_or_special_file_in_a_snapshots_place_is_not_trusted() {
    use std::os::unix::fs::symlink;
    let (w, sb) = mark_replaced("wf_l");
    let folder = w.path(".rollback/wf_l/a1");
    let aside = w.tmp.path().join("a1-aside");
    let copy = w.tmp.path().join("a1-copy");
    std::fs::rename(&folder, &aside).unwrap();
    std::fs::create_dir(&copy).unwrap();
    for f in std::fs::read_dir(&aside).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
    }
    symlink(&copy, &folder).unwrap();
    refused_as_untrusted(&sb, "wf_l", ".rollback/wf_l/a1");
    std::fs::remove_file(&folder).unwrap();
    std::fs::rename(&aside, &folder).unwrap();

    let meta = folder.join("meta.json");
    let genuine = std::fs::read(&meta).unwrap();
    let outside = w.tmp.path().join("meta-copy.json");
    std::fs::write(&outside, &genuine).unwrap();
    std::fs::remove_file(&meta).unwrap();
    symlink(&outside, &meta).unwrap();
    refused_as_untrusted(&sb, "wf_l", ".rollback/wf_l/a1/meta.json");
    std::fs::remove_file(&meta).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &meta,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    refused_as_untrusted(&sb, "wf_l", ".rollback/wf_l/a1/meta.json");
    std::fs::remove_file(&meta).unwrap();
    std::fs::write(&meta, &genuine).unwrap();
    std::fs::hard_link(&meta, w.tmp.path().join("meta-link.json")).unwrap();
    refused_as_untrusted(&sb, "wf_l", ".rollback/wf_l/a1/meta.json");
    std::fs::remove_file(w.tmp.path().join("meta-link.json")).unwrap();
    rolls_back(&sb, "wf_l");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// A snapshot folder others could change (writable by them here; owned by them
/// likewise) is not used for a rollback or a prune, as it is not for a write: refused
/// with `reserved_path`, its snapshots kept; made private again, it rolls back.
#[test]
fn a_snapshot_folder_others_could_change_is_not_read() {
    use std::os::unix::fs::PermissionsExt;
    let (w, sb) = mark_replaced("wf_p");
    let mode = |rel: &str, m: u32| {
        std::fs::set_permissions(w.path(rel), std::fs::Permissions::from_mode(m)).unwrap();
    };
    w.clock.advance(chrono::Duration::days(10));
    for rel in [".rollback", ".rollback/wf_p", ".rollback/wf_p/a1"] {
        mode(rel, 0o777);
        refused_and_kept(&w, &sb, "wf_p", rel, "writable by other users");
        mode(rel, 0o700);
    }
    rolls_back(&sb, "wf_p");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// With the snapshot folder `rel` of `wf` (whose action a1 replaced `m.txt` with `x`)
/// open to others: its rollback is refused, previewed and done, with `reserved_path`
/// and a reason holding `words`, and a prune passes it by, its snapshot and the file kept.
fn refused_and_kept(w: &World, sb: &ailab_sandbox_core::Sandbox, wf: &str, rel: &str, words: &str) {
    let info = sb.rollback_info(wf).unwrap();
    assert_eq!(
        (info.rollback_available, info.reason_code),
        (false, Some(ReasonCode::ReservedPath)),
        "{rel}: {info:?}"
    );
    let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rel}: {rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ReasonCode::ReservedPath),
        "{rel}: {rb:?}"
    );
    let reason = rb.reason.unwrap();
    assert!(
        reason.contains(words) && reason.contains("its snapshots are kept"),
        "{rel}: {reason}"
    );
    // The folder is named once.
    let folder = format!("{}'", w.path(rel).display());
    assert_eq!(reason.matches(&folder).count(), 1, "{rel}: {reason}");
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(report.workflows_pruned.is_empty(), "{rel}: {report:?}");
    assert!(
        w.path(&format!(".rollback/{wf}/a1/meta.json")).exists(),
        "{rel}"
    );
    assert!(
        w.path(&format!(".rollback/{wf}/a1/backup")).exists(),
        "{rel}"
    );
    assert_eq!(w.read("m.txt"), b"x", "{rel}");
}

/// A snapshot folder an access control list opens to another user (the store, the
/// workflow's or the action's folder) is not read either: its rollback is refused with
/// `reserved_path` and it is not pruned, its snapshots kept; with a list naming only
/// this process's user, it rolls back.
#[test]
fn a_snapshot_folder_an_access_control_list_opens_to_others_is_not_read() {
    let me = rustix::process::geteuid().as_raw();
    let other = if me == 65534 { 65533 } else { 65534 };
    let (w, sb) = mark_replaced("wf_acl");
    w.clock.advance(chrono::Duration::days(10));
    for rel in [".rollback", ".rollback/wf_acl", ".rollback/wf_acl/a1"] {
        if acl_giving_write(&w.path(rel), other, true).is_err() {
            eprintln!("no access control lists on this filesystem: skipped");
            return;
        }
        let words = format!("{rel}' is writable by other users through its access control list");
        refused_and_kept(&w, &sb, "wf_acl", rel, &words);
        acl_giving_write(&w.path(rel), me, true).unwrap();
    }
    rolls_back(&sb, "wf_acl");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// A genuine snapshot edited in place (its target renamed) no longer rolls back; put
/// back as it was, it does.
#[test]
fn an_edited_snapshot_refuses_its_workflow_rollback() {
    let w = World::new();
    w.write("m.txt", b"mark");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_meta", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "m.txt", "content": "x"},
            {"action_id": "a2", "intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    let path = meta_path(&w, "wf_meta", "a1");
    let genuine = std::fs::read(&path).unwrap();
    let edited = String::from_utf8(genuine.clone())
        .unwrap()
        .replace("\"m.txt\"", "\"other.txt\"");
    std::fs::write(&path, edited).unwrap();
    refused_as_untrusted(&sb, "wf_meta", ".rollback/wf_meta/a1/meta.json");
    assert_eq!(w.read("m.txt"), b"x");
    assert!(!w.path("other.txt").exists());
    assert_eq!(w.read("n.txt"), b"n", "nothing of the workflow was undone");

    std::fs::write(&path, genuine).unwrap();
    rolls_back(&sb, "wf_meta");
    assert_eq!(w.read("m.txt"), b"mark");
    assert!(!w.path("n.txt").exists());
}

/// A hand-made "restored" mark would make a rollback skip a file and report success:
/// it is refused instead.
#[test]
fn a_planted_restore_mark_is_not_trusted() {
    let (w, sb) = mark_replaced("wf_mark");
    std::fs::write(
        w.root.join(".rollback/wf_mark/a1/restored.json"),
        br#"{"execution_id":"exec_x","restored_checksum":null}"#,
    )
    .unwrap();
    refused_as_untrusted(&sb, "wf_mark", ".rollback/wf_mark/a1/restored.json");
    assert_eq!(w.read("m.txt"), b"x");
    // A genuine mark, written by a rollback, is honoured.
    std::fs::remove_file(w.root.join(".rollback/wf_mark/a1/restored.json")).unwrap();
    assert_eq!(
        sb.rollback_workflow("wf_mark", &RollbackOptions::default())
            .status,
        "rolled_back"
    );
    let again = sb.rollback_workflow("wf_mark", &RollbackOptions::default());
    assert_eq!(again.steps_rolled_back, 0, "{again:?}");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// A run that died after its commit point is finished at the next start. A record
/// planted beside its snapshot, claiming the same run and carrying a commit of its own
/// (a staged unit file, a registry entry, an audit line), is left alone: recovery
/// finishes the genuine action only, and the trail and registry hold nothing forged.
#[test]
fn recovery_acts_on_sealed_snapshots_only() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let mut config = w.writable_config();
    config.durability = ailab_sandbox_core::config::Durability::Batched;
    let sb = w.open(config.clone());
    sb.failpoints().arm_crash("before_registry", 1);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sb.run_plan(plan(json!({"workflow_id": "wf_commit", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]})))
    }));
    assert!(outcome.is_err(), "the run should die");
    drop(sb);

    let unit = b"[Service]\nExecStart=/bin/sh -c id\n";
    let staged = ".ailab-tmp-00000000000000000000000000000001";
    std::fs::write(w.root.join(staged), unit).unwrap();
    let mut forged = read_meta(&w, "wf_commit", "a1");
    forged["action_id"] = json!("a9");
    forged["snapshot_id"] = json!(format!("{}z", forged["snapshot_id"].as_str().unwrap()));
    forged["original_path"] = json!("evil.service");
    forged["existed"] = json!(false);
    forged["kind"] = json!("missing");
    forged["sha256"] = Value::Null;
    forged["size_bytes"] = Value::Null;
    forged["mode"] = Value::Null;
    forged["commit"]["staged_name"] = json!(staged);
    forged["commit"]["after_sha256"] = json!(sha(unit));
    forged["commit"]["artifact"] = Value::Null;
    forged["commit"]["audit"]["action_id"] = json!("a9");
    forged["commit"]["audit"]["target_path"] = json!("/etc/forged");
    plant(&w, "wf_commit", "a9", &forged, None);

    let sb = w.open(config);
    assert_eq!(
        w.read("a.txt"),
        b"ALPHA\n",
        "the genuine action is finished"
    );
    assert!(!w.path("evil.service").exists());
    let arts = sb.registry().get_by_workflow("wf_commit").unwrap();
    assert_eq!(arts.len(), 1);
    assert_eq!(arts[0].action_id, "a1");
    let trail = sb.audit_log().list(100, Some("wf_commit")).unwrap();
    assert!(trail.iter().all(|e| e.action_id != "a9"), "{trail:?}");
    assert!(trail.iter().all(|e| !e.target_path.contains("forged")));
    assert_eq!(sb.audit_stats().unwrap().success, 1);
    assert!(sb.audit_verify().unwrap().ok);
}

/// The key is made once, private to the owner, and read back by the next start, so
/// snapshots taken before a restart still roll back; a damaged key stops the start with
/// a message naming it.
#[test]
fn the_seal_key_is_private_and_outlives_the_process() {
    use std::os::unix::fs::PermissionsExt;
    let (w, sb) = mark_replaced("wf_keep");
    drop(sb);
    let key = w.state.join("seal.key");
    let bytes = std::fs::read(&key).unwrap();
    assert_eq!(bytes.len(), 32);
    assert_ne!(bytes, [0u8; 32]);
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let sb = w.sandbox();
    assert_eq!(std::fs::read(&key).unwrap(), bytes, "not replaced");
    rolls_back(&sb, "wf_keep");
    drop(sb);

    std::fs::write(&key, b"short").unwrap();
    let err = match ailab_sandbox_core::Sandbox::open(w.writable_config()) {
        Ok(_) => panic!("a damaged key stops the start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("seal.key"), "{err}");
}

/// Genuine records moved where they do not belong prove nothing: a restore mark copied
/// from another snapshot of the workflow, and a whole snapshot folder copied into another
/// root, are refused like forged ones.
#[test]
fn genuine_records_copied_elsewhere_are_not_trusted() {
    let w = World::new();
    let (root2, config) = two_roots(&w);
    w.write("m.txt", b"mark");
    w.write("n.txt", b"note");
    let sb = w.open(config.clone());
    run(
        &sb,
        json!({"workflow_id": "wf_copy", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "m.txt", "content": "x"},
            {"action_id": "a2", "intent": "replace_file", "path": "n.txt", "content": "y"}]}),
    );
    let one = sb.rollback_workflow(
        "wf_copy",
        &RollbackOptions {
            action_id: Some("a2".into()),
            ..RollbackOptions::default()
        },
    );
    assert_eq!(one.status, "rolled_back", "{one:?}");
    let folder = |root: &std::path::Path, a: &str| root.join(format!(".rollback/wf_copy/{a}"));
    std::fs::copy(
        folder(&w.root, "a2").join("restored.json"),
        folder(&w.root, "a1").join("restored.json"),
    )
    .unwrap();
    refused_as_untrusted(&sb, "wf_copy", ".rollback/wf_copy/a1/restored.json");
    assert_eq!(w.read("m.txt"), b"x");
    std::fs::remove_file(folder(&w.root, "a1").join("restored.json")).unwrap();

    copy_tree(&folder(&w.root, "a1"), &folder(&root2, "a1"));
    refused_as_untrusted(&sb, "wf_copy", ".rollback/wf_copy/a1/meta.json");
    // Said to be sealed for the root it came from, not forged.
    let reason = sb.rollback_info("wf_copy").unwrap().reason.unwrap();
    assert!(
        reason.contains(&format!("was sealed for the root '{}'", w.root.display()))
            && !reason.contains("seal:"),
        "{reason}"
    );
    assert!(!root2.join("m.txt").exists());
    std::fs::remove_dir_all(root2.join(".rollback")).unwrap();
    rolls_back(&sb, "wf_copy");
    assert_eq!(w.read("m.txt"), b"mark");
}

/// Removing records is caught too, through the audit trail in the state directory: a
/// workflow whose snapshot folder (or its metadata) is gone is not reported rolled back
/// with that file left as it was, and a removed restore mark does not make an undone
/// action be restored a second time.
#[test]
fn removed_records_are_caught_through_the_audit_trail() {
    let w = World::new();
    w.write("m.txt", b"mark");
    w.write("n.txt", b"note");
    let sb = w.sandbox();
    let plan = json!({"workflow_id": "wf_rm", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "m.txt", "content": "x"},
        {"action_id": "a2", "intent": "replace_file", "path": "n.txt", "content": "y"}]});
    run(&sb, plan);
    let a2 = w.root.join(".rollback/wf_rm/a2");
    let kept = w.tmp.path().join("a2-kept");
    copy_tree(&a2, &kept);
    for remove in [
        |d: &std::path::Path| std::fs::remove_dir_all(d).unwrap(),
        |d: &std::path::Path| std::fs::remove_file(d.join("meta.json")).unwrap(),
    ] {
        remove(&a2);
        let rb = sb.rollback_workflow("wf_rm", &RollbackOptions::default());
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
        let reason = rb.reason.unwrap();
        assert!(
            reason.contains("'a2'") && reason.contains("n.txt"),
            "{reason}"
        );
        assert_eq!(
            (w.read("m.txt"), w.read("n.txt")),
            (b"x".to_vec(), b"y".to_vec())
        );
        let _ = std::fs::remove_dir_all(&a2);
        copy_tree(&kept, &a2);
    }
    rolls_back(&sb, "wf_rm");
    assert_eq!(w.read("n.txt"), b"note");

    // The file changes again; with the restore marks gone, a second forced rollback
    // would put the old bytes back over it, but the trail says both were undone.
    w.write("n.txt", b"later");
    for a in ["a1", "a2"] {
        std::fs::remove_file(w.root.join(format!(".rollback/wf_rm/{a}/restored.json"))).unwrap();
    }
    let again = sb.rollback_workflow("wf_rm", &forced());
    assert_eq!(again.steps_rolled_back, 0, "{again:?}");
    assert_eq!(w.read("n.txt"), b"later");
}

/// A link planted in `.rollback/` is never followed, not even to decide whether an action
/// id was used: the write is refused for what it is (no snapshot can be taken there), not
/// blamed on an id that was never used, and nothing is written.
#[test]
fn a_link_planted_in_the_rollback_folder_is_not_followed() {
    let w = World::new();
    std::fs::create_dir_all(w.root.join("elsewhere/a1")).unwrap();
    std::fs::create_dir_all(w.root.join(".rollback")).unwrap();
    std::os::unix::fs::symlink("../elsewhere", w.root.join(".rollback/wf_ln")).unwrap();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_ln", "actions": [{"action_id": "a1", "intent": "create_file", "path": "n.txt", "content": "x"}]}),
    );
    assert_ne!(
        code(&r, 0).as_deref(),
        Some("invalid_id"),
        "{:?}",
        r.actions
    );
    assert_ne!(status(&r), "success");
    assert!(!w.path("n.txt").exists());
    assert!(w.path("elsewhere/a1").read_dir().unwrap().next().is_none());
}

/// A folder nothing vouches for — unsealed, planted, or another state directory's — does
/// not stop a prune, and is kept: nothing proves its age. Its workflow is listed among
/// those the prune could not do, saying why (it was counted among the young ones, said
/// only in the log).
#[test]
fn prune_is_not_stopped_by_untrusted_folders() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_old", "actions": [{"intent": "create_file", "path": "o.txt", "content": "o"}]}),
    );
    let mut meta = read_meta(&w, "wf_old", &first_action(&w, "wf_old"));
    meta.as_object_mut().unwrap().remove("seal");
    meta["workflow_id"] = json!("wf_junk");
    meta["action_id"] = json!("a1");
    plant(&w, "wf_junk", "a1", &meta, None);
    w.clock.advance(chrono::Duration::days(10));
    run(
        &sb,
        json!({"workflow_id": "wf_new", "actions": [{"intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_old"]);
    assert_eq!(report.workflows_kept, 1);
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    let kept = &report.workflows_failed[0];
    assert_eq!(kept.workflow_id, "wf_junk");
    assert_eq!(kept.reason_code, ReasonCode::ChecksumMismatch, "{kept:?}");
    assert!(
        kept.reason
            .starts_with("kept: 1 of its snapshot folders cannot be used as they stand, so they are neither judged nor removed: "),
        "{kept:?}"
    );
    assert!(w.root.join(".rollback/wf_new").exists());
    assert!(w.root.join(".rollback/wf_junk/a1/meta.json").exists());
}

/// A second runtime writing in the same root with another state directory (which the
/// README forbids) makes snapshots the first cannot trust: the first says that this may
/// be why, rather than only blame tampering or a replaced key.
#[test]
fn another_state_directorys_snapshots_are_said_to_be_possibly_that() {
    let w = World::new();
    let sb = w.sandbox();
    let mut other = w.writable_config();
    other.state_dir = w.tmp.path().join("state2");
    run(
        &w.open(other),
        json!({"workflow_id": "wf_other", "actions": [{"intent": "create_file", "path": "x.txt", "content": "x"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    let kept = &report.workflows_failed[0];
    assert_eq!(kept.workflow_id, "wf_other");
    assert!(
        kept.reason
            .contains("a runtime with another state directory writing in this root"),
        "{kept:?}"
    );
    assert!(w.path("x.txt").exists());
}

/// The config of a second runtime over the world's root, with its own state directory.
fn with_other_state_dir(w: &World) -> ailab_sandbox_core::config::Config {
    let mut other = w.writable_config();
    other.state_dir = w.tmp.path().join("state2");
    other
}

fn owner_record(w: &World) -> Value {
    serde_json::from_slice(&std::fs::read(w.root.join(".rollback/.ailab-owner")).unwrap()).unwrap()
}

/// Why a start with `config` over the world's root is refused.
fn start_refused(w: &World, config: ailab_sandbox_core::config::Config) -> String {
    let clock: std::sync::Arc<dyn ailab_sandbox_core::clock::Clock> =
        std::sync::Arc::new(w.clock.clone());
    ailab_sandbox_core::Sandbox::open_with_clock(config, clock)
        .unwrap_err()
        .to_string()
}

/// A snapshot store as the runtime makes it, with nothing in it.
fn make_private_store(w: &World) {
    std::fs::create_dir_all(w.root.join(".rollback")).unwrap();
    std::fs::set_permissions(
        w.root.join(".rollback"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
}

/// Makes a file private to its owner holding `bytes`, as the runtime's own are.
fn write_private(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
}

/// A runtime started over a root whose snapshot store another state directory claimed
/// writes nothing there: the root is skipped at start, saying whose the store is and what
/// to do, and the other's files and snapshots are left as they are.
#[test]
fn a_root_another_state_directory_writes_in_is_skipped_at_start() {
    let w = World::new();
    run(
        &w.sandbox(),
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    assert_eq!(
        owner_record(&w)["state_dir"],
        json!(w.state.display().to_string())
    );
    let before = w.tree();
    let err = start_refused(&w, with_other_state_dir(&w));
    // The refusal is read by plans' callers too: it names no state directory (the
    // record in the root names the owner).
    assert!(
        err.contains(
            "belongs to another runtime's state directory, the one its record names, not to this runtime's state directory"
        ) && err.contains("remove ")
            && err.contains(".rollback/.ailab-owner"),
        "{err}"
    );
    for state in [w.state.clone(), w.tmp.path().join("state2")] {
        assert!(!err.contains(&state.display().to_string()), "{err}");
    }
    assert_eq!(w.tree(), before);
    // With a root of its own beside it, it starts, and says why the shared one is not used.
    let (config, own) = {
        let mut c = with_other_state_dir(&w);
        let own = w.tmp.path().join("own");
        c.roots.push(own.clone());
        (c, own)
    };
    let other = w.open(config);
    assert_eq!(other.roots(), [own.as_path()]);
    assert!(
        other.skipped_roots()[0].contains("two runtimes writing in one root"),
        "{:?}",
        other.skipped_roots()
    );
    assert_eq!(w.tree(), before);
    // A record damaged, or something else in its place, is no one's to take over unsaid.
    let record = w.root.join(".rollback/.ailab-owner");
    let sealed = std::fs::read(&record).unwrap();
    for (what, said) in [
        ("damaged", "its record is damaged"),
        ("link", "is not a record the runtime wrote"),
    ] {
        std::fs::remove_file(&record).unwrap();
        match what {
            "damaged" => std::fs::write(&record, b"{\"state_dir\": 7").unwrap(),
            _ => std::os::unix::fs::symlink(w.tmp.path().join("elsewhere"), &record).unwrap(),
        }
        let err = start_refused(&w, w.writable_config());
        assert!(
            err.contains("belongs to an owner this runtime cannot tell") && err.contains(said),
            "{what}: {err}"
        );
    }
    std::fs::remove_file(&record).unwrap();
    std::fs::write(&record, &sealed).unwrap();
    std::fs::set_permissions(&record, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // The owner goes on writing there.
    run(
        &w.sandbox(),
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(w.read("b.txt"), b"b");
}

/// Two runtimes with different state directories started before either wrote: the one
/// that writes second is refused (`conflict`) before it touches its target, and the
/// first keeps writing.
#[test]
fn a_store_claimed_after_start_refuses_the_other_runtimes_first_snapshot() {
    let w = World::new();
    w.write("t.txt", b"mine");
    let first = w.sandbox();
    let second = w.open(with_other_state_dir(&w));
    run(
        &first,
        json!({"workflow_id": "wf_1", "actions": [{"intent": "create_file", "path": "one.txt", "content": "1"}]}),
    );
    let r = run(
        &second,
        json!({"workflow_id": "wf_2", "actions": [{"intent": "replace_file", "path": "t.txt", "content": "theirs"}]}),
    );
    assert_eq!(action_status(&r, 0), "failed", "{r:?}");
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{r:?}");
    assert_eq!(w.read("t.txt"), b"mine");
    assert!(!w.root.join(".rollback/wf_2").exists());
    run(
        &first,
        json!({"workflow_id": "wf_3", "actions": [{"intent": "replace_file", "path": "t.txt", "content": "again"}]}),
    );
    assert_eq!(w.read("t.txt"), b"again");
}

/// A store claimed by this very state directory under an earlier seal key (the operator
/// made a new key after losing the old one) is claimed again with the new key, and
/// writing goes on; a state directory copied to another path keeps its roots (its key
/// is the same); a start that may not write claims nothing.
#[test]
fn a_replaced_key_or_a_moved_state_directory_keeps_the_root() {
    let w = World::new();
    // Never claimed (as a store made before claims were), opened without writes: left
    // unclaimed.
    make_private_store(&w);
    drop(w.open(w.config()));
    assert!(!w.root.join(".rollback/.ailab-owner").exists());
    run(
        &w.sandbox(),
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    let first = std::fs::read(w.root.join(".rollback/.ailab-owner")).unwrap();
    let key = w.state.join("seal.key");
    std::fs::remove_file(&key).unwrap();
    write_private(&key, &[9u8; 32]);
    let sb = w.sandbox();
    assert_eq!(sb.roots(), [w.root.as_path()]);
    assert_noticed(
        &sb,
        "named this state directory under an earlier seal key: it is claimed again",
    );
    let again = std::fs::read(w.root.join(".rollback/.ailab-owner")).unwrap();
    assert_ne!(again, first, "sealed again with the new key");
    assert!(seal_key(&w).open::<Value>(&again).is_ok());
    run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(w.read("b.txt"), b"b");
    drop(sb);
    let moved = w.tmp.path().join("state_moved");
    std::fs::rename(&w.state, &moved).unwrap();
    let mut c = w.writable_config();
    c.state_dir = moved;
    let sb = w.open(c);
    assert_eq!(sb.roots(), [w.root.as_path()]);
    run(
        &sb,
        json!({"workflow_id": "wf_c", "actions": [{"intent": "create_file", "path": "c.txt", "content": "c"}]}),
    );
    assert_eq!(w.read("c.txt"), b"c");
}

/// An empty owner record, as a power cut can leave a claim written without syncs
/// (`relaxed`), or as a hand may make one, names no one: a runtime that may write claims
/// it and writes, and one of another state directory then finds it claimed.
#[test]
fn an_empty_owner_record_is_claimed_by_the_first_writer() {
    let w = World::new();
    make_private_store(&w);
    write_private(&w.root.join(".rollback/.ailab-owner"), b"");
    let sb = w.sandbox();
    assert_eq!(sb.roots(), [w.root.as_path()]);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    assert_eq!(action_status(&r, 0), "success", "{r:?}");
    assert_eq!(w.read("a.txt"), b"a");
    let record = std::fs::read(w.root.join(".rollback/.ailab-owner")).unwrap();
    assert!(seal_key(&w).open::<Value>(&record).is_ok());
    assert_eq!(
        owner_record(&w)["state_dir"],
        json!(w.state.display().to_string())
    );
    let err = start_refused(&w, with_other_state_dir(&w));
    assert!(
        err.contains("belongs to another runtime's state directory"),
        "{err}"
    );
}

/// A running runtime's claim removed (or emptied) by hand, then taken by a runtime of
/// another state directory: the first sees it at its next write, refused `conflict`
/// before it touches anything, and the other's files stay; a claim removed and taken by
/// no one is made again by the next write.
#[test]
fn a_claim_lost_while_running_is_seen_at_the_next_write() {
    let w = World::new();
    let first = w.sandbox();
    run(
        &first,
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "f.txt", "content": "a"}]}),
    );
    let record = w.root.join(".rollback/.ailab-owner");
    // Removed, no one else about: claimed again by the next write.
    std::fs::remove_file(&record).unwrap();
    run(
        &first,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "replace_file", "path": "f.txt", "content": "b"}]}),
    );
    assert_eq!(w.read("f.txt"), b"b");
    assert!(
        seal_key(&w)
            .open::<Value>(&std::fs::read(&record).unwrap())
            .is_ok()
    );
    let root = w.root.display().to_string();
    // What the state document tells of the root: usable, or skipped and why.
    let told = |sb: &ailab_sandbox_core::Sandbox| {
        let doc = sb.state_doc().unwrap();
        (doc.sandbox_roots.contains(&root), doc.skipped_roots)
    };
    assert_eq!(told(&first), (true, vec![]));
    for how in ["removed", "emptied"] {
        match how {
            "removed" => std::fs::remove_file(&record).unwrap(),
            _ => std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&record)
                .map(drop)
                .unwrap(),
        }
        let other_dir = w.tmp.path().join(format!("state_{how}"));
        let mut c = w.writable_config();
        c.state_dir = other_dir.clone();
        let other = w.open(c);
        let wf = format!("wf_other_{how}");
        let r = run(
            &other,
            json!({"workflow_id": wf, "actions": [{"intent": "replace_file", "path": "f.txt", "content": "theirs"}]}),
        );
        assert_eq!(action_status(&r, 0), "success", "{how}: {r:?}");
        assert_eq!(
            owner_record(&w)["state_dir"],
            json!(other_dir.display().to_string())
        );
        let (usable, skipped) = told(&first);
        assert!(!usable, "{how}");
        assert!(
            skipped.len() == 1
                && skipped[0].contains(&format!("the snapshot store of root {root} belongs to"))
                && skipped[0].contains(&format!("'{}'", record.display())),
            "{how}: {skipped:?}"
        );
        assert_eq!(told(&other), (true, vec![]), "{how}");
        let r = run(
            &first,
            json!({"workflow_id": format!("wf_late_{how}"), "actions": [{"intent": "replace_file", "path": "f.txt", "content": "mine"}]}),
        );
        assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{how}: {r:?}");
        assert_eq!(w.read("f.txt"), b"theirs", "{how}");
        assert!(!w.root.join(format!(".rollback/wf_late_{how}")).exists());
        // Given back to the first, as the refusal says (the other gone for good).
        drop(other);
        std::fs::remove_file(&record).unwrap();
        std::fs::remove_dir_all(w.root.join(format!(".rollback/{wf}"))).unwrap();
        // No one's now: usable, claimed again by the next write.
        assert_eq!(told(&first), (true, vec![]), "{how}");
        let r = run(
            &first,
            json!({"workflow_id": format!("wf_back_{how}"), "actions": [{"intent": "replace_file", "path": "f.txt", "content": "back"}]}),
        );
        assert_eq!(action_status(&r, 0), "success", "{how}: {r:?}");
        assert_eq!(
            owner_record(&w)["state_dir"],
            json!(w.state.display().to_string())
        );
    }
}

/// A copy of the state directory at another path has its seal key, but is another
/// runtime with its own trail and locks: it is refused the root the original claimed,
/// told how to take it over if the original is gone, and then the original is refused.
#[test]
fn a_copy_of_the_state_directory_is_not_taken_for_it() {
    let w = World::new();
    run(
        &w.sandbox(),
        json!({"workflow_id": "wf_0", "actions": [{"intent": "create_file", "path": "f.txt", "content": "0"}]}),
    );
    let copy = w.tmp.path().join("state_copy");
    copy_tree(&w.state, &copy);
    let copied = {
        let mut c = w.writable_config();
        c.state_dir = copy.clone();
        c
    };
    let err = start_refused(&w, copied.clone());
    assert!(
        err.contains(
            "belongs to a copy of this runtime's state directory at another path (it has this runtime's seal key;"
        ) && err.contains("remove "),
        "{err}"
    );
    assert!(!err.contains(&w.state.display().to_string()), "{err}");
    // The original gone for good: its copy takes the root, with its snapshots.
    std::fs::remove_file(w.root.join(".rollback/.ailab-owner")).unwrap();
    let taken = w.open(copied);
    run(
        &taken,
        json!({"workflow_id": "wf_1", "actions": [{"intent": "replace_file", "path": "f.txt", "content": "1"}]}),
    );
    assert_eq!(w.read("f.txt"), b"1");
    let err = start_refused(&w, w.writable_config());
    assert!(
        err.contains("belongs to a copy of this runtime's state directory at another path"),
        "{err}"
    );
}

/// A store with snapshots and no owner record (its record removed, or made before
/// records were) is claimed by the next runtime that may write, which says so: they may
/// be another state directory's, whose runtime is refused the root from then on.
#[test]
fn claiming_a_store_that_holds_snapshots_says_so() {
    let w = World::new();
    run(
        &w.sandbox(),
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    std::fs::remove_file(w.root.join(".rollback/.ailab-owner")).unwrap();
    let other = w.open(with_other_state_dir(&w));
    assert_noticed(
        &other,
        "held the snapshots of 1 workflow and no owner record",
    );
    assert_eq!(
        owner_record(&w)["state_dir"],
        json!(w.tmp.path().join("state2").display().to_string())
    );
    // An empty store claimed says nothing.
    let fresh = World::new();
    make_private_store(&fresh);
    let sb = fresh.sandbox();
    assert!(
        sb.notices().iter().all(|n| !n.contains("owner record")),
        "{:?}",
        sb.notices()
    );
}

/// What a claim killed before its rename leaves in the store's top (its temporary file)
/// is removed by a prune once it is too old to be a claim under way; a young one stays.
#[test]
fn a_prune_removes_what_a_dead_claim_left() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    let old = w.root.join(".rollback/.ailab-tmp-dead");
    let young = w.root.join(".rollback/.ailab-tmp-young");
    write_private(&old, b"");
    write_private(&young, b"");
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
        .unwrap();
    sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(!old.exists());
    assert!(young.exists());
    assert!(w.root.join(".rollback/.ailab-owner").exists());
}

/// A folder without a record holds at most a snapshot the runtime stopped making (its
/// backup, temporary files): one that holds anything else was filled by someone else,
/// and is kept and named like any folder nothing vouches for, not pruned as unfinished.
#[test]
fn a_folder_without_a_record_holding_foreign_files_is_not_pruned() {
    let w = World::new();
    let sb = w.sandbox();
    let folder = w.root.join(".rollback/wf_q/a1");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("notes.txt"), b"precious\n").unwrap();
    std::fs::create_dir_all(w.root.join(".rollback/wf_e/a1")).unwrap();
    std::fs::write(w.root.join(".rollback/wf_e/a1/backup"), b"half made\n").unwrap();
    w.clock.advance(chrono::Duration::days(10));
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(report.workflows_pruned, ["wf_e"], "{report:?}");
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    let kept = &report.workflows_failed[0];
    assert_eq!(kept.workflow_id, "wf_q");
    assert_eq!(kept.reason_code, ReasonCode::ChecksumMismatch, "{kept:?}");
    assert!(
        kept.reason.contains(
            "has no meta.json but holds what the runtime did not make there ('notes.txt')"
        ),
        "{kept:?}"
    );
    assert_eq!(
        std::fs::read(folder.join("notes.txt")).unwrap(),
        b"precious\n"
    );
}

/// Pruned writes are not missing snapshots: after a prune the workflow id can be used
/// again and its new run rolls back. A run that also wrote into a root this process is
/// not configured with is not "rolled back" by it: the whole-workflow rollback is refused
/// naming the actions it cannot reach, one action at a time works, and a process with
/// every root finishes the job.
#[test]
fn the_audit_cross_check_spares_pruned_writes_and_other_roots() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_again", "actions": [{"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_again"]);
    run(
        &sb,
        json!({"workflow_id": "wf_again", "actions": [{"action_id": "b1", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    rolls_back(&sb, "wf_again");
    assert!(!w.path("two.txt").exists());
    assert_eq!(w.read("one.txt"), b"1", "pruned: no longer reversible");
    drop(sb);

    let (root2, both) = two_roots(&w);
    let sb = w.open(both);
    run(
        &sb,
        json!({"workflow_id": "wf_two", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "here.txt", "content": "h"},
            {"action_id": "a2", "intent": "create_file", "path": root2.join("there.txt").display().to_string(), "content": "t"}]}),
    );
    assert!(root2.join("there.txt").exists());
    drop(sb);
    let sb = w.sandbox();
    // What GET /agentic/rollback/{id} says is what POST then does.
    let info = sb.rollback_info("wf_two").unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(
        info.reason_code,
        Some(ReasonCode::OutsideSandbox),
        "{info:?}"
    );
    assert!(info.reason.unwrap().contains("'a2'"));
    let rb = sb.rollback_workflow("wf_two", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::OutsideSandbox), "{rb:?}");
    let reason = rb.reason.unwrap();
    assert!(
        reason.contains("'a2'") && !reason.contains("'a1'"),
        "{reason}"
    );
    assert!(
        !reason.contains("root2"),
        "no path outside this process's roots: {reason}"
    );
    assert!(w.path("here.txt").exists(), "nothing rolled back");
    // Asked for alone, it is refused for itself, with no word of the other actions.
    let alone = sb.rollback_workflow(
        "wf_two",
        &RollbackOptions {
            action_id: Some("a2".to_owned()),
            ..RollbackOptions::default()
        },
    );
    assert_eq!(
        alone.reason_code,
        Some(ReasonCode::OutsideSandbox),
        "{alone:?}"
    );
    let reason = alone.reason.unwrap_or_default();
    assert!(
        reason.contains("so it cannot be rolled back by this process")
            && !reason.contains("other actions"),
        "{reason}"
    );
    let one = sb.rollback_workflow(
        "wf_two",
        &RollbackOptions {
            action_id: Some("a1".to_owned()),
            ..RollbackOptions::default()
        },
    );
    assert_eq!(one.status, "rolled_back", "{one:?}");
    assert!(!w.path("here.txt").exists());
    assert!(root2.join("there.txt").exists(), "not this process's root");
    drop(sb);
    // Given but skipped at start (others may write in it): named as such, with why.
    let (_, both) = two_roots(&w);
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root2, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(0o777);
    let rb = w
        .open(both)
        .rollback_workflow("wf_two", &RollbackOptions::default());
    mode(0o755);
    let reason = rb.reason.unwrap_or_default();
    assert_eq!(rb.reason_code, Some(ReasonCode::OutsideSandbox), "{reason}");
    assert!(
        reason.contains(&format!(
            "the root {}, which this process skipped at start: root {} ",
            root2.display(),
            root2.display()
        )) && reason.contains("writable by other users")
            && reason.contains("make that root usable")
            && !reason.contains("not configured"),
        "{reason}"
    );
    let (_, both) = two_roots(&w);
    let info = w.open(both).rollback_info("wf_two").unwrap();
    assert!(info.rollback_available, "{info:?}");
    assert_eq!((info.reason_code, info.reason), (None, None));
    let (_, both) = two_roots(&w);
    rolls_back(&w.open(both), "wf_two");
    assert!(!root2.join("there.txt").exists());
}

/// A rollback after a prune says which writes it could not undo, so that "rolled back"
/// is not taken for "as before the workflow": here a prune made with one of two roots
/// removed that root's snapshots, and the rollback with both restores the other's.
#[test]
fn a_rollback_names_the_writes_a_prune_made_irreversible() {
    let w = World::new();
    let (root2, both) = two_roots(&w);
    let sb = w.open(both);
    run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": root2.join("two.txt").display().to_string(), "content": "2"},
            {"action_id": "a3", "intent": "create_file", "path": "four.txt", "content": "4"}]}),
    );
    // Undone before the prune: nothing of it stays, so nothing is said of it.
    let one = sb.rollback_workflow(
        "wf_m",
        &RollbackOptions {
            action_id: Some("a3".to_owned()),
            ..RollbackOptions::default()
        },
    );
    assert_eq!(one.status, "rolled_back", "{one:?}");
    drop(sb);
    w.clock.advance(chrono::Duration::days(10));
    let week = std::time::Duration::from_secs(7 * 86_400);
    assert_eq!(w.sandbox().prune(week).unwrap().workflows_pruned, ["wf_m"]);
    let (_, both) = two_roots(&w);
    let sb = w.open(both);
    run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [{"action_id": "b1", "intent": "create_file", "path": "three.txt", "content": "3"}]}),
    );
    let rb = sb.rollback_workflow("wf_m", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!((rb.steps_rolled_back, rb.reason_code), (2, None));
    let reason = rb.reason.unwrap();
    assert!(
        reason.contains("1 earlier write(s) had their snapshots pruned"),
        "{reason}"
    );
    assert!(
        reason.contains("'a1'") && !reason.contains("'a2'"),
        "{reason}"
    );
    assert!(!reason.contains("'a3'"), "{reason}");
    assert!(!w.path("three.txt").exists());
    assert!(!root2.join("two.txt").exists());
    assert!(w.path("one.txt").exists(), "pruned: stays");
    // Nothing pruned, nothing said.
    run(
        &sb,
        json!({"workflow_id": "wf_n", "actions": [{"intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    let rb = sb.rollback_workflow("wf_n", &RollbackOptions::default());
    assert_eq!((rb.status.as_str(), rb.reason), ("rolled_back", None));
}

fn first_action(w: &World, wf: &str) -> String {
    std::fs::read_dir(w.root.join(format!(".rollback/{wf}")))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .into_string()
        .unwrap()
}

/// Pruning several roots, where a workflow wrote into one of them only, prunes every old
/// workflow and records it; a root spelled with a trailing slash is the same root for the
/// snapshots it holds.
#[test]
fn prune_over_several_roots_and_root_spellings() {
    let w = World::new();
    let (root2, both) = two_roots(&w);
    let sb = w.open(both.clone());
    run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [{"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"action_id": "b1", "intent": "create_file", "path": root2.join("b.txt").display().to_string(), "content": "b"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_a", "wf_b"]);
    run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [{"action_id": "a2", "intent": "create_file", "path": "a2.txt", "content": "a"}]}),
    );
    rolls_back(&sb, "wf_a");
    drop(sb);

    let mut slashed = w.writable_config();
    slashed.roots = vec![std::path::PathBuf::from(format!("{}/", w.root.display()))];
    let sb = w.open(slashed);
    run(
        &sb,
        json!({"workflow_id": "wf_s", "actions": [{"action_id": "s1", "intent": "create_file", "path": "s.txt", "content": "s"}]}),
    );
    drop(sb);
    let sb = w.sandbox();
    rolls_back(&sb, "wf_s");
    assert!(!w.path("s.txt").exists());
}

/// A prune records itself before removing anything; the writes its mark covers are
/// pruned, whatever of their snapshots is left (here one removed, one still there): the
/// rollback names them and restores none, and the next prune removes what is left. With
/// every folder gone and no prune, the refusal names the actions as missing.
#[test]
fn a_prune_that_stopped_half_way_or_a_removed_workflow_folder_is_refused() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_half", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    // Recorded, then stopped before the folders went.
    let seq = sb.audit_log().last_seq().unwrap();
    ailab_sandbox_core::confine::state::StateDir::open(&w.state)
        .unwrap()
        .write_prune_mark("wf_half", &[(w.root.display().to_string(), seq)])
        .unwrap();
    std::fs::remove_dir_all(w.root.join(".rollback/wf_half/a1")).unwrap();
    let rb = sb.rollback_workflow("wf_half", &RollbackOptions::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let said = rb.reason.unwrap();
    assert!(
        said.contains("2 write(s) had their snapshots pruned")
            && said.contains("'a1' (")
            && said.contains("two.txt')"),
        "{said}"
    );
    assert!(w.path("one.txt").exists() && w.path("two.txt").exists());
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_half"]);

    run(
        &sb,
        json!({"workflow_id": "wf_gone", "actions": [{"action_id": "g1", "intent": "create_file", "path": "g.txt", "content": "g"}]}),
    );
    std::fs::remove_dir_all(w.root.join(".rollback/wf_gone")).unwrap();
    let rb = sb.rollback_workflow("wf_gone", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    assert!(rb.reason.unwrap().contains("'g1'"));
}

/// A world whose workflow `wf` created `one.txt` and `two.txt` (actions `a1`, `a2`) ten
/// days ago, and whose prune of a week then died at failure point `point`.
fn pruned_until_it_dies(wf: &str, point: &str) -> World {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": wf, "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    sb.failpoints().arm_crash(point, 1);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sb.prune(std::time::Duration::from_secs(7 * 86_400))
    }));
    assert!(outcome.is_err(), "the prune dies");
    w
}

/// A prune killed once its mark is made and before it moves the workflow's folder
/// leaves the folder whole: the writes the mark covers stay pruned (as a prune that
/// finished leaves them), and a plan run on the workflow since rolls back as a whole,
/// the file it replaced given back its pruned write's bytes. The next prune removes
/// the folder (both were refused as "a prune stopped half way" until a prune ran again
/// and the later writes had aged too).
#[test]
fn a_prune_killed_before_moving_the_folder_leaves_later_writes_reversible() {
    let w = pruned_until_it_dies("wf_k", "sync_prune_marks");
    assert!(w.state.join("inflight/wf_k.pruned").exists(), "marked");
    assert!(w.root.join(".rollback/wf_k/a1").is_dir(), "not moved");

    let sb = w.sandbox();
    // Nothing written since: nothing to roll back, the covered writes named.
    let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    let said = rb.reason.unwrap();
    assert!(
        said.contains("2 write(s) had their snapshots pruned") && said.contains("two.txt')"),
        "{said}"
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_k", "actions": [
            {"action_id": "a3", "intent": "create_file", "path": "three.txt", "content": "3"},
            {"action_id": "a4", "intent": "replace_file", "path": "one.txt", "content": "1b"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = sb.rollback_workflow("wf_k", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 2, "{rb:?}");
    assert!(!w.path("three.txt").exists());
    assert_eq!(std::fs::read(w.path("one.txt")).unwrap(), b"1");
    assert_eq!(std::fs::read(w.path("two.txt")).unwrap(), b"2");
    let said = rb.reason.unwrap_or_default();
    assert!(
        said.contains("2 earlier write(s) had their snapshots pruned")
            && said.contains("one.txt')")
            && said.contains("two.txt')"),
        "{said}"
    );

    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_k"], "{report:?}");
    assert!(!w.root.join(".rollback/wf_k").exists());
    assert_eq!(std::fs::read(w.path("one.txt")).unwrap(), b"1");
}

/// A prune moves a workflow's snapshot folder aside in one step before removing it: one
/// that dies while removing leaves no half-removed workflow, so later writes of the
/// workflow stay reversible, and the next prune removes what it left.
#[test]
fn a_prune_that_dies_while_removing_leaves_the_workflow_reversible() {
    let w = pruned_until_it_dies("wf_cut", "during_prune");
    let aside = || {
        std::fs::read_dir(w.root.join(".rollback"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".ailab-pruned-")
            })
            .count()
    };
    assert_eq!(aside(), 1, "moved aside whole");
    assert!(!w.root.join(".rollback/wf_cut").exists());

    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_cut", "actions": [
            {"action_id": "a3", "intent": "create_file", "path": "three.txt", "content": "3"}]}),
    );
    let rb = sb.rollback_workflow("wf_cut", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1);
    assert!(!w.path("three.txt").exists());
    assert!(w.path("one.txt").exists() && w.path("two.txt").exists());
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert!(report.workflows_pruned.is_empty(), "{report:?}");
    assert_eq!(aside(), 0, "swept by the next prune");
}

/// A root reached through another spelling of its path (a symlink to it) is the same
/// root for the snapshots it holds.
#[test]
fn a_root_named_through_a_symlink_keeps_its_snapshots() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_ln", "actions": [{"action_id": "a1", "intent": "create_file", "path": "l.txt", "content": "l"}]}),
    );
    drop(sb);
    let link = w.tmp.path().join("link-to-here");
    std::os::unix::fs::symlink(w.tmp.path(), &link).unwrap();
    let mut c = w.writable_config();
    c.roots = vec![link.join("root")];
    let sb = w.open(c);
    rolls_back(&sb, "wf_ln");
    assert!(!w.path("l.txt").exists());
}

/// After a prune the workflow's action ids may be used again, a prune made with one of
/// two roots leaves the other's snapshots reversible, and a root named through a
/// symlinked path still has its missing snapshots noticed.
#[test]
fn prune_marks_name_their_roots_and_runs() {
    let w = World::new();
    let (root2, both) = two_roots(&w);
    let sb = w.open(both.clone());
    run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "a"},
            {"action_id": "b1", "intent": "create_file", "path": root2.join("b.txt").display().to_string(), "content": "b"}]}),
    );
    drop(sb);
    w.clock.advance(chrono::Duration::days(10));
    let sb = w.sandbox();
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_p"]);
    run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [{"action_id": "a1", "intent": "create_file", "path": "again.txt", "content": "x"}]}),
    );
    drop(sb);
    let sb = w.open(both);
    rolls_back(&sb, "wf_p");
    assert!(!w.path("again.txt").exists());
    assert!(
        !root2.join("b.txt").exists(),
        "root2 was not pruned: still reversible"
    );
    assert!(w.path("a.txt").exists(), "pruned: no longer reversible");
    drop(sb);

    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_q", "actions": [
            {"action_id": "q1", "intent": "create_file", "path": "q1.txt", "content": "1"},
            {"action_id": "q2", "intent": "create_file", "path": "q2.txt", "content": "2"}]}),
    );
    drop(sb);
    std::fs::remove_dir_all(w.root.join(".rollback/wf_q/q1")).unwrap();
    let link = w.tmp.path().join("via");
    std::os::unix::fs::symlink(w.tmp.path(), &link).unwrap();
    let mut linked = w.writable_config();
    linked.roots = vec![link.join("root")];
    let sb = w.open(linked);
    let rb = sb.rollback_workflow("wf_q", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    assert!(rb.reason.unwrap().contains("'q1'"));
    assert!(w.path("q2.txt").exists());
}
