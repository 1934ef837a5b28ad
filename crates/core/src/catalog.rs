//! The operation catalog: the 11 sandbox write operations of SPEC §3, defined once.
//!
//! Every face (CLI `ops`, MCP tool list, HTTP) is generated from [`OPERATIONS`], so the
//! lists cannot drift apart.

use crate::confine::ExtensionPolicy;
use crate::reason::{ReasonCode, Refusal, Verdict};
use serde::Serialize;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

wire_enum! {
    /// What kind of change an operation makes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[allow(missing_docs)]
    pub enum MutationClass {
        Create = "create",
        Append = "append",
        Replace = "replace",
        Transform = "transform",
        Generate = "generate",
        /// Used by the audit trail and metrics of rollbacks; no intent maps to it.
        Rollback = "rollback",
    }
}

wire_enum! {
    /// Risk of an action, as assessed by governance.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    #[allow(missing_docs)]
    pub enum RiskLevel {
        Low = "low",
        Medium = "medium",
        High = "high",
    }
}

/// The input an operation takes besides its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// `content`: text written as given.
    Content,
    /// `data`: a structured value serialized by the target's format.
    Data,
    /// `edits`: exact-text replacements.
    Edits,
    /// Nothing: the path is all.
    None,
}

/// What an operation leaves at its target, given what is there. Where operations behave
/// differently they match on it, and exhaustively wherever a default could change what
/// is written or refused (rendering, the checks before a write, the payload taken), so
/// a new operation is given each such behaviour on purpose rather than falling into
/// another's; words (the MCP descriptions and advice) fall back on general ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// `content` as a new file; refused when the path exists.
    Create,
    /// The file's bytes followed by `content`; the file is made when missing.
    Append,
    /// `content` in place of an existing file's bytes; refused when it is missing.
    Replace,
    /// `content`, whether the file exists or not.
    Write,
    /// `data` serialized in a format.
    Serialize(Format),
    /// The file's bytes with `edits` applied; refused when it is missing.
    Edit,
    /// A directory and its missing parents: no bytes.
    Directory,
}

/// The format [`Effect::Serialize`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
    /// Chosen by the target's extension: JSON, YAML, TOML or INI.
    ByExtension,
}

/// One entry of the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Operation {
    /// The intent name, e.g. `create_file`.
    pub name: &'static str,
    /// What kind of change it makes.
    pub mutation_class: MutationClass,
    /// Extensions it may write; empty means every allowed extension (or, for
    /// `create_directory`, none apply).
    pub extensions: &'static [&'static str],
    /// Largest number of bytes it may leave on disk; `None` for directories.
    pub max_size_bytes: Option<u64>,
    /// Baseline risk.
    pub risk_level: RiskLevel,
    /// Whether every use is governed even where others are not.
    pub requires_governance: bool,
    /// What it leaves at its target.
    #[serde(skip)]
    pub effect: Effect,
    /// One line for people and for LLM tool descriptions.
    #[serde(skip)]
    pub summary: &'static str,
}

impl Operation {
    /// Whether the operation creates directories rather than files.
    pub fn is_directory(&self) -> bool {
        self.effect == Effect::Directory
    }

    /// Whether what it leaves depends on the bytes the target holds (an append, an
    /// edit): those must be read, and cannot be judged on a guess.
    pub fn reads_target(&self) -> bool {
        match self.effect {
            Effect::Append | Effect::Edit => true,
            Effect::Create
            | Effect::Replace
            | Effect::Write
            | Effect::Serialize(_)
            | Effect::Directory => false,
        }
    }

    /// The input it takes besides its path.
    pub fn payload(&self) -> Payload {
        match self.effect {
            Effect::Create | Effect::Append | Effect::Replace | Effect::Write => Payload::Content,
            Effect::Serialize(_) => Payload::Data,
            Effect::Edit => Payload::Edits,
            Effect::Directory => Payload::None,
        }
    }
}

/// The largest file any operation writes (`generate_report`, `sandbox_transform`): what
/// reads must accept, so that an agent can read back whatever it wrote.
pub const LARGEST_WRITE_BYTES: u64 = 5 * MIB;

/// The catalog, in the order of SPEC §3.
pub static OPERATIONS: [Operation; 11] = [
    Operation {
        name: "create_file",
        mutation_class: MutationClass::Create,
        extensions: &[],
        max_size_bytes: Some(MIB),
        risk_level: RiskLevel::Medium,
        requires_governance: false,
        effect: Effect::Create,
        summary: "Create a new text file with the given content; fails if the path already exists.",
    },
    Operation {
        name: "append_file",
        mutation_class: MutationClass::Append,
        extensions: &[],
        max_size_bytes: Some(MIB),
        risk_level: RiskLevel::Medium,
        requires_governance: false,
        effect: Effect::Append,
        summary: "Append content to a file, creating it when missing.",
    },
    Operation {
        name: "replace_file",
        mutation_class: MutationClass::Replace,
        extensions: &[],
        max_size_bytes: Some(MIB),
        risk_level: RiskLevel::Medium,
        requires_governance: false,
        effect: Effect::Replace,
        summary: "Replace the whole content of an existing regular file.",
    },
    Operation {
        name: "create_directory",
        mutation_class: MutationClass::Create,
        extensions: &[],
        max_size_bytes: None,
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Directory,
        summary: "Create a directory and any missing parents (mkdir -p); succeeds if it exists.",
    },
    Operation {
        name: "write_json",
        mutation_class: MutationClass::Generate,
        extensions: &[".json"],
        max_size_bytes: Some(2 * MIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Serialize(Format::Json),
        summary: "Serialize a structured value as pretty JSON into a .json file.",
    },
    Operation {
        name: "write_yaml",
        mutation_class: MutationClass::Generate,
        extensions: &[".yaml", ".yml"],
        max_size_bytes: Some(MIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Serialize(Format::Yaml),
        summary: "Serialize a structured value as YAML into a .yaml or .yml file.",
    },
    Operation {
        name: "write_markdown",
        mutation_class: MutationClass::Generate,
        extensions: &[".md"],
        max_size_bytes: Some(2 * MIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Write,
        summary: "Write a Markdown document (.md), creating or replacing it.",
    },
    Operation {
        name: "generate_report",
        mutation_class: MutationClass::Generate,
        extensions: &[".md"],
        max_size_bytes: Some(5 * MIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Write,
        summary: "Write a Markdown report (.md), creating or replacing it.",
    },
    Operation {
        name: "generate_config",
        mutation_class: MutationClass::Generate,
        extensions: &[".json", ".yaml", ".yml", ".toml", ".ini"],
        max_size_bytes: Some(512 * KIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Serialize(Format::ByExtension),
        summary: "Serialize a structured value as a config file chosen by extension (json, yaml, toml, ini).",
    },
    Operation {
        name: "generate_script",
        mutation_class: MutationClass::Generate,
        extensions: &[".py", ".sh"],
        max_size_bytes: Some(MIB),
        risk_level: RiskLevel::Medium,
        requires_governance: true,
        effect: Effect::Write,
        summary: "Write a .py or .sh script as plain text; it is never made executable.",
    },
    Operation {
        name: "sandbox_transform",
        mutation_class: MutationClass::Transform,
        extensions: &[],
        max_size_bytes: Some(5 * MIB),
        risk_level: RiskLevel::Low,
        requires_governance: false,
        effect: Effect::Edit,
        summary: "Apply exact-text edits to an existing file; each `old` must match exactly once; all or nothing.",
    },
];

/// Intents that are never executed, whatever the phase.
pub const FORBIDDEN_INTENTS: [&str; 6] = [
    "delete_file",
    "move_file",
    "run_command",
    "restart_service",
    "install_package",
    "modify_config",
];

/// Read-only intents (classified as `readonly` scope).
pub const READ_INTENTS: [&str; 3] = ["read_file", "list_directory", "get_file_info"];

/// The name a report counts `intent` under: the catalog's writes, the named forbidden
/// intents, the read intents and the rollbacks by name (an operator wants to see
/// `run_command` denials as such), anything else `other`. Intents come from clients, so
/// a report keyed by them would otherwise grow without bound.
pub fn intent_label(intent: &str) -> &str {
    let known = op_for_intent(intent).is_some()
        || FORBIDDEN_INTENTS.contains(&intent)
        || READ_INTENTS.contains(&intent)
        || matches!(intent, "rollback_action" | "rollback_workflow");
    if known { intent } else { "other" }
}

/// Maps an intent to its operation, if it is one of the 11 sandbox writes.
pub fn op_for_intent(intent: &str) -> Option<&'static Operation> {
    OPERATIONS.iter().find(|op| op.name == intent)
}

/// Whether `intent` is one of the 11 sandbox write operations.
pub fn is_sandbox_write_intent(intent: &str) -> bool {
    op_for_intent(intent).is_some()
}

/// Checks an operation against a target extension and the bytes it would leave on disk.
///
/// `ext` is the extension with its dot (`.json`, or empty), judged as
/// [`crate::confine::path::normalize_extension`] gives it: case and trailing dots or
/// spaces are ignored. The extension policy's block-list always wins; then the
/// operation's own list, if it has one; then the allow-list.
pub fn is_allowed_operation(
    op: &Operation,
    ext: &str,
    size: u64,
    extensions: &ExtensionPolicy,
) -> Verdict {
    if !op.is_directory() {
        let trimmed = ext.trim_end_matches(['.', ' ']);
        let normal;
        let ext = if trimmed.len() == ext.len() && !ext.bytes().any(|b| b.is_ascii_uppercase()) {
            ext
        } else {
            normal = trimmed.to_ascii_lowercase();
            normal.as_str()
        };
        // An operation bound to its formats names them: the allow-list would name
        // extensions it cannot write. A blocked extension is told as blocked first.
        if !op.extensions.is_empty()
            && !op.extensions.contains(&ext)
            && !extensions.is_extension_blocked(ext)
        {
            return Err(Refusal::new(
                ReasonCode::ExtensionNotAllowed,
                format!(
                    "{} writes only {} files; {} is not one of them{}",
                    op.name,
                    op.extensions.join(" "),
                    shown_ext(ext),
                    if ext.is_empty() {
                        format!(
                            " (a name that starts with a dot, such as '{}', has no extension either)",
                            op.extensions[0]
                        )
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        extensions.check(ext)?;
    }
    if let Some(max) = op.max_size_bytes
        && size > max
    {
        return Err(Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "{} would leave {size} bytes on disk; its limit is {max} bytes ({})",
                op.name,
                human_bytes(max)
            ),
        ));
    }
    Ok(())
}

/// The extensions `op` may write under `policy`: its own list, or the allow-list when it
/// has none, less what the policy refuses; empty for a directory operation.
pub fn writable_extensions(op: &Operation, policy: &ExtensionPolicy) -> Vec<String> {
    if op.is_directory() {
        return Vec::new();
    }
    let candidates: Vec<String> = if op.extensions.is_empty() {
        policy.allowed().to_vec()
    } else {
        op.extensions.iter().map(|e| (*e).to_owned()).collect()
    };
    candidates
        .into_iter()
        .filter(|e| policy.check(e).is_ok())
        .collect()
}

pub(crate) fn shown_ext(ext: &str) -> String {
    if ext.is_empty() {
        "a name without extension".to_owned()
    } else {
        // Escaped as the path it comes from is: a control or invisible character is
        // shown, not sent raw to a terminal or lost in a sentence.
        crate::confine::path::shown_path(ext)
    }
}

/// `1048576` → `1 MiB`, for sentences.
pub fn human_bytes(n: u64) -> String {
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        crate::sandbox::counted_u64(n, "byte")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_has_eleven_unique_intents() {
        let mut names: Vec<_> = OPERATIONS.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 11);
    }

    #[test]
    fn only_generate_script_is_always_governed() {
        let governed: Vec<_> = OPERATIONS
            .iter()
            .filter(|o| o.requires_governance)
            .map(|o| o.name)
            .collect();
        assert_eq!(governed, ["generate_script"]);
    }

    #[test]
    fn the_largest_write_is_the_largest_operation_limit() {
        let largest = OPERATIONS.iter().filter_map(|o| o.max_size_bytes).max();
        assert_eq!(largest, Some(LARGEST_WRITE_BYTES));
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(MIB), "1 MiB");
        assert_eq!(human_bytes(512 * KIB), "512 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
