//! Configuration: TOML parsing, precedence flag > env > file > defaults, validation.

use ailab_sandbox_core::config::{
    Config, ConfigError, DEFAULT_ADDR, DEFAULT_MAX_BODY_BYTES, DEFAULT_ROOTS, DEFAULT_STATE_DIR,
    Durability, MAX_WORKFLOW_BYTES, Overrides, RawConfig, env,
};
use std::collections::HashMap;
use std::path::PathBuf;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn resolve(
    file: Option<&str>,
    vars: &[(&str, &str)],
    flags: &Overrides,
) -> Result<Config, ConfigError> {
    let raw = file.map(|t| RawConfig::from_toml(t).unwrap());
    Config::resolve(raw, &env_of(vars), flags)
}

fn paths(v: &[&str]) -> Vec<PathBuf> {
    v.iter().map(PathBuf::from).collect()
}

const FILE: &str = r#"
roots = ["/srv/file-root"]
state_dir = "/srv/file-state"
enable_write = true
dry_run = false
"#;

#[test]
fn defaults_are_secure() {
    let c = Config::resolve(None, &no_env, &Overrides::default()).unwrap();
    assert!(!c.enable_write);
    assert!(c.dry_run);
    assert_eq!(c.addr, "127.0.0.1:8787");
    assert_eq!(DEFAULT_ADDR, "127.0.0.1:8787");
    assert_eq!(c.token, None);
    assert_eq!(c.phase, "28.3");
    assert_eq!(c.durability, Durability::Strict);
    assert_eq!(c.roots, paths(&DEFAULT_ROOTS));
    assert_eq!(c.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
    assert!(!c.roots_explicit && !c.state_dir_explicit);
    assert_eq!(c.limits.max_path_depth, 8);
    assert_eq!(c.limits.max_artifacts_per_workflow, 100);
    assert_eq!(c.limits.max_workflow_bytes, 25 * 1024 * 1024);
    assert_eq!(c.limits.writes_per_minute, 10);
}

#[test]
fn default_config_value_matches_resolved_defaults() {
    let d = Config::default();
    assert!(!d.enable_write && d.dry_run);
    assert_eq!(d.addr, DEFAULT_ADDR);
    assert!(d.validate().is_ok());
}

#[test]
fn unknown_top_level_key_is_an_error_naming_it() {
    let err = RawConfig::from_toml("rootz = [\"/srv/x\"]\n").unwrap_err();
    assert!(err.0.contains("rootz"), "{err}");
}

#[test]
fn unknown_key_inside_limits_is_an_error_naming_it() {
    let err = RawConfig::from_toml("[limits]\nmax_depth = 3\n").unwrap_err();
    assert!(err.0.contains("max_depth"), "{err}");
}

#[test]
fn unknown_key_inside_server_and_extensions_is_an_error() {
    let err = RawConfig::from_toml("[server]\nport = 1\n").unwrap_err();
    assert!(err.0.contains("port"), "{err}");
    let err = RawConfig::from_toml("[extensions]\ndenied = [\".x\"]\n").unwrap_err();
    assert!(err.0.contains("denied"), "{err}");
}

/// A key of more dotted parts than the reader goes into is refused in words that say
/// what a config holds, not the reader's bare "recursion limit".
#[test]
fn a_key_of_too_many_parts_is_said_so() {
    for text in [
        format!("[limits]\n{} = 1\n", vec!["a"; 5000].join(".")),
        format!("[{}]\n", vec!["a"; 5000].join(".")),
    ] {
        let err = RawConfig::from_toml(&text).unwrap_err();
        assert!(err.0.contains("too many dotted parts"), "{err}");
    }
}

/// A section written as an array is refused, not read field by field in order; a key
/// inside an inline table is the one blamed; a section or key given twice is named;
/// a key with no value is said to have none.
#[test]
fn section_shapes_and_repeats_are_named() {
    for (text, want) in [
        (
            "limits = [7, 1000, 3, 2, 5]\n",
            "'limits' must be a section: a [limits] line with its keys beneath it",
        ),
        (
            "[[limits]]\nmax_path_depth = 3\n",
            "not [[limits]] (an array of tables)",
        ),
        ("extensions = 5\n", "'extensions' must be a section"),
        (
            "limits = { max_path_depth = \"9\" }\n",
            "(line 1, key 'max_path_depth'): 'max_path_depth' must be a whole number",
        ),
        (
            "[limits]\nmax_path_depth = 3\n[limits]\nwrites_per_minute = 4\n",
            "(line 3): the section [limits] is given twice: put its keys under one [limits]",
        ),
        (
            "[limits]\nmax_path_depth = 3\nmax_path_depth = 4\n",
            "(line 3, key 'max_path_depth'): 'max_path_depth' is given twice",
        ),
        (
            "phase =\n",
            "(line 1, key 'phase'): no value follows the '='",
        ),
        // An `=` inside a string is no key's.
        (
            "[limits]\nmax_path_depth = \"a=b\"\n",
            "(line 2, key 'max_path_depth'): 'max_path_depth' must be a whole number",
        ),
    ] {
        let err = RawConfig::from_toml(text).unwrap_err();
        assert!(err.0.contains(want), "{text:?}: {err}");
    }
    // The server's section may hold the token: its value is never shown.
    let err = RawConfig::from_toml("server = \"s3cret-token\"\n").unwrap_err();
    assert!(
        err.0.contains("'server' must be a section") && !err.0.contains("s3cret"),
        "{err}"
    );
    // Nor is a line inside a multi-line string, or one whose key is written with an
    // escape (which could spell `token`): their text never appears.
    for text in [
        "[server]\ntoken = \"\"\"\nQUJDREVGR0hJSktM=\\x\n\"\"\"\n",
        "[server]\n\"tok\\u0065n\" = QUJDREVGR0hJSktM\n",
        // A `"""` in a comment opens no string.
        "# strings use \"\"\" quotes\n[server]\ntoken = \"\"\"\nQUJDREVGR0hJSktM=\"\"\" x\n",
    ] {
        let err = RawConfig::from_toml(text).unwrap_err();
        assert!(
            !err.0.contains("QUJDREVGR0hJSktM") && err.0.contains("the line is not shown"),
            "{text:?}: {err}"
        );
    }
    // An inline table of the right keys is a section like any other.
    let raw = RawConfig::from_toml("limits = { max_path_depth = 3 }\n").unwrap();
    assert_eq!(raw.limits.unwrap().max_path_depth, Some(3));
}

#[test]
fn wrong_value_type_is_an_error() {
    assert!(RawConfig::from_toml("enable_write = \"yes\"\n").is_err());
    assert!(RawConfig::from_toml("durability = \"lazy\"\n").is_err());
}

/// A wrong type is said in an operator's words: what to write, not the Rust type that
/// holds it (`usize`, `struct RawLimits`, `as i128`, "wanted string or table").
#[test]
fn wrong_value_types_are_said_in_plain_words() {
    for (toml, want) in [
        (
            "limits = 5\n",
            "'limits' must be a section: a [limits] line with its keys beneath it, one per line, or an inline table (limits = { key = value }), not a number (5)",
        ),
        (
            "[limits]\nmax_path_depth = \"8\"\n",
            "'max_path_depth' must be a whole number (no sign), not a string (\"8\")",
        ),
        // A list's entry is named as one, not the list (which said "'allowed' must be
        // a string"); the list itself of the wrong type is named as the list.
        (
            "[extensions]\nallowed = [\".md\", 1]\n",
            "each entry of 'allowed' must be a string, not a number (1)",
        ),
        (
            "[extensions]\nallowed = \".md\"\n",
            "'allowed' must be an array, not a string (\".md\")",
        ),
        (
            "roots = [3]\n",
            "each entry of 'roots' must be a path (a string), not a number (3)",
        ),
        (
            "[limits]\nwrites_per_minute = -1\n",
            "'writes_per_minute' is a number (-1); it must be a whole number (no sign)",
        ),
        (
            "[limits]\nmax_artifacts_per_workflow = 99999999999999999999\n",
            "integer too large",
        ),
        (
            "[limits]\nwrites_per_minute = -99999999999999999999999\n",
            "must be a whole number (no sign)",
        ),
        (
            "[limits]\nmax_path_depth = 99999999999999999999\n",
            "max_path_depth takes 1 to 8",
        ),
        (
            "[server]\nmax_body_bytes = 99999999999999999999\n",
            "max_body_bytes takes 1024 to 268435456",
        ),
        (
            "[limits]\nwrites_per_minute = 4294967296\n",
            "integer too large: `4294967296`, expected a whole number of at most 4294967295",
        ),
        ("durability = 1\n", "\"strict\", \"batched\" or \"relaxed\""),
        (
            "phase = \"28\\q3\"\n",
            "a backslash in a string starts no TOML escape",
        ),
        ("phase = \"\"\"28.3\n", "a multi-line string is not closed"),
        ("phase = \"28.3\n", "a string is not closed"),
        (
            "enable_write = TRUE\n",
            "'TRUE' is not a boolean; write true or false",
        ),
        (
            "dry_run = yes # on\n",
            "'yes' is not a boolean; write true or false",
        ),
        (
            "phase = TRUE # x\n",
            "'TRUE' is a bare word; TOML takes a string in double quotes",
        ),
        (
            "state_dir = falsey\n",
            "'falsey' is a bare word; TOML takes a string in double quotes, a number in digits",
        ),
        (
            "dry_run = no\n",
            "'no' is not a boolean; write true or false",
        ),
        (
            "[limits]\nwrites_per_minute = ten\n",
            "'ten' is a bare word; TOML takes a string in double quotes, a number in digits",
        ),
        // No single word to quote: said to be there.
        (
            "[extensions]\nallowed = [\n  md,\n]\n",
            "a bare word on this line; TOML takes a string in double quotes",
        ),
        (
            "[extensions]\nallowed = [\"c#\", md]\n",
            "(line 2, key 'allowed'): a bare word on this line; TOML takes",
        ),
        (
            "limits = { writes_per_minute = ten }\n",
            "a bare word on this line; TOML takes",
        ),
        ("phase = 28.3.1\n", "invalid float"),
    ] {
        let err = RawConfig::from_toml(toml).unwrap_err().0;
        assert!(err.contains(want), "{toml:?}: {err}");
        for rust in ["usize", "u32", "u64", "struct", "i128", "wanted"] {
            assert!(!err.contains(rust), "{toml:?}: {err}");
        }
    }
}

/// A line holding the token is never quoted, but what is wrong with it is said: that it
/// must be a string, that it is given twice, that its string is not closed.
#[test]
fn a_bad_token_line_says_what_is_wrong_without_the_token() {
    for (toml, want) in [
        (
            "[server]\ntoken = 123456789012345678\n",
            "the token must be a string",
        ),
        (
            "[server]\ntoken = \"s3cret-s3cret-s3cret\"\ntoken = \"s3cret-s3cret-s3cret\"\n",
            "given twice",
        ),
        ("[server]\ntoken = \"s3cret-s3cret-s3cret\n", "not closed"),
        ("[server]\ntoken = s3cret-s3cret-s3cret\n", "double quotes"),
        (
            "[server]\ntoken = \"s3cret-s3cret-s3cret\\q\"\n",
            "a backslash in the token's string starts no escape",
        ),
        (
            "[server]\ntoken = \"\"\"s3cret-s3cret-s3cret\n",
            "not closed",
        ),
    ] {
        let err = RawConfig::from_toml(toml).unwrap_err().0;
        assert!(err.contains(want), "{toml:?}: {err}");
        assert!(
            !err.contains("s3cret") && !err.contains("123456789012345678"),
            "{toml:?}: {err}"
        );
    }
}

#[test]
fn full_spec_example_file_parses() {
    let text = r#"
roots = ["/srv/a", "/srv/b"]
state_dir = "/srv/state"
phase = "28.5"
enable_write = false
dry_run = true
durability = "relaxed"
[limits]
max_artifacts_per_workflow = 50
max_workflow_bytes = 1000
writes_per_minute = 3
max_path_depth = 4
[extensions]
allowed = [".txt", ".md"]
blocked = [".service", ".bak"]
[server]
addr = "127.0.0.1:9000"
token = "0123456789abcdef0123"
"#;
    let c = resolve(Some(text), &[], &Overrides::default()).unwrap();
    assert_eq!(c.roots, paths(&["/srv/a", "/srv/b"]));
    assert_eq!(c.phase, "28.5");
    assert_eq!(c.durability, Durability::Relaxed);
    assert_eq!(c.limits.max_path_depth, 4);
    assert_eq!(c.limits.writes_per_minute, 3);
    assert_eq!(c.extensions.allowed(), [".txt", ".md"]);
    assert!(c.extensions.is_extension_blocked(".bak"));
    assert!(c.extensions.is_extension_blocked(".so"));
    assert_eq!(c.addr, "127.0.0.1:9000");
    assert_eq!(c.token.as_deref(), Some("0123456789abcdef0123"));
}

#[test]
fn file_overrides_defaults() {
    let c = resolve(Some(FILE), &[], &Overrides::default()).unwrap();
    assert_eq!(c.roots, paths(&["/srv/file-root"]));
    assert_eq!(c.state_dir, PathBuf::from("/srv/file-state"));
    assert!(c.enable_write);
    assert!(!c.dry_run);
    assert!(c.roots_explicit && c.state_dir_explicit);
}

#[test]
fn env_overrides_file() {
    let vars = [
        (env::ROOTS, "/srv/env-a:/srv/env-b"),
        (env::STATE_DIR, "/srv/env-state"),
        (env::ENABLE_WRITE, "false"),
        (env::DRY_RUN, "true"),
    ];
    let c = resolve(Some(FILE), &vars, &Overrides::default()).unwrap();
    assert_eq!(c.roots, paths(&["/srv/env-a", "/srv/env-b"]));
    assert_eq!(c.state_dir, PathBuf::from("/srv/env-state"));
    assert!(!c.enable_write);
    assert!(c.dry_run);
}

#[test]
fn env_turns_writing_on_over_defaults() {
    let vars = [(env::ENABLE_WRITE, "1"), (env::DRY_RUN, "off")];
    let c = resolve(None, &vars, &Overrides::default()).unwrap();
    assert!(c.enable_write);
    assert!(!c.dry_run);
}

#[test]
fn flags_override_env_and_file() {
    let vars = [
        (env::ROOTS, "/srv/env-a"),
        (env::STATE_DIR, "/srv/env-state"),
        (env::ENABLE_WRITE, "false"),
        (env::DRY_RUN, "true"),
    ];
    let flags = Overrides {
        roots: paths(&["/srv/flag-root"]),
        state_dir: Some(PathBuf::from("/srv/flag-state")),
        enable_write: true,
        no_dry_run: true,
        addr: Some("127.0.0.1:9999".to_owned()),
        ..Overrides::default()
    };
    let c = resolve(Some(FILE), &vars, &flags).unwrap();
    assert_eq!(c.roots, paths(&["/srv/flag-root"]));
    assert_eq!(c.state_dir, PathBuf::from("/srv/flag-state"));
    assert!(c.enable_write);
    assert!(!c.dry_run);
    assert_eq!(c.addr, "127.0.0.1:9999");
}

#[test]
fn absent_flags_do_not_override() {
    let vars = [(env::ENABLE_WRITE, "no"), (env::DRY_RUN, "yes")];
    let c = resolve(Some(FILE), &vars, &Overrides::default()).unwrap();
    assert!(!c.enable_write);
    assert!(c.dry_run);
}

#[test]
fn bad_boolean_env_value_names_the_variable() {
    let err = resolve(None, &[(env::ENABLE_WRITE, "maybe")], &Overrides::default()).unwrap_err();
    assert!(err.0.contains("AI_LAB_ENABLE_SANDBOX_WRITE"), "{err}");
    assert!(err.0.contains("maybe"), "{err}");
    let err = resolve(None, &[(env::DRY_RUN, "")], &Overrides::default()).unwrap_err();
    assert!(err.0.contains("AI_LAB_SANDBOX_DRY_RUN"), "{err}");
}

/// A variable set to nothing is refused by name, not taken as "use the defaults" (an
/// unset shell variable passed on would otherwise point the runtime at other
/// directories); an empty token is kept for `serve` to refuse.
#[test]
fn empty_variables_are_refused_not_defaulted() {
    for var in [env::ROOTS, env::STATE_DIR] {
        let err = resolve(Some(FILE), &[(var, "")], &Overrides::default()).unwrap_err();
        assert!(
            err.0.contains(var) && err.0.contains("empty"),
            "{var}: {err}"
        );
    }
    let c = resolve(None, &[(env::TOKEN, "")], &Overrides::default()).unwrap();
    assert_eq!(c.token.as_deref(), Some(""));
    // Separators alone name no root: said so, not "no sandbox root is configured: give
    // at least one in roots, AI_LAB_SANDBOX_ROOTS or --root" to one who set it.
    for value in [":", ":::"] {
        let err = resolve(Some(FILE), &[(env::ROOTS, value)], &Overrides::default()).unwrap_err();
        assert!(
            err.0.starts_with(&format!(
                "{} is {value:?}: separators and no path",
                env::ROOTS
            )),
            "{value}: {err}"
        );
    }
    // So does an empty entry among paths: a root would be dropped without a word.
    for (value, entry) in [("/srv/a::/srv/b", 2), ("/srv/a:", 2), (":/srv/a", 1)] {
        let err = resolve(None, &[(env::ROOTS, value)], &Overrides::default()).unwrap_err();
        assert!(
            err.0.starts_with(&format!(
                "{} is {value:?}: entry {entry} is empty",
                env::ROOTS
            )),
            "{value}: {err}"
        );
    }
    let c = resolve(
        None,
        &[(env::ROOTS, "/srv/a:/srv/b")],
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.roots, paths(&["/srv/a", "/srv/b"]));
}

#[test]
fn token_from_env_and_flag() {
    let tok_env = "env-token-0123456789";
    let tok_flag = "flag-token-0123456789";
    let c = resolve(None, &[(env::TOKEN, tok_env)], &Overrides::default()).unwrap();
    assert_eq!(c.token.as_deref(), Some(tok_env));
    let flags = Overrides {
        token: Some(tok_flag.to_owned()),
        ..Overrides::default()
    };
    let c = resolve(None, &[(env::TOKEN, tok_env)], &flags).unwrap();
    assert_eq!(c.token.as_deref(), Some(tok_flag));
    // Only `serve` uses the token, and refuses a short one: other commands still run.
    let c = resolve(None, &[(env::TOKEN, "short")], &Overrides::default()).unwrap();
    assert_eq!(c.token.as_deref(), Some("short"));
}

#[test]
fn relative_root_is_refused() {
    let err = resolve(Some("roots = [\"sandbox\"]\n"), &[], &Overrides::default()).unwrap_err();
    assert!(
        err.0.contains("sandbox") && err.0.contains("absolute"),
        "{err}"
    );
    let err = resolve(
        None,
        &[(env::ROOTS, "/srv/ok:rel/dir")],
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(err.0.contains("rel/dir"), "{err}");
    // Each refusal says where the value came from, so that the right one is changed.
    assert!(
        err.0.ends_with(" (root from AI_LAB_SANDBOX_ROOTS)"),
        "{err}"
    );
    let err = resolve(Some("roots = [\"sandbox\"]\n"), &[], &Overrides::default()).unwrap_err();
    assert!(
        err.0.ends_with(" (root from roots in the config file)"),
        "{err}"
    );
    let flags = Overrides {
        roots: paths(&["/srv/a", "/srv/a/b"]),
        ..Overrides::default()
    };
    let err = resolve(None, &[(env::ROOTS, "rel")], &flags).unwrap_err();
    assert!(
        err.0.contains("overlap") && err.0.ends_with(" (root from --root)"),
        "{err}"
    );
    let err = resolve(
        Some("state_dir = \"/x\"\n"),
        &[(env::STATE_DIR, "relative/state")],
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(
        err.0
            .starts_with("state_dir 'relative/state' is not an absolute path")
            && err.0.ends_with(" (state_dir from AI_LAB_STATE_DIR)"),
        "{err}"
    );
    let err = resolve(Some("phase = \"28\"\n"), &[], &Overrides::default()).unwrap_err();
    assert!(
        err.0.ends_with(" (phase from phase in the config file)"),
        "{err}"
    );
    // An empty one is shown as empty, quoted (it read "root  is not ..."), with an example.
    let err = resolve(Some("roots = [\"\"]\n"), &[], &Overrides::default()).unwrap_err();
    assert!(
        err.0.starts_with("root '' is not an absolute path"),
        "{err}"
    );
    assert!(err.0.contains("such as /srv/sandbox"), "{err}");
}

/// A root whose path would make every path given into it refused (a bidirectional
/// formatting character, an invisible one) is refused at start, naming the character.
#[test]
fn a_root_that_reads_otherwise_is_refused() {
    for root in [
        "/srv/r\u{202E}oot",
        "/srv/a\u{2067}b",
        "/srv/sand\u{200B}box",
        "/srv/a\u{2028}b",
    ] {
        let err = resolve(None, &[(env::ROOTS, root)], &Overrides::default()).unwrap_err();
        assert!(
            err.0.starts_with("root: the path") && err.0.contains("U+2"),
            "{err}"
        );
        assert!(
            !err.0
                .chars()
                .any(ailab_sandbox_core::confine::path::shows_otherwise),
            "{err}"
        );
    }
}

#[test]
fn dotdot_root_and_empty_roots_are_refused() {
    let err = resolve(
        None,
        &[(env::ROOTS, "/srv/a/../etc")],
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(err.0.contains(".."), "{err}");
    assert!(resolve(Some("roots = []\n"), &[], &Overrides::default()).is_err());
}

#[test]
fn state_dir_inside_a_root_is_refused() {
    let flags = Overrides {
        roots: paths(&["/srv/a", "/srv/b"]),
        state_dir: Some(PathBuf::from("/srv/b/state")),
        ..Overrides::default()
    };
    let err = resolve(None, &[], &flags).unwrap_err();
    assert!(
        err.0.contains("/srv/b/state") && err.0.contains("/srv/b"),
        "{err}"
    );
    let flags = Overrides {
        state_dir: Some(PathBuf::from("/srv/a")),
        ..flags
    };
    assert!(resolve(None, &[], &flags).is_err());
}

#[test]
fn state_dir_with_dotdot_into_a_root_is_refused() {
    let flags = Overrides {
        roots: paths(&["/srv/root"]),
        state_dir: Some(PathBuf::from("/srv/other/../root/state")),
        ..Overrides::default()
    };
    assert!(resolve(None, &[], &flags).is_err());
}

#[test]
fn state_dir_next_to_a_root_with_shared_prefix_is_fine() {
    let flags = Overrides {
        roots: paths(&["/srv/root"]),
        state_dir: Some(PathBuf::from("/srv/root_state")),
        ..Overrides::default()
    };
    let c = resolve(None, &[], &flags).unwrap();
    assert_eq!(c.state_dir, PathBuf::from("/srv/root_state"));
}

#[test]
fn relative_state_dir_is_refused() {
    let err = resolve(None, &[(env::STATE_DIR, "state")], &Overrides::default()).unwrap_err();
    assert!(err.0.contains("state_dir"), "{err}");
}

#[test]
fn max_path_depth_above_eight_or_zero_is_refused() {
    let err = resolve(
        Some("[limits]\nmax_path_depth = 9\n"),
        &[],
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(
        err.0.contains("max_path_depth") && err.0.contains('9'),
        "{err}"
    );
    assert!(
        resolve(
            Some("[limits]\nmax_path_depth = 0\n"),
            &[],
            &Overrides::default()
        )
        .is_err()
    );
    let c = resolve(
        Some("[limits]\nmax_path_depth = 8\n"),
        &[],
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.limits.max_path_depth, 8);
}

#[test]
fn lock_wait_is_read_and_bounded() {
    assert_eq!(
        resolve(None, &[], &Overrides::default())
            .unwrap()
            .limits
            .lock_wait_seconds,
        30
    );
    let c = resolve(
        Some("[limits]\nlock_wait_seconds = 5\n"),
        &[],
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.limits.lock_wait_seconds, 5);
    for bad in ["0", "3601"] {
        let err = resolve(
            Some(&format!("[limits]\nlock_wait_seconds = {bad}\n")),
            &[],
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            err.0.contains("lock_wait_seconds")
                && err.0.contains(bad)
                && err.0.contains("1 to 3600"),
            "{err}"
        );
    }
}

#[test]
fn zero_limits_are_refused() {
    for text in [
        "[limits]\nwrites_per_minute = 0\n",
        "[limits]\nmax_artifacts_per_workflow = 0\n",
        "[limits]\nmax_workflow_bytes = 0\n",
    ] {
        assert!(
            resolve(Some(text), &[], &Overrides::default()).is_err(),
            "{text}"
        );
    }
}

#[test]
fn malformed_phase_is_refused() {
    for phase in [
        "latest", "28", "28.3.1", "28.x", "", "28.03", "0028.3", "12345.1",
    ] {
        let flags = Overrides {
            phase: Some(phase.to_owned()),
            ..Overrides::default()
        };
        assert!(resolve(None, &[], &flags).is_err(), "{phase:?}");
    }
    let flags = Overrides {
        phase: Some("28.2".to_owned()),
        ..Overrides::default()
    };
    assert_eq!(resolve(None, &[], &flags).unwrap().phase, "28.2");
    for phase in ["0.5", "28.10", "1000.0"] {
        let flags = Overrides {
            phase: Some(phase.to_owned()),
            ..Overrides::default()
        };
        assert_eq!(resolve(None, &[], &flags).unwrap().phase, phase);
    }
}

#[test]
fn fallback_state_dir_uses_xdg_then_home() {
    let x = env_of(&[("XDG_STATE_HOME", "/home/u/.st"), ("HOME", "/home/u")]);
    assert_eq!(
        Config::fallback_state_dir(&x),
        Some(PathBuf::from("/home/u/.st/ailab-sandbox"))
    );
    let h = env_of(&[("XDG_STATE_HOME", "relative"), ("HOME", "/home/u")]);
    assert_eq!(
        Config::fallback_state_dir(&h),
        Some(PathBuf::from("/home/u/.local/state/ailab-sandbox"))
    );
    assert_eq!(Config::fallback_state_dir(&no_env), None);
}

#[test]
fn nested_or_duplicate_roots_are_refused() {
    for roots in [
        ["/srv/a", "/srv/a/b"],
        ["/srv/a/b", "/srv/a"],
        ["/srv/a", "/srv/a/"],
    ] {
        let flags = Overrides {
            roots: paths(&roots),
            ..Overrides::default()
        };
        let err = resolve(None, &[], &flags).unwrap_err();
        // One directory given twice is said so, not as an overlap.
        let want = if roots[1].trim_end_matches('/') == roots[0] {
            "is given twice"
        } else {
            "overlap"
        };
        assert!(err.0.contains(want), "{roots:?}: {err}");
    }
    // A root that is the state directory is said so too ("lies inside" it was).
    let flags = Overrides {
        roots: paths(&["/srv/a"]),
        state_dir: Some(PathBuf::from("/srv/a/")),
        ..Overrides::default()
    };
    let err = resolve(None, &[], &flags).unwrap_err();
    assert!(err.0.contains("is also the state_dir"), "{err}");
    let flags = Overrides {
        roots: paths(&["/srv/a", "/srv/ab"]),
        ..Overrides::default()
    };
    assert_eq!(resolve(None, &[], &flags).unwrap().roots.len(), 2);
}

#[test]
fn max_body_bytes_flag_beats_file_and_is_range_checked() {
    let text = "[server]\nmax_body_bytes = 2048\n";
    assert_eq!(
        resolve(Some(text), &[], &Overrides::default())
            .unwrap()
            .max_body_bytes,
        2048
    );
    let flags = Overrides {
        max_body_bytes: Some(8192),
        ..Overrides::default()
    };
    assert_eq!(
        resolve(Some(text), &[], &flags).unwrap().max_body_bytes,
        8192
    );
    assert_eq!(
        resolve(None, &[], &Overrides::default())
            .unwrap()
            .max_body_bytes,
        DEFAULT_MAX_BODY_BYTES
    );
    let err = resolve(
        Some("[server]\nmax_body_bytes = 10\n"),
        &[],
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(err.0.contains("max_body_bytes = 10"), "{}", err.0);
    assert!(err.0.contains("--max-body-bytes"), "{}", err.0);
}

/// A zero budget is refused naming the key that holds it, and only that one.
#[test]
fn a_zero_budget_names_its_key() {
    for key in ["max_artifacts_per_workflow", "max_workflow_bytes"] {
        let err = resolve(
            Some(&format!("[limits]\n{key} = 0\n")),
            &[],
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            err.0.starts_with(&format!("limits.{key} = 0 ")),
            "{}",
            err.0
        );
        let other = if key == "max_workflow_bytes" {
            "max_artifacts_per_workflow"
        } else {
            "max_workflow_bytes"
        };
        assert!(!err.0.contains(other), "{}", err.0);
    }
}

#[test]
fn default_body_limit_carries_every_plan_the_catalog_allows() {
    // JSON escaping makes a text byte at most two bytes on the wire (quote, backslash,
    // newline) and a control character six; the rest of an action (path, ids) is small.
    const ACTION_FIELDS: u64 = 64 * 1024;
    let limit = DEFAULT_MAX_BODY_BYTES as u64;
    let budget = ailab_sandbox_core::config::MAX_ARTIFACTS_PER_WORKFLOW * ACTION_FIELDS;
    assert!(limit >= 2 * MAX_WORKFLOW_BYTES + budget, "{limit}");
    for op in ailab_sandbox_core::catalog::OPERATIONS.iter() {
        let max = op.max_size_bytes.unwrap_or(0);
        assert!(limit >= 6 * max + ACTION_FIELDS, "{}: {max}", op.name);
    }
    assert_eq!(Config::default().max_body_bytes, DEFAULT_MAX_BODY_BYTES);
}

#[test]
fn a_wrongly_typed_value_is_named_by_line_and_key_but_a_token_is_not_echoed() {
    let err = RawConfig::from_toml("enable_write = true\ndry_run = \"false\"\n").unwrap_err();
    assert!(
        err.0.contains("line 2")
            && err.0.contains("key 'dry_run'")
            && err
                .0
                .contains("'dry_run' must be true or false, not a string"),
        "{err}"
    );
    for toml in [
        "[server]\ntoken = 1234567890123456789\n",
        "server.token = 1234567890123456789\n",
        "server = { token = 1234567890123456789 }\n",
    ] {
        let err = RawConfig::from_toml(toml).unwrap_err();
        assert!(err.0.contains("(line "), "{err}");
        assert!(
            !err.0.contains("1234567890"),
            "the value is not echoed: {err}"
        );
    }
}

#[test]
fn extension_entries_that_could_never_match_are_refused() {
    for (toml, named) in [
        ("[extensions]\nblocked = [\".tar.gz\"]\n", ".tar.gz"),
        ("[extensions]\nallowed = [\"*\"]\n", "*"),
        ("[extensions]\nallowed = [\"\"]\n", "''"),
        ("[extensions]\nallowed = [\" .txt\"]\n", " .txt"),
        ("[extensions]\nallowed = []\n", "empty"),
    ] {
        let raw = RawConfig::from_toml(&format!("roots = [\"/srv/r\"]\n{toml}")).unwrap();
        let err = Config::resolve(Some(raw), &no_env, &Overrides::default()).unwrap_err();
        assert!(err.0.contains(named), "{toml}: {err}");
    }
    let raw = RawConfig::from_toml(
        "roots = [\"/srv/r\"]\n[extensions]\nallowed = [\"md\", \".TXT\", \".c++\"]\nblocked = [\".gz\"]\n",
    )
    .unwrap();
    assert!(Config::resolve(Some(raw), &no_env, &Overrides::default()).is_ok());
}

#[test]
fn a_root_inside_the_state_directory_is_refused() {
    let flags = Overrides {
        roots: paths(&["/srv/state/inflight"]),
        state_dir: Some(PathBuf::from("/srv/state")),
        ..Overrides::default()
    };
    let err = resolve(None, &[], &flags).unwrap_err();
    assert!(err.0.contains("inside the state_dir"), "{err}");
}

/// Extension lists set in code are checked as a config file's are: an entry that can
/// never match (`*.md`, `.tar.gz`) or an empty allow-list is refused, naming it.
#[test]
fn extension_lists_set_in_code_are_validated() {
    use ailab_sandbox_core::confine::ExtensionPolicy;
    for (allowed, blocked, want) in [
        (None, vec!["*.md".to_owned()], "*.md'"),
        (None, vec![".tar.gz".to_owned()], "'.tar.gz'"),
        (Some(vec![]), vec![], "extensions.allowed is empty"),
        (
            Some(vec![".service".to_owned(), "SO".to_owned()]),
            vec![],
            "every entry of extensions.allowed (.service .so) is on the block-list",
        ),
        (
            Some(vec![".md".to_owned()]),
            vec!["md".to_owned()],
            "every entry of extensions.allowed (.md) is on the block-list",
        ),
    ] {
        let mut c = Config::with_roots(vec!["/srv/r".into()], "/srv/s".into());
        c.extensions = ExtensionPolicy::new(allowed.as_deref(), &blocked);
        let err = c.validate().unwrap_err().0;
        assert!(err.contains(want), "{want}: {err}");
    }
    let mut c = Config::with_roots(vec!["/srv/r".into()], "/srv/s".into());
    c.extensions = ExtensionPolicy::new(None, &[".md".to_owned()]);
    assert!(c.validate().is_ok());
    // One entry left unblocked is enough.
    let allowed = [".md".to_owned(), ".service".to_owned()];
    c.extensions = ExtensionPolicy::new(Some(&allowed), &[]);
    assert!(c.validate().is_ok());
}

/// A variable a flag overrides is not read: its value, however wrong, stops nothing, as
/// `AI_LAB_SANDBOX_CONFIG` under `--config`. Without the flag it is judged and named.
#[test]
fn a_variable_a_flag_overrides_is_not_judged() {
    let vars = [
        (env::ROOTS, ""),
        (env::STATE_DIR, ""),
        (env::ENABLE_WRITE, "maybe"),
        (env::DRY_RUN, "perhaps"),
        (env::TOKEN, "short"),
    ];
    let flags = Overrides {
        roots: paths(&["/srv/flag-root"]),
        state_dir: Some(PathBuf::from("/srv/flag-state")),
        enable_write: true,
        no_dry_run: true,
        token: Some("flag-token-0123456789abcdef".to_owned()),
        ..Overrides::default()
    };
    let c = resolve(None, &vars, &flags).unwrap();
    assert_eq!(c.roots, paths(&["/srv/flag-root"]));
    assert_eq!(c.state_dir, PathBuf::from("/srv/flag-state"));
    assert!(c.enable_write && !c.dry_run);
    assert_eq!(c.token.as_deref(), Some("flag-token-0123456789abcdef"));
    for (name, _) in vars.iter().take(4) {
        let one = vars
            .iter()
            .filter(|(n, _)| n == name)
            .copied()
            .collect::<Vec<_>>();
        let err = resolve(None, &one, &Overrides::default()).unwrap_err().0;
        assert!(err.contains(name), "{name}: {err}");
    }
}

/// The token never shows in a configuration's `Debug`, read from a file or resolved.
#[test]
fn debug_output_never_shows_the_token() {
    let hidden = |shown: String| {
        assert!(!shown.contains("-token-0123456789"), "{shown}");
        assert!(shown.contains("token: Some(<redacted>)"), "{shown}");
    };
    let raw = RawConfig::from_toml("[server]\ntoken = \"file-token-0123456789\"\n").unwrap();
    hidden(format!("{:?}", raw.server));
    hidden(format!(
        "{:?}",
        Config {
            token: Some("set-token-0123456789".to_owned()),
            ..Config::default()
        }
    ));
    hidden(format!(
        "{:?}",
        Overrides {
            token: Some("flag-token-0123456789".to_owned()),
            ..Overrides::default()
        }
    ));
}

/// The config file can turn writing on, so it is read only when no other user could have
/// changed it: not writable by others, in folders others cannot swap it in, reached only
/// through links of root's or this user's; a larger file than asked is not read whole.
#[test]
fn a_config_file_another_user_could_change_is_refused() {
    use ailab_sandbox_core::confine::read_operator_file;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap()
    };
    let read = |p: &std::path::Path| read_operator_file(p, "config file", 64);
    let good = dir.path().join("good.toml");
    fs::write(&good, "enable_write = true\n").unwrap();
    mode(&good, 0o644);
    assert_eq!(read(&good).unwrap().unwrap(), b"enable_write = true\n");
    let link = dir.path().join("link.toml");
    symlink(&good, &link).unwrap();
    assert_eq!(read(&link).unwrap().unwrap(), b"enable_write = true\n");
    assert_eq!(read_operator_file(&good, "config file", 4).unwrap(), None);
    // A trailing `/` names a directory, as the system takes it (the file was read).
    let slashed = std::path::PathBuf::from(format!("{}/", good.display()));
    let err = read(&slashed).unwrap_err();
    assert!(err.ends_with("/ names a directory, not a file"), "{err}");

    let open = dir.path().join("open.toml");
    fs::write(&open, "enable_write = true\n").unwrap();
    mode(&open, 0o666);
    let err = read(&open).unwrap_err();
    assert!(
        err.starts_with(&format!("config file {} is refused: ", open.display()))
            && err.contains("writable by other users"),
        "{err}"
    );
    // Through a link the refusal is the same, naming the path given and the file.
    let to_open = dir.path().join("to_open.toml");
    symlink(&open, &to_open).unwrap();
    let err = read(&to_open).unwrap_err();
    assert!(
        err.contains("writable by other users")
            && err.contains(&format!("{} (at {})", to_open.display(), open.display())),
        "{err}"
    );

    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    mode(&shared, 0o777);
    let inside = shared.join("c.toml");
    fs::write(&inside, "dry_run = false\n").unwrap();
    mode(&inside, 0o644);
    let err = read(&inside).unwrap_err();
    assert!(err.contains("has no sticky bit"), "{err}");
    // A sticky folder keeps others from swapping a file of this user's.
    mode(&shared, 0o1777);
    assert_eq!(read(&inside).unwrap().unwrap(), b"dry_run = false\n");

    // A pipe of this process's (`--config <(…)` gives `/dev/fd/N`) is read as it flows
    // when it is this user's alone; one reached by a name in a folder is no regular file.
    let (reader, mut writer) = std::io::pipe().unwrap();
    std::io::Write::write_all(&mut writer, b"dry_run = false\n").unwrap();
    drop(writer);
    let own = std::path::PathBuf::from(format!(
        "/dev/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&reader)
    ));
    assert_eq!(read(&own).unwrap().unwrap(), b"dry_run = false\n");
    drop(reader);
    let fifo = dir.path().join("fifo.toml");
    rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, 0o600.into()).unwrap();
    let err = read(&fifo).unwrap_err();
    assert!(err.contains("is not a regular file"), "{err}");
    let err = read(std::path::Path::new("/dev/null")).unwrap_err();
    assert!(err.contains("not a regular file"), "{err}");
    let looped = dir.path().join("loop.toml");
    symlink(&looped, &looped).unwrap();
    assert!(read(&looped).unwrap_err().contains("(a loop)"));

    // An access control list giving another user write is as a mode giving it; one
    // that names only this process's user is not.
    let acl = |file: &std::path::Path, uid: u32| crate::support::acl_giving_write(file, uid, false);
    let listed = dir.path().join("listed.toml");
    fs::write(&listed, "enable_write = true\n").unwrap();
    mode(&listed, 0o644);
    let me = rustix::process::geteuid().as_raw();
    let other = if me == 65534 { 65533 } else { 65534 };
    if acl(&listed, other).is_ok() {
        let err = read(&listed).unwrap_err();
        assert!(err.contains("through its access control list"), "{err}");
        acl(&listed, me).unwrap();
        assert_eq!(read(&listed).unwrap().unwrap(), b"enable_write = true\n");
        // A folder on the way is judged by its list too.
        let listed_dir = dir.path().join("listed_dir");
        fs::create_dir(&listed_dir).unwrap();
        mode(&listed_dir, 0o755);
        let inside = listed_dir.join("c.toml");
        fs::write(&inside, "enable_write = true\n").unwrap();
        mode(&inside, 0o644);
        acl(&listed_dir, other).unwrap();
        let err = read(&inside).unwrap_err();
        assert!(err.contains("writable by other users"), "{err}");
    } else {
        eprintln!("no access control lists on this filesystem: that part skipped");
    }

    // Another user's file, where this process may give one away.
    if rustix::process::geteuid().is_root() {
        let theirs = dir.path().join("theirs.toml");
        fs::write(&theirs, "enable_write = true\n").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        let err = read(&theirs).unwrap_err();
        assert!(err.contains("owned by uid 65534"), "{err}");
    }
}
