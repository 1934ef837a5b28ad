//! Any path string, resolved lexically and then inspected and written through a real
//! root handle that holds symlinks and a hard link to outside: it is refused, or it lands
//! inside the root; the outside file never changes.
#![no_main]

use ailab_sandbox_core::confine::{SandboxRoot, resolve_sandbox_path};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

struct Fixture {
    _tmp: tempfile::TempDir,
    root: SandboxRoot,
    root_path: PathBuf,
    secret: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root_path = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root_path.join("a/b")).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        let secret = outside.join("secret.txt");
        std::fs::write(&secret, b"secret").expect("write");
        std::os::unix::fs::symlink(&outside, root_path.join("lnk")).expect("symlink");
        std::os::unix::fs::symlink("../../outside/secret.txt", root_path.join("a/rel.txt")).expect("symlink");
        std::fs::hard_link(&secret, root_path.join("hard.txt")).expect("link");
        let root = SandboxRoot::open(&root_path, false).expect("root");
        Fixture { _tmp: tmp, root, root_path, secret }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else { return };
    let f = fixture();
    let roots = vec![f.root_path.clone()];
    let Ok(resolved) = resolve_sandbox_path(path, &roots, None, 8) else { return };
    assert!(resolved.rel.components().iter().all(|c| c != ".." && c != "." && !c.is_empty()));
    if f.root.inspect(&resolved.rel).is_ok() {
        let _ = f.root.write_atomic(&resolved.rel, b"fuzz", 0o644, false, false);
    }
    assert_eq!(std::fs::read(&f.secret).expect("secret"), b"secret");
});
