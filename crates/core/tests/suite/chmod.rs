//! `detect_chmod_intent`: requests to change permissions are recognised; ordinary text is not.

use ailab_sandbox_core::policy::{CHMOD_PATTERN_COUNT, detect_chmod_intent};

fn flagged(text: &str) -> bool {
    detect_chmod_intent(text).is_some()
}

#[test]
fn at_least_ten_distinct_pattern_families_fire() {
    let samples = [
        "chmod +x a",
        "chmod 755 a",
        "use chmod -R",
        "os.chmod(p, m)",
        "std::fs::set_permissions(p, m)",
        "give it +x",
        "make it executable",
        "set the executable bit",
        "stat.S_IXUSR",
        "mode 0o755",
        "install -m 644 a b",
        "setfacl -m u:x:rwx a",
        "permissions 0755",
        "mode -rwxr-xr-x",
        "executable: true",
        "os.WriteFile(p, data, 0755)",
        "make it setuid root",
    ];
    let mut names: Vec<&str> = samples
        .iter()
        .map(|s| detect_chmod_intent(s).unwrap_or_else(|| panic!("{s:?} not detected")))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    assert_eq!(names.len(), CHMOD_PATTERN_COUNT, "{names:?}");
}

/// The pattern a refusal names is what was asked: a symbolic mode that adds no execute
/// bit is not called "+x".
#[test]
fn a_symbolic_mode_is_named_for_what_it_is() {
    for text in ["chmod o+w f", "chmod g+s dir", "chmod u=rw f", "chmod +x f"] {
        let name = detect_chmod_intent(text).unwrap_or_default();
        assert!(
            name.starts_with("chmod with a symbolic mode") && !name.contains("+x ("),
            "{text}: {name}"
        );
    }
}

#[test]
fn chmod_plus_x_is_detected() {
    assert!(flagged("chmod +x run.sh"));
    assert!(flagged("then CHMOD +X the script"));
}

#[test]
fn chmod_octal_modes_are_detected() {
    for text in [
        "chmod 755 run.sh",
        "chmod 0755 run.sh",
        "chmod 775 dir",
        "chmod 777 everything",
        "chmod -R 755 out",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn chmod_symbolic_modes_are_detected() {
    for text in [
        "chmod u+x run.sh",
        "chmod a+x run.sh",
        "chmod ug+x run.sh",
        "chmod g=rwx x",
        "chmod o+w f",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn plus_x_without_chmod_is_detected() {
    for text in [
        "make it +x",
        "give it +x please",
        "script should be u+x",
        "mark a+x",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn make_executable_phrases_are_detected() {
    for text in [
        "make executable",
        "Make it executable.",
        "please make the script executable",
        "mark as executable",
        "mark it as executable",
        "mark the script as executable",
        "it needs to be executable",
        "make it exec",
        "make runnable",
        "make this file executable please",
        "make it executable—then commit",
        "make run.sh executable/runnable",
        "the script should be executable.",
        "make scripts/deploy/run-all.sh executable",
        "make them all executable",
        "make each executable",
        "deploy.sh must be executable, otherwise cron fails",
        "The script must be executable. Cron runs it hourly.",
        "chmod+x s.sh",
        "run chmod0755 on s.sh",
        "chmod=x s.sh",
        "make_executable",
        "make-executable s.sh",
        "set permissions to 0755",
        "Ensure the script is executable.",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn executable_bit_phrases_are_detected() {
    for text in [
        "set the executable bit",
        "turn on the execute bit",
        "set the exec bit",
        "add execute permission",
        "set the x bit",
        "flip the X bits",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn chmod_calls_in_code_are_detected() {
    for text in [
        "os.chmod(p, 0o755)",
        "fs.chmodSync(path, 0o755)",
        "Path('x').chmod(0o700)",
        "os.fchmod(fd, mode)",
        "std::fs::set_permissions(p, perms)",
        "st.st_mode | stat.S_IXUSR",
        "mode = 0o755",
        "install -m 755 x /usr/bin",
        "chattr +i file",
        // Named without the call's parentheses (SPEC §5 names os.chmod).
        "os.chmod",
        "call os.chmod on it",
        "then Path.chmod it",
        "then os.chmod it to 0755",
        // Keyword arguments written without spaces.
        "os.open(p, flags, mode=0o755)",
        "mkdir(mode=0755)",
        "permissions=0775",
        "set_executable",
        "call set-executable on it",
        "set permissions to rwxr-xr-x",
        "permissions: -rwxr-xr-x",
        "file mode rwxrwxrwx",
        "give it 755 permissions",
        "executable: true",
        "executable=true",
        "is_executable = yes",
        "Change the permissions of a.sh to 777.",
        "set the file mode of a.sh to 755",
        "Set the file permission bits of a.sh to 0755.",
        "Please add the x permission to a.sh for the owner.",
        "Give a.sh execute rights for the owner.",
        "Create a.sh; ensure it's executable for cron.",
        "Write a.sh with os.WriteFile(\"a.sh\", data, 0755) in Go.",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn a_bare_chmod_word_is_detected() {
    assert!(flagged("use chmod afterwards"));
    assert!(flagged("`chmod`"));
}

/// Look-alike letters, full-width forms and invisible code points do not hide a request.
#[test]
fn look_alike_spellings_are_detected() {
    for text in [
        "\u{441}hmod 755 deploy.sh",
        "\u{ff43}\u{ff48}\u{ff4d}\u{ff4f}\u{ff44} \u{ff17}\u{ff15}\u{ff15} deploy.sh",
        "ch\u{200d}mod 755 deploy.sh",
        "ch\u{ad}mod 755 deploy.sh",
        "make it exe\u{200b}cutable",
        "m\u{430}ke it executable",
        // Mathematical bold, circled letters, small capitals, accents, a ligature.
        "\u{1d41c}\u{1d421}\u{1d426}\u{1d428}\u{1d41d} +x deploy.sh",
        "\u{24d2}\u{24d7}\u{24dc}\u{24de}\u{24d3} 755 deploy.sh",
        "\u{1d04}\u{29c}\u{1d0d}\u{1d0f}\u{1d05} 755 deploy.sh",
        "chm\u{f3}d +x deploy.sh",
        "make it exe\u{301}cutable",
        "set the \u{1d41e}\u{1d431}\u{1d41e}\u{1d41c}\u{1d42e}\u{1d42d}\u{1d41a}\u{1d41b}\u{1d425}\u{1d41e} bit",
    ] {
        assert!(flagged(text), "{text:?}");
    }
    assert!(!flagged(
        "\u{441}\u{434}\u{435}\u{43b}\u{430}\u{442}\u{44c} \u{43e}\u{442}\u{447}\u{451}\u{442}"
    ));
}

#[test]
fn detection_names_the_pattern() {
    let name = detect_chmod_intent("chmod 755 x").unwrap();
    assert!(name.contains("chmod"), "{name}");
    let name = detect_chmod_intent("set the executable bit").unwrap();
    assert!(name.contains("executable"), "{name}");
}

#[test]
fn ordinary_text_is_not_detected() {
    for text in [
        "executive summary",
        "add +xml support",
        "x+y=2",
        "write the report",
        "maximum",
        "exec summary of chmodless",
        "the executable name is printed in the log",
        "list the executables this project builds",
        "make a note of the exec summary",
        "set up the executable's search path in the readme",
        "make the executable's output quieter",
        "Quarterly report to be sent to exec staff",
        "Make sure your executable is signed before release",
        "Make notes on each executable we ship",
        "make every executable smaller",
        "Notes for when the job must be exec'd by cron",
        "This file will be executable documentation for the API",
        "Make a list of executable targets in the README",
        "Make sure exec staff get the quarterly report",
        "Summary made by exec committee",
        "Make the build faster. Executable size matters",
        "Every snippet in this README should be runnable.",
        "The tool is executable documentation.",
        "set permissions to 0644 for the config",
        "version 0.755 release notes",
        "mode 644 files only",
        "open(p, mode=0o644)",
        "mode=0644",
        "permissions: -rw-r--r--",
        "644 permissions",
        "executable: false",
        "the executable is true to its name",
        "rwx",
        "os.WriteFile(p, data, 0644)",
        "the 2024 report, 0123 ticket",
        "the backup runs at 0700 hours",
        "sync at 0530, then report",
        "meeting moved to 0745 UTC",
        "shift starts by 0730",
        "the user's setup notes",
        "sets of user ids",
        "suite results",
        "add a reset-user-id endpoint to the API docs",
        "document the asset-group-id parameter of the Google Ads API",
        "store the offset-group-id in the config",
        "pluralize nouns by appending +s",
        "a CSV of suid values from the survey",
        "rename the suid field to session_uid",
        "find all SUID binaries and list them in a report",
        "it's executable documentation, ensure the links work",
        "",
    ] {
        assert_eq!(detect_chmod_intent(text), None, "{text:?}");
    }
}

/// Bits that run a file as its owner or group, and capabilities, are permissions too.
#[test]
fn setuid_setgid_and_capabilities_are_detected() {
    for text in [
        "make the helper setuid root",
        "mark it SUID",
        "make the helper suid",
        "set-uid bit on helper",
        "make helper set-gid root",
        "set uid bit on helper",
        "suid-root helper",
        "sgid on the shared folder",
        "set-uid on ./helper",
        "setuid-root helper",
        "mark helper suid files",
        "set the sgid bit on the folder",
        "setgid directory for the team",
        "setcap cap_net_bind_service=+ep ./server",
        "the set-user-ID bit on the tool",
        "give it u+s",
        "mode with S_ISUID",
    ] {
        assert!(flagged(text), "{text:?}");
    }
}

#[test]
fn words_ending_in_x_before_bit_are_not_detected() {
    for text in [
        "fix bitrate calculation",
        "explain the complex bit manipulation",
        "the index bitmap is rebuilt",
        "latex bibliography and box bits",
    ] {
        assert_eq!(detect_chmod_intent(text), None, "{text:?}");
    }
}
