//! `check_sandbox_governance`: the ordered checks of SPEC §5, intents, risk.

use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::catalog::{OPERATIONS, RiskLevel};
use ailab_sandbox_core::confine::{ExtensionPolicy, MAX_PATH_DEPTH, SandboxRoot, TargetKind};
use ailab_sandbox_core::policy::{
    Approval, GovernanceContext, GovernanceRequest, assess_sandbox_risk, check_intent,
    check_sandbox_governance,
};
use ailab_sandbox_core::reason::Verdict;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

const ROOT: &str = "/srv/gov-root";
const STATE: &str = "/srv/gov-state";

fn req<'a>(intent: &'a str, path: &'a str) -> GovernanceRequest<'a> {
    GovernanceRequest {
        intent,
        path,
        phase: "28.3",
        root: None,
        description: None,
        tool: None,
    }
}

/// Governance of a path configured under [`ROOT`] whose root holds nothing: the path's
/// own checks decide.
fn lexical(r: &GovernanceRequest<'_>, size: u64) -> Verdict<Approval> {
    let root_paths = [PathBuf::from(ROOT)];
    let empty = TempDir::new().unwrap();
    let roots = [SandboxRoot::open(empty.path(), false).unwrap()];
    let ext = ExtensionPolicy::default();
    let ctx = GovernanceContext {
        root_paths: &root_paths,
        roots: &roots,
        state_dir: Path::new(STATE),
        extensions: &ext,
        max_depth: MAX_PATH_DEPTH,
        syncs_folders: false,
    };
    check_sandbox_governance(r, &ctx, size)
}

fn code(r: &GovernanceRequest<'_>) -> Option<ReasonCode> {
    lexical(r, 1).err().map(|e| e.reason_code)
}

fn code_of(intent: &str, path: &str) -> Option<ReasonCode> {
    code(&req(intent, path))
}

struct Disk {
    _tmp: TempDir,
    root_path: PathBuf,
    outside: PathBuf,
    state: PathBuf,
    roots: Vec<SandboxRoot>,
}

fn disk() -> Disk {
    let tmp = TempDir::new().unwrap();
    let root_path = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    for d in [&root_path, &outside] {
        fs::DirBuilder::new().mode(0o755).create(d).unwrap();
    }
    let roots = vec![SandboxRoot::open(&root_path, false).unwrap()];
    let state = tmp.path().join("state");
    Disk {
        _tmp: tmp,
        root_path,
        outside,
        state,
        roots,
    }
}

fn on_disk(d: &Disk, r: &GovernanceRequest<'_>, state_dir: &Path, size: u64) -> Verdict<Approval> {
    let root_paths = [d.root_path.clone()];
    let ext = ExtensionPolicy::default();
    let ctx = GovernanceContext {
        root_paths: &root_paths,
        roots: &d.roots,
        state_dir,
        extensions: &ext,
        max_depth: MAX_PATH_DEPTH,
        syncs_folders: false,
    };
    check_sandbox_governance(r, &ctx, size)
}

fn disk_code(d: &Disk, intent: &str, path: &str) -> Option<ReasonCode> {
    on_disk(d, &req(intent, path), &d.state, 1)
        .err()
        .map(|e| e.reason_code)
}

#[test]
fn a_plain_create_file_is_approved() {
    let a = lexical(&req("create_file", "notes/hello.md"), 5).unwrap();
    assert_eq!(a.op.name, "create_file");
    assert_eq!(a.resolved.root_index, 0);
    assert_eq!(a.resolved.rel.as_string(), "notes/hello.md");
    assert_eq!(a.ext, ".md");
    assert_eq!(a.risk, RiskLevel::Medium);
    assert_eq!(a.target.kind, TargetKind::Missing);
}

#[test]
fn every_catalog_intent_is_approved_on_a_suitable_path() {
    for o in OPERATIONS.iter() {
        let path = if o.is_directory() {
            "out/dir".to_owned()
        } else {
            format!(
                "out/file{}",
                o.extensions.first().copied().unwrap_or(".txt")
            )
        };
        let a = lexical(&req(o.name, &path), 1).unwrap_or_else(|e| panic!("{}: {e}", o.name));
        assert_eq!(a.op.name, o.name);
    }
}

#[test]
fn forbidden_intents_are_forbidden_intent() {
    for intent in [
        "delete_file",
        "move_file",
        "run_command",
        "restart_service",
        "install_package",
        "modify_config",
    ] {
        assert_eq!(
            code_of(intent, "x.txt"),
            Some(ReasonCode::ForbiddenIntent),
            "{intent}"
        );
    }
}

#[test]
fn a_forbidden_intent_spelt_otherwise_is_still_forbidden_intent() {
    for intent in [
        "DELETE_FILE",
        "Delete_File",
        "delete-file",
        "run command",
        "run_command ",
        " Install-Package",
        "ｄｅｌｅｔｅ_file",
        "deleteFile",
        "DeleteFile",
        "runCommand",
        "delete.file",
        "delete\u{2010}file",
        "delete\u{2212}file",
        "delete_file\0",
        "delete\tfile",
    ] {
        let refusal = lexical(&req(intent, "x.txt"), 1).unwrap_err();
        assert_eq!(
            refusal.reason_code,
            ReasonCode::ForbiddenIntent,
            "{intent:?}"
        );
        assert!(refusal.reason.contains("(read as "), "{}", refusal.reason);
    }
}

#[test]
fn unknown_and_read_intents_are_not_sandbox_write() {
    for intent in [
        "read_file",
        "list_directory",
        "get_file_info",
        "frobnicate",
        "write_file",
        "create_files",
        "rm",
    ] {
        assert_eq!(
            code_of(intent, "x.txt"),
            Some(ReasonCode::NotSandboxWrite),
            "{intent}"
        );
    }
}

#[test]
fn malformed_intent_strings_are_unknown_operation() {
    let long = "a".repeat(65);
    for intent in [
        "",
        "Create_File",
        "CREATE_FILE",
        "create-file",
        "create file",
        "create_file ",
        "rm -rf /",
        "create_file\n",
        long.as_str(),
        "créer",
    ] {
        assert_eq!(
            code_of(intent, "x.txt"),
            Some(ReasonCode::UnknownOperation),
            "{intent:?}"
        );
    }
    // A write operation's name spelt otherwise is answered with its name.
    let refusal = lexical(&req("Create-File", "x.txt"), 1).unwrap_err();
    assert!(
        refusal
            .reason
            .contains("(names are lower case, words joined by `_`: create_file)"),
        "{}",
        refusal.reason
    );
}

#[test]
fn a_shell_tool_makes_a_write_intent_forbidden() {
    for tool in ["bash", "Shell", "exec", "terminal"] {
        let r = GovernanceRequest {
            tool: Some(tool),
            ..req("create_file", "x.txt")
        };
        assert_eq!(code(&r), Some(ReasonCode::ForbiddenIntent), "{tool}");
    }
    // The refusal names the tool and says how a tool that only writes files passes.
    let refusal =
        ailab_sandbox_core::policy::intent_refusal("create_file", Some("Write Python File"));
    assert_eq!(refusal.reason_code, ReasonCode::ForbiddenIntent);
    assert!(
        refusal
            .reason
            .starts_with("the tool 'Write Python File' runs commands or code")
            && refusal
                .reason
                .ends_with("may be named without such a word: python, bash, node, exec, run…)"),
        "{}",
        refusal.reason
    );
    let r = GovernanceRequest {
        tool: Some("editor"),
        ..req("create_file", "x.txt")
    };
    assert_eq!(code(&r), None);
}

#[test]
fn phase_28_2_is_phase_not_supported() {
    let r = GovernanceRequest {
        phase: "28.2",
        ..req("create_file", "x.txt")
    };
    let err = lexical(&r, 1).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::PhaseNotSupported);
    assert!(err.reason.contains("28.2"), "{}", err.reason);
}

#[test]
fn phases_that_allow_writes_and_those_that_do_not() {
    for phase in ["28.3", "28.5", "28.6", "28.7", "28.8"] {
        let r = GovernanceRequest {
            phase,
            ..req("create_file", "x.txt")
        };
        assert_eq!(code(&r), None, "{phase}");
    }
    for phase in ["28.1", "28.2", "28.4", "29.0", "", "28.3 ", "latest"] {
        let r = GovernanceRequest {
            phase,
            ..req("create_file", "x.txt")
        };
        assert_eq!(code(&r), Some(ReasonCode::PhaseNotSupported), "{phase:?}");
    }
}

#[test]
fn phase_is_checked_before_the_intent() {
    let r = GovernanceRequest {
        phase: "28.2",
        ..req("delete_file", "../x.service")
    };
    assert_eq!(code(&r), Some(ReasonCode::PhaseNotSupported));
}

#[test]
fn intent_is_checked_before_chmod() {
    let r = GovernanceRequest {
        description: Some("chmod +x it"),
        ..req("run_command", "x.txt")
    };
    assert_eq!(code(&r), Some(ReasonCode::ForbiddenIntent));
}

#[test]
fn chmod_in_the_description_is_chmod_forbidden() {
    let r = GovernanceRequest {
        description: Some("write the script and chmod +x it"),
        ..req("generate_script", "run.sh")
    };
    let err = lexical(&r, 10).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ChmodForbidden);
    // It says which of the action's texts asks for it, so that the right one is changed.
    assert!(
        err.reason
            .starts_with("the action's description asks to change permissions (")
            && err
                .reason
                .ends_with("so remove that request from the description"),
        "{}",
        err.reason
    );
}

#[test]
fn chmod_as_the_intent_is_chmod_forbidden() {
    assert_eq!(code_of("chmod", "x.sh"), Some(ReasonCode::ChmodForbidden));
}

/// An intent is an identifier, so a pattern's words come joined by underscores or hyphens.
#[test]
fn a_chmod_pattern_spelled_as_an_intent_is_chmod_forbidden() {
    for intent in [
        "make_executable",
        "mark-as-executable",
        "set_executable_bit",
        "add_execute_permission",
        "mark_as_exec",
        "set_permissions",
        "setPermissions",
        "setExecutable",
    ] {
        assert_eq!(
            code_of(intent, "x.sh"),
            Some(ReasonCode::ChmodForbidden),
            "{intent}"
        );
    }
    assert_eq!(
        code_of("make_file", "x.sh"),
        Some(ReasonCode::NotSandboxWrite)
    );
}

#[test]
fn chmod_is_reported_before_a_traversal_path() {
    let r = GovernanceRequest {
        description: Some("chmod 755"),
        ..req("create_file", "../../etc/x.sh")
    };
    assert_eq!(code(&r), Some(ReasonCode::ChmodForbidden));
}

#[test]
fn traversal_is_reported_before_a_blocked_extension() {
    assert_eq!(
        code_of("create_file", "../evil.service"),
        Some(ReasonCode::PathTraversal)
    );
    assert_eq!(
        code_of("create_file", "a//evil.so"),
        Some(ReasonCode::PathTraversal)
    );
}

#[test]
fn depth_is_reported_before_a_blocked_extension() {
    assert_eq!(
        code_of("create_file", "1/2/3/4/5/6/7/8/x.service"),
        Some(ReasonCode::DepthExceeded)
    );
    assert_eq!(code_of("create_file", "1/2/3/4/5/6/7/x.txt"), None);
}

#[test]
fn outside_and_reserved_are_reported_before_the_extension() {
    assert_eq!(
        code_of("create_file", "/etc/systemd/system/x.service"),
        Some(ReasonCode::OutsideSandbox)
    );
    assert_eq!(
        code_of("create_file", "/srv/gov-root_evil/x.txt"),
        Some(ReasonCode::OutsideSandbox)
    );
    assert_eq!(
        code_of("create_file", ".rollback/wf/x.service"),
        Some(ReasonCode::ReservedPath)
    );
    assert_eq!(
        code_of("write_json", ".Rollback/a1/meta.json"),
        Some(ReasonCode::ReservedPath)
    );
}

#[test]
fn absolute_path_inside_the_root_is_approved() {
    let a = lexical(&req("write_json", "/srv/gov-root/out/data.json"), 10).unwrap();
    assert_eq!(a.resolved.rel.as_string(), "out/data.json");
    assert_eq!(
        code_of("write_json", ROOT),
        Some(ReasonCode::OutsideSandbox)
    );
}

#[test]
fn blocked_extension_comes_before_operation_extension_and_size() {
    assert_eq!(
        code_of("write_json", "x.service"),
        Some(ReasonCode::BlockedExtension)
    );
    assert_eq!(
        code_of("create_file", "X.SERVICE"),
        Some(ReasonCode::BlockedExtension)
    );
    assert_eq!(
        code_of("create_file", "x.service."),
        Some(ReasonCode::BlockedExtension)
    );
    assert_eq!(
        code_of("create_file", "x.service "),
        Some(ReasonCode::BlockedExtension)
    );
    assert_eq!(
        code_of("append_file", "lib/libx.so"),
        Some(ReasonCode::BlockedExtension)
    );
}

#[test]
fn operation_extension_lists_are_enforced() {
    assert_eq!(
        code_of("write_json", "x.yaml"),
        Some(ReasonCode::ExtensionNotAllowed)
    );
    assert_eq!(
        code_of("generate_script", "x.txt"),
        Some(ReasonCode::ExtensionNotAllowed)
    );
    assert_eq!(
        code_of("generate_config", "x.md"),
        Some(ReasonCode::ExtensionNotAllowed)
    );
    assert_eq!(
        code_of("write_markdown", "x.json"),
        Some(ReasonCode::ExtensionNotAllowed)
    );
    assert_eq!(
        code_of("create_file", "x.exe.bin"),
        Some(ReasonCode::ExtensionNotAllowed)
    );
}

/// An extension refusal names the file, so that a plan of many files says which one to
/// rename ("a name without extension is not on the allow-list" named none).
#[test]
fn extension_refusals_name_the_file() {
    for (intent, path) in [
        ("create_file", "notes/noext"),
        ("create_file", "x.service"),
        ("write_json", "data/x.yaml"),
    ] {
        let err = lexical(&req(intent, path), 1).unwrap_err();
        assert!(
            err.reason.starts_with(&format!("'{path}': ")),
            "{}",
            err.reason
        );
    }
}

#[test]
fn size_is_the_last_check() {
    let err = lexical(&req("write_json", "x.json"), 2 * 1024 * 1024 + 1).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::SizeExceeded);
    assert!(lexical(&req("write_json", "x.json"), 2 * 1024 * 1024).is_ok());
    // A wrong extension is reported rather than the size.
    let err = lexical(&req("write_json", "x.yaml"), u64::MAX).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ExtensionNotAllowed);
}

#[test]
fn check_intent_alone_needs_no_path() {
    assert_eq!(
        check_intent(&req("write_yaml", "")).unwrap().name,
        "write_yaml"
    );
    assert_eq!(
        check_intent(&req("delete_file", ""))
            .unwrap_err()
            .reason_code,
        ReasonCode::ForbiddenIntent
    );
}

// ---- with root handles -------------------------------------------------------------------

#[test]
fn symlink_escape_is_reported_before_the_extension() {
    let d = disk();
    symlink(d.outside.join("x.service"), d.root_path.join("l.service")).unwrap();
    assert_eq!(
        disk_code(&d, "create_file", "l.service"),
        Some(ReasonCode::SymlinkEscape)
    );
    symlink(&d.outside, d.root_path.join("out")).unwrap();
    assert_eq!(
        disk_code(&d, "create_file", "out/x.txt"),
        Some(ReasonCode::SymlinkEscape)
    );
}

#[test]
fn inside_symlink_hardlink_and_fifo_are_refused_by_governance() {
    let d = disk();
    fs::write(d.root_path.join("real.txt"), b"x").unwrap();
    symlink("real.txt", d.root_path.join("link.txt")).unwrap();
    assert_eq!(
        disk_code(&d, "replace_file", "link.txt"),
        Some(ReasonCode::SymlinkRefused)
    );
    fs::write(d.outside.join("o.txt"), b"x").unwrap();
    fs::hard_link(d.outside.join("o.txt"), d.root_path.join("h.txt")).unwrap();
    assert_eq!(
        disk_code(&d, "replace_file", "h.txt"),
        Some(ReasonCode::HardlinkRefused)
    );
    let sock = d.root_path.join("s.txt");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert_eq!(
        disk_code(&d, "append_file", "s.txt"),
        Some(ReasonCode::NotRegularFile)
    );
}

#[test]
fn target_kind_decides_file_versus_directory_operations() {
    let d = disk();
    fs::DirBuilder::new()
        .mode(0o755)
        .create(d.root_path.join("dir"))
        .unwrap();
    fs::create_dir(d.root_path.join("dir.md")).unwrap();
    fs::write(d.root_path.join("f.txt"), b"abc").unwrap();
    assert_eq!(
        disk_code(&d, "create_file", "dir.md"),
        Some(ReasonCode::AlreadyExists)
    );
    assert_eq!(
        disk_code(&d, "replace_file", "dir.md"),
        Some(ReasonCode::NotRegularFile)
    );
    assert_eq!(
        disk_code(&d, "create_directory", "f.txt"),
        Some(ReasonCode::AlreadyExists)
    );
    let a = on_disk(&d, &req("create_directory", "dir"), &d.state, 0).unwrap();
    assert_eq!(a.target.kind, TargetKind::Directory);
    let a = on_disk(&d, &req("replace_file", "f.txt"), &d.state, 3).unwrap();
    assert!(matches!(a.target.kind, TargetKind::File { size: 3, .. }));
}

/// What an operation finds on disk (a file where its folder or a parent folder would be,
/// a folder where its file would be) is its own precondition, told after governance's
/// checks (SPEC §5): a blocked extension is named first.
#[test]
fn a_blocked_extension_is_named_before_what_the_operation_finds_on_disk() {
    let d = disk();
    fs::write(d.root_path.join("y.service"), b"unit").unwrap();
    fs::write(d.root_path.join("plain"), b"file").unwrap();
    fs::create_dir(d.root_path.join("dir.exe")).unwrap();
    for (intent, path) in [
        ("create_file", "dir.exe"),
        ("replace_file", "dir.exe"),
        ("create_directory", "y.service"),
        ("create_directory", "y.service/sub"),
        ("create_file", "plain/x.exe"),
    ] {
        assert_eq!(
            disk_code(&d, intent, path),
            Some(ReasonCode::BlockedExtension),
            "{intent} {path}"
        );
    }
    assert_eq!(
        disk_code(&d, "create_file", "plain/x.txt"),
        Some(ReasonCode::NotFound)
    );
}

#[test]
fn state_directory_is_reserved() {
    let d = disk();
    let state = d.root_path.join("state");
    let err = on_disk(&d, &req("create_file", "state/artifacts.txt"), &state, 1).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ReservedPath);
    let err = on_disk(&d, &req("create_directory", "state"), &state, 0).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ReservedPath);
    assert!(on_disk(&d, &req("create_file", "stateful.txt"), &state, 1).is_ok());
}

// ---- risk ----------------------------------------------------------------------------------

#[test]
fn scripts_are_at_least_medium_risk() {
    for (intent, path) in [
        ("create_file", "a.py"),
        ("create_file", "run.SH"),
        ("sandbox_transform", "tools/x.py"),
        ("generate_script", "x.sh"),
        ("append_file", "x.sh"),
    ] {
        assert!(
            assess_sandbox_risk(intent, path) >= RiskLevel::Medium,
            "{intent} {path}"
        );
    }
    assert_eq!(
        assess_sandbox_risk("sandbox_transform", "notes.md"),
        RiskLevel::Low
    );
}

#[test]
fn directories_and_data_are_low_risk() {
    assert_eq!(
        assess_sandbox_risk("create_directory", "out/reports"),
        RiskLevel::Low
    );
    assert_eq!(
        assess_sandbox_risk("write_json", "out/data.json"),
        RiskLevel::Low
    );
    assert_eq!(
        assess_sandbox_risk("generate_report", "r.md"),
        RiskLevel::Low
    );
}

#[test]
fn sensitive_paths_are_high_risk() {
    for (intent, path) in [
        ("create_file", ".ssh/authorized_keys"),
        ("append_file", "home/.ssh/authorized_keys"),
        ("replace_file", ".bashrc"),
        ("create_file", ".git/hooks/pre-commit.sh"),
        ("create_directory", ".ssh"),
        ("create_file", ".config/autostart/x.txt"),
    ] {
        assert_eq!(
            assess_sandbox_risk(intent, path),
            RiskLevel::High,
            "{intent} {path}"
        );
    }
}

#[test]
fn unknown_intents_are_high_risk() {
    assert_eq!(assess_sandbox_risk("delete_file", "x.txt"), RiskLevel::High);
    assert_eq!(assess_sandbox_risk("whatever", "x.txt"), RiskLevel::High);
}
