//! Configuration in two stages: a raw, serde-parsed file (`deny_unknown_fields`) merged
//! with environment and flags, then validated without I/O into a [`Config`].
//! Precedence: flag > environment > file > defaults (SPEC §11).

use crate::confine::ExtensionPolicy;
use crate::confine::path::MAX_PATH_DEPTH;
use crate::policy::DEFAULT_PHASE;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Default sandbox roots.
pub const DEFAULT_ROOTS: [&str; 2] = ["/tmp/opencode/sandbox", "/opt/ai-lab/sandbox"];
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/opt/ai-lab/runtime/state";
/// Default HTTP address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8787";
/// `MAX_ARTIFACTS_PER_WORKFLOW`.
pub const MAX_ARTIFACTS_PER_WORKFLOW: u64 = 100;
/// `MAX_WORKFLOW_BYTES` (25 MiB).
pub const MAX_WORKFLOW_BYTES: u64 = 25 * 1024 * 1024;
/// `RATE_LIMIT_WRITES_PER_MIN`.
pub const RATE_LIMIT_WRITES_PER_MIN: u32 = 10;
/// How long a write waits for a file another writer holds, by default (seconds).
pub const LOCK_WAIT_SECONDS: u64 = 30;
/// The longest wait `limits.lock_wait_seconds` may ask for (an hour).
pub const MAX_LOCK_WAIT_SECONDS: u64 = 3600;

/// Environment variable names.
pub mod env {
    /// Colon-separated sandbox roots.
    pub const ROOTS: &str = "AI_LAB_SANDBOX_ROOTS";
    /// State directory.
    pub const STATE_DIR: &str = "AI_LAB_STATE_DIR";
    /// Write flag.
    pub const ENABLE_WRITE: &str = "AI_LAB_ENABLE_SANDBOX_WRITE";
    /// Dry-run flag.
    pub const DRY_RUN: &str = "AI_LAB_SANDBOX_DRY_RUN";
    /// HTTP bearer token.
    pub const TOKEN: &str = "AI_LAB_SANDBOX_TOKEN";
    /// Config file path.
    pub const CONFIG: &str = "AI_LAB_SANDBOX_CONFIG";
    /// Every variable the runtime reads.
    pub const ALL: [&str; 6] = [ROOTS, STATE_DIR, ENABLE_WRITE, DRY_RUN, TOKEN, CONFIG];
}

/// How hard the runtime works to survive a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// fsync data, directories and logs, each where it was written.
    Strict,
    /// As durable as `strict` (an action reported done survives a power cut), committed
    /// differently: a small file write appends one entry to its workflow's commit log and
    /// syncs that one file; a larger one makes a whole-filesystem sync (`syncfs`) of its
    /// snapshot and staged new bytes; a write that creates directories makes two. The rest
    /// reaches the disk at the next sync point, and start-up recovery finishes from the
    /// log or the commit record what a power cut lost. Faster on a filesystem of its own,
    /// slower where other programs write heavily to the same filesystem (each sync waits
    /// for their data too). Linux only; elsewhere it behaves as `strict`.
    Batched,
    /// No fsync: atomic when the process dies, but a power cut may lose the writes made
    /// since the system last flushed its caches, leaving their files (and snapshots, and
    /// the registry's tail) empty or short; a start then says which records were torn,
    /// and a rollback may be refused for them. For trees that can be made again.
    Relaxed,
}

impl Durability {
    /// Whether writes survive a power cut once an action reports success.
    pub fn is_durable(self) -> bool {
        self != Durability::Relaxed
    }
}

/// The config file as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RawConfig {
    pub roots: Option<Vec<PathBuf>>,
    pub state_dir: Option<PathBuf>,
    pub phase: Option<String>,
    pub enable_write: Option<bool>,
    pub dry_run: Option<bool>,
    pub durability: Option<Durability>,
    pub limits: Option<RawLimits>,
    pub extensions: Option<RawExtensions>,
    pub server: Option<RawServer>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RawLimits {
    pub max_artifacts_per_workflow: Option<u64>,
    pub max_workflow_bytes: Option<u64>,
    pub writes_per_minute: Option<u32>,
    pub max_path_depth: Option<usize>,
    pub lock_wait_seconds: Option<u64>,
}

/// `[extensions]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RawExtensions {
    pub allowed: Option<Vec<String>>,
    pub blocked: Option<Vec<String>>,
}

/// `[server]`.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RawServer {
    pub addr: Option<String>,
    pub token: Option<String>,
    pub max_body_bytes: Option<usize>,
}

impl std::fmt::Debug for RawServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            addr,
            token,
            max_body_bytes,
        } = self;
        f.debug_struct("RawServer")
            .field("addr", addr)
            .field("token", &redacted(token))
            .field("max_body_bytes", max_body_bytes)
            .finish()
    }
}

impl RawConfig {
    /// Parses TOML; an error names the line and the key it is about (never the value,
    /// which may be the token).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        check_sections(text)?;
        toml::from_str(text).map_err(|e| {
            let (mut at, mut secret, mut token_line, mut key, mut value) =
                (String::new(), false, false, String::new(), String::new());
            let mut header = None;
            if let Some(span) = e.span() {
                let start = floor_char_boundary(text, span.start.min(text.len()));
                let line_no = text[..start].matches('\n').count() + 1;
                let line = text.lines().nth(line_no - 1).unwrap_or("");
                let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
                // However the token is written (`token`, `server.token`, an inline
                // table, `"tok\u0065n"`, a multi-line string), a message about its line
                // may quote it: a line naming it, one with an escape, and one inside a
                // multi-line string are never quoted, nor their keys.
                token_line = line.contains("token");
                let in_multiline = in_multiline_string(&text[..line_start]);
                let escaped_key = line.split('=').next().is_some_and(|k| k.contains('\\'));
                secret = token_line || escaped_key || in_multiline;
                at = format!(" (line {line_no}");
                if line.trim_start().starts_with('[') {
                    header = Some(line.split('#').next().unwrap_or_default().trim());
                } else if let Some((k, v)) = key_before(line, start - line_start)
                    && !secret
                {
                    at.push_str(&format!(", key '{}'", k.escape_debug()));
                    key = k;
                    value = v.trim().to_owned();
                }
                at.push(')');
            }
            let why = if secret {
                // Classified, never quoted: the reader's message may hold the value.
                let m = e.message();
                let what = if m.starts_with("invalid type")
                    || m.starts_with("string values must be quoted")
                {
                    if token_line {
                        "the token must be a string, in double quotes"
                    } else {
                        "a value on this line is of the wrong type, or a string without quotes"
                    }
                } else if m.starts_with("duplicate key") {
                    "a key on this line is given twice"
                } else if toml_bad_escape(m) && token_line {
                    "a backslash in the token's string starts no escape: write a backslash itself as \\\\, or put the token in single quotes"
                } else if toml_bad_escape(m) {
                    "a backslash in a string on this line starts no escape: write a backslash itself as \\\\, or put the string in single quotes"
                } else if toml_unclosed(m) && m.starts_with("invalid multi-line") {
                    "a multi-line string is not closed (its ending three quotes are missing)"
                } else if toml_unclosed(m) {
                    "a string on this line is not closed (its ending quote is missing)"
                } else if token_line {
                    "the token must be a string, in double quotes, alone on its line"
                } else {
                    "this line is not valid TOML"
                };
                let why = if token_line {
                    "it holds the token"
                } else {
                    "it may hold the token"
                };
                format!("{what} (the line is not shown: {why})")
            } else if let Some(words) = bare_word_words(e.message(), &key, &value) {
                words
            } else if e.message().trim() == "recursion limit" {
                // Said without a place: a dotted key or a header of hundreds of parts.
                "a key or a section header has too many dotted parts for the reader; a config has two levels, a [section] and its keys (key = value)".to_owned()
            } else if e.message().trim() == "duplicate key" {
                match header {
                    Some(h) => format!(
                        "the section {h} is given twice: put its keys under one {h}"
                    ),
                    None if !key.is_empty() => format!(
                        "'{}' is given twice: keep one",
                        key.escape_debug()
                    ),
                    None => "a key is given twice: keep one".to_owned(),
                }
            } else {
                plain_words(e.message().trim(), &key)
            };
            ConfigError(format!("invalid config{at}: {why}"))
        })
    }
}

/// The sections of a config file, each a table of keys.
const SECTIONS: [&str; 3] = ["limits", "extensions", "server"];

/// Refuses a section written as an array (`limits = [7, 1000]`, `[[limits]]`), which the
/// reader would otherwise take field by field in order, silently. A text that is not
/// TOML is left to the reader, whose message names the line.
fn check_sections(text: &str) -> Result<(), ConfigError> {
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Ok(());
    };
    match SECTIONS
        .into_iter()
        .find(|s| table.get(*s).is_some_and(|v| !v.is_table()))
    {
        Some(s) => Err(ConfigError(format!(
            "invalid config: '{s}' must be a section: a [{s}] line with its keys beneath it, one per line, or an inline table ({s} = {{ key = value }}), not {}",
            match &table[s] {
                toml::Value::Array(a) if a.iter().all(toml::Value::is_table) => {
                    format!("[[{s}]] (an array of tables)")
                }
                // The server's section may hold the token: its value is never shown.
                v if s == "server" => toml_type(v).to_owned(),
                v => format!("{} ({v})", toml_type(v)),
            }
        ))),
        None => Ok(()),
    }
}

/// A TOML value's kind, in the words of the messages about it.
fn toml_type(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "a number",
        toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// The key at byte `col` of `line`, or whose value stands there, and the text after its
/// `=`: in an inline table (`limits = { max_path_depth = "9" }`) the inner key is
/// blamed, not the section; an `=` inside a string is no key's. `None` on a line
/// without `=`.
fn key_before(line: &str, col: usize) -> Option<(String, &str)> {
    let col = floor_char_boundary(line, col.min(line.len()));
    // Where `=`, `{` and `,` stand outside strings (and before a comment).
    let mut marks: Vec<(usize, u8)> = Vec::new();
    toml_code(line, |i, c| {
        if matches!(c, b'=' | b'{' | b',') {
            marks.push((i, c));
        }
    });
    // A key at `col`: the first mark after it is its `=`.
    let at_key = marks
        .iter()
        .find(|&&(p, _)| p >= col)
        .filter(|&&(p, c)| c == b'=' && !line[col..p].trim().is_empty())
        .map(|&(p, _)| p);
    let eq = at_key.or_else(|| {
        marks
            .iter()
            .rev()
            .find(|&&(p, c)| c == b'=' && p < col)
            .map(|&(p, _)| p)
    })?;
    let from = marks
        .iter()
        .rev()
        .find(|&&(p, c)| c != b'=' && p < eq)
        .map_or(0, |&(p, _)| p + 1);
    let k = line[from..eq].trim().trim_matches('"');
    Some((k.to_owned(), &line[eq + 1..]))
}

/// Whether `text` (a config file up to the start of a line) ends inside a multi-line
/// string, so that a `"""` in a comment or in another string is not taken for one.
fn in_multiline_string(text: &str) -> bool {
    toml_code(text, |_, _| {})
}

/// Reads `text` as TOML reads its quotes, comments and escapes, handing `code` each byte
/// (and its offset) that stands outside every string and comment; whether the text ends
/// inside a multi-line string.
fn toml_code(text: &str, mut code: impl FnMut(usize, u8)) -> bool {
    #[derive(PartialEq)]
    enum In {
        Code,
        Comment,
        Basic,
        Literal,
        MultiBasic,
        MultiLiteral,
    }
    let (b, mut at, mut i) = (text.as_bytes(), In::Code, 0);
    let starts = |i: usize, d: &[u8]| b[i..].starts_with(d);
    while i < b.len() {
        let c = b[i];
        match at {
            In::Code if starts(i, b"\"\"\"") => (at, i) = (In::MultiBasic, i + 2),
            In::Code if starts(i, b"'''") => (at, i) = (In::MultiLiteral, i + 2),
            In::Code if c == b'"' => at = In::Basic,
            In::Code if c == b'\'' => at = In::Literal,
            In::Code if c == b'#' => at = In::Comment,
            In::Code => code(i, c),
            In::Comment | In::Basic | In::Literal if c == b'\n' => at = In::Code,
            In::Basic | In::MultiBasic if c == b'\\' => i += 1,
            In::Basic if c == b'"' => at = In::Code,
            In::Literal if c == b'\'' => at = In::Code,
            In::MultiBasic if starts(i, b"\"\"\"") => (at, i) = (In::Code, i + 2),
            In::MultiLiteral if starts(i, b"'''") => (at, i) = (In::Code, i + 2),
            _ => {}
        }
        i += 1;
    }
    matches!(at, In::MultiBasic | In::MultiLiteral)
}

/// `i`, or the nearest char boundary of `text` below it.
fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// What to say of a bare word the TOML reader refused (`TRUE`, `yes`, `no`, `ten`), which
/// it words as the value it took the word to begin (`invalid boolean, expected \`true\``,
/// `invalid float, expected \`nan\``) or as a string left unquoted; `None` when the
/// message is another. `value` is the line after `=`: a single word is quoted, a word
/// inside an array or table is only said to be there.
fn bare_word_words(message: &str, key: &str, value: &str) -> Option<String> {
    let word = value.split('#').next().unwrap_or_default().trim();
    let single = !word.is_empty()
        && word.len() <= 40
        && word
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let begins_number = word.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    let about_a_word = message.starts_with("invalid boolean")
        || message.starts_with("string values must be quoted")
        || (message.starts_with("invalid float") && !begins_number);
    if !about_a_word {
        return None;
    }
    const TOML_TAKES: &str = "TOML takes a string in double quotes, a number in digits, a boolean as true or false in lower case";
    // A key on this line with nothing after its `=` (a line inside a multi-line array
    // has no key of its own).
    if word.is_empty() && !key.is_empty() {
        return Some(format!(
            "no value follows the '='; give one or leave the key out ({TOML_TAKES})"
        ));
    }
    if !single {
        return Some(format!("a bare word on this line; {TOML_TAKES}"));
    }
    Some(if matches!(key, "enable_write" | "dry_run") {
        format!("'{word}' is not a boolean; write true or false, in lower case and without quotes")
    } else {
        format!("'{word}' is a bare word; {TOML_TAKES}")
    })
}

/// Whether the TOML reader's `message` is about a backslash that starts no escape.
fn toml_bad_escape(message: &str) -> bool {
    message.starts_with("missing escaped value") || message.starts_with("invalid escape")
}

/// Whether the TOML reader's `message` is about a string that is not closed (one-line or
/// multi-line, basic or literal).
fn toml_unclosed(message: &str) -> bool {
    [
        "invalid basic string",
        "invalid literal string",
        "invalid multi-line",
    ]
    .iter()
    .any(|p| message.starts_with(p))
}

/// The TOML reader's message in an operator's words: Rust's type names (`usize`,
/// `struct RawLimits`) say what the code holds, not what to write, and its syntax
/// messages quote its grammar.
fn plain_words(message: &str, key: &str) -> String {
    if message == "wanted string or table" && key == "durability" {
        return "expected a string: \"strict\", \"batched\" or \"relaxed\"".to_owned();
    }
    if toml_bad_escape(message) {
        return "a backslash in a string starts no TOML escape (\\b, \\t, \\n, \\f, \\r, \\\", \\\\, \\uXXXX or \\UXXXXXXXX): write a backslash itself as \\\\, or use a string in single quotes, which takes backslashes as they are".to_owned();
    }
    if toml_unclosed(message) {
        return if message.starts_with("invalid multi-line") {
            "a multi-line string is not closed (its ending three quotes are missing)"
        } else {
            "a string is not closed (its ending quote is missing)"
        }
        .to_owned();
    }
    let mut m = message.replace(" as i128", "");
    // Beyond 64 bits the value arrives as a 128-bit integer ("invalid type"); beyond the
    // key's own type as "invalid value": either way too large, unless it has a sign.
    let too_large = m.contains("expected u")
        && (m.starts_with("invalid type: integer") || m.starts_with("invalid value: integer"))
        && !m.contains("integer `-");
    if too_large {
        m = format!(
            "integer too large:{}",
            m.split_once("integer").map_or("", |x| x.1)
        );
    }
    for (t, max) in [
        ("usize", usize::MAX as u64),
        ("u64", u64::MAX),
        ("u32", u32::MAX.into()),
        ("u16", u16::MAX.into()),
        ("u8", u8::MAX.into()),
    ] {
        let words = if too_large {
            // The key's own range where it has a narrower one than its type.
            match key_range(key) {
                Some((low, high)) => format!("{key} takes {low} to {high}"),
                None => format!("expected a whole number of at most {max}"),
            }
        } else {
            "expected a whole number (no sign)".to_owned()
        };
        m = m.replace(&format!("expected {t}"), &words);
    }
    let m = match m.find("expected struct ") {
        Some(i) => format!("{}expected a table (a [section] of keys)", &m[..i]),
        None => m,
    };
    if key.is_empty() {
        return m;
    }
    // The reader names the list, not which of its entries is wrong, for a list's entry
    // of the wrong type: not the list itself, which is one.
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let place =
        if matches!(leaf, "roots" | "allowed" | "blocked") && !m.contains("expected a sequence") {
            format!("each entry of '{}'", key.escape_debug())
        } else {
            format!("'{}'", key.escape_debug())
        };
    crate::shape_words::value_said(&place, &m).unwrap_or(m)
}

/// The range a numeric key takes when narrower than its type's (see `validate`).
fn key_range(key: &str) -> Option<(u64, u64)> {
    match key.rsplit('.').next().unwrap_or(key) {
        "max_path_depth" => Some((1, MAX_PATH_DEPTH as u64)),
        "lock_wait_seconds" => Some((1, MAX_LOCK_WAIT_SECONDS)),
        "max_body_bytes" => Some((MIN_BODY_BYTES_LIMIT as u64, MAX_BODY_BYTES_LIMIT as u64)),
        _ => None,
    }
}

/// The largest request body `serve` takes (`[server] max_body_bytes`).
pub const MAX_BODY_BYTES_LIMIT: usize = 256 * 1024 * 1024;

/// The smallest `[server] max_body_bytes`: a plan of one small action fits.
pub const MIN_BODY_BYTES_LIMIT: usize = 1024;

/// Refuses extension entries the policy could never match: it compares a file's last
/// extension (`.gz` for `a.tar.gz`), lower-cased, so an entry is one extension such as
/// `.md` (the dot optional). An empty allow-list would refuse every file.
fn check_extension_lists(x: &RawExtensions) -> Result<(), ConfigError> {
    check_extension_entries(
        x.allowed.as_deref(),
        x.blocked.as_deref().unwrap_or_default(),
    )
}

/// [`check_extension_lists`] on the entries themselves: for a file's lists before they
/// are taken, and for a policy built in code (`Config::validate`), which would otherwise
/// hold an entry that never matches.
fn check_extension_entries(
    allowed: Option<&[String]>,
    blocked: &[String],
) -> Result<(), ConfigError> {
    if allowed.is_some_and(<[String]>::is_empty) {
        return Err(ConfigError(
            "extensions.allowed is empty, so no file could be written; leave it out for the default allow-list".into(),
        ));
    }
    for (list, entries) in [
        ("allowed", allowed.unwrap_or_default()),
        ("blocked", blocked),
    ] {
        for e in entries {
            let bare = e.strip_prefix('.').unwrap_or(e);
            let ok = !bare.is_empty()
                && bare
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '~'));
            if !ok {
                return Err(ConfigError(format!(
                    "extensions.{list} entry '{}' is not a file extension such as .md; give one extension per entry (a file is judged by its last extension only, so '.tar.gz' would never match: write '.gz')",
                    e.escape_debug()
                )));
            }
        }
    }
    if allowed.is_some() {
        // The block-list always wins: an allow-list it empties allows nothing either.
        let policy = ExtensionPolicy::new(allowed, blocked);
        if !policy
            .allowed()
            .iter()
            .any(|e| policy.is_extension_allowed(e))
        {
            return Err(ConfigError(format!(
                "every entry of extensions.allowed ({}) is on the block-list, which always wins, so no file could be written; allow an extension that is not blocked (blocked: {})",
                policy.allowed().join(" "),
                policy.blocked().join(" ")
            )));
        }
    }
    Ok(())
}

/// Values given on the command line; `None`/empty means "not given". Its `Debug` never
/// shows the token.
#[derive(Clone, Default)]
#[allow(missing_docs)]
pub struct Overrides {
    pub roots: Vec<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub phase: Option<String>,
    pub enable_write: bool,
    pub no_dry_run: bool,
    pub addr: Option<String>,
    pub token: Option<String>,
    pub max_body_bytes: Option<usize>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            roots,
            state_dir,
            phase,
            enable_write,
            no_dry_run,
            addr,
            token,
            max_body_bytes,
        } = self;
        f.debug_struct("Overrides")
            .field("roots", roots)
            .field("state_dir", state_dir)
            .field("phase", phase)
            .field("enable_write", enable_write)
            .field("no_dry_run", no_dry_run)
            .field("addr", addr)
            .field("token", &redacted(token))
            .field("max_body_bytes", max_body_bytes)
            .finish()
    }
}

impl Overrides {
    /// Whether a flag given overrides the environment variable `var` (one of [`mod@env`]).
    pub fn overrides(&self, var: &str) -> bool {
        match var {
            env::ROOTS => !self.roots.is_empty(),
            env::STATE_DIR => self.state_dir.is_some(),
            env::ENABLE_WRITE => self.enable_write,
            env::DRY_RUN => self.no_dry_run,
            env::TOKEN => self.token.is_some(),
            _ => false,
        }
    }
}

/// Default largest HTTP request body (64 MiB).
///
/// A plan travels as JSON, where a quote, backslash or newline of content takes two bytes
/// and a control character six. 64 MiB carries a plan that fills the whole
/// `MAX_WORKFLOW_BYTES` with text escaped at two bytes a byte, and one operation's 5 MiB
/// content escaped at six, with room for the actions' other fields: no plan the catalog
/// and the default budget allow is refused over HTTP when the CLI would take it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Artifacts a workflow may register in all its runs (`budget_artifacts_exceeded`
    /// past it); default [`MAX_ARTIFACTS_PER_WORKFLOW`].
    pub max_artifacts_per_workflow: u64,
    /// Bytes a workflow may write in all its runs (`budget_bytes_exceeded` past it);
    /// default [`MAX_WORKFLOW_BYTES`].
    pub max_workflow_bytes: u64,
    /// Writes a workflow may make per minute (`rate_limited`, with the seconds to wait);
    /// default [`RATE_LIMIT_WRITES_PER_MIN`].
    pub writes_per_minute: u32,
    /// Components a path may have (`depth_exceeded` past it); 1 to
    /// [`MAX_PATH_DEPTH`], the default.
    pub max_path_depth: usize,
    /// How long a write, run or rollback waits for a file, a workflow or a log another
    /// process holds before it gives up (`conflict` for files and workflows): a stopped or
    /// hung process must not stall the others for good.
    pub lock_wait_seconds: u64,
}

impl Limits {
    /// The file's `[limits]` over these, where it gives one.
    fn take(&mut self, l: RawLimits) {
        if let Some(v) = l.max_artifacts_per_workflow {
            self.max_artifacts_per_workflow = v;
        }
        if let Some(v) = l.max_workflow_bytes {
            self.max_workflow_bytes = v;
        }
        if let Some(v) = l.writes_per_minute {
            self.writes_per_minute = v;
        }
        if let Some(v) = l.max_path_depth {
            self.max_path_depth = v;
        }
        if let Some(v) = l.lock_wait_seconds {
            self.lock_wait_seconds = v;
        }
    }

    /// Each limit within its range.
    fn check(&self) -> Result<(), ConfigError> {
        if self.max_path_depth == 0 || self.max_path_depth > MAX_PATH_DEPTH {
            return Err(ConfigError(format!(
                "limits.max_path_depth = {} is out of range; allowed 1 to {MAX_PATH_DEPTH}",
                self.max_path_depth
            )));
        }
        if !(1..=MAX_LOCK_WAIT_SECONDS).contains(&self.lock_wait_seconds) {
            return Err(ConfigError(format!(
                "limits.lock_wait_seconds = {} is out of range; allowed 1 to {MAX_LOCK_WAIT_SECONDS}",
                self.lock_wait_seconds
            )));
        }
        if self.writes_per_minute == 0 {
            return Err(ConfigError(
                "limits.writes_per_minute = 0 would forbid every write; give at least 1".into(),
            ));
        }
        for (key, value) in [
            (
                "max_artifacts_per_workflow",
                self.max_artifacts_per_workflow,
            ),
            ("max_workflow_bytes", self.max_workflow_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError(format!(
                    "limits.{key} = 0 would forbid every write; give at least 1"
                )));
            }
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_artifacts_per_workflow: MAX_ARTIFACTS_PER_WORKFLOW,
            max_workflow_bytes: MAX_WORKFLOW_BYTES,
            writes_per_minute: RATE_LIMIT_WRITES_PER_MIN,
            max_path_depth: MAX_PATH_DEPTH,
            lock_wait_seconds: LOCK_WAIT_SECONDS,
        }
    }
}

/// The resolved configuration, passed explicitly as `&Config`. Its `Debug` never shows
/// the token.
#[derive(Clone)]
pub struct Config {
    /// Sandbox roots, absolute, in order.
    pub roots: Vec<PathBuf>,
    /// Whether the roots were configured (rather than the defaults).
    pub roots_explicit: bool,
    /// State directory: the audit trail, the artifact registry, run records, locks and
    /// the seal key. The runtime's own (it takes over names such as `inflight/ID.json`);
    /// every instance given the same one shares its trail, budgets and rate limits.
    pub state_dir: PathBuf,
    /// Whether the state directory was configured; if not, an uncreatable default falls
    /// back to the user's state directory.
    pub state_dir_explicit: bool,
    /// Phase in force.
    pub phase: String,
    /// Whether the write executor is on (`AI_LAB_ENABLE_SANDBOX_WRITE`). Plans write
    /// only with this on and [`Config::dry_run`] off; otherwise they are simulated.
    pub enable_write: bool,
    /// Whether plans are only simulated (`AI_LAB_SANDBOX_DRY_RUN`), on by default.
    pub dry_run: bool,
    /// fsync policy.
    pub durability: Durability,
    /// Budgets and limits.
    pub limits: Limits,
    /// Extension lists.
    pub extensions: ExtensionPolicy,
    /// HTTP address.
    pub addr: String,
    /// HTTP bearer token.
    pub token: Option<String>,
    /// Largest HTTP request body in bytes.
    pub max_body_bytes: usize,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so that a field added is a field shown (or hidden) on purpose.
        let Self {
            roots,
            roots_explicit,
            state_dir,
            state_dir_explicit,
            phase,
            enable_write,
            dry_run,
            durability,
            limits,
            extensions,
            addr,
            token,
            max_body_bytes,
        } = self;
        f.debug_struct("Config")
            .field("roots", roots)
            .field("roots_explicit", roots_explicit)
            .field("state_dir", state_dir)
            .field("state_dir_explicit", state_dir_explicit)
            .field("phase", phase)
            .field("enable_write", enable_write)
            .field("dry_run", dry_run)
            .field("durability", durability)
            .field("limits", limits)
            .field("extensions", extensions)
            .field("addr", addr)
            .field("token", &redacted(token))
            .field("max_body_bytes", max_body_bytes)
            .finish()
    }
}

/// A token as `Debug` shows it: whether there is one, never what it is.
fn redacted(token: &Option<String>) -> Option<Redacted> {
    token.as_ref().map(|_| Redacted)
}

/// A secret in `Debug` output.
struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The defaults SPEC §11 names: roots `/tmp/opencode/sandbox` and `/opt/ai-lab/sandbox`,
/// the host's shared state directory `/opt/ai-lab/runtime/state` (falling back to the
/// user's when it cannot be made), writing off and dry-run on. An embedder usually wants
/// [`Config::with_roots`], its own roots and state directory.
impl Default for Config {
    fn default() -> Self {
        Self {
            roots: DEFAULT_ROOTS.iter().map(PathBuf::from).collect(),
            roots_explicit: false,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            state_dir_explicit: false,
            phase: DEFAULT_PHASE.to_owned(),
            enable_write: false,
            dry_run: true,
            durability: Durability::Strict,
            limits: Limits::default(),
            extensions: ExtensionPolicy::default(),
            addr: DEFAULT_ADDR.to_owned(),
            token: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// A configuration problem, naming the key or variable and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// A configuration for the given roots and state directory, everything else default.
    /// Handy for embedding and tests.
    pub fn with_roots(roots: Vec<PathBuf>, state_dir: PathBuf) -> Self {
        Self {
            roots,
            roots_explicit: true,
            state_dir,
            state_dir_explicit: true,
            ..Self::default()
        }
    }

    /// Merges file, environment (read through `env`) and flags, then validates. A
    /// variable a flag overrides is not read, so neither is its value judged (as a file's
    /// value under a variable or a flag is not).
    pub fn resolve(
        file: Option<RawConfig>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let env = |name: &str| env(name).filter(|_| !flags.overrides(name));
        let file = file.unwrap_or_default();
        // Where each path and the phase come from, for a refusal to say which to change.
        let from = |flag: Option<&str>, var: Option<&str>, key: Option<&str>| {
            flag.map(str::to_owned)
                .or_else(|| var.filter(|v| env(v).is_some()).map(str::to_owned))
                .or_else(|| key.map(|k| format!("{k} in the config file")))
                .unwrap_or_else(|| "the default".to_owned())
        };
        let sources = [
            (
                "root",
                from(
                    (!flags.roots.is_empty()).then_some("--root"),
                    Some(env::ROOTS),
                    file.roots.as_ref().map(|_| "roots"),
                ),
            ),
            (
                "state_dir",
                from(
                    flags.state_dir.as_ref().map(|_| "--state-dir"),
                    Some(env::STATE_DIR),
                    file.state_dir.as_ref().map(|_| "state_dir"),
                ),
            ),
            (
                "phase",
                from(
                    flags.phase.as_ref().map(|_| "--phase"),
                    None,
                    file.phase.as_ref().map(|_| "phase"),
                ),
            ),
        ];
        let mut c = Config::default();
        c.resolve_roots(file.roots, &env, flags)?;
        c.resolve_state_dir(file.state_dir, &env, flags)?;
        c.resolve_mode((file.phase, file.enable_write, file.dry_run), &env, flags)?;
        if let Some(d) = file.durability {
            c.durability = d;
        }
        if let Some(l) = file.limits {
            c.limits.take(l);
        }
        if let Some(x) = file.extensions {
            check_extension_lists(&x)?;
            c.extensions =
                ExtensionPolicy::new(x.allowed.as_deref(), x.blocked.as_deref().unwrap_or(&[]));
        }
        c.resolve_server(file.server, &env, flags);
        c.validate().map_err(|ConfigError(why)| {
            let source = sources.iter().find(|(what, _)| {
                why.strip_prefix(what)
                    .is_some_and(|rest| rest.starts_with([' ', 's', ':']))
            });
            ConfigError(match source {
                Some((what, source)) => format!("{why} ({what} from {source})"),
                None => why,
            })
        })?;
        Ok(c)
    }

    /// The roots: the file's, then `AI_LAB_SANDBOX_ROOTS`, then `--root`.
    fn resolve_roots(
        &mut self,
        file: Option<Vec<PathBuf>>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        if let Some(roots) = file {
            self.roots = roots;
            self.roots_explicit = true;
        }
        if let Some(v) = non_empty(
            env,
            env::ROOTS,
            "the configured or default roots",
            "absolute directories separated by ':'",
        )? {
            if v.split(':').all(str::is_empty) {
                return Err(ConfigError(format!(
                    "{} is {v:?}: separators and no path; unset it to use the configured or default roots, or give absolute directories separated by ':'",
                    env::ROOTS
                )));
            }
            // An empty entry is refused like an empty variable: `$A:$B` with `$B` unset
            // would otherwise drop a root without a word.
            if let Some(n) = v.split(':').position(str::is_empty) {
                return Err(ConfigError(format!(
                    "{} is {v:?}: entry {} is empty (an unset variable between the separators?); give absolute directories separated by ':', none empty",
                    env::ROOTS,
                    n + 1
                )));
            }
            self.roots = v.split(':').map(PathBuf::from).collect();
            self.roots_explicit = true;
        }
        if !flags.roots.is_empty() {
            self.roots = flags.roots.clone();
            self.roots_explicit = true;
        }
        Ok(())
    }

    /// The state directory: the file's, then `AI_LAB_STATE_DIR`, then `--state-dir`.
    fn resolve_state_dir(
        &mut self,
        file: Option<PathBuf>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        if let Some(p) = file {
            self.state_dir = p;
            self.state_dir_explicit = true;
        }
        if let Some(v) = non_empty(
            env,
            env::STATE_DIR,
            "the configured or default state directory",
            "an absolute directory",
        )? {
            self.state_dir = PathBuf::from(v);
            self.state_dir_explicit = true;
        }
        if let Some(p) = &flags.state_dir {
            self.state_dir = p.clone();
            self.state_dir_explicit = true;
        }
        Ok(())
    }

    /// The phase and the two switches (file, variable, flag; the phase has no
    /// variable): `phase`, `enable_write` and `dry_run` as the file gives them.
    fn resolve_mode(
        &mut self,
        (phase, enable_write, dry_run): (Option<String>, Option<bool>, Option<bool>),
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        if let Some(p) = flags.phase.clone().or(phase) {
            self.phase = p;
        }
        if let Some(b) = enable_write {
            self.enable_write = b;
        }
        if let Some(v) = env(env::ENABLE_WRITE) {
            self.enable_write = parse_bool(env::ENABLE_WRITE, &v)?;
        }
        if flags.enable_write {
            self.enable_write = true;
        }
        if let Some(b) = dry_run {
            self.dry_run = b;
        }
        if let Some(v) = env(env::DRY_RUN) {
            self.dry_run = parse_bool(env::DRY_RUN, &v)?;
        }
        if flags.no_dry_run {
            self.dry_run = false;
        }
        Ok(())
    }

    /// The server's address, token and body limit: the file's `[server]`, then the
    /// token's variable, then the flags.
    fn resolve_server(
        &mut self,
        file: Option<RawServer>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) {
        if let Some(s) = file {
            if let Some(a) = s.addr {
                self.addr = a;
            }
            self.token = s.token;
            if let Some(m) = s.max_body_bytes {
                self.max_body_bytes = m;
            }
        }
        // An empty token is kept, for `serve` to refuse (it is no token), rather than
        // quietly serving without one.
        if let Some(t) = env(env::TOKEN) {
            self.token = Some(t);
        }
        if let Some(a) = &flags.addr {
            self.addr = a.clone();
        }
        if let Some(t) = &flags.token {
            self.token = Some(t.clone());
        }
        if let Some(m) = flags.max_body_bytes {
            self.max_body_bytes = m;
        }
    }

    /// Checks the values without I/O.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.roots.is_empty() {
            return Err(ConfigError("no sandbox root is configured: give at least one in roots, AI_LAB_SANDBOX_ROOTS or --root".into()));
        }
        self.check_path_names()?;
        self.check_roots()?;
        self.check_state_dir()?;
        self.check_roots_fit_a_run_record()?;
        if !is_phase_syntax(&self.phase) {
            return Err(ConfigError(format!(
                "phase '{}' is not written as a phase is, two numbers of at most four digits without leading zeros joined by a dot, such as 28.3 (sandbox writes need {}; any other phase so written, 29.0 say, allows reads only)",
                self.phase.escape_debug(),
                crate::policy::write_phases_listed("or")
            )));
        }
        check_extension_entries(Some(self.extensions.allowed()), self.extensions.blocked())?;
        self.limits.check()?;
        if !(MIN_BODY_BYTES_LIMIT..=MAX_BODY_BYTES_LIMIT).contains(&self.max_body_bytes) {
            return Err(ConfigError(format!(
                "server.max_body_bytes = {} (set in the config file or by serve --max-body-bytes) is out of range; allowed {MIN_BODY_BYTES_LIMIT} to {MAX_BODY_BYTES_LIMIT}",
                self.max_body_bytes
            )));
        }
        // The token's length is the server's concern (`serve` refuses a short one): the
        // other commands never use it, so a short one does not stop them.
        Ok(())
    }

    /// The roots' and the state directory's paths as text.
    fn check_path_names(&self) -> Result<(), ConfigError> {
        // A path that is not UTF-8 would be shown, matched and recorded under another
        // name than the directory it opens (SPEC §2 refuses invalid UTF-8 in paths).
        for (what, p) in self
            .roots
            .iter()
            .map(|r| ("root", r))
            .chain([("state_dir", &self.state_dir)])
        {
            match p.to_str() {
                None => {
                    return Err(ConfigError(format!(
                        "{what} {} is not valid UTF-8; give a path in UTF-8",
                        p.display()
                    )));
                }
                // Nor a control character (SPEC §2): a newline in it would forge lines
                // wherever the path is shown.
                Some(text) if text.chars().any(char::is_control) => {
                    return Err(ConfigError(format!(
                        "{what} {} contains a control character; give a path without any",
                        text.escape_debug()
                    )));
                }
                // Nor what makes a name read otherwise (every path given into such a
                // root would be refused for it).
                Some(text) => {
                    if let Err(r) = crate::confine::path::detect_misleading_name(text) {
                        return Err(ConfigError(format!("{what}: {}", r.reason)));
                    }
                }
            }
        }
        Ok(())
    }

    /// Each root on its own, then against the others.
    fn check_roots(&self) -> Result<(), ConfigError> {
        for r in &self.roots {
            if !r.is_absolute() {
                return Err(ConfigError(format!(
                    "root '{}' is not an absolute path; give each root as an absolute path, such as /srv/sandbox",
                    r.display()
                )));
            }
            if r.parent().is_none() {
                return Err(ConfigError(format!(
                    "root {} is the filesystem root; give a dedicated directory",
                    r.display()
                )));
            }
            if r.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(ConfigError(format!(
                    "root {} contains '..'; give the plain path",
                    r.display()
                )));
            }
        }
        for (i, a) in self.roots.iter().enumerate() {
            if let Some(b) = self.roots[i + 1..]
                .iter()
                .find(|b| a.starts_with(b) || b.starts_with(a))
            {
                if a == b {
                    return Err(ConfigError(format!(
                        "root {} is given twice; give each root once",
                        a.display()
                    )));
                }
                return Err(ConfigError(format!(
                    "roots {} and {} overlap (one lies inside the other, so its '.rollback/' would be writable through the other); give separate directories",
                    a.display(),
                    b.display()
                )));
            }
        }
        Ok(())
    }

    /// Each root's path fits a run record alone.
    fn check_roots_fit_a_run_record(&self) -> Result<(), ConfigError> {
        // A run names the roots it writes into in its run record, one small block: a root
        // that does not fit there alone could never be written. (Roots that only fit
        // apart refuse the plans that write into them all: `Sandbox::record_room`.)
        for r in &self.roots {
            let (taken, room) =
                crate::recovery::InflightRecord::room_for_roots(&[r.display().to_string()]);
            if taken > room {
                return Err(ConfigError(format!(
                    "root {} is too long a path: a run's record names the roots it writes into, and this one takes {taken} bytes there, more than the {room} it has room for; give a shorter path",
                    crate::confine::path::shown_path(&r.display().to_string())
                )));
            }
        }
        Ok(())
    }

    /// The state directory, and where it lies against the roots.
    fn check_state_dir(&self) -> Result<(), ConfigError> {
        if !self.state_dir.is_absolute() {
            return Err(ConfigError(format!(
                "state_dir '{}' is not an absolute path; give an absolute path, such as /var/lib/ailab-sandbox",
                self.state_dir.display()
            )));
        }
        if self
            .state_dir
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(ConfigError(format!(
                "state_dir {} contains '..'; give the plain path",
                self.state_dir.display()
            )));
        }
        if let Some(r) = self.roots.iter().find(|r| **r == self.state_dir) {
            return Err(ConfigError(format!(
                "root {} is also the state_dir; the runtime's own files are never writable, so give them separate directories",
                r.display()
            )));
        }
        if let Some(r) = self.roots.iter().find(|r| r.starts_with(&self.state_dir)) {
            return Err(ConfigError(format!(
                "root {} lies inside the state_dir {}; the runtime's own files are never writable, so give a root outside it",
                r.display(),
                self.state_dir.display()
            )));
        }
        if let Some(r) = self.roots.iter().find(|r| self.state_dir.starts_with(r)) {
            return Err(ConfigError(format!(
                "state_dir {} lies inside the sandbox root {}; it must be outside every root",
                self.state_dir.display(),
                r.display()
            )));
        }
        Ok(())
    }

    /// The user's state directory, used when the default one cannot be created.
    pub fn fallback_state_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        if let Some(x) = env("XDG_STATE_HOME").filter(|x| x.starts_with('/')) {
            return Some(Path::new(&x).join("ailab-sandbox"));
        }
        env("HOME")
            .filter(|h| h.starts_with('/'))
            .map(|h| Path::new(&h).join(".local/state/ailab-sandbox"))
    }
}

/// The variable `name`, refused when set but empty (often an unset shell variable
/// passed on): the defaults it would fall back to are other directories than intended.
fn non_empty(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    unset_means: &str,
    give: &str,
) -> Result<Option<String>, ConfigError> {
    match env(name) {
        Some(v) if v.is_empty() => Err(ConfigError(format!(
            "{name} is set but empty; unset it to use {unset_means}, or give {give}"
        ))),
        v => Ok(v),
    }
}

fn parse_bool(var: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError(format!(
            "{var}='{}' is not a boolean; use true/false, 1/0, yes/no or on/off",
            v.escape_debug()
        ))),
    }
}

/// Whether `phase` looks like `28.3`.
pub fn is_phase_syntax(phase: &str) -> bool {
    let mut parts = phase.split('.');
    // No leading zero: `28.03` would name no phase the runtime knows while meaning 28.3.
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.len() <= 4
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}
