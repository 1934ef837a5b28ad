//! Governance overhead, measured: governed writes through the executor against the bare
//! floor for the same work in the same process, plus rollback, hashing and a large
//! registry.
//! `cargo run --release -p ailab-sandbox-core --features internals --example bench -- [--json] [--quick]`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

use ailab_sandbox_core::artifact::{ArtifactEntry, ArtifactRegistry};
use ailab_sandbox_core::audit::{AuditLog, AuditRecord, AuditStatus};
use ailab_sandbox_core::catalog::MutationClass;
use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::confine::RelPath;
use ailab_sandbox_core::confine::root::{FILE_MODE, write_atomic_in};
use ailab_sandbox_core::confine::state::StateDir;
use ailab_sandbox_core::sandbox::RollbackOptions;
use ailab_sandbox_core::{Config, Plan, Sandbox};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde_json::json;
use std::time::{Duration, Instant};

/// Temporary directories live until the process exits: deleting thousands of files
/// between cases makes ext4 skip recently freed inodes when allocating, which would
/// charge one case's clean-up to the next case.
fn keep(dir: tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().to_path_buf();
    KEPT.lock().unwrap().push(dir);
    path
}

static KEPT: std::sync::Mutex<Vec<tempfile::TempDir>> = std::sync::Mutex::new(Vec::new());

/// Starts a timed case from a clean page cache: dirty data left by the previous case
/// would otherwise be written back during this one.
fn settle() {
    rustix::fs::sync();
}

/// A measured stretch per operation: wall-clock time, and the CPU time of the whole
/// process (user and system, every thread) meanwhile. The CPU time moves far less with
/// the machine's other load than the wall clock does, and leaves out waits for the disk:
/// it is what to compare between builds of the write path.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
}

/// The start of a [`Sample`].
struct Stopwatch {
    wall: Instant,
    cpu: Duration,
}

fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

impl Stopwatch {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: cpu_time(),
        }
    }

    /// What passed since the start, divided among `n` operations.
    fn per(&self, n: usize) -> Sample {
        Sample {
            wall: self.wall.elapsed() / n as u32,
            cpu: (cpu_time() - self.cpu) / n as u32,
        }
    }
}

struct Row {
    name: String,
    per_op: Duration,
    /// Median over the repetitions of (this case / its floor measured right before it).
    ratio: Option<f64>,
    /// The CPU time per operation and its ratio to the floor's, where measured.
    cpu: Option<(Duration, Option<f64>)>,
}

/// The median over the repetitions of (this case / its floor measured right before it).
fn median_ratio(samples: &[Duration], floor: &[Duration]) -> f64 {
    let mut r: Vec<f64> = samples
        .iter()
        .zip(floor)
        .map(|(s, b)| s.as_secs_f64() / b.as_secs_f64())
        .collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

/// One case's samples and the floor samples taken beside them.
fn row(name: String, samples: &[Sample], floor: Option<&[Sample]>) -> Row {
    let walls = |s: &[Sample]| s.iter().map(|x| x.wall).collect::<Vec<_>>();
    let cpus = |s: &[Sample]| s.iter().map(|x| x.cpu).collect::<Vec<_>>();
    Row {
        name,
        per_op: median(walls(samples)),
        ratio: floor.map(|f| median_ratio(&walls(samples), &walls(f))),
        cpu: Some((
            median(cpus(samples)),
            floor.map(|f| median_ratio(&cpus(samples), &cpus(f))),
        )),
    }
}

/// A row of one wall-clock time, no CPU time (a rollback).
fn timed_row(name: String, wall: Duration) -> Row {
    Row {
        name,
        per_op: wall,
        ratio: None,
        cpu: None,
    }
}

const USAGE: &str = "usage: bench [--json] [--quick] [--only registry|rollback|audit|concurrent|readers|governed-strict|governed-batched|governed-relaxed|bare-durable|bare-fast] [--n N] [--size BYTES]
Temporary directories are made under $TMPDIR (default /tmp).";

fn sandbox(dir: &std::path::Path, durability: Durability) -> Sandbox {
    let mut c = Config::with_roots(vec![dir.join("root")], dir.join("state"));
    c.enable_write = true;
    c.dry_run = false;
    c.durability = durability;
    c.limits.writes_per_minute = 1_000_000;
    c.limits.max_artifacts_per_workflow = 1_000_000;
    c.limits.max_workflow_bytes = u64::MAX / 4;
    Sandbox::open(c).unwrap()
}

/// N governed actions, one plan per action (the common agent pattern), alternating
/// create_file and replace_file on N/2 paths.
fn governed(n: usize, size: usize, durability: Durability) -> Sample {
    let tmp = keep(tempfile::tempdir().unwrap());
    let sb = sandbox(&tmp, durability);
    let content = "x".repeat(size);
    settle();
    let start = Stopwatch::start();
    for i in 0..n {
        let (intent, path) = if i % 2 == 0 {
            ("create_file", format!("f{}.txt", i / 2))
        } else {
            ("replace_file", format!("f{}.txt", i / 2))
        };
        let plan: Plan = serde_json::from_value(json!({"workflow_id": "wf_bench", "actions": [
            {"action_id": format!("a{i}"), "intent": intent, "path": path, "content": content}]}))
        .unwrap();
        let r = sb.run_plan(plan).unwrap();
        assert!(r.is_success(), "{:?}", r.actions[0].reason);
    }
    start.per(n)
}

/// `threads` agents at once, each with its own workflow, `n` one-action plans in all
/// (1 KiB, alternating create and replace): wall time per action, and with batched
/// durability the whole-filesystem syncs made per action (each small write also syncs its
/// workflow's commit log once).
fn governed_concurrent(n: usize, threads: usize, durability: Durability) -> (Sample, f64) {
    let tmp = keep(tempfile::tempdir().unwrap());
    let sb = std::sync::Arc::new(sandbox(&tmp, durability));
    let content = "x".repeat(1024);
    settle();
    let syncs_before = sb.batched_syncs().unwrap_or(0);
    let start = Stopwatch::start();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (sb, content) = (sb.clone(), content.clone());
            std::thread::spawn(move || {
                for i in 0..n / threads {
                    let intent = if i % 2 == 0 { "create_file" } else { "replace_file" };
                    let plan: Plan = serde_json::from_value(json!({"workflow_id": format!("wf_c{t}"), "actions": [
                        {"action_id": format!("a{i}"), "intent": intent, "path": format!("t{t}/f{}.txt", i / 2), "content": content}]}))
                    .unwrap();
                    assert!(sb.run_plan(plan).unwrap().is_success());
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let per_action = start.per(n);
    let syncs = sb.batched_syncs().unwrap_or(0) - syncs_before;
    (per_action, syncs as f64 / n as f64)
}

/// Latency of a reader (the newest 50 artifacts and the audit statistics, what a
/// dashboard polls) while two agents write `n` one-action plans in all under `strict`
/// durability, and over the same registry and log once they are done: (p50, p90, p99)
/// of each.
fn reads_during_writes(n: usize) -> ([Duration; 3], [Duration; 3]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = keep(tempfile::tempdir().unwrap());
    let sb = std::sync::Arc::new(sandbox(&tmp, Durability::Strict));
    let read = |sb: &Sandbox| {
        let t = Instant::now();
        sb.artifacts(50, None).unwrap();
        sb.audit_stats().unwrap();
        t.elapsed()
    };
    let quantiles = |mut lat: Vec<Duration>| {
        lat.sort();
        [0.5, 0.9, 0.99].map(|q| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)])
    };
    settle();
    let writing = std::sync::Arc::new(AtomicBool::new(true));
    let reader = {
        let (sb, writing) = (sb.clone(), writing.clone());
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            while writing.load(Ordering::SeqCst) {
                lat.push(read(&sb));
                std::thread::sleep(Duration::from_micros(200));
            }
            lat
        })
    };
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let sb = sb.clone();
            std::thread::spawn(move || {
                for i in 0..n / 2 {
                    let plan: Plan = serde_json::from_value(json!({"workflow_id": format!("wf_r{t}"), "actions": [
                        {"action_id": format!("a{i}"), "intent": "create_file", "path": format!("t{t}/f{i}.txt"), "content": "x"}]}))
                    .unwrap();
                    assert!(sb.run_plan(plan).unwrap().is_success());
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    writing.store(false, Ordering::SeqCst);
    let busy = quantiles(reader.join().unwrap());
    (busy, quantiles((0..500).map(|_| read(&sb)).collect()))
}

/// The floor for [`governed_concurrent`]: `threads` writers of durable bare writes.
fn bare_concurrent(n: usize, threads: usize) -> Sample {
    let start = Stopwatch::start();
    let workers: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || bare(n / threads, 1024, Floor::Durable)))
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    start.per(n)
}

/// How the floor makes its writes durable.
#[derive(Clone, Copy, PartialEq)]
enum Floor {
    /// `fdatasync` the file, `fsync` the directory.
    Durable,
    /// No sync at all.
    Fast,
    /// No per-file sync; one `syncfs` after each write.
    Syncfs,
}

/// The floor: the same N writes as atomic temp + rename through a directory handle.
fn bare(n: usize, size: usize, floor: Floor) -> Sample {
    let tmp = keep(tempfile::tempdir().unwrap());
    let dir = Dir::open_ambient_dir(&tmp, ambient_authority()).unwrap();
    let content = vec![b'x'; size];
    settle();
    let start = Stopwatch::start();
    for i in 0..n {
        let name = format!("f{}.txt", i / 2);
        write_atomic_in(
            &dir,
            &name,
            &content,
            FILE_MODE,
            i % 2 == 0,
            floor == Floor::Durable,
        )
        .unwrap();
        if floor == Floor::Syncfs {
            rustix::fs::syncfs(dir.open(".").unwrap()).unwrap();
        }
    }
    start.per(n)
}

/// A sample as the one-case runs print it.
fn shown(s: Sample) -> String {
    format!(
        "{:.1} µs (CPU {:.1} µs)",
        s.wall.as_secs_f64() * 1e6,
        s.cpu.as_secs_f64() * 1e6
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A rollback of 100 actions, after a trail of `earlier` lines recording changes, weeks
/// before, to files of the same names in another folder of the root (a long-lived
/// sandbox where every workflow writes `notes.md`): the conflict check looks at the
/// trail's changes to each target's name since its snapshot.
/// A rollback of a workflow of 100 `create_file` actions (`d{i % 10}/f{i}.txt`), the
/// trail holding `earlier` lines before its writes and `later` lines after them, each
/// of a write by another workflow to a file of one of its files' names in another folder.
fn rollback_100(durability: Durability, (earlier, later): (usize, usize), left: u64) -> Duration {
    let tmp = keep(tempfile::tempdir().unwrap());
    let sb = sandbox(&tmp, durability);
    // Folders earlier rollbacks had to leave elsewhere in the root (other workflows'
    // files still in them), as the ledger holds them after a long churn.
    if left > 0 {
        use ailab_sandbox_core::confine::DirId;
        use ailab_sandbox_core::left_dirs::{LeftDirs, Maker};
        use ailab_sandbox_core::snapshot::LeftDir;
        let state = StateDir::open(&tmp.join("state")).unwrap();
        let ledger = LeftDirs::open(&state, false).unwrap();
        let maker = Maker {
            workflow_id: "wf_old".into(),
            action_id: "a1".into(),
            at: "2026-01-01T00:00:00.000000Z".into(),
        };
        let dirs: Vec<LeftDir> = (0..left)
            .map(|i| LeftDir {
                path: format!("other/g{}/d/e/k{i}", i / 10),
                id: DirId {
                    dev: 1,
                    ino: i,
                    born_ns: Some(i),
                },
            })
            .collect();
        let root = tmp.join("root").display().to_string();
        for chunk in dirs.chunks(1_000) {
            ledger.record(&root, chunk, &maker).unwrap();
        }
        // A rollback before, as a server's earlier ones: the ledger is read (once a
        // process) before the one timed.
        let plan: Plan = serde_json::from_value(json!({"workflow_id": "wf_warm", "actions": [
            {"intent": "create_file", "path": "warm.txt", "content": "w"}]}))
        .unwrap();
        assert!(sb.run_plan(plan).unwrap().is_success());
        let warm = sb.rollback_workflow("wf_warm", &RollbackOptions::default());
        assert_eq!(warm.steps_rolled_back, 1);
    }
    let others = |n: usize, when: &str, folder: &str| {
        let state = StateDir::open(&tmp.join("state")).unwrap();
        let log = AuditLog::open(&state, false, 1_000_000).unwrap();
        let root = tmp.join("root");
        for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
            log.append(
                chunk
                    .iter()
                    .map(|&i| AuditRecord {
                        timestamp: when.into(),
                        execution_id: format!("ex_{folder}_{}", i / 100),
                        workflow_id: format!("wf_{folder}_{}", i / 100),
                        action_id: format!("a{i}"),
                        mutation_class: Some(MutationClass::Create),
                        mutation_type: "create_file".into(),
                        target_path: format!(
                            "{}/{folder}/d{}/f{}.txt",
                            root.display(),
                            i % 500,
                            i % 100
                        ),
                        before_checksum: None,
                        after_checksum: Some(format!("{i:064x}")),
                        rollback_available: false,
                        rollback_path: None,
                        status: AuditStatus::Success,
                        reason_code: None,
                        error: None,
                    })
                    .collect(),
            )
            .unwrap();
        }
    };
    others(earlier, "2026-01-01T00:00:00.000000Z", "old");
    for i in 0..100 {
        let plan: Plan = serde_json::from_value(json!({"workflow_id": "wf_rb", "actions": [
            {"intent": "create_file", "path": format!("d{}/f{i}.txt", i % 10), "content": "y".repeat(1024)}]}))
        .unwrap();
        assert!(sb.run_plan(plan).unwrap().is_success());
    }
    // Dated after every snapshot whatever the clock says; indexed before the rollback,
    // as a server indexes its own lines as it writes them.
    others(later, "2099-01-01T00:00:00.000000Z", "new");
    sb.audit_stats().unwrap();
    settle();
    let start = Instant::now();
    let r = sb.rollback_workflow("wf_rb", &RollbackOptions::default());
    let t = start.elapsed();
    assert_eq!(r.steps_rolled_back, 100);
    t
}

fn sha_throughput() -> (f64, f64) {
    use sha2::Digest;
    let buf = vec![0xa5u8; 64 << 20];
    let mut best_hex = f64::MAX;
    let mut best_raw = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        std::hint::black_box(ailab_sandbox_core::hash::sha256_hex(&buf));
        best_hex = best_hex.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(sha2::Sha256::digest(&buf));
        best_raw = best_raw.min(t.elapsed().as_secs_f64());
    }
    let mib = 64.0;
    (mib / best_hex, mib / best_raw)
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn registry(entries: usize, chain: usize) -> (Duration, f64, Duration, Duration, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path()).unwrap();
    {
        // Written in bulk: the load, not the write, is measured here.
        let reg = ArtifactRegistry::open(&state, false).unwrap();
        let mut batch = Vec::with_capacity(10_000);
        for i in 0..entries {
            let parent = if i > 0 && i < chain {
                Some(format!("art_{:08}", i - 1))
            } else {
                None
            };
            batch.push(ArtifactEntry {
                artifact_id: format!("art_{i:08}"),
                path: format!("/tmp/opencode/sandbox/w{}/f{i}.txt", i % 1000),
                checksum_sha256: format!("{i:064x}"),
                size_bytes: 1024,
                mutation_type: "create_file".into(),
                workflow_id: format!("wf_{}", i % 1000),
                action_id: format!("a{i}"),
                parent_workflow_id: None,
                parent_artifact_id: parent,
                generated_by_action: format!("ex_1/a{i}"),
                created_at: "2026-11-30T00:00:00.000000Z".into(),
            });
            if batch.len() == 10_000 {
                reg.register_many(&batch).unwrap();
                batch.clear();
            }
        }
        reg.register_many(&batch).unwrap();
    }
    let rss_before = rss_mib();
    let t = Instant::now();
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    let load = t.elapsed();
    let mem = rss_mib() - rss_before;
    let t = Instant::now();
    let lineage = reg.get_lineage(&format!("art_{:08}", chain - 1)).unwrap();
    let lin = t.elapsed();
    assert_eq!(lineage.len(), chain - 1);
    let t = Instant::now();
    let count = reg.count_by_workflow("wf_7").unwrap();
    let cnt = t.elapsed();
    (load, mem, lin, cnt, count)
}

/// An audit trail of `entries` lines (a million-artifact state's: 1,000 workflows, a
/// tenth of their writes rolled back), written in bulk, then opened by a fresh process
/// (this program again, `--audit-open DIR`) so the memory it adds is its own.
fn audit_trail(entries: usize) -> AuditOpen {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path()).unwrap();
    {
        let log = AuditLog::open(&state, false, 1_000_000).unwrap();
        let mut batch = Vec::with_capacity(10_000);
        for i in 0..entries {
            let undo = i % 10 == 9;
            batch.push(AuditRecord {
                timestamp: "2026-11-30T00:00:00.000000Z".into(),
                execution_id: format!("ex_{:08}", i / 10),
                workflow_id: format!("wf_{}", i % 1000),
                action_id: format!("a{}", if undo { i - 1 } else { i }),
                mutation_class: Some(if undo {
                    MutationClass::Rollback
                } else {
                    MutationClass::Create
                }),
                mutation_type: if undo { "rollback" } else { "create_file" }.into(),
                target_path: format!("/tmp/opencode/sandbox/w{}/f{i}.txt", i % 1000),
                before_checksum: None,
                after_checksum: Some(format!("{i:064x}")),
                rollback_available: !undo,
                rollback_path: (!undo)
                    .then(|| format!("/tmp/opencode/sandbox/.rollback/wf_{}/a{i}", i % 1000)),
                status: if undo {
                    AuditStatus::RolledBack
                } else {
                    AuditStatus::Success
                },
                reason_code: None,
                error: None,
            });
            if batch.len() == 10_000 {
                log.append(std::mem::take(&mut batch)).unwrap();
            }
        }
        log.append(batch).unwrap();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--audit-open")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The `n`th of the lines of a name a thousand folders share, a millisecond apart.
fn notes_line(n: usize) -> AuditRecord {
    let ms = n % 1000;
    let s = n / 1000;
    AuditRecord {
        timestamp: format!("2026-11-30T01:{:02}:{:02}.{ms:03}000Z", s / 60, s % 60),
        execution_id: format!("ex_notes_{}", n / 10),
        workflow_id: format!("wf_notes_{}", n % 1000),
        action_id: format!("a{n}"),
        mutation_class: Some(MutationClass::Append),
        mutation_type: "append_file".into(),
        target_path: format!("/tmp/opencode/sandbox/w{}/notes.md", n % 1000),
        before_checksum: Some(format!("{:064x}", n + 1)),
        after_checksum: Some(format!("{n:064x}")),
        rollback_available: true,
        rollback_path: Some(format!(
            "/tmp/opencode/sandbox/.rollback/wf_notes_{}/a{n}",
            n % 1000
        )),
        status: AuditStatus::Success,
        reason_code: None,
        error: None,
    }
}

/// What opening an audit trail costs (see [`audit_trail`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct AuditOpen {
    lines: u64,
    open_ms: f64,
    rss_mib: f64,
    newest_50_us: f64,
    workflow_lines: usize,
    workflow_us: f64,
    first_by_name_ms: f64,
    next_by_name_us: f64,
    append_alone_us: f64,
    append_during_read_us: f64,
    /// Lines the other thread reads back: 100,000, or all of a smaller trail (`--quick`).
    read_back: usize,
    long_read_ms: f64,
    last_change_us: f64,
    all_changes_ms: f64,
}

fn audit_open(dir: &std::path::Path) -> AuditOpen {
    let state = StateDir::open(dir).unwrap();
    let rss_before = rss_mib();
    let t = Instant::now();
    let log = AuditLog::open(&state, false, 1_000_000).unwrap();
    let open = t.elapsed();
    let rss = rss_mib() - rss_before;
    let t = Instant::now();
    assert_eq!(log.list(50, None).unwrap().len(), 50);
    let newest = t.elapsed();
    let t = Instant::now();
    let workflow_lines = log.by_workflow("wf_7").unwrap().len();
    let workflow = t.elapsed();
    // Recovery's look-up of the changes to one file (file `fN.txt` of folder `wN`, written
    // once): the first builds the index by name.
    let changes_to = |n: usize| {
        let t = Instant::now();
        let found = log
            .changes_since(
                &format!("f{n}.txt"),
                |p| p.ends_with(&format!("/w{n}/f{n}.txt")),
                "",
                "",
            )
            .unwrap();
        assert_eq!(found.len(), 1);
        t.elapsed()
    };
    let first = changes_to(7);
    let next = changes_to(8);
    let lines = log.last_seq().unwrap();
    // An append while another thread of the process reads 100,000 lines back (a
    // rollback of an old workflow reading the lines of its targets' names), against
    // appends alone.
    let append = || {
        let t = Instant::now();
        log.append(vec![AuditRecord {
            timestamp: "2026-11-30T00:00:01.000000Z".into(),
            execution_id: "ex_append".into(),
            workflow_id: "wf_append".into(),
            action_id: "a0".into(),
            mutation_class: None,
            mutation_type: "create_file".into(),
            target_path: "/tmp/opencode/sandbox/append.txt".into(),
            before_checksum: None,
            after_checksum: None,
            rollback_available: false,
            rollback_path: None,
            status: AuditStatus::Blocked,
            reason_code: None,
            error: None,
        }])
        .unwrap();
        t.elapsed()
    };
    let append_alone = median((0..21).map(|_| append()).collect());
    let read_back = usize::try_from(lines).map_or(100_000, |l| l.min(100_000));
    let (append_during_read, long_read) = std::thread::scope(|s| {
        let reading = s.spawn(|| {
            let t = Instant::now();
            assert_eq!(log.list(read_back, None).unwrap().len(), read_back);
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        let during = append();
        (during, reading.join().unwrap())
    });
    // Recovery's look-up of a target's last change, for a name a thousand folders share
    // (`notes.md`, 100,000 lines of it written after the rest), against reading every
    // change of the name and keeping the target's latest.
    for chunk in 0..10 {
        log.append(
            (chunk * 10_000..(chunk + 1) * 10_000)
                .map(notes_line)
                .collect(),
        )
        .unwrap();
    }
    let target = "/tmp/opencode/sandbox/w7/notes.md";
    let t = Instant::now();
    let rel = RelPath::from_components(vec!["w7".into(), "notes.md".into()]);
    let last = log.last_change(&rel, |p| p == target).unwrap();
    let last_change = t.elapsed();
    let t = Instant::now();
    let all = log
        .changes_since("notes.md", |p| p == target, "", "")
        .unwrap();
    let all_changes = t.elapsed();
    assert_eq!(last.map(|e| e.seq), all.last().map(|e| e.seq));
    AuditOpen {
        lines,
        open_ms: open.as_secs_f64() * 1e3,
        rss_mib: rss,
        newest_50_us: newest.as_secs_f64() * 1e6,
        workflow_lines,
        workflow_us: workflow.as_secs_f64() * 1e6,
        first_by_name_ms: first.as_secs_f64() * 1e3,
        next_by_name_us: next.as_secs_f64() * 1e6,
        append_alone_us: append_alone.as_secs_f64() * 1e6,
        append_during_read_us: append_during_read.as_secs_f64() * 1e6,
        read_back,
        long_read_ms: long_read.as_secs_f64() * 1e3,
        last_change_us: last_change.as_secs_f64() * 1e6,
        all_changes_ms: all_changes.as_secs_f64() * 1e3,
    }
}

impl std::fmt::Display for AuditOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "audit trail {} lines: open {:.0} ms, +{:.0} MiB RSS, newest 50 {:.0} µs, one workflow's {} lines {:.0} µs, changes to a file: first {:.0} ms, next {:.0} µs; an append {:.0} µs alone, {:.0} µs while another thread reads {} lines back ({:.0} ms); the last change to a file of a name written 100,000 times {:.0} µs (all of them read: {:.0} ms)",
            self.lines,
            self.open_ms,
            self.rss_mib,
            self.newest_50_us,
            self.workflow_lines,
            self.workflow_us,
            self.first_by_name_ms,
            self.next_by_name_us,
            self.append_alone_us,
            self.append_during_read_us,
            self.read_back,
            self.long_read_ms,
            self.last_change_us,
            self.all_changes_ms
        )
    }
}

fn main() {
    run();
    KEPT.lock().unwrap().clear();
}

fn run() {
    let args: Vec<String> = std::env::args().collect();
    let mut rest = args.iter().skip(1);
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--json" | "--quick" => {}
            "--only" | "--n" | "--size" | "--audit-open" if rest.next().is_some() => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                return;
            }
            other => {
                eprintln!("bench: unexpected argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let json_out = args.iter().any(|a| a == "--json");
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    const CASES: [&str; 10] = [
        "registry",
        "rollback",
        "audit",
        "concurrent",
        "readers",
        "governed-strict",
        "governed-batched",
        "governed-relaxed",
        "bare-durable",
        "bare-fast",
    ];
    if let Some(o) = only.as_deref().filter(|o| !CASES.contains(o)) {
        eprintln!("bench: --only {o:?} names no case\n{USAGE}");
        std::process::exit(2);
    }
    let flag = |name: &str, default: usize| {
        let Some(v) = args
            .iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
        else {
            return default;
        };
        v.parse().unwrap_or_else(|_| {
            eprintln!("bench: {name} {v:?} is not a whole number\n{USAGE}");
            std::process::exit(2);
        })
    };
    let size = flag("--size", 1024);
    if only.as_deref() == Some("registry") {
        let (load, mem, lin, cnt, count) = registry(if quick { 20_000 } else { 1_000_000 }, 1000);
        println!(
            "registry load {:.0} ms, +{mem:.0} MiB, lineage {:.0} µs, count {:.1} µs ({count})",
            load.as_secs_f64() * 1e3,
            lin.as_secs_f64() * 1e6,
            cnt.as_secs_f64() * 1e6
        );
        return;
    }
    if let Some(dir) = args
        .iter()
        .position(|a| a == "--audit-open")
        .and_then(|i| args.get(i + 1))
    {
        println!(
            "{}",
            serde_json::to_string(&audit_open(std::path::Path::new(dir))).unwrap()
        );
        return;
    }
    if only.as_deref() == Some("rollback") {
        // A rollback alone, and with `--n` lines naming its files' names in other
        // folders, older than its writes, then newer.
        let n = flag("--n", 100_000);
        let plain = rollback_100(Durability::Relaxed, (0, 0), 0);
        let older = rollback_100(Durability::Relaxed, (n, 0), 0);
        let newer = rollback_100(Durability::Relaxed, (0, n), 0);
        let left = rollback_100(Durability::Relaxed, (0, 0), n as u64 / 5);
        println!(
            "rollback of 100 actions (relaxed) {:.1} ms; with {n} lines naming its file names in other folders: older {:.1} ms, newer {:.1} ms; with {} folders of others left on the ledger {:.1} ms",
            plain.as_secs_f64() * 1e3,
            older.as_secs_f64() * 1e3,
            newer.as_secs_f64() * 1e3,
            n / 5,
            left.as_secs_f64() * 1e3
        );
        return;
    }
    if only.as_deref() == Some("audit") {
        println!("{}", audit_trail(flag("--n", 1_000_000)));
        return;
    }
    if only.as_deref() == Some("concurrent") {
        // Four agents at once, batched and strict, beside four bare writers.
        let n = flag("--n", 400);
        let floor = bare_concurrent(n, 4);
        let (gb, syncs) = governed_concurrent(n, 4, Durability::Batched);
        let gs = governed_concurrent(n, 4, Durability::Strict).0;
        println!(
            "4 writers bare {}, batched {} ({:.2}×, 1 log sync and {syncs:.2} syncfs per action), strict {} ({:.2}×)",
            shown(floor),
            shown(gb),
            gb.wall.as_secs_f64() / floor.wall.as_secs_f64(),
            shown(gs),
            gs.wall.as_secs_f64() / floor.wall.as_secs_f64()
        );
        KEPT.lock().unwrap().clear();
        return;
    }
    if only.as_deref() == Some("readers") {
        let (busy, idle) = reads_during_writes(flag("--n", 300));
        let us = |d: [Duration; 3]| {
            d.map(|x| format!("{:.0}", x.as_secs_f64() * 1e6))
                .join(" / ")
        };
        println!(
            "reads (50 artifacts + audit stats), p50 / p90 / p99: while 2 strict agents write {} µs, after {} µs",
            us(busy),
            us(idle)
        );
        KEPT.lock().unwrap().clear();
        return;
    }
    if let Some(mode) = only.as_deref().and_then(|o| o.strip_prefix("bare-")) {
        let n = flag("--n", 2000);
        let t = bare(
            n,
            size,
            if mode == "durable" {
                Floor::Durable
            } else {
                Floor::Fast
            },
        );
        println!("bare {mode} {size} bytes: {} per write", shown(t));
        KEPT.lock().unwrap().clear();
        return;
    }
    if let Some(mode) = only.as_deref().and_then(|o| o.strip_prefix("governed-")) {
        // One case alone, for profilers.
        let d = match mode {
            "strict" => Durability::Strict,
            "batched" => Durability::Batched,
            _ => Durability::Relaxed,
        };
        let n = flag("--n", 2000);
        let t = governed(n, size, d);
        println!("governed {mode} {size} bytes: {} per action", shown(t));
        return;
    }
    let n = if quick { 20 } else { 100 };
    let mut rows = Vec::new();
    let reps = if quick { 1 } else { 5 };
    for (size, label) in [(1024usize, "1 KiB"), (256 * 1024, "256 KiB")] {
        // Each governed case runs right after its floor, `reps` times over; medians are
        // reported, so a noisy moment of the machine weighs on one sample only.
        let (mut bd, mut bf, mut bs, mut gs, mut gb, mut gr) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            bd.push(bare(n, size, Floor::Durable));
            gs.push(governed(n, size, Durability::Strict));
            gb.push(governed(n, size, Durability::Batched));
            bf.push(bare(n, size, Floor::Fast));
            gr.push(governed(n, size, Durability::Relaxed));
            bs.push(bare(n, size, Floor::Syncfs));
        }
        rows.push(row(format!("bare durable write, {label}"), &bd, None));
        rows.push(row(format!("bare non-durable write, {label}"), &bf, None));
        rows.push(row(format!("bare write + syncfs, {label}"), &bs, Some(&bd)));
        rows.push(row(format!("governed strict, {label}"), &gs, Some(&bd)));
        rows.push(row(format!("governed batched, {label}"), &gb, Some(&bd)));
        rows.push(row(format!("governed relaxed, {label}"), &gr, Some(&bf)));
    }
    // Four agents at once, each on its own workflow (and so its own commit log).
    let threads = 4;
    let (mut cb, mut cg, mut cs, mut syncs) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        cb.push(bare_concurrent(n * 2, threads));
        let (t, per) = governed_concurrent(n * 2, threads, Durability::Batched);
        cg.push(t);
        syncs.push(per);
        cs.push(governed_concurrent(n * 2, threads, Durability::Strict).0);
    }
    rows.push(row(
        format!("bare durable write, {threads} writers, 1 KiB (wall per write)"),
        &cb,
        None,
    ));
    rows.push(row(
        format!("governed strict, {threads} agents, 1 KiB (wall per action)"),
        &cs,
        Some(&cb),
    ));
    syncs.sort_by(f64::total_cmp);
    rows.push(row(
        format!(
            "governed batched, {threads} agents, 1 KiB (+1 log sync, {:.2} syncfs per action)",
            syncs[syncs.len() / 2]
        ),
        &cg,
        Some(&cb),
    ));
    for (d, label) in [
        (Durability::Strict, "strict"),
        (Durability::Batched, "batched"),
        (Durability::Relaxed, "relaxed"),
    ] {
        rows.push(timed_row(
            format!("rollback of a 100-action workflow ({label}), total"),
            rollback_100(d, (0, 0), 0),
        ));
    }
    let earlier = if quick { 2_000 } else { 100_000 };
    rows.push(timed_row(
        format!("same (relaxed), after {earlier} older lines naming its file names"),
        rollback_100(Durability::Relaxed, (earlier, 0), 0),
    ));
    rows.push(timed_row(
        format!("same (relaxed), before {earlier} newer lines naming them in other folders"),
        rollback_100(Durability::Relaxed, (0, earlier), 0),
    ));
    let left = if quick { 2_000 } else { 20_000 };
    rows.push(timed_row(
        format!("same (relaxed), {left} folders of others left elsewhere on the ledger"),
        rollback_100(Durability::Relaxed, (0, 0), left),
    ));
    let (sha_hex, sha_raw) = sha_throughput();
    let entries = if quick { 20_000 } else { 1_000_000 };
    let (load, mem, lin, cnt, count) = registry(entries, 1000);
    let audit = audit_trail(entries);
    if json_out {
        let doc = json!({
            "actions_per_case": n,
            "rows": rows.iter().map(|r| json!({
                "name": r.name,
                "micros_per_op": r.per_op.as_secs_f64() * 1e6,
                "ratio_to_floor": r.ratio,
                "cpu_micros_per_op": r.cpu.map(|(c, _)| c.as_secs_f64() * 1e6),
                "cpu_ratio_to_floor": r.cpu.and_then(|(_, x)| x),
            })).collect::<Vec<_>>(),
            "sha256_mib_s": {"runtime_helper": sha_hex, "sha2_direct": sha_raw, "ratio": sha_hex / sha_raw},
            "registry": {"entries": entries, "load_ms": load.as_secs_f64() * 1e3, "rss_mib": mem,
                          "lineage_1000_deep_us": lin.as_secs_f64() * 1e6, "count_by_workflow_us": cnt.as_secs_f64() * 1e6, "count": count},
            "audit_trail": audit,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap());
        return;
    }
    println!(
        "{:<66} {:>12} {:>10} {:>12} {:>10}",
        "case", "per op", "vs floor", "CPU per op", "vs floor"
    );
    let times = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.2}×"));
    for r in &rows {
        println!(
            "{:<66} {:>10.1}µs {:>10} {:>12} {:>10}",
            r.name,
            r.per_op.as_secs_f64() * 1e6,
            times(r.ratio),
            r.cpu.map_or(String::new(), |(c, _)| format!(
                "{:.1}µs",
                c.as_secs_f64() * 1e6
            )),
            times(r.cpu.and_then(|(_, x)| x))
        );
    }
    println!(
        "sha256 via runtime helper {sha_hex:.0} MiB/s, sha2 direct {sha_raw:.0} MiB/s ({:.0}%)",
        100.0 * sha_hex / sha_raw
    );
    println!(
        "registry {entries} entries: load {:.0} ms, +{mem:.0} MiB RSS, lineage 1000-deep {:.0} µs, count_by_workflow {:.1} µs ({count})",
        load.as_secs_f64() * 1e3,
        lin.as_secs_f64() * 1e6,
        cnt.as_secs_f64() * 1e6
    );
    println!("{audit}");
}
