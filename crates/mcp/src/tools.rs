//! The tool table: every tool's name, description, fields and annotations, defined once.
//!
//! The 11 write tools are generated from the operation catalog
//! ([`ailab_sandbox_core::catalog::OPERATIONS`]), so the MCP tool list cannot drift from
//! the CLI `ops` list or the HTTP face. Each tool's JSON Schema *and* its argument parser
//! are derived from the same [`Field`] list, so what the schema promises is exactly what
//! the parser accepts (`additionalProperties: false` is enforced, not just advertised).

use crate::render::example_file;
use ailab_sandbox_core::Sandbox;
use ailab_sandbox_core::catalog::{
    Effect, Format, MutationClass, OPERATIONS, Operation, Payload, human_bytes, writable_extensions,
};
use ailab_sandbox_core::plan::{Edit, ID_PATTERN};
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use std::sync::Arc;

/// Most artifacts `list_artifacts` returns in one call.
pub(crate) const MAX_LIST_LIMIT: u64 = ailab_sandbox_core::sandbox::MAX_LIST_LIMIT as u64;

/// Most entries `list_directory` returns in one call.
pub(crate) const MAX_DIR_ENTRIES: usize = 500;

/// Default for `list_artifacts`.
pub(crate) const DEFAULT_LIST_LIMIT: u64 = ailab_sandbox_core::sandbox::DEFAULT_LIST_LIMIT as u64;

/// What a tool does when called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// One of the 11 catalog writes.
    Write(&'static Operation),
    ReadFile,
    ListDirectory,
    GetFileInfo,
    RollbackWorkflow,
    RollbackAction,
    ListArtifacts,
    GetArtifact,
    GetState,
}

/// The JSON type a field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string.
    Str,
    /// A string that must be a valid id.
    Id,
    /// A boolean.
    Bool,
    /// A whole number in `min..=max`.
    Uint { min: u64, max: u64 },
    /// Any JSON value.
    Any,
    /// A non-empty list of `{old, new}` edits.
    Edits,
}

/// One argument of a tool.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    pub name: &'static str,
    pub kind: Kind,
    pub required: bool,
    pub description: String,
}

impl Field {
    fn new(name: &'static str, kind: Kind, required: bool, description: impl Into<String>) -> Self {
        Self {
            name,
            kind,
            required,
            description: description.into(),
        }
    }

    fn schema(&self) -> Value {
        let mut s = match self.kind {
            Kind::Str => json!({"type": "string"}),
            Kind::Id => json!({"type": "string", "pattern": ID_PATTERN}),
            Kind::Bool => json!({"type": "boolean"}),
            Kind::Uint { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
            // Every JSON type but null, which the runtime refuses (no file is written
            // for nothing): an empty schema would let a client send it.
            Kind::Any => json!({"type": ["object", "array", "string", "number", "boolean"]}),
            Kind::Edits => json!({
                "type": "array",
                "minItems": 1,
                "maxItems": ailab_sandbox_core::plan::MAX_EDITS_PER_PLAN,
                "items": {
                    "type": "object",
                    "properties": {
                        "old": {"type": "string", "minLength": 1, "description": "Exact text to replace; it must occur exactly once in the file."},
                        "new": {"type": "string", "description": "Replacement text (may be empty to delete `old`)."}
                    },
                    "required": ["old", "new"],
                    "additionalProperties": false
                }
            }),
        };
        if let Value::Object(m) = &mut s {
            m.insert(
                "description".into(),
                Value::String(self.description.clone()),
            );
        }
        s
    }
}

/// One tool: its wire definition and what it does.
#[derive(Debug, Clone)]
pub(crate) struct ToolSpec {
    pub kind: ToolKind,
    pub fields: Vec<Field>,
    pub tool: Tool,
}

impl ToolSpec {
    fn new(
        name: &'static str,
        kind: ToolKind,
        title: String,
        description: String,
        fields: Vec<Field>,
        annotations: ToolAnnotations,
    ) -> Self {
        let mut props = JsonObject::new();
        for f in &fields {
            props.insert(f.name.into(), f.schema());
        }
        let required: Vec<Value> = fields
            .iter()
            .filter(|f| f.required)
            .map(|f| Value::String(f.name.into()))
            .collect();
        let mut schema = JsonObject::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(props));
        if !required.is_empty() {
            schema.insert("required".into(), Value::Array(required));
        }
        schema.insert("additionalProperties".into(), json!(false));
        let tool = Tool::new(name, description, Arc::new(schema))
            .with_title(title)
            .with_annotations(annotations);
        Self { kind, fields, tool }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.tool.name
    }

    /// Checks `args` against the fields: no unknown field, every required field present
    /// and not null, every value of the right type. Null optional fields count as absent.
    pub fn parse(&self, args: JsonObject) -> Result<Args, String> {
        for key in args.keys() {
            if !self.fields.iter().any(|f| f.name == key) {
                return Err(format!(
                    "{} does not take '{key}'; it takes {}",
                    self.name(),
                    self.field_list()
                ));
            }
        }
        for f in &self.fields {
            let v = args.get(f.name).filter(|v| !v.is_null());
            match v {
                None if f.required => {
                    return Err(format!(
                        "{} needs '{}' ({})",
                        self.name(),
                        f.name,
                        kind_name(f.kind)
                    ));
                }
                None => {}
                Some(v) => check_kind(f, v)?,
            }
        }
        Ok(Args { map: args })
    }

    fn field_list(&self) -> String {
        if self.fields.is_empty() {
            return "no arguments".to_owned();
        }
        self.fields
            .iter()
            .map(|f| {
                format!(
                    "'{}'{}",
                    f.name,
                    if f.required { " (required)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Str => "a string",
        Kind::Id => "an id string",
        Kind::Bool => "true or false",
        Kind::Uint { .. } => "a whole number",
        Kind::Any => "any JSON value except null",
        Kind::Edits => "a list of {\"old\": ..., \"new\": ...} objects",
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// [`json_type`]'s words for a value still in its text (`text` starts a JSON value),
/// for the screen, which never builds what it judges.
pub(crate) fn json_type_of_text(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

/// A non-negative whole number, also written with a fraction of zero (`5.0`, an integer
/// to JSON Schema).
fn whole_number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        let f = v.as_f64()?;
        // Below 2^53 every whole double is exact.
        (f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&f)).then_some(f as u64)
    })
}

fn check_kind(f: &Field, v: &Value) -> Result<(), String> {
    let wrong = || {
        format!(
            "'{}' must be {}, not {}",
            f.name,
            kind_name(f.kind),
            json_type(v)
        )
    };
    match f.kind {
        Kind::Str | Kind::Id => v.is_string().then_some(()).ok_or_else(wrong),
        Kind::Bool => v.is_boolean().then_some(()).ok_or_else(wrong),
        Kind::Uint { min, max } => match whole_number(v) {
            Some(n) if (min..=max).contains(&n) => Ok(()),
            Some(n) => Err(format!(
                "'{}' is {n}; it must be between {min} and {max}",
                f.name
            )),
            // `max as f64` rounds up for `u64::MAX` (to 2^64, itself out of range).
            None if v
                .as_f64()
                .is_some_and(|x| x.fract() == 0.0 && x >= max as f64 + 1.0) =>
            {
                Err(format!(
                    "'{}' is {v}; it must be between {min} and {max}",
                    f.name
                ))
            }
            // A whole double past 2^53 may not be the number written (a fraction or an
            // exponent rounded to it): asked for in digits alone.
            None if v.as_f64().is_some_and(|x| x.fract() == 0.0 && x >= 0.0) => Err(format!(
                "'{}' is {v}; a number this large must be written as digits alone, without a fraction or an exponent, so that it is exact (between {min} and {max})",
                f.name
            )),
            None if v.is_number() => Err(format!(
                "'{}' is {v}; it must be a whole number between {min} and {max}",
                f.name
            )),
            None => Err(wrong()),
        },
        Kind::Any => Ok(()),
        Kind::Edits => {
            let Some(list) = v.as_array() else {
                return Err(wrong());
            };
            if list.is_empty() {
                return Err(format!(
                    "'{}' is empty; give at least one {{\"old\", \"new\"}} edit",
                    f.name
                ));
            }
            for (i, e) in list.iter().enumerate() {
                if let Some(problem) = edit_problem(e) {
                    return Err(format!(
                        "'{}' item {} must be an object with exactly the strings 'old' and 'new'; {problem}",
                        f.name,
                        i + 1
                    ));
                }
            }
            Ok(())
        }
    }
}

/// What keeps `e` from being an edit, in words; `None` when it is one.
fn edit_problem(e: &Value) -> Option<String> {
    let Value::Object(m) = e else {
        return Some(format!("it is {}", json_type(e)));
    };
    if let Some(k) = m.keys().find(|k| !matches!(k.as_str(), "old" | "new")) {
        return Some(format!("it also has '{}'", k.escape_debug()));
    }
    ["old", "new"].into_iter().find_map(|k| match m.get(k) {
        None => Some(format!("'{k}' is missing")),
        Some(Value::String(_)) => None,
        Some(v) => Some(format!("'{k}' is {}", json_type(v))),
    })
}

/// Arguments that passed [`ToolSpec::parse`]; the getters cannot meet a wrong type.
#[derive(Debug, Clone, Default)]
pub(crate) struct Args {
    map: JsonObject,
}

impl Args {
    fn present(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<String> {
        self.present(key).and_then(Value::as_str).map(str::to_owned)
    }

    /// A boolean field (absent: false).
    pub fn flag(&self, key: &str) -> bool {
        self.present(key).and_then(Value::as_bool).unwrap_or(false)
    }

    /// A whole-number field.
    pub fn uint(&self, key: &str) -> Option<u64> {
        self.present(key).and_then(whole_number)
    }

    /// Any JSON value, as given, taken out (not copied: it may be large).
    pub fn take_value(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// The edits, taken out.
    pub fn take_edits(&mut self, key: &str) -> Option<Vec<Edit>> {
        self.take_value(key)
            .and_then(|v| serde_json::from_value(v).ok())
    }
}

/// A tool's title: its name's words, the first capitalised, a format's name in capitals
/// ("Write JSON").
fn title_of(name: &str) -> String {
    let words: Vec<String> = name
        .split('_')
        .enumerate()
        .map(|(i, w)| match w {
            "json" | "yaml" => w.to_uppercase(),
            _ if i == 0 => {
                let mut c = w.chars();
                c.next()
                    .map(|first| first.to_uppercase().chain(c).collect())
                    .unwrap_or_default()
            }
            _ => w.to_owned(),
        })
        .collect();
    words.join(" ")
}

/// The extensions `op` may write under the operator's extension policy.
/// The reason codes a call of `op` gets when the policy rules out all its files: its own
/// extensions refused as the policy refuses them, or, with none of its own, every allowed
/// extension blocked.
fn ruled_out_because(op: &Operation, sandbox: &Sandbox) -> String {
    let policy = &sandbox.config().extensions;
    let mut codes: Vec<String> = op
        .extensions
        .iter()
        .filter_map(|e| policy.check(e).err())
        .map(|r| r.reason_code.to_string())
        .collect();
    codes.sort();
    codes.dedup();
    if codes.is_empty() {
        "blocked_extension".to_owned()
    } else {
        codes.join(" or ")
    }
}

/// `depth`: the configured `limits.max_path_depth`; `example`, a path of the kind asked.
fn path_field(what: &str, example: &str, required: bool, depth: usize) -> Field {
    Field::new(
        "path",
        Kind::Str,
        required,
        format!(
            "{what}, relative to the sandbox root (e.g. \"{example}\"). Absolute paths are accepted only inside a root. No '..', no '~', at most {depth} components; '.rollback/' is reserved."
        ),
    )
}

fn root_field() -> Field {
    Field::new(
        "root",
        Kind::Str,
        false,
        "Which sandbox root, by its configured absolute path (see get_state); default the first root.",
    )
}

fn workflow_field(what: &str) -> Field {
    Field::new("workflow_id", Kind::Id, false, what.to_owned())
}

fn write_tool(op: &'static Operation, sandbox: &Sandbox) -> ToolSpec {
    let ext_text = extensions_text(op, sandbox);
    let size_text = match op.max_size_bytes {
        Some(max) => format!(" Size limit: {} on disk.", human_bytes(max)),
        None => String::new(),
    };
    let fields = write_fields(op, sandbox);
    let registered = if op.is_directory() {
        "Each call is checked and snapshotted first (a folder is not registered as an artifact)"
    } else {
        "Each write is checked, snapshotted first and registered as an artifact"
    };
    let description = format!(
        "{} {ext_text}{size_text} Writes only inside the sandbox roots, never through a shell, and never sets execute bits (files 0644). {registered}; undo it with rollback_action or rollback_workflow. When the operator has not enabled writing, the call is only simulated: the result says so and nothing is written.",
        op.summary
    );
    let destructive = !matches!(
        op.mutation_class,
        MutationClass::Create | MutationClass::Append
    );
    let annotations = ToolAnnotations::with_title(title_of(op.name))
        .read_only(false)
        .destructive(destructive)
        .idempotent(op.is_directory())
        .open_world(false);
    ToolSpec::new(
        op.name,
        ToolKind::Write(op),
        title_of(op.name),
        description,
        fields,
        annotations,
    )
}

/// What a write tool's description says of the files `op` may write on this server.
fn extensions_text(op: &Operation, sandbox: &Sandbox) -> String {
    let exts = writable_extensions(op, &sandbox.config().extensions);
    if op.is_directory() {
        "Creates directories only (mode 0755).".to_owned()
    } else if exts.is_empty() {
        format!(
            "This server's extension policy allows none of the files this operation writes, so every call is refused ({}).",
            ruled_out_because(op, sandbox)
        )
    } else if op.extensions.is_empty() {
        format!("Allowed extensions: {}.", exts.join(" "))
    } else {
        format!("Only {} files.", exts.join(" "))
    }
}

/// A write tool's fields, its payload's (when it takes one) after the path.
fn write_fields(op: &Operation, sandbox: &Sandbox) -> Vec<Field> {
    let mut fields = vec![path_field(
        if op.is_directory() {
            "Directory to create"
        } else {
            "Target file"
        },
        &example_file(op, &sandbox.config().extensions),
        true,
        sandbox.config().limits.max_path_depth,
    )];
    fields.extend(payload_field(op));
    fields.push(workflow_field(
        "Groups this write with others for rollback; default: this MCP session's workflow. 1-64 letters, digits, '.', '_' or '-'.",
    ));
    fields.push(Field::new(
        "description",
        Kind::Str,
        false,
        "What the write is for, read by governance only (it is not stored): asking here for chmod or an executable file gets the call refused.",
    ));
    fields.push(root_field());
    fields
}

/// The field of what `op` writes: content, data or edits; `None` when it takes none.
fn payload_field(op: &Operation) -> Option<Field> {
    match op.payload() {
        Payload::Content => Some(Field::new(
            "content",
            Kind::Str,
            true,
            match op.effect {
                Effect::Append => {
                    "Text appended to the end of the file, as given (include a trailing newline if you want one)."
                }
                _ if op.name == "generate_script" => {
                    "The script's full text. It is written as a plain file and never made executable."
                }
                _ => "The file's full text, written exactly as given (UTF-8).",
            },
        )),
        Payload::Data => Some(Field::new(
            "data",
            Kind::Any,
            true,
            match op.effect {
                Effect::Serialize(Format::Json) => {
                    "Any JSON value except null; it is written as pretty-printed JSON."
                }
                Effect::Serialize(Format::Yaml) => {
                    "Any JSON value except null; it is written as YAML."
                }
                _ => {
                    "The config as a JSON value (an object for .toml and .ini); it is serialized by the target's extension: .json, .yaml/.yml, .toml or .ini (INI: an object of sections, each an object of plain values)."
                }
            },
        )),
        Payload::Edits => Some(Field::new(
            "edits",
            Kind::Edits,
            true,
            format!(
                "Exact-text replacements applied in order (at most {}); each 'old' must occur exactly once in the current text. All or nothing: if one edit fails, nothing is written.",
                ailab_sandbox_core::plan::MAX_EDITS_PER_PLAN
            ),
        )),
        Payload::None => None,
    }
}

fn read_only(title: &str) -> ToolAnnotations {
    ToolAnnotations::with_title(title)
        .read_only(true)
        .open_world(false)
}

/// Every tool, write tools first (in catalog order).
pub(crate) fn all_tools(sandbox: &Sandbox) -> Vec<ToolSpec> {
    let mut out: Vec<ToolSpec> = OPERATIONS
        .iter()
        .map(|op| write_tool(op, sandbox))
        .collect();
    out.extend(read_tools(sandbox));
    out.extend(rollback_tools());
    out.extend(artifact_tools());
    out.push(ToolSpec::new(
        "get_state",
        ToolKind::GetState,
        "Get state".into(),
        "The runtime's state: whether writes are real or simulated (and why), phase, sandbox roots, limits, counts, and this session's workflow id.".into(),
        Vec::new(),
        read_only("Get state"),
    ));
    out
}

/// The tools that read the sandbox's files.
fn read_tools(sandbox: &Sandbox) -> [ToolSpec; 3] {
    let depth = sandbox.config().limits.max_path_depth;
    let readable = crate::render::example_written_file(&sandbox.config().extensions);
    let read_limit =
        ailab_sandbox_core::catalog::human_bytes(ailab_sandbox_core::sandbox::READ_LIMIT);
    [
        ToolSpec::new(
            "read_file",
            ToolKind::ReadFile,
            "Read file".into(),
            format!(
                "Read a text file inside the sandbox (at most {read_limit}). The text content is the file's text, exactly for a UTF-8 file; the structured result also gives size_bytes and sha256. A file that is not valid UTF-8 shows each invalid sequence as U+FFFD, with invalid_utf8_at (the first bad byte's offset) and a note saying so. Confined like writes: no '..', no symlinks, nothing outside the roots."
            ),
            vec![path_field("File to read", &readable, true, depth), root_field()],
            read_only("Read file"),
        ),
        ToolSpec::new(
            "list_directory",
            ToolKind::ListDirectory,
            "List directory".into(),
            format!("List a directory inside the sandbox, sorted by name: each entry's name, kind (file, directory, symlink, special) and size. Omit 'path' (or give '.') for the top of the root; one trailing '/' is taken. At most {MAX_DIR_ENTRIES} entries per call: a larger directory is listed in pages, each answer saying the 'offset' of the next."),
            vec![
                path_field(
                    "Directory to list (default: the root itself)",
                    "notes/drafts",
                    false,
                    depth,
                ),
                root_field(),
                Field::new(
                    "offset",
                    Kind::Uint { min: 0, max: u64::MAX },
                    false,
                    "How many entries (in name order) to skip; default 0.".to_owned(),
                ),
            ],
            read_only("List directory"),
        ),
        ToolSpec::new(
            "get_file_info",
            ToolKind::GetFileInfo,
            "Get file info".into(),
            "Describe a path inside the sandbox: file, directory, symlink, special (FIFO, socket, device) or missing, never following a link ('.' is the top of the root); for a file its size and sha256 (up to 1 GiB), and the artifact it holds (none once changed by hand or rolled back).".into(),
            vec![path_field("Path to describe", &readable, true, depth), root_field()],
            read_only("Get file info"),
        ),
    ]
}

/// The tools that undo writes.
fn rollback_tools() -> [ToolSpec; 2] {
    [
        ToolSpec::new(
            "rollback_workflow",
            ToolKind::RollbackWorkflow,
            "Roll back workflow".into(),
            "Undo every write of a workflow, newest first, restoring each file from its snapshot and verifying it by checksum. Default: this session's workflow. Refuses with 'conflict' if a file changed after the workflow wrote it, unless force is true.".into(),
            vec![
                workflow_field("Workflow to roll back; default: this MCP session's workflow."),
                Field::new("force", Kind::Bool, false, "Restore even files that changed after the workflow wrote them (default false)."),
            ],
            ToolAnnotations::with_title("Roll back workflow").read_only(false).destructive(true).open_world(false),
        ),
        ToolSpec::new(
            "rollback_action",
            ToolKind::RollbackAction,
            "Roll back one action".into(),
            "Undo one write (by the action_id a write tool returned), restoring the file from its snapshot, verified by checksum. Refuses with 'conflict' if the file changed since, unless force is true.".into(),
            vec![
                Field::new("action_id", Kind::Id, true, "The action to undo, as returned by the write tool (act_...)."),
                workflow_field("The action's workflow; default: this MCP session's workflow."),
                Field::new("force", Kind::Bool, false, "Restore even if the file changed after the action wrote it (default false)."),
            ],
            ToolAnnotations::with_title("Roll back one action").read_only(false).destructive(true).open_world(false),
        ),
    ]
}

/// The tools that look up the artifacts written.
fn artifact_tools() -> [ToolSpec; 2] {
    [
        ToolSpec::new(
            "list_artifacts",
            ToolKind::ListArtifacts,
            "List artifacts".into(),
            "List registered artifacts (files written), newest first, with path, checksum, size, intent, workflow and action; those whose write was rolled back are marked so.".into(),
            vec![
                Field::new(
                    "limit",
                    Kind::Uint { min: 1, max: MAX_LIST_LIMIT },
                    false,
                    format!("How many, newest first (default {DEFAULT_LIST_LIMIT}, at most {MAX_LIST_LIMIT})."),
                ),
                workflow_field("Only this workflow's artifacts (default: all workflows)."),
            ],
            read_only("List artifacts"),
        ),
        ToolSpec::new(
            "get_artifact",
            ToolKind::GetArtifact,
            "Get artifact".into(),
            "One artifact with its lineage: the earlier artifacts it derives from, nearest first."
                .into(),
            vec![Field::new(
                "artifact_id",
                Kind::Id,
                true,
                "The artifact (art_...), as returned by a write tool or list_artifacts.",
            )],
            read_only("Get artifact"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox on a new root and state directory in `dir` (`name` tells several
    /// apart), its config changed by `tweak` first.
    fn sandbox(
        dir: &tempfile::TempDir,
        name: &str,
        tweak: impl FnOnce(&mut ailab_sandbox_core::Config),
    ) -> Sandbox {
        let mut config = ailab_sandbox_core::Config::with_roots(
            vec![dir.path().join(format!("root{name}"))],
            dir.path().join(format!("state{name}")),
        );
        tweak(&mut config);
        let Ok(sb) = Sandbox::open(config) else {
            panic!("open")
        };
        sb
    }

    /// An allow-list of `exts`, with the default block-list.
    fn allowing(exts: &[&str]) -> ailab_sandbox_core::confine::ExtensionPolicy {
        let exts: Vec<String> = exts.iter().map(|e| (*e).to_owned()).collect();
        ailab_sandbox_core::confine::ExtensionPolicy::new(Some(&exts), &[])
    }

    /// A tool whose files the extension policy allows none of says so, instead of
    /// "Only  files.".
    #[test]
    fn a_tool_the_extension_policy_rules_out_says_so() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("tempdir")
        };
        let sb = sandbox(&dir, "", |config| {
            config.extensions = allowing(&[".txt", ".md"]);
        });
        let describe = |name: &str| {
            let Some(op) = ailab_sandbox_core::catalog::op_for_intent(name) else {
                panic!("{name}")
            };
            write_tool(op, &sb)
                .tool
                .description
                .map(|d| d.to_string())
                .unwrap_or_default()
        };
        let json = describe("write_json");
        assert!(json.contains("allows none of the files"), "{json}");
        assert!(json.contains("(extension_not_allowed)"), "{json}");
        assert!(!json.contains("Only  files"), "{json}");
        let md = describe("write_markdown");
        assert!(md.contains("Only .md files."), "{md}");

        // Ruled out by the block-list: the code a call gets says so. (A tool for any
        // extension cannot be: an allow-list the block-list empties is refused at start.)
        let sb = sandbox(&dir, "2", |config| {
            config.extensions = ailab_sandbox_core::confine::ExtensionPolicy::new(
                Some(&[".txt".to_owned(), ".md".to_owned()]),
                &[".md".to_owned()],
            );
        });
        let Some(op) = ailab_sandbox_core::catalog::op_for_intent("write_markdown") else {
            panic!("write_markdown")
        };
        let text = write_tool(op, &sb)
            .tool
            .description
            .map(|d| d.to_string())
            .unwrap_or_default();
        assert!(text.contains("(blocked_extension)"), "{text}");
    }

    /// A write tool's path example is a file it may write under this server's policy: an
    /// agent copying it is not refused for its extension.
    #[test]
    fn path_examples_follow_the_extension_policy() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("tempdir")
        };
        let sb = sandbox(&dir, "", |config| {
            config.extensions = allowing(&[".txt", ".json"]);
        });
        let example = |name: &str| {
            let Some(t) = all_tools(&sb).into_iter().find(|t| t.tool.name == name) else {
                panic!("{name}")
            };
            let schema = serde_json::Value::Object((*t.tool.input_schema).clone());
            schema["properties"]["path"]["description"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            example("create_file").contains("\"notes/todo.txt\""),
            "{}",
            example("create_file")
        );
        assert!(
            example("write_json").contains("\"notes/todo.json\""),
            "{}",
            example("write_json")
        );
        assert!(example("create_directory").contains("\"notes/drafts\""));
        // A file to read or describe: one a session may have written.
        for read in ["read_file", "get_file_info"] {
            assert!(
                example(read).contains("\"notes/todo.txt\""),
                "{}",
                example(read)
            );
        }
        let Some(op) = ailab_sandbox_core::catalog::op_for_intent("create_file") else {
            panic!("create_file")
        };
        let advice = crate::render::what_to_do(
            ailab_sandbox_core::reason::ReasonCode::PathTraversal,
            Some(crate::render::Writer {
                op,
                policy: &sb.config().extensions,
            }),
        );
        assert!(advice.contains("\"notes/todo.txt\""), "{advice}");
    }

    /// Every tool's path field states the depth this server allows, not a default.
    #[test]
    fn path_fields_state_the_configured_depth() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("tempdir")
        };
        let sb = sandbox(&dir, "", |config| {
            config.limits.max_path_depth = 3;
        });
        let mut with_path = 0;
        for t in all_tools(&sb) {
            let schema = serde_json::Value::Object((*t.tool.input_schema).clone());
            let Some(path) = schema["properties"]["path"]["description"].as_str() else {
                continue;
            };
            with_path += 1;
            assert!(
                path.contains("at most 3 components"),
                "{}: {path}",
                t.tool.name
            );
        }
        assert_eq!(with_path, 14, "11 write tools and 3 read tools");
    }
}
