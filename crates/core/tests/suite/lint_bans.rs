//! The bans of SPEC §12.1-2 in `clippy.toml`, held to account. Each statement below is a
//! chmod or subprocess route the runtime must never take, and each expects the lint that
//! refuses it: should a ban stop resolving or firing (a path renamed upstream, an entry
//! dropped), `cargo clippy --all-targets -- -D warnings` fails on the unfulfilled
//! expectation. Compiled by every clippy run, never called.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;

#[allow(dead_code, reason = "a lint probe: compiled, never run")]
fn chmod_routes(
    path: &std::path::Path,
    file: &std::fs::File,
    perms: &std::fs::Permissions,
    dir: &cap_std::fs::Dir,
    cap_file: &cap_std::fs::File,
    cap_perms: &cap_std::fs::Permissions,
) {
    use cap_fs_ext::DirExt as _;
    use rustix::fs::{AtFlags, CWD, Mode};
    let exec_bits = Mode::from_raw_mode(0o755);

    #[expect(clippy::disallowed_methods)]
    let _ = std::fs::set_permissions(path, perms.clone());
    #[expect(clippy::disallowed_methods)]
    let _ = file.set_permissions(perms.clone());
    #[expect(clippy::disallowed_methods)]
    let _ = std::fs::Permissions::from_mode(0o755);
    #[expect(clippy::disallowed_methods)]
    perms.clone().set_mode(0o755);
    #[expect(clippy::disallowed_methods)]
    perms.clone().set_readonly(true);
    #[expect(clippy::disallowed_methods)]
    let _ = dir.set_permissions("x", cap_perms.clone());
    #[expect(clippy::disallowed_methods)]
    let _ = cap_file.set_permissions(cap_perms.clone());
    #[expect(clippy::disallowed_methods)]
    let _ = dir.set_symlink_permissions("x", cap_perms.clone());
    #[expect(clippy::disallowed_methods)]
    let _ = rustix::fs::chmod(path, exec_bits);
    #[expect(clippy::disallowed_methods)]
    let _ = rustix::fs::chmodat(CWD, path, exec_bits, AtFlags::empty());
    #[expect(clippy::disallowed_methods)]
    let _ = rustix::fs::fchmod(file, exec_bits);
}

#[allow(dead_code, reason = "a lint probe: compiled, never run")]
fn subprocess_routes(command: &mut std::process::Command) {
    #[expect(clippy::disallowed_methods)]
    let _ = std::process::Command::new("sh");
    #[expect(clippy::disallowed_methods)]
    let _ = command.exec();
}
