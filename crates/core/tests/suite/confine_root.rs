//! `SandboxRoot` on real directories: symlinks, hard links, special files, modes.

use ailab_sandbox_core::confine::path::TEMP_MARKER;
use ailab_sandbox_core::confine::root::{DIR_MODE, FILE_MODE, remove_temp_files};
use ailab_sandbox_core::confine::{
    MAX_PATH_DEPTH, RelPath, SandboxRoot, TargetKind, resolve_sandbox_path,
};
use ailab_sandbox_core::{Config, ReasonCode, Sandbox};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

struct Fx {
    _tmp: TempDir,
    root_path: PathBuf,
    outside: PathBuf,
    root: SandboxRoot,
}

fn mkdir_755(p: &Path) {
    fs::DirBuilder::new().mode(0o755).create(p).unwrap();
}

fn fx() -> Fx {
    let tmp = TempDir::new().unwrap();
    let root_path = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    mkdir_755(&root_path);
    mkdir_755(&outside);
    let root = SandboxRoot::open(&root_path, false).unwrap();
    Fx {
        _tmp: tmp,
        root_path,
        outside,
        root,
    }
}

fn rel(p: &str) -> RelPath {
    resolve_sandbox_path(p, &[PathBuf::from("/unused-root")], None, MAX_PATH_DEPTH)
        .unwrap()
        .rel
}

fn inspect_code(fx: &Fx, p: &str) -> ReasonCode {
    fx.root.inspect(&rel(p)).unwrap_err().reason_code
}

fn write_code(fx: &Fx, p: &str) -> ReasonCode {
    fx.root
        .write_atomic(&rel(p), b"new", FILE_MODE, false, false)
        .unwrap_err()
        .reason_code
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn leftover_temp_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(TEMP_MARKER) {
            out.push(name);
        }
        if e.file_type().unwrap().is_dir() {
            out.extend(leftover_temp_files(&e.path()));
        }
    }
    out
}

// ---- opening roots ---------------------------------------------------------------------

#[test]
fn open_refuses_a_relative_root() {
    let err = SandboxRoot::open(Path::new("relative/root"), true).unwrap_err();
    assert!(err.contains("not an absolute path"), "{err}");
    assert!(!Path::new("relative").exists());
}

#[test]
fn open_refuses_a_symlinked_root() {
    let tmp = TempDir::new().unwrap();
    let real = tmp.path().join("real");
    mkdir_755(&real);
    let link = tmp.path().join("link");
    symlink(&real, &link).unwrap();
    let err = SandboxRoot::open(&link, false).unwrap_err();
    assert!(err.contains("symbolic link"), "{err}");
    let err = SandboxRoot::open(&link, true).unwrap_err();
    assert!(err.contains("symbolic link"), "{err}");
}

#[test]
fn open_refuses_a_world_writable_root_without_sticky_bit() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("squatted");
    mkdir_755(&dir);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = SandboxRoot::open(&dir, false).unwrap_err();
    assert!(err.contains("sticky"), "{err}");
}

#[test]
fn open_refuses_a_root_another_group_can_write_without_sticky_bit() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("grouped");
    mkdir_755(&dir);
    let egid = rustix::process::getegid().as_raw();
    let other = if egid == 65534 { 65533 } else { 65534 };
    if let Err(e) = std::os::unix::fs::chown(&dir, None, Some(other)) {
        // Not privileged, and not in that group: the fixture cannot be built.
        assert_ne!(rustix::process::geteuid().as_raw(), 0, "{e}");
        return;
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o775)).unwrap();
    let err = SandboxRoot::open(&dir, false).unwrap_err();
    assert!(err.contains("writable by other users"), "{err}");
    // The process's own group may write: a user private group.
    std::os::unix::fs::chown(&dir, None, Some(egid)).unwrap();
    SandboxRoot::open(&dir, false).unwrap();
    // And another group may, with the sticky bit.
    std::os::unix::fs::chown(&dir, None, Some(other)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1775)).unwrap();
    SandboxRoot::open(&dir, false).unwrap();
}

#[test]
fn open_accepts_a_world_writable_root_with_sticky_bit() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("shared");
    mkdir_755(&dir);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let root = SandboxRoot::open(&dir, false).unwrap();
    assert_eq!(root.path(), dir.as_path());
}

#[test]
fn open_refuses_a_root_owned_by_another_user() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("foreign");
    mkdir_755(&dir);
    let other = if rustix::process::geteuid().as_raw() == 65534 {
        65533
    } else {
        65534
    };
    if std::os::unix::fs::chown(&dir, Some(other), None).is_err() {
        // Not privileged: the directory cannot be given away, so build the refusal case
        // differently: a root-owned directory is foreign to an unprivileged user.
        let err = SandboxRoot::open(Path::new("/"), false).unwrap_err();
        assert!(err.contains("owned by uid"), "{err}");
        return;
    }
    let err = SandboxRoot::open(&dir, false).unwrap_err();
    assert!(err.contains("owned by uid"), "{err}");
}

/// A uid that is not this process's.
fn other_uid() -> u32 {
    if rustix::process::geteuid().as_raw() == 65534 {
        65533
    } else {
        65534
    }
}

/// Gives `p` (not following a symlink) to another user; `false` when this process is not
/// privileged enough to, in which case the fixture cannot be built.
fn give_away(p: &Path) -> bool {
    match std::os::unix::fs::lchown(p, Some(other_uid()), None) {
        Ok(()) => true,
        Err(e) => {
            assert_ne!(rustix::process::geteuid().as_raw(), 0, "{e}");
            false
        }
    }
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn open_refuses_a_root_below_a_directory_owned_by_another_user() {
    let tmp = TempDir::new().unwrap();
    let foreign = tmp.path().join("foreign");
    mkdir_755(&foreign);
    mkdir_755(&foreign.join("root"));
    if !give_away(&foreign) {
        return;
    }
    let shown = foreign.display().to_string();
    for (root, create) in [
        (foreign.join("root"), false),
        (foreign.join("new/deeper/root"), true),
    ] {
        let err = SandboxRoot::open(&root, create).unwrap_err();
        assert!(err.contains(&shown), "{err}");
        assert!(
            err.contains(&format!("owned by uid {}", other_uid())),
            "{err}"
        );
        assert!(err.contains("mode 0755"), "{err}");
        assert!(
            err.contains("must be owned by root (uid 0) or by this process's uid"),
            "{err}"
        );
    }
    assert!(!foreign.join("new").exists(), "nothing created beneath it");
}

#[test]
fn open_refuses_a_root_below_a_group_or_world_writable_directory_without_sticky_bit() {
    let tmp = TempDir::new().unwrap();
    let shared = tmp.path().join("shared");
    mkdir_755(&shared);
    mkdir_755(&shared.join("root"));
    // Group-writable counts when the group is not this process's own: giving the folder
    // to another group needs privileges, without which that case cannot be built.
    let foreign_group = std::os::unix::fs::chown(&shared, None, Some(4321)).is_ok();
    let modes: &[u32] = if foreign_group {
        &[0o777, 0o775, 0o757]
    } else {
        &[0o777, 0o757]
    };
    for &mode in modes {
        chmod(&shared, mode);
        for (root, create) in [
            (shared.join("root"), false),
            (shared.join("new/root"), true),
        ] {
            let err = SandboxRoot::open(&root, create).unwrap_err();
            assert!(err.contains(&shared.display().to_string()), "{err}");
            assert!(err.contains(&format!("mode {mode:04o}")), "{err}");
            assert!(err.contains("sticky bit"), "{err}");
        }
        assert!(!shared.join("new").exists(), "nothing created beneath it");
    }
    // Like /tmp: others may add entries but not move or remove this process's.
    chmod(&shared, 0o1777);
    SandboxRoot::open(&shared.join("root"), false).unwrap();
    SandboxRoot::open(&shared.join("new/root"), true).unwrap();
    // Writable by this process's own group only (a user private group): accepted.
    let egid = rustix::process::getegid().as_raw();
    std::os::unix::fs::chown(&shared, None, Some(egid)).unwrap();
    chmod(&shared, 0o775);
    SandboxRoot::open(&shared.join("root"), false).unwrap();
}

#[test]
fn open_accepts_root_owned_ancestors() {
    // / and /tmp (or wherever the temporary directory lives) belong to root or to us.
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("root");
    mkdir_755(&root);
    SandboxRoot::open(&root, false).unwrap();
}

#[test]
fn open_follows_a_symlinked_ancestor_and_checks_where_it_leads() {
    let tmp = TempDir::new().unwrap();
    let real = tmp.path().join("real");
    mkdir_755(&real);
    mkdir_755(&real.join("root"));
    symlink(&real, tmp.path().join("abs")).unwrap();
    symlink("real", tmp.path().join("rel")).unwrap();
    mkdir_755(&tmp.path().join("sub"));
    symlink("../real", tmp.path().join("sub/up")).unwrap();
    let through = [
        tmp.path().join("abs/root"),
        tmp.path().join("rel/root"),
        tmp.path().join("sub/up/root"),
    ];
    for root in &through {
        let opened = SandboxRoot::open(root, false).unwrap();
        assert_eq!(opened.path(), root.as_path(), "the configured path is kept");
        opened
            .write_atomic(&rel("seen.txt"), b"x", FILE_MODE, false, false)
            .unwrap();
        assert!(real.join("root/seen.txt").exists());
        fs::remove_file(real.join("root/seen.txt")).unwrap();
    }
    // The directory a link leads to is checked as if it were named.
    chmod(&real, 0o777);
    for root in &through {
        let err = SandboxRoot::open(root, false).unwrap_err();
        assert!(err.contains(&real.display().to_string()), "{err}");
        assert!(err.contains("mode 0777"), "{err}");
    }
}

#[test]
fn open_refuses_a_symlinked_ancestor_owned_by_another_user() {
    let tmp = TempDir::new().unwrap();
    let real = tmp.path().join("real");
    mkdir_755(&real);
    mkdir_755(&real.join("root"));
    let link = tmp.path().join("theirs");
    symlink(&real, &link).unwrap();
    if !give_away(&link) {
        return;
    }
    let err = SandboxRoot::open(&link.join("root"), false).unwrap_err();
    assert!(err.contains(&link.display().to_string()), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(
        err.contains(&format!("owned by uid {}", other_uid())),
        "{err}"
    );
    assert!(
        err.contains("must be owned by root (uid 0) or by this process's uid"),
        "{err}"
    );
}

#[test]
fn open_refuses_an_ancestor_symlink_loop_without_hanging() {
    let tmp = TempDir::new().unwrap();
    symlink("loop2", tmp.path().join("loop1")).unwrap();
    symlink("loop1", tmp.path().join("loop2")).unwrap();
    let err = SandboxRoot::open(&tmp.path().join("loop1/root"), true).unwrap_err();
    assert!(err.contains("symbolic links"), "{err}");
}

#[test]
fn open_refuses_an_ancestor_that_is_a_file() {
    let tmp = TempDir::new().unwrap();
    let file = tmp.path().join("f.txt");
    fs::write(&file, b"x").unwrap();
    let err = SandboxRoot::open(&file.join("root"), true).unwrap_err();
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn roots_nested_through_a_symlink_are_refused_at_start_up() {
    let tmp = TempDir::new().unwrap();
    let a = tmp.path().join("A");
    mkdir_755(&a);
    mkdir_755(&a.join("inner"));
    symlink(a.join("inner"), tmp.path().join("lnk")).unwrap();
    symlink(tmp.path(), tmp.path().join("alias")).unwrap();
    let state = tmp.path().join("state");
    for (outer, inner) in [
        (a.clone(), tmp.path().join("lnk/B")),
        (a.clone(), tmp.path().join("alias/A")),
        (a.clone(), tmp.path().join("alias/A/inner/C")),
    ] {
        for roots in [
            vec![outer.clone(), inner.clone()],
            vec![inner.clone(), outer.clone()],
        ] {
            let err = Sandbox::open(Config::with_roots(roots.clone(), state.clone()))
                .err()
                .unwrap_or_else(|| panic!("{roots:?} were accepted"))
                .to_string();
            assert!(err.contains("overlap"), "{err}");
            assert!(err.contains(&format!("{} ", outer.display())), "{err}");
            assert!(err.contains(&format!("{} ", inner.display())), "{err}");
        }
    }
    assert!(!a.join(".rollback").exists(), "no root was used");
    // Refused before any is made: `lnk/B` and `alias/A/inner/C` were made through the
    // links, in the outer root.
    assert!(!a.join("inner/B").exists() && !a.join("inner/C").exists());
    // Siblings reached through a symlink do not overlap.
    mkdir_755(&tmp.path().join("other"));
    symlink(tmp.path().join("other"), tmp.path().join("lnk2")).unwrap();
    let roots = vec![a.clone(), tmp.path().join("lnk2/B")];
    let sb = Sandbox::open(Config::with_roots(roots, state)).unwrap();
    assert_eq!(sb.roots().len(), 2);
}

#[test]
fn contains_compares_real_directories_not_paths() {
    let tmp = TempDir::new().unwrap();
    let a = tmp.path().join("A");
    mkdir_755(&a);
    mkdir_755(&a.join("inner"));
    symlink(a.join("inner"), tmp.path().join("lnk")).unwrap();
    let outer = SandboxRoot::open(&a, false).unwrap();
    let inner = SandboxRoot::open(&tmp.path().join("lnk/B"), true).unwrap();
    let prefix_sibling = SandboxRoot::open(&tmp.path().join("AB"), true).unwrap();
    assert!(outer.contains(&inner));
    assert!(!inner.contains(&outer));
    assert!(outer.contains(&SandboxRoot::open(&a, false).unwrap()));
    assert!(!outer.contains(&prefix_sibling));
    assert!(!prefix_sibling.contains(&outer));
}

#[test]
fn open_creates_a_missing_root_with_mode_0755() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("a/b/root");
    let root = SandboxRoot::open(&dir, true).unwrap();
    assert!(dir.is_dir());
    assert_eq!(root.path(), dir.as_path());
    for d in [tmp.path().join("a"), tmp.path().join("a/b"), dir.clone()] {
        assert_eq!(mode_of(&d) & !DIR_MODE, 0, "{d:?}: mode {:o}", mode_of(&d));
        let uid = fs::metadata(&d).unwrap().uid();
        assert_eq!(uid, rustix::process::geteuid().as_raw(), "{d:?}");
    }
}

#[test]
fn open_without_create_refuses_a_missing_root() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("missing");
    let err = SandboxRoot::open(&dir, false).unwrap_err();
    assert!(err.contains("cannot be inspected"), "{err}");
    assert!(!dir.exists());
}

#[test]
fn open_refuses_a_file_and_a_dotdot_root() {
    let tmp = TempDir::new().unwrap();
    let file = tmp.path().join("f.txt");
    fs::write(&file, b"x").unwrap();
    assert!(
        SandboxRoot::open(&file, true)
            .unwrap_err()
            .contains("not a directory")
    );
    let dotdot = tmp.path().join("x/../y");
    assert!(SandboxRoot::open(&dotdot, true).unwrap_err().contains(".."));
    assert!(!tmp.path().join("y").exists());
}

// ---- symlinks --------------------------------------------------------------------------

#[test]
fn symlinked_target_pointing_outside_is_symlink_escape() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    symlink(&secret, fx.root_path.join("link.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "link.txt"), ReasonCode::SymlinkEscape);
}

#[test]
fn relative_symlink_climbing_out_is_symlink_escape() {
    let fx = fx();
    fs::write(fx.outside.join("secret.txt"), b"outside").unwrap();
    symlink("../outside/secret.txt", fx.root_path.join("link.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "link.txt"), ReasonCode::SymlinkEscape);
}

#[test]
fn symlink_into_a_prefix_sibling_is_symlink_escape() {
    let fx = fx();
    let evil = PathBuf::from(format!("{}_evil", fx.root_path.display()));
    mkdir_755(&evil);
    fs::write(evil.join("x.txt"), b"evil").unwrap();
    symlink(evil.join("x.txt"), fx.root_path.join("link.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "link.txt"), ReasonCode::SymlinkEscape);
    fs::remove_dir_all(&evil).unwrap();
}

#[test]
fn symlinked_target_pointing_inside_is_symlink_refused() {
    let fx = fx();
    fs::write(fx.root_path.join("real.txt"), b"inside").unwrap();
    symlink("real.txt", fx.root_path.join("link.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "link.txt"), ReasonCode::SymlinkRefused);
    symlink(fx.root_path.join("real.txt"), fx.root_path.join("abs.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "abs.txt"), ReasonCode::SymlinkRefused);
    // Out by `..` and back in by the root's own name: inside all the same.
    let name = fx.root_path.file_name().unwrap().to_str().unwrap();
    symlink(format!("../{name}/real.txt"), fx.root_path.join("back.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "back.txt"), ReasonCode::SymlinkRefused);
    // Out and into a sibling whose name begins like the root's: outside.
    symlink(format!("../{name}x/real.txt"), fx.root_path.join("out.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "out.txt"), ReasonCode::SymlinkEscape);
}

#[test]
fn symlinked_parent_pointing_outside_is_symlink_escape() {
    let fx = fx();
    symlink(&fx.outside, fx.root_path.join("sub")).unwrap();
    assert_eq!(inspect_code(&fx, "sub/x.txt"), ReasonCode::SymlinkEscape);
    assert_eq!(write_code(&fx, "sub/x.txt"), ReasonCode::SymlinkEscape);
    assert!(!fx.outside.join("x.txt").exists());
}

#[test]
fn symlinked_grandparent_pointing_outside_is_symlink_escape() {
    let fx = fx();
    mkdir_755(&fx.outside.join("b"));
    symlink(&fx.outside, fx.root_path.join("a")).unwrap();
    assert_eq!(inspect_code(&fx, "a/b/x.txt"), ReasonCode::SymlinkEscape);
    assert_eq!(write_code(&fx, "a/b/x.txt"), ReasonCode::SymlinkEscape);
    assert_eq!(
        fx.root
            .create_dir_all(&rel("a/b/c"), false)
            .unwrap_err()
            .reason_code,
        ReasonCode::SymlinkEscape
    );
    assert!(!fx.outside.join("b/x.txt").exists());
    assert!(!fx.outside.join("b/c").exists());
}

#[test]
fn symlinked_parent_and_grandparent_pointing_inside_are_symlink_refused() {
    let fx = fx();
    mkdir_755(&fx.root_path.join("real"));
    mkdir_755(&fx.root_path.join("real/b"));
    symlink("real", fx.root_path.join("alias")).unwrap();
    assert_eq!(inspect_code(&fx, "alias/x.txt"), ReasonCode::SymlinkRefused);
    assert_eq!(
        inspect_code(&fx, "alias/b/x.txt"),
        ReasonCode::SymlinkRefused
    );
    assert_eq!(write_code(&fx, "alias/b/x.txt"), ReasonCode::SymlinkRefused);
    assert!(!fx.root_path.join("real/b/x.txt").exists());
}

#[test]
fn dangling_symlink_pointing_outside_is_symlink_escape() {
    let fx = fx();
    let target = fx.outside.join("not-yet.txt");
    symlink(&target, fx.root_path.join("dangling.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "dangling.txt"), ReasonCode::SymlinkEscape);
    // A no-replace write must not create the file the link points to.
    let err = fx
        .root
        .write_atomic(&rel("dangling.txt"), b"x", FILE_MODE, true, false)
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::AlreadyExists);
    assert!(!target.exists());
}

#[test]
fn dangling_symlink_pointing_inside_is_symlink_refused() {
    let fx = fx();
    symlink("missing.txt", fx.root_path.join("dangling.txt")).unwrap();
    assert_eq!(
        inspect_code(&fx, "dangling.txt"),
        ReasonCode::SymlinkRefused
    );
}

#[test]
fn symlink_chain_leaving_the_root_is_symlink_escape() {
    let fx = fx();
    symlink(&fx.outside, fx.root_path.join("hop2")).unwrap();
    symlink("hop2", fx.root_path.join("hop1")).unwrap();
    assert_eq!(inspect_code(&fx, "hop1/x.txt"), ReasonCode::SymlinkEscape);
}

/// A chain as long as the kernel follows (40 links) that ends outside is an escape too.
#[test]
fn a_long_symlink_chain_leaving_the_root_is_symlink_escape() {
    let fx = fx();
    symlink(&fx.outside, fx.root_path.join("ch1")).unwrap();
    for i in 2..=40 {
        symlink(format!("ch{}", i - 1), fx.root_path.join(format!("ch{i}"))).unwrap();
    }
    for i in [9, 16, 40] {
        assert_eq!(
            inspect_code(&fx, &format!("ch{i}/x.txt")),
            ReasonCode::SymlinkEscape,
            "ch{i}"
        );
    }
}

#[test]
fn symlink_loop_is_refused_without_hanging() {
    let fx = fx();
    symlink("b.txt", fx.root_path.join("a.txt")).unwrap();
    symlink("a.txt", fx.root_path.join("b.txt")).unwrap();
    symlink("self.txt", fx.root_path.join("self.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "a.txt"), ReasonCode::SymlinkRefused);
    assert_eq!(inspect_code(&fx, "self.txt"), ReasonCode::SymlinkRefused);
    assert_eq!(
        fx.root
            .read_file(&rel("a.txt"), 1024)
            .unwrap_err()
            .reason_code,
        ReasonCode::SymlinkRefused
    );
}

/// An atomic write replaces only a plain file: a link found at its target (another
/// program's, put there since the target was judged) is neither followed nor removed.
#[test]
fn write_atomic_over_a_symlink_neither_follows_nor_removes_it() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    symlink(&secret, fx.root_path.join("link.txt")).unwrap();
    let r = fx
        .root
        .write_atomic(&rel("link.txt"), b"inside", FILE_MODE, false, false)
        .unwrap_err();
    assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
    assert!(r.reason.contains("a symbolic link"), "{}", r.reason);
    assert_eq!(fs::read(&secret).unwrap(), b"outside");
    let meta = fs::symlink_metadata(fx.root_path.join("link.txt")).unwrap();
    assert!(meta.file_type().is_symlink());
    assert!(leftover_temp_files(&fx.root_path).is_empty());
}

#[test]
fn read_file_through_a_symlink_is_refused() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    symlink(&secret, fx.root_path.join("link.txt")).unwrap();
    assert_eq!(
        fx.root
            .read_file(&rel("link.txt"), 1024)
            .unwrap_err()
            .reason_code,
        ReasonCode::SymlinkEscape
    );
}

/// The refusal does not count the links: the others may be names outside the sandbox
/// (the count, 5 here, told the caller of their coming and going).
#[test]
fn read_file_of_a_hard_linked_file_is_refused_in_words_that_fit_a_read() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    for i in 0..3 {
        fs::hard_link(&secret, fx.outside.join(format!("other{i}"))).unwrap();
    }
    fs::hard_link(&secret, fx.root_path.join("hl.txt")).unwrap();
    for err in [
        fx.root.read_file(&rel("hl.txt"), 1024).unwrap_err(),
        fx.root.inspect(&rel("hl.txt")).unwrap_err(),
    ] {
        assert_eq!(err.reason_code, ReasonCode::HardlinkRefused);
        assert!(
            err.reason
                .starts_with("'hl.txt' has other hard links; a file with more than one link")
                && err.reason.contains("never read or written")
                && !err.reason.contains('5'),
            "{}",
            err.reason
        );
    }
}

#[test]
fn remove_file_leaves_a_symlink_and_its_target_alone() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    symlink(&secret, fx.root_path.join("link.txt")).unwrap();
    let err = fx.root.remove_file(&rel("link.txt"), false).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::SymlinkEscape);
    assert!(fs::symlink_metadata(fx.root_path.join("link.txt")).is_ok());
    assert_eq!(fs::read(&secret).unwrap(), b"outside");
}

// ---- hard links and special files ------------------------------------------------------

#[test]
fn hard_link_to_a_file_outside_is_hardlink_refused() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    fs::hard_link(&secret, fx.root_path.join("h.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "h.txt"), ReasonCode::HardlinkRefused);
    assert_eq!(
        fx.root
            .read_file(&rel("h.txt"), 1024)
            .unwrap_err()
            .reason_code,
        ReasonCode::HardlinkRefused
    );
}

#[test]
fn hard_link_between_two_inside_files_is_hardlink_refused() {
    let fx = fx();
    fs::write(fx.root_path.join("a.txt"), b"a").unwrap();
    fs::hard_link(fx.root_path.join("a.txt"), fx.root_path.join("b.txt")).unwrap();
    assert_eq!(inspect_code(&fx, "a.txt"), ReasonCode::HardlinkRefused);
    assert_eq!(inspect_code(&fx, "b.txt"), ReasonCode::HardlinkRefused);
}

#[test]
fn write_atomic_on_a_hard_link_leaves_the_outside_file_unchanged() {
    let fx = fx();
    let secret = fx.outside.join("secret.txt");
    fs::write(&secret, b"outside").unwrap();
    fs::hard_link(&secret, fx.root_path.join("h.txt")).unwrap();
    let r = fx
        .root
        .write_atomic(&rel("h.txt"), b"replaced", FILE_MODE, false, false)
        .unwrap_err();
    assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
    assert!(
        r.reason.contains("a file with 2 hard links")
            && r.reason.contains("gave it another name or put it there"),
        "{}",
        r.reason
    );
    assert_eq!(fs::read(&secret).unwrap(), b"outside");
    assert_eq!(fs::metadata(&secret).unwrap().nlink(), 2);
    assert!(leftover_temp_files(&fx.root_path).is_empty());
}

#[test]
fn fifo_is_not_regular_file_and_never_blocks() {
    let fx = fx();
    let fifo = fx.root_path.join("pipe.txt");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(inspect_code(&fx, "pipe.txt"), ReasonCode::NotRegularFile);
    // Opened non-blocking: with no writer this must return, not hang.
    assert_eq!(
        fx.root
            .read_file(&rel("pipe.txt"), 1024)
            .unwrap_err()
            .reason_code,
        ReasonCode::NotRegularFile
    );
}

#[test]
fn socket_is_not_regular_file() {
    let fx = fx();
    let _listener = std::os::unix::net::UnixListener::bind(fx.root_path.join("s.sock")).unwrap();
    assert_eq!(inspect_code(&fx, "s.sock"), ReasonCode::NotRegularFile);
    assert_eq!(
        fx.root
            .read_file(&rel("s.sock"), 1024)
            .unwrap_err()
            .reason_code,
        ReasonCode::NotRegularFile
    );
}

// ---- inspect ---------------------------------------------------------------------------

#[test]
fn inspect_reports_missing_file_and_directory() {
    let fx = fx();
    mkdir_755(&fx.root_path.join("d"));
    fs::write(fx.root_path.join("d/f.txt"), b"12345").unwrap();
    let info = fx.root.inspect(&rel("d/f.txt")).unwrap();
    assert!(
        matches!(info.kind, TargetKind::File { size: 5, .. }),
        "{info:?}"
    );
    assert_eq!(info.existing_parents, 1);
    assert_eq!(
        fx.root.inspect(&rel("d")).unwrap().kind,
        TargetKind::Directory
    );
    let missing = fx.root.inspect(&rel("d/x/y/z.txt")).unwrap();
    assert_eq!(missing.kind, TargetKind::Missing);
    assert_eq!(missing.existing_parents, 1);
}

#[test]
fn inspect_through_a_file_used_as_directory_is_not_found() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"x").unwrap();
    assert_eq!(inspect_code(&fx, "f.txt/x.txt"), ReasonCode::NotFound);
}

// ---- writes, modes, directories --------------------------------------------------------

#[test]
fn write_atomic_creates_parents_0755_and_file_0644() {
    let fx = fx();
    let created = fx
        .root
        .write_atomic(&rel("a/b/c/f.txt"), b"hello", FILE_MODE, false, false)
        .unwrap();
    assert_eq!(created, ["a", "a/b", "a/b/c"]);
    assert_eq!(
        fs::read(fx.root_path.join("a/b/c/f.txt")).unwrap(),
        b"hello"
    );
    for d in ["a", "a/b", "a/b/c"] {
        let m = mode_of(&fx.root_path.join(d));
        assert_eq!(m & !DIR_MODE, 0, "{d}: {m:o}");
        assert_eq!(m & 0o700, 0o700, "{d}: {m:o}");
    }
    let m = mode_of(&fx.root_path.join("a/b/c/f.txt"));
    assert_eq!(m & !FILE_MODE, 0, "{m:o}");
    assert_eq!(m & 0o111, 0, "{m:o}");
    assert_eq!(m & 0o600, 0o600, "{m:o}");
}

#[test]
fn write_atomic_never_sets_an_execute_bit_even_when_asked() {
    let fx = fx();
    fx.root
        .write_atomic(&rel("run.sh"), b"#!/bin/sh\necho hi\n", 0o777, false, false)
        .unwrap();
    let m = mode_of(&fx.root_path.join("run.sh"));
    assert_eq!(m & 0o111, 0, "{m:o}");
    assert_eq!(m & 0o7000, 0, "{m:o}");
}

#[test]
fn write_atomic_replaces_content_and_leaves_no_temp_file() {
    let fx = fx();
    fx.root
        .write_atomic(&rel("f.txt"), b"one", FILE_MODE, false, false)
        .unwrap();
    fx.root
        .write_atomic(&rel("f.txt"), b"two", FILE_MODE, false, true)
        .unwrap();
    assert_eq!(fs::read(fx.root_path.join("f.txt")).unwrap(), b"two");
    assert!(leftover_temp_files(&fx.root_path).is_empty());
}

#[test]
fn write_atomic_no_replace_refuses_an_existing_file() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"original").unwrap();
    let err = fx
        .root
        .write_atomic(&rel("f.txt"), b"new", FILE_MODE, true, false)
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::AlreadyExists);
    assert_eq!(fs::read(fx.root_path.join("f.txt")).unwrap(), b"original");
    assert!(leftover_temp_files(&fx.root_path).is_empty());
    fx.root
        .write_atomic(&rel("g.txt"), b"new", FILE_MODE, true, false)
        .unwrap();
    assert_eq!(fs::read(fx.root_path.join("g.txt")).unwrap(), b"new");
}

#[test]
fn write_atomic_through_a_file_parent_is_refused() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"x").unwrap();
    assert_eq!(write_code(&fx, "f.txt/inner.txt"), ReasonCode::NotFound);
    assert_eq!(fs::read(fx.root_path.join("f.txt")).unwrap(), b"x");
}

#[test]
fn create_dir_all_is_idempotent() {
    let fx = fx();
    let first = fx.root.create_dir_all(&rel("x/y/z"), true).unwrap();
    assert_eq!(first, ["x", "x/y", "x/y/z"]);
    let second = fx.root.create_dir_all(&rel("x/y/z"), false).unwrap();
    assert!(second.is_empty());
    assert!(fx.root_path.join("x/y/z").is_dir());
    let m = mode_of(&fx.root_path.join("x/y/z"));
    assert_eq!(m & !DIR_MODE, 0, "{m:o}");
}

#[test]
fn create_dir_all_over_a_file_is_already_exists() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"x").unwrap();
    assert_eq!(
        fx.root
            .create_dir_all(&rel("f.txt"), false)
            .unwrap_err()
            .reason_code,
        ReasonCode::AlreadyExists
    );
}

#[test]
fn create_dir_all_on_a_symlinked_dir_is_refused() {
    let fx = fx();
    symlink(&fx.outside, fx.root_path.join("out")).unwrap();
    assert_eq!(
        fx.root
            .create_dir_all(&rel("out"), false)
            .unwrap_err()
            .reason_code,
        ReasonCode::SymlinkEscape
    );
}

#[test]
fn read_file_returns_bytes_and_refuses_above_the_limit() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"0123456789").unwrap();
    assert_eq!(fx.root.read_file(&rel("f.txt"), 10).unwrap(), b"0123456789");
    assert_eq!(
        fx.root.read_file(&rel("f.txt"), 9).unwrap_err().reason_code,
        ReasonCode::SizeExceeded
    );
    assert_eq!(
        fx.root
            .read_file(&rel("none.txt"), 9)
            .unwrap_err()
            .reason_code,
        ReasonCode::NotFound
    );
}

#[test]
fn remove_file_and_remove_empty_dir() {
    let fx = fx();
    fx.root
        .write_atomic(&rel("d/f.txt"), b"x", FILE_MODE, false, false)
        .unwrap();
    assert!(!fx.root.remove_empty_dir(&rel("d"), None, false).unwrap());
    fx.root.remove_file(&rel("d/f.txt"), false).unwrap();
    assert!(!fx.root_path.join("d/f.txt").exists());
    fx.root.remove_file(&rel("d/f.txt"), false).unwrap();
    assert!(fx.root.remove_empty_dir(&rel("d"), None, false).unwrap());
    assert!(!fx.root_path.join("d").exists());
    assert_eq!(
        fx.root
            .write_atomic(&rel("e/g.txt"), b"x", FILE_MODE, false, false)
            .map(|_| fx
                .root
                .remove_file(&rel("e"), false)
                .unwrap_err()
                .reason_code)
            .unwrap(),
        ReasonCode::NotRegularFile
    );
}

/// Entries removed while a directory is listed are left out of the listing, not taken
/// for a failure to list it.
#[test]
fn list_dir_leaves_out_entries_removed_while_it_lists() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = fx();
    let dir = fx.root_path.join("d");
    mkdir_755(&dir);
    for i in 0..200 {
        fs::write(dir.join(format!("keep{i}")), b"k").unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..200_000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let f = dir.join(format!("churn{}", i % 64));
                let _ = fs::write(&f, b"c");
                let _ = fs::remove_file(&f);
            }
        });
        for _ in 0..300 {
            let listed = fx.root.list_dir(Some(&rel("d")));
            let listed = listed.unwrap_or_else(|r| {
                done.store(true, Ordering::Relaxed);
                panic!("{}: {}", r.reason_code, r.reason)
            });
            let kept = listed.iter().filter(|e| e.name.starts_with("keep")).count();
            assert_eq!(kept, 200);
        }
        done.store(true, Ordering::Relaxed);
    });
}

#[test]
fn list_dir_reports_kinds_without_following_links() {
    let fx = fx();
    fs::write(fx.root_path.join("f.txt"), b"abc").unwrap();
    mkdir_755(&fx.root_path.join("d"));
    symlink(&fx.outside, fx.root_path.join("l")).unwrap();
    let list = fx.root.list_dir(None).unwrap();
    let kinds: Vec<(&str, &str, Option<u64>)> = list
        .iter()
        .map(|e| (e.name.as_str(), e.kind.as_str(), e.size_bytes))
        .collect();
    assert_eq!(
        kinds,
        [
            ("d", "directory", None),
            ("f.txt", "file", Some(3)),
            ("l", "symlink", None)
        ]
    );
    assert_eq!(
        fx.root.list_dir(Some(&rel("l"))).unwrap_err().reason_code,
        ReasonCode::SymlinkEscape
    );
}

#[test]
fn remove_temp_files_cleans_only_marked_files() {
    let fx = fx();
    mkdir_755(&fx.root_path.join("d"));
    fs::write(fx.root_path.join(format!("{TEMP_MARKER}1")), b"x").unwrap();
    fs::write(fx.root_path.join(format!("d/{TEMP_MARKER}2")), b"x").unwrap();
    fs::write(fx.root_path.join("d/keep.txt"), b"x").unwrap();
    // Another process's temporary file is left when only a dead process's are removed.
    let dead = "ex_00000000000000000000000011111111";
    fs::write(
        fx.root_path.join(format!("{TEMP_MARKER}0000000022222222")),
        b"x",
    )
    .unwrap();
    fs::write(
        fx.root_path.join(format!("{TEMP_MARKER}0000000011111111")),
        b"x",
    )
    .unwrap();
    let removed = remove_temp_files(fx.root.dir(), MAX_PATH_DEPTH, Some(dead)).unwrap();
    assert_eq!(removed, 1);
    assert!(
        fx.root_path
            .join(format!("{TEMP_MARKER}0000000022222222"))
            .exists()
    );
    let removed = remove_temp_files(fx.root.dir(), MAX_PATH_DEPTH, None).unwrap();
    assert_eq!(removed, 3);
    assert!(leftover_temp_files(&fx.root_path).is_empty());
    assert!(fx.root_path.join("d/keep.txt").exists());
}

// ---- swaps after the check ---------------------------------------------------------------

#[test]
fn directory_swapped_for_a_symlink_after_inspect_is_refused_at_write() {
    let fx = fx();
    mkdir_755(&fx.root_path.join("d"));
    let info = fx.root.inspect(&rel("d/x.txt")).unwrap();
    assert_eq!(info.kind, TargetKind::Missing);
    fs::rename(fx.root_path.join("d"), fx.root_path.join("d_old")).unwrap();
    symlink(&fx.outside, fx.root_path.join("d")).unwrap();
    assert_eq!(write_code(&fx, "d/x.txt"), ReasonCode::SymlinkEscape);
    assert!(!fx.outside.join("x.txt").exists());
    assert!(!fx.root_path.join("d_old/x.txt").exists());
}

#[test]
fn root_handle_stays_on_the_opened_directory_after_the_path_is_swapped() {
    let fx = fx();
    let moved = fx.root_path.with_file_name("root_moved");
    fs::rename(&fx.root_path, &moved).unwrap();
    symlink(&fx.outside, &fx.root_path).unwrap();
    fx.root
        .write_atomic(&rel("x.txt"), b"confined", FILE_MODE, false, false)
        .unwrap();
    assert_eq!(fs::read(moved.join("x.txt")).unwrap(), b"confined");
    assert!(!fx.outside.join("x.txt").exists());
}

/// Batched syncs flush whole filesystems; a directory inside a root can be another
/// filesystem mounted there, and a write into it must widen the set that is synced.
#[test]
fn batched_syncs_cover_every_filesystem_written_to() {
    use ailab_sandbox_core::confine::state::FsSync;
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let sync = FsSync::open(&[tmp.path()]).unwrap();
    assert_eq!(sync.filesystems(), 1);
    let open = |p: &std::path::Path| {
        cap_std::fs::Dir::open_ambient_dir(p, cap_std::ambient_authority()).unwrap()
    };
    sync.cover(&open(&tmp.path().join("sub"))).unwrap();
    assert_eq!(sync.filesystems(), 1, "same filesystem, nothing added");
    let other = std::path::Path::new("/dev/shm");
    let dev = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if dev(other).is_none() || dev(other) == dev(tmp.path()) {
        return; // no second filesystem to try here
    }
    sync.cover(&open(other)).unwrap();
    assert_eq!(sync.filesystems(), 2);
    sync.cover(&open(other)).unwrap();
    assert_eq!(sync.filesystems(), 2, "each filesystem once");
    sync.sync().unwrap();
}

/// Concurrent callers share syncs: every call returns once a sync that started after it
/// asked has finished, and no more syncs are made than calls.
#[test]
fn batched_syncs_are_shared_by_concurrent_callers() {
    use ailab_sandbox_core::confine::state::FsSync;
    let tmp = tempfile::tempdir().unwrap();
    let sync = std::sync::Arc::new(FsSync::open(&[tmp.path()]).unwrap());
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (sync, barrier, dir) = (sync.clone(), barrier.clone(), tmp.path().to_path_buf());
            std::thread::spawn(move || {
                for i in 0..5 {
                    fs::write(dir.join(format!("f{t}_{i}")), b"x").unwrap();
                    barrier.wait();
                    sync.sync().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let made = sync.syncs_made();
    assert!((1..=40).contains(&made), "{made} syncs for 40 calls");
}

/// A directory reserved by identity (the state directory, mounted into a root where no
/// path says so) is never passed through: not for a write, a read or a listing, and
/// not under another name (a second mount, or a rename, keeps the identity).
#[test]
fn a_reserved_directory_is_unreachable_under_any_name() {
    let mut fx = fx();
    mkdir_755(&fx.root_path.join("state"));
    fs::write(fx.root_path.join("state/seal.key"), b"k").unwrap();
    let m = fs::metadata(fx.root_path.join("state")).unwrap();
    fx.root
        .reserve(vec![((m.dev(), m.ino()), "the state directory".to_owned())]);
    for name in ["state", "renamed"] {
        let code = |r: Result<(), ailab_sandbox_core::Refusal>| r.unwrap_err().reason_code;
        let p = format!("{name}/x.txt");
        assert_eq!(write_code(&fx, &p), ReasonCode::ReservedPath, "{p}");
        assert_eq!(inspect_code(&fx, &p), ReasonCode::ReservedPath, "{p}");
        let key = rel(&format!("{name}/seal.key"));
        assert_eq!(
            code(fx.root.read_file(&key, 10).map(drop)),
            ReasonCode::ReservedPath
        );
        assert_eq!(
            code(fx.root.list_dir(Some(&rel(name))).map(drop)),
            ReasonCode::ReservedPath
        );
        if name == "state" {
            fs::rename(fx.root_path.join("state"), fx.root_path.join("renamed")).unwrap();
        }
    }
    assert!(!fx.root_path.join("renamed/x.txt").exists());
    // Other directories are as before.
    mkdir_755(&fx.root_path.join("d"));
    fx.root
        .write_atomic(&rel("d/x.txt"), b"ok", FILE_MODE, false, false)
        .unwrap();
}
