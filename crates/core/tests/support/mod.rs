//! Fixtures shared by the executor, rollback, registry and audit tests.
#![allow(dead_code)]

use ailab_sandbox_core::clock::{Clock, ManualClock};
use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::{Config, Plan, RunResult, Sandbox};
use chrono::TimeZone;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A temporary world: a root, a state directory and an outside directory.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub outside: PathBuf,
    pub clock: ManualClock,
}

impl World {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let state = tmp.path().join("state");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), b"outside-secret").unwrap();
        let start = chrono::Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
        Self {
            tmp,
            root,
            state,
            outside,
            clock: ManualClock::new(start),
        }
    }

    pub fn config(&self) -> Config {
        let mut c = Config::with_roots(vec![self.root.clone()], self.state.clone());
        c.durability = Durability::Relaxed;
        c
    }

    pub fn writable_config(&self) -> Config {
        let mut c = self.config();
        c.enable_write = true;
        c.dry_run = false;
        c
    }

    /// A sandbox with writes enabled and the manual clock.
    pub fn sandbox(&self) -> Sandbox {
        self.open(self.writable_config())
    }

    pub fn open(&self, config: Config) -> Sandbox {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        Sandbox::open_with_clock(config, clock).unwrap()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap()
    }

    pub fn write(&self, rel: &str, bytes: &[u8]) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    /// The root's tree (without `.rollback/`): path → file bytes, or `None` for a directory.
    pub fn tree(&self) -> BTreeMap<String, Option<Vec<u8>>> {
        tree(&self.root)
    }

    /// The outside directory's tree.
    pub fn outside_tree(&self) -> BTreeMap<String, Option<Vec<u8>>> {
        tree(&self.outside)
    }
}

pub fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let e = e.unwrap();
        let p = e.path();
        let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
        if rel == ".rollback" {
            continue;
        }
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.insert(rel, None);
            walk(base, &p, out);
        } else if ft.is_file() {
            out.insert(rel, Some(std::fs::read(&p).unwrap()));
        } else {
            out.insert(rel, Some(b"<special>".to_vec()));
        }
    }
}

pub fn plan(v: serde_json::Value) -> Plan {
    serde_json::from_value(v).unwrap()
}

pub fn run(sb: &Sandbox, v: serde_json::Value) -> RunResult {
    sb.run_plan(plan(v)).unwrap()
}

/// The statuses of action `action`'s lines on workflow `wf`'s trail, oldest first.
pub fn action_statuses(
    sb: &Sandbox,
    wf: &str,
    action: &str,
) -> Vec<ailab_sandbox_core::audit::AuditStatus> {
    sb.audit_log()
        .by_workflow(wf)
        .unwrap()
        .into_iter()
        .filter(|e| e.action_id == action)
        .map(|e| e.status)
        .collect()
}

pub fn sha(bytes: &[u8]) -> String {
    ailab_sandbox_core::hash::sha256_hex(bytes)
}

pub fn status(r: &RunResult) -> String {
    serde_json::to_value(r.status)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

pub fn action_status(r: &RunResult, i: usize) -> String {
    serde_json::to_value(r.actions[i].status)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// The statuses of a workflow's audit lines, newest first, as the log spells them.
pub fn audit_statuses(sb: &Sandbox, workflow_id: &str) -> Vec<String> {
    sb.audit_entries(100, Some(workflow_id))
        .unwrap()
        .iter()
        .map(|e| {
            serde_json::to_value(e.status)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

pub fn code(r: &RunResult, i: usize) -> Option<String> {
    r.actions[i].reason_code.map(|c| c.as_str().to_owned())
}

pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Makes `to` hold what `from` holds, keeping each folder both hold (as a power cut keeps
/// a durable folder, inode and all, which snapshots record): files copied again, what
/// `from` does not hold removed.
pub fn put_back_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(to).unwrap() {
        let e = e.unwrap();
        let path = e.path();
        let kept = std::fs::symlink_metadata(from.join(e.file_name())).is_ok_and(|m| m.is_dir());
        if e.file_type().unwrap().is_dir() {
            if !kept {
                std::fs::remove_dir_all(&path).unwrap();
            }
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            put_back_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// What the disk holds at a sync point: the root and the state directory.
pub struct Durable {
    saved: tempfile::TempDir,
}

impl Durable {
    pub fn take(w: &World) -> Self {
        Self::of(&w.root, &w.state)
    }

    /// [`Durable::take`] of a world's root and state directory given by path.
    pub fn of(root: &Path, state: &Path) -> Self {
        let saved = tempfile::tempdir().unwrap();
        copy_tree(root, &saved.path().join("root"));
        copy_tree(state, &saved.path().join("state"));
        Self { saved }
    }

    /// Has every sync point of a sandbox armed with `points` record, just before it
    /// syncs, what it makes durable: `last` holds the latest.
    pub fn record_sync_points(
        points: &Arc<ailab_sandbox_core::failpoint::FailPoints>,
        w: &World,
        last: &Arc<std::sync::Mutex<Option<Durable>>>,
    ) {
        fn arm(
            points: &Arc<ailab_sandbox_core::failpoint::FailPoints>,
            dirs: (PathBuf, PathBuf),
            last: Arc<std::sync::Mutex<Option<Durable>>>,
        ) {
            let again = Arc::clone(points);
            points.interleave(
                "batch_sync",
                Arc::new(move || {
                    *last.lock().unwrap() = Some(Durable::of(&dirs.0, &dirs.1));
                    arm(&again, dirs.clone(), Arc::clone(&last));
                }),
            );
        }
        arm(points, (w.root.clone(), w.state.clone()), Arc::clone(last));
    }

    /// The power cut: the root and the state directory go back to this sync point,
    /// except the commit logs, which were synced since.
    pub fn restore_except_commit_logs(&self, w: &World) {
        put_back_tree(&self.saved.path().join("root"), &w.root);
        let logs = w.state.join("inflight");
        let kept: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&logs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| {
                let b = std::fs::read(&p).unwrap();
                (p, b)
            })
            .collect();
        std::fs::remove_dir_all(&w.state).unwrap();
        copy_tree(&self.saved.path().join("state"), &w.state);
        for (p, b) in kept {
            std::fs::write(p, b).unwrap();
        }
    }
}

/// Asserts that one of the sandbox's start-up notices mentions `text`.
#[track_caller]
pub fn assert_noticed(sb: &Sandbox, text: &str) {
    assert!(
        sb.notices().iter().any(|n| n.contains(text)),
        "no notice mentions {text:?}: {:?}",
        sb.notices()
    );
}

/// Rollback options that restore over later changes (`force`), for the whole workflow.
pub fn forced() -> ailab_sandbox_core::sandbox::RollbackOptions {
    ailab_sandbox_core::sandbox::RollbackOptions {
        action_id: None,
        force: true,
    }
}

/// The newest `rolled_back` line of workflow `wf` on the trail.
pub fn rolled_back_line(
    sb: &ailab_sandbox_core::Sandbox,
    wf: &str,
) -> ailab_sandbox_core::audit::SandboxAuditEntry {
    sb.audit_entries(100, Some(wf))
        .unwrap()
        .into_iter()
        .find(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
        .expect("a rolled_back line is on the trail")
}

/// `action:Status` for each of a workflow's audit lines, newest first.
pub fn statuses_of(sb: &ailab_sandbox_core::Sandbox, wf: &str) -> Vec<String> {
    sb.audit_entries(50, Some(wf))
        .unwrap()
        .iter()
        .map(|e| format!("{}:{:?}", e.action_id, e.status))
        .collect()
}

/// A workflow's run record as the state directory holds it.
pub fn run_record(w: &World, wf: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(w.state.join(format!("inflight/{wf}.json"))).unwrap();
    // A record rewritten in place is padded to its block with NUL bytes.
    serde_json::from_str(text.trim_end_matches('\0')).unwrap()
}

/// Makes workflow `wf`'s run record say it was written in an earlier boot of the machine
/// (one a crash ended), as a start after a reboot finds it.
pub fn from_an_earlier_boot(w: &World, wf: &str) {
    let mut rec = run_record(w, wf);
    rec["boot"] = serde_json::json!("an-earlier-boot");
    std::fs::write(w.state.join(format!("inflight/{wf}.json")), rec.to_string()).unwrap();
}

/// A second root beside the world's, made, and `config` with both roots.
pub fn with_second_root(
    w: &World,
    config: &ailab_sandbox_core::Config,
) -> (std::path::PathBuf, ailab_sandbox_core::Config) {
    let root2 = w.tmp.path().join("root2");
    std::fs::create_dir(&root2).unwrap();
    let mut both = config.clone();
    both.roots = vec![w.root.clone(), root2.clone()];
    (root2, both)
}

/// Runs a one-file plan of `wf` in `sb` and asserts that it is blocked for a root this
/// process lacks, `root` unnamed: a refusal reaches clients, who learn no path outside
/// the roots (the log names it).
#[track_caller]
pub fn assert_run_blocked_for_a_root_it_lacks(sb: &Sandbox, wf: &str, root: &std::path::Path) {
    let r = run(
        sb,
        serde_json::json!({"workflow_id": wf, "actions": [
            {"intent": "create_file", "path": "blocked.txt", "content": "b\n"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    let why = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(
        why.contains("this process is not configured with")
            && !why.contains(&root.display().to_string()),
        "{r:?}"
    );
}

/// Another program appending `line` to `path` (open, append, close), to be run at a
/// failpoint: what a log writer outside the runtime does at that moment.
pub fn another_program_appends(
    path: PathBuf,
    line: &'static [u8],
) -> ailab_sandbox_core::failpoint::Interleave {
    std::sync::Arc::new(move || {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, line).unwrap();
    })
}

/// Asserts that the preview of a rollback of `wf` (what `GET /agentic/rollback` answers)
/// offers none and gives `code`, and that the rollback then is refused with `code` too;
/// returns the preview's reason.
#[track_caller]
pub fn assert_refused_as_previewed(
    sb: &Sandbox,
    wf: &str,
    code: ailab_sandbox_core::ReasonCode,
) -> String {
    let info = sb.rollback_info(wf).unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(info.reason_code, Some(code), "{info:?}");
    let rb = sb.rollback_workflow(wf, &Default::default());
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(code), "{rb:?}");
    info.reason.unwrap_or_default()
}

/// Gives user `uid` read and write on `path` (and, with `search`, the right to pass
/// through a folder) in an access control list, written as the kernel keeps one: its
/// mask allows them, the owner's and group's modes stay as a plain mode would set them.
pub fn acl_giving_write(path: &std::path::Path, uid: u32, search: bool) -> rustix::io::Result<()> {
    let x = u16::from(search);
    let mut v = vec![2, 0, 0, 0];
    for (tag, perm, id) in [
        (0x01u16, 6 | x, u32::MAX),
        (0x02, 6 | x, uid),
        (0x04, 4 | x, u32::MAX),
        (0x10, 6 | x, u32::MAX),
        (0x20, 4 | x, u32::MAX),
    ] {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    rustix::fs::setxattr(
        path,
        "system.posix_acl_access",
        &v,
        rustix::fs::XattrFlags::empty(),
    )
}

/// Runs `f` on this thread without the capabilities that let root read and search any
/// folder (capabilities are per thread): as a user other than root is, whatever its
/// modes say. A process without them runs `f` as it is.
pub fn without_dac_override<T>(f: impl FnOnce() -> T) -> T {
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    let held = capabilities(None).unwrap();
    let mut fewer = held;
    fewer.effective -= CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
    set_capabilities(None, fewer).unwrap();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    set_capabilities(None, held).unwrap();
    out.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Runs `plan` and makes it die at the `nth` hit of the crash point `point`.
pub fn run_killed(sb: &Sandbox, p: serde_json::Value, point: &str, nth: u32) {
    sb.failpoints().arm_crash(point, nth);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sb.run_plan(plan(p))));
    assert!(outcome.is_err(), "the run dies at {point}");
}

/// The runtime's temporary files anywhere beneath `dir`.
pub fn temp_files(dir: &Path) -> Vec<String> {
    paths_in(dir)
        .into_iter()
        .filter(|e| e.contains(".ailab-tmp-"))
        .collect()
}

/// Every path beneath `dir`, folders before what they hold.
pub fn paths_in(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(paths_in(&p));
        }
    }
    out
}
