//! Landlock: once a thread restricts itself, a raw write outside the writable
//! directories fails, and so does starting a program.

use crate::support::*;
use ailab_sandbox_core::confine::kernel::restrict_to;

#[test]
fn raw_writes_outside_and_exec_fail_once_restricted() {
    let w = World::new();
    std::fs::create_dir_all(&w.root).unwrap();
    let (root, outside) = (w.root.clone(), w.outside.clone());
    // Landlock binds the calling thread and its future children only: a fresh thread
    // keeps the rest of the test process unrestricted.
    let (report, inside, outside_write, exec) = std::thread::spawn(move || {
        let report = restrict_to(std::slice::from_ref(&root));
        let inside = std::fs::write(root.join("in.txt"), b"ok");
        let outside_write = std::fs::write(outside.join("escaped.txt"), b"pwned");
        let exec = std::process::Command::new("/bin/true").status();
        (report, inside, outside_write, exec)
    })
    .join()
    .unwrap();
    eprintln!("landlock: {report:?}");
    if !report.is_enforced() {
        assert!(
            report.detail.is_some(),
            "an unenforced report says why: {report:?}"
        );
        return;
    }
    assert!(report.abi.unwrap_or(0) >= 1, "{report:?}");
    assert!(
        inside.is_ok(),
        "writing beneath the root still works: {inside:?}"
    );
    let err = outside_write.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(!w.outside.join("escaped.txt").exists());
    assert!(exec.is_err(), "execve is denied: {exec:?}");
    // This thread was never restricted.
    std::fs::write(w.outside.join("after.txt"), b"free").unwrap();
}

/// The grant names the directory a process holds, not the path it was opened by: a path
/// renamed and replaced by a link since (while a start recovered, say) grants nothing
/// where the link leads.
#[test]
fn the_grant_follows_the_held_directory_not_its_path() {
    use ailab_sandbox_core::confine::kernel::restrict_to_dirs;
    use std::os::fd::AsFd as _;
    let w = World::new();
    std::fs::create_dir_all(&w.root).unwrap();
    let (root, outside) = (w.root.clone(), w.outside.clone());
    let (report, moved_write, through_link) = std::thread::spawn(move || {
        let held = std::fs::File::open(&root).unwrap();
        let moved = root.with_file_name("moved-root");
        std::fs::rename(&root, &moved).unwrap();
        std::os::unix::fs::symlink(&outside, &root).unwrap();
        let shown = root.display().to_string();
        let report = restrict_to_dirs(&[(shown.as_str(), held.as_fd())]);
        let moved_write = std::fs::write(moved.join("in.txt"), b"ok");
        let through_link = std::fs::write(root.join("escaped.txt"), b"pwned");
        (report, moved_write, through_link)
    })
    .join()
    .unwrap();
    if !report.is_enforced() {
        assert!(report.detail.is_some(), "{report:?}");
        return;
    }
    assert!(
        moved_write.is_ok(),
        "the held directory stays writable: {moved_write:?}"
    );
    assert_eq!(
        through_link.unwrap_err().kind(),
        std::io::ErrorKind::PermissionDenied
    );
    assert!(!w.outside.join("escaped.txt").exists());
}
