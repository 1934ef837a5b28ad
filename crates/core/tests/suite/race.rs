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
