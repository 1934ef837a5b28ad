//! A directory inside the root flips between a real directory and a symlink to outside
//! while plans write into it: no write may ever land outside.

use crate::support::*;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    let flipper = {
        let stop = stop.clone();
        let d = w.path("d");
        let real = w.path("d_real");
        let outside = w.outside.clone();
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if std::fs::rename(&d, &real).is_ok()
                    && std::os::unix::fs::symlink(&outside, &d).is_ok()
                {
                    flips += 1;
                }
                std::thread::yield_now();
                let _ = std::fs::remove_file(&d);
                let _ = std::fs::rename(&real, &d);
                std::thread::yield_now();
            }
            flips
        })
    };
    let attempts = 3000;
    let mut succeeded = 0;
    for i in 0..attempts {
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
    let flips = flipper.join().unwrap();
    assert!(flips > 100, "the race must really happen ({flips} flips)");
    assert_eq!(
        w.outside_tree(),
        outside_before,
        "zero files written outside in {attempts} attempts"
    );
    assert!(
        succeeded > 0,
        "some writes land inside while the directory is real"
    );
    assert!(sb.audit_verify().unwrap().ok);
}
