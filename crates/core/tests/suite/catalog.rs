//! The operation catalog of SPEC §3.

use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::catalog::{
    FORBIDDEN_INTENTS, MutationClass, OPERATIONS, Operation, RiskLevel, is_allowed_operation,
    is_sandbox_write_intent, op_for_intent,
};
use ailab_sandbox_core::confine::{ExtensionPolicy, normalize_extension};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// SPEC §3, row by row: intent, class, extensions (empty = all allowed), max size, risk,
/// always governed.
type Row = (
    &'static str,
    MutationClass,
    &'static [&'static str],
    Option<u64>,
    RiskLevel,
    bool,
);

const SPEC_TABLE: [Row; 11] = [
    (
        "create_file",
        MutationClass::Create,
        &[],
        Some(MIB),
        RiskLevel::Medium,
        false,
    ),
    (
        "append_file",
        MutationClass::Append,
        &[],
        Some(MIB),
        RiskLevel::Medium,
        false,
    ),
    (
        "replace_file",
        MutationClass::Replace,
        &[],
        Some(MIB),
        RiskLevel::Medium,
        false,
    ),
    (
        "create_directory",
        MutationClass::Create,
        &[],
        None,
        RiskLevel::Low,
        false,
    ),
    (
        "write_json",
        MutationClass::Generate,
        &[".json"],
        Some(2 * MIB),
        RiskLevel::Low,
        false,
    ),
    (
        "write_yaml",
        MutationClass::Generate,
        &[".yaml", ".yml"],
        Some(MIB),
        RiskLevel::Low,
        false,
    ),
    (
        "write_markdown",
        MutationClass::Generate,
        &[".md"],
        Some(2 * MIB),
        RiskLevel::Low,
        false,
    ),
    (
        "generate_report",
        MutationClass::Generate,
        &[".md"],
        Some(5 * MIB),
        RiskLevel::Low,
        false,
    ),
    (
        "generate_config",
        MutationClass::Generate,
        &[".json", ".yaml", ".yml", ".toml", ".ini"],
        Some(512 * KIB),
        RiskLevel::Low,
        false,
    ),
    (
        "generate_script",
        MutationClass::Generate,
        &[".py", ".sh"],
        Some(MIB),
        RiskLevel::Medium,
        true,
    ),
    (
        "sandbox_transform",
        MutationClass::Transform,
        &[],
        Some(5 * MIB),
        RiskLevel::Low,
        false,
    ),
];

fn op(name: &str) -> &'static Operation {
    op_for_intent(name).unwrap_or_else(|| panic!("{name} is in the catalog"))
}

fn verdict(name: &str, ext: &str, size: u64) -> Option<ReasonCode> {
    is_allowed_operation(op(name), ext, size, &ExtensionPolicy::default())
        .err()
        .map(|r| r.reason_code)
}

/// An extension each file operation accepts.
fn sample_ext(o: &Operation) -> &'static str {
    o.extensions.first().copied().unwrap_or(".txt")
}

#[test]
fn catalog_matches_spec_table_row_by_row() {
    assert_eq!(OPERATIONS.len(), SPEC_TABLE.len());
    for (o, (name, class, exts, max, risk, governed)) in OPERATIONS.iter().zip(SPEC_TABLE) {
        assert_eq!(o.name, name);
        assert_eq!(o.mutation_class, class, "{name}");
        assert_eq!(o.extensions, exts, "{name}");
        assert_eq!(o.max_size_bytes, max, "{name}");
        assert_eq!(o.risk_level, risk, "{name}");
        assert_eq!(o.requires_governance, governed, "{name}");
        assert_eq!(op_for_intent(name), Some(o));
        assert!(is_sandbox_write_intent(name));
    }
}

#[test]
fn mutation_class_and_risk_wire_names() {
    let classes = [
        (MutationClass::Create, "create"),
        (MutationClass::Append, "append"),
        (MutationClass::Replace, "replace"),
        (MutationClass::Transform, "transform"),
        (MutationClass::Generate, "generate"),
        (MutationClass::Rollback, "rollback"),
    ];
    for (c, s) in classes {
        assert_eq!(c.as_str(), s);
        assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{s}\""));
    }
    assert!(
        OPERATIONS
            .iter()
            .all(|o| o.mutation_class != MutationClass::Rollback)
    );
    assert_eq!(RiskLevel::Low.as_str(), "low");
    assert_eq!(RiskLevel::High.as_str(), "high");
    assert!(RiskLevel::Low < RiskLevel::Medium && RiskLevel::Medium < RiskLevel::High);
}

#[test]
fn operation_serializes_with_the_ops_fields() {
    let v = serde_json::to_value(op("write_yaml")).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "name": "write_yaml",
            "mutation_class": "generate",
            "extensions": [".yaml", ".yml"],
            "max_size_bytes": 1_048_576,
            "risk_level": "low",
            "requires_governance": false
        })
    );
}

#[test]
fn forbidden_and_unknown_intents_are_not_operations() {
    assert_eq!(
        FORBIDDEN_INTENTS,
        [
            "delete_file",
            "move_file",
            "run_command",
            "restart_service",
            "install_package",
            "modify_config"
        ]
    );
    for intent in
        FORBIDDEN_INTENTS
            .iter()
            .copied()
            .chain(["read_file", "", "CREATE_FILE", "create_file "])
    {
        assert!(op_for_intent(intent).is_none(), "{intent:?}");
        assert!(!is_sandbox_write_intent(intent), "{intent:?}");
    }
}

#[test]
fn size_at_the_maximum_is_allowed_and_one_byte_more_refused() {
    for o in OPERATIONS.iter().filter(|o| !o.is_directory()) {
        let max = o.max_size_bytes.unwrap();
        let ext = sample_ext(o);
        assert_eq!(verdict(o.name, ext, max), None, "{} at {max}", o.name);
        assert_eq!(verdict(o.name, ext, 0), None, "{} empty", o.name);
        assert_eq!(
            verdict(o.name, ext, max + 1),
            Some(ReasonCode::SizeExceeded),
            "{} at {}",
            o.name,
            max + 1
        );
    }
}

#[test]
fn size_refusal_names_the_limit() {
    let err = is_allowed_operation(
        op("generate_config"),
        ".toml",
        512 * KIB + 1,
        &ExtensionPolicy::default(),
    )
    .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::SizeExceeded);
    assert!(err.reason.contains("524289"), "{}", err.reason);
    assert!(err.reason.contains("512 KiB"), "{}", err.reason);
}

#[test]
fn create_directory_ignores_extension_and_size() {
    assert_eq!(verdict("create_directory", "", u64::MAX), None);
    assert_eq!(verdict("create_directory", ".d", 0), None);
}

#[test]
fn blocked_extensions_are_refused_for_every_file_operation() {
    for name in [
        "X.SERVICE",
        "x.service.",
        "x.service ",
        "lib.so",
        "unit.Socket",
        "a.exe",
    ] {
        let ext = normalize_extension(name);
        for o in OPERATIONS.iter().filter(|o| !o.is_directory()) {
            assert_eq!(
                verdict(o.name, &ext, 1),
                Some(ReasonCode::BlockedExtension),
                "{} on {name:?}",
                o.name
            );
        }
    }
}

/// The extension given as a caller may spell it: case and trailing dots or spaces do not
/// change the verdict (`.SERVICE` is blocked, not merely "not on the allow-list").
#[test]
fn an_extension_is_judged_however_it_is_spelled() {
    for ext in [".SERVICE", ".service.", ".Service ", ".EXE"] {
        assert_eq!(
            verdict("create_file", ext, 1),
            Some(ReasonCode::BlockedExtension),
            "{ext:?}"
        );
    }
    for ext in [".TXT", ".Md.", ".json "] {
        assert_eq!(verdict("create_file", ext, 1), None, "{ext:?}");
    }
    assert_eq!(verdict("write_json", ".JSON", 1), None);
}

#[test]
fn extensions_outside_an_operation_list_are_not_allowed() {
    let cases = [
        ("write_json", ".yaml"),
        ("write_json", ".jsonl"),
        ("write_yaml", ".json"),
        ("write_markdown", ".txt"),
        ("write_markdown", ".markdown"),
        ("generate_report", ".html"),
        ("generate_config", ".md"),
        ("generate_config", ".conf"),
        ("generate_script", ".txt"),
        ("generate_script", ".js"),
    ];
    for (name, ext) in cases {
        assert_eq!(
            verdict(name, ext, 1),
            Some(ReasonCode::ExtensionNotAllowed),
            "{name} {ext}"
        );
    }
}

#[test]
fn every_listed_extension_is_accepted_by_its_operation() {
    for o in OPERATIONS.iter() {
        for ext in o.extensions {
            assert_eq!(verdict(o.name, ext, 1), None, "{} {ext}", o.name);
        }
    }
}

#[test]
fn generic_operations_take_any_allowed_extension_but_not_unknown_ones() {
    for name in [
        "create_file",
        "append_file",
        "replace_file",
        "sandbox_transform",
    ] {
        for ext in [".txt", ".py", ".csv", ".diff"] {
            assert_eq!(verdict(name, ext, 1), None, "{name} {ext}");
        }
        for ext in [".bin", ".png", ""] {
            assert_eq!(
                verdict(name, ext, 1),
                Some(ReasonCode::ExtensionNotAllowed),
                "{name} {ext:?}"
            );
        }
    }
}

#[test]
fn extension_check_comes_before_size_check() {
    assert_eq!(
        verdict("write_json", ".yaml", u64::MAX),
        Some(ReasonCode::ExtensionNotAllowed)
    );
    assert_eq!(
        verdict("create_file", ".service", u64::MAX),
        Some(ReasonCode::BlockedExtension)
    );
}

/// An operation bound to its formats names them when refusing a name without extension
/// or off the allow-list, not the allow-list's extensions it could never write; a blocked
/// extension is still told as blocked.
#[test]
fn a_format_bound_operation_names_its_own_extensions() {
    let policy = ExtensionPolicy::default();
    for (name, ext, names) in [
        (
            "write_json",
            "",
            "write_json writes only .json files; a name without extension",
        ),
        (
            "generate_config",
            "",
            "generate_config writes only .json .yaml .yml .toml .ini files; a name without extension is not one of them (a name that starts with a dot, such as '.json',",
        ),
        (
            "write_yaml",
            ".xyz",
            "write_yaml writes only .yaml .yml files",
        ),
        (
            "generate_script",
            "",
            "(a name that starts with a dot, such as '.py', has no extension either)",
        ),
    ] {
        let err = is_allowed_operation(op(name), ext, 1, &policy).unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::ExtensionNotAllowed,
            "{name} {ext}"
        );
        assert!(err.reason.contains(names), "{name} {ext}: {}", err.reason);
        assert!(!err.reason.contains(".txt"), "{name} {ext}: {}", err.reason);
    }
    let err = is_allowed_operation(op("write_json"), ".service", 1, &policy).unwrap_err();
    assert_eq!(
        err.reason_code,
        ReasonCode::BlockedExtension,
        "{}",
        err.reason
    );
    // An allow-list without .json still stops write_json, naming the allow-list.
    let narrow = ExtensionPolicy::new(Some(&[".txt".to_owned()]), &[]);
    let err = is_allowed_operation(op("write_json"), ".json", 1, &narrow).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ExtensionNotAllowed);
    assert!(err.reason.contains("allowed: .txt"), "{}", err.reason);
}
