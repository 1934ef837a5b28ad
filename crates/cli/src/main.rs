//! `ailab-sandbox`: the command-line face of the governed write runtime.
#![forbid(unsafe_code)]

/// A long-running server frees on some threads what its requests allocated on others;
/// glibc's per-thread arenas kept much of it (a 25-minute load: 860 MB resident for 101
/// MB in use). mimalloc gives more of it back (a 10-minute load: 280 MB against glibc's
/// 374 MB, for 74 MB in use).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` that tolerates a closed standard output (`ailab-sandbox audit | head`):
/// the command's work is done either way, and a broken pipe is not worth a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::output_failed(e);
        }
    }};
}

/// `eprintln!` that tolerates a standard error that cannot be written (a full disk, a
/// reader gone): the command's work and its result matter more than its remarks, and
/// `eprintln!` would panic.
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The first failure to write to standard output, other than a reader that went away
/// (`| head`): a result lost on a full disk must not leave exit code 0.
static OUTPUT_FAILURE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn output_failed(e: std::io::Error) {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        let _ = OUTPUT_FAILURE.set(e.to_string());
    }
}

mod human;

use ailab_sandbox_core::artifact::ListedArtifact;
use ailab_sandbox_core::catalog::{OPERATIONS, writable_extensions};
use ailab_sandbox_core::config::{Config, ConfigError, Overrides, RawConfig, env as envvars};
use ailab_sandbox_core::plan::check_id;
use ailab_sandbox_core::sandbox::{CheckRequest, RollbackOptions};
use ailab_sandbox_core::{ReasonCode, Refusal, Sandbox};
use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Governed filesystem write runtime: plans of write actions, confined to sandbox roots,
/// snapshotted, audited and reversible.
#[derive(Debug, Parser)]
#[command(
    name = "ailab-sandbox",
    version,
    about,
    long_about = None,
    after_help = "Logs go to standard error; AI_LAB_SANDBOX_LOG sets their level (error, warn, info, debug, trace; default info for serve and mcp, warn otherwise)."
)]
struct Cli {
    /// TOML config file (else AI_LAB_SANDBOX_CONFIG).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Sandbox root, an absolute path; repeat for several (else AI_LAB_SANDBOX_ROOTS, config, /tmp/opencode/sandbox and /opt/ai-lab/sandbox).
    #[arg(long = "root", global = true, value_name = "DIR")]
    roots: Vec<PathBuf>,
    /// State directory for the audit log and artifact registry, an absolute path (else AI_LAB_STATE_DIR, config, /opt/ai-lab/runtime/state or, when that cannot be made or other users could change it, $XDG_STATE_HOME/ailab-sandbox, else ~/.local/state/ailab-sandbox).
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Phase in force (else phase in the config; default 28.3).
    #[arg(long, global = true)]
    phase: Option<String>,
    /// Turn the write executor on (else AI_LAB_ENABLE_SANDBOX_WRITE, then enable_write in the config; default off).
    #[arg(long, global = true)]
    enable_write: bool,
    /// Turn dry-run off (else AI_LAB_SANDBOX_DRY_RUN=false, then dry_run = false in the config; default on).
    #[arg(long, global = true)]
    no_dry_run: bool,
    /// Print machine-readable JSON (serve: its start-up errors only; mcp: never, its
    /// standard output is the session's).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Execute (or simulate) a plan: a JSON file, or - for standard input.
    Run {
        /// PLAN.json or -.
        plan: String,
    },
    /// Governance verdict only: nothing is written (as at every start, a run that died
    /// mid-write is recovered first).
    Check {
        /// The intent, e.g. create_file.
        #[arg(long)]
        intent: String,
        /// The target path.
        #[arg(long)]
        path: String,
        /// The action's description (searched for chmod requests).
        #[arg(long)]
        description: Option<String>,
        /// Bytes the action would leave on disk (0, the default: the size is not judged).
        #[arg(long, default_value_t = 0, value_parser = byte_count, allow_hyphen_values = true)]
        size: u64,
        /// The root, by its configured path.
        #[arg(long = "in-root", value_name = "ROOT")]
        in_root: Option<String>,
    },
    /// Roll a workflow (or one action) back, verified by checksum; only said, not done,
    /// unless writing is on and dry-run off (--enable-write --no-dry-run).
    Rollback {
        /// The workflow.
        workflow_id: String,
        /// Only this action.
        #[arg(long = "action")]
        action_id: Option<String>,
        /// Restore even files changed since the workflow wrote them.
        #[arg(long)]
        force: bool,
    },
    /// The audit trail: its latest lines (with no subcommand), `stats` or `verify`.
    Audit(AuditArgs),
    /// The artifact registry: its latest artifacts (with no subcommand), or `show ID`
    /// with lineage.
    Artifacts(ArtifactArgs),
    /// Execution mode, phase, flags, roots (and those skipped), limits, durability,
    /// counts, notices and version.
    State,
    /// The operation catalog.
    Ops,
    /// Serve the HTTP API (JSON + Prometheus /metrics).
    Serve {
        /// Address to bind (else addr in the config's server table; default 127.0.0.1:8787).
        #[arg(long)]
        addr: Option<String>,
        /// Bearer token every route requires. Other local users can read a command line:
        /// prefer AI_LAB_SANDBOX_TOKEN or the config file.
        #[arg(long)]
        token: Option<String>,
        /// Largest request body in bytes, 1024 to 268435456 (else max_body_bytes in the config's server table; default 64 MiB).
        #[arg(long, value_name = "BYTES", value_parser = body_bytes, allow_hyphen_values = true)]
        max_body_bytes: Option<usize>,
    },
    /// MCP server on standard input/output.
    Mcp,
    /// Remove snapshots of finished workflows older than a duration (e.g. 2w, 7d, 12h, 30m, 90s);
    /// only said, not done, unless writing is on and dry-run off.
    Prune {
        /// Age: a number and a unit, s, m, h, d or w (e.g. 7d).
        #[arg(long = "older-than", value_parser = parse_duration, allow_hyphen_values = true)]
        older_than: std::time::Duration,
    },
}

// `--limit`/`--workflow` shape the list; given with a subcommand they would be ignored,
// so clap refuses the pair.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct AuditArgs {
    #[command(subcommand)]
    sub: Option<AuditSub>,
    /// How many entries, newest first (at least 1).
    #[arg(long, default_value_t = ailab_sandbox_core::sandbox::DEFAULT_LIST_LIMIT, value_parser = at_least_one, allow_hyphen_values = true)]
    limit: usize,
    /// Only this workflow.
    #[arg(long)]
    workflow: Option<String>,
}

#[derive(Debug, Subcommand)]
enum AuditSub {
    /// Counts by status, reason code, mutation class and intent.
    Stats,
    /// Check the hash chain and head; exit 1 when broken, 2 when it cannot be read.
    Verify,
}

// `--limit`/`--workflow` shape the list; given with a subcommand they would be ignored,
// so clap refuses the pair.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ArtifactArgs {
    #[command(subcommand)]
    sub: Option<ArtifactSub>,
    /// How many entries, newest first (at least 1).
    #[arg(long, default_value_t = ailab_sandbox_core::sandbox::DEFAULT_LIST_LIMIT, value_parser = at_least_one, allow_hyphen_values = true)]
    limit: usize,
    /// Only this workflow.
    #[arg(long)]
    workflow: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ArtifactSub {
    /// One artifact and its lineage.
    Show {
        /// The artifact id.
        id: String,
    },
}

/// A list's `--limit`: 0 would answer an empty list for any query (HTTP refuses it too).
/// One too large to count is "all of them".
fn at_least_one(s: &str) -> Result<usize, String> {
    match whole_number(s) {
        Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(format!(
            "'{s}' is not a count of entries; give a whole number from 1 (no sign)"
        )),
    }
}

/// `serve --max-body-bytes`: a count of bytes, said so when it is not one (its range is
/// the configuration's to check, as for `[server] max_body_bytes`).
fn body_bytes(s: &str) -> Result<usize, String> {
    let allowed = format!(
        "give a whole number from 1024 to {}",
        ailab_sandbox_core::config::MAX_BODY_BYTES_LIMIT
    );
    match counted(s) {
        Some(Some(n)) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(None) => Err(format!(
            "'{s}' is more bytes than can be counted; {allowed}"
        )),
        None => Err(format!(
            "'{s}' is not a number of bytes; {allowed} (no sign)"
        )),
    }
}

/// `check --size`: bytes. One too large to count is refused here, not judged as the
/// largest count, which the verdict would then quote as if it had been given.
fn byte_count(s: &str) -> Result<u64, String> {
    match counted(s) {
        Some(Some(n)) => Ok(n),
        Some(None) => Err(format!(
            "'{s}' is more bytes than can be counted; give a whole number from 0 to {}",
            u64::MAX
        )),
        None => Err(format!(
            "'{s}' is not a size in bytes; give a whole number from 0 (no sign or unit)"
        )),
    }
}

/// Digits only: `Some(None)` for a count too large for 64 bits, which a message is not
/// to quote as the largest count, as if it had been given.
fn counted(s: &str) -> Option<Option<u64>> {
    match whole_number(s)? {
        u64::MAX if s.trim_start_matches('0') != u64::MAX.to_string() => Some(None),
        n => Some(Some(n)),
    }
}

/// Digits only, saturating: a count too large for the machine is the largest it holds.
fn whole_number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse().unwrap_or(u64::MAX))
}

/// Exit codes (SPEC §10).
const EXIT_OK: u8 = 0;
const EXIT_REFUSED: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let err = || {
        format!(
            "'{s}' is not a duration; use a whole number (no sign) and a unit: 30s, 15m, 12h, 7d or 2w"
        )
    };
    let unit_at = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (n, unit) = s.split_at(unit_at);
    // An age too large to count prunes nothing, as any beyond the calendar does.
    let n = whole_number(n).ok_or_else(err)?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(err()),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

fn main() -> ExitCode {
    ailab_sandbox_core::confine::root::use_spec_creation_modes();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(with_arguments_escaped(e)),
    };
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(opt) = given_on_both_sides(&args, &valued_globals()) {
        use clap::CommandFactory as _;
        return usage_error(Cli::command().error(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "{opt} is given both before and after the command; give it on one side only (only the values after the command would count, without a word: {})",
                match opt {
                    "--root" => "a plan meant for one root could land in another",
                    "--state-dir" => "the audit trail and registry written would not be the ones meant",
                    _ => "the value before it would be ignored",
                }
            ),
        ));
    }
    // A bad level is refused once the command's output is known, as any configuration.
    let logging = init_tracing(matches!(cli.command, Command::Serve { .. } | Command::Mcp));
    catch_file_size_signal();
    // Before any thread: a connection, a lock, a folder on a write's way each hold one.
    ailab_sandbox_core::confine::kernel::raise_open_file_limit();
    // Standard output is the JSON-RPC channel of `mcp`: nothing else goes there.
    let json = cli.json && !matches!(cli.command, Command::Mcp);
    // Only runs and rollbacks leave lines that say what they did.
    let audited = matches!(cli.command, Command::Run { .. } | Command::Rollback { .. });
    let outcome = logging.map_err(anyhow::Error::from).and_then(|()| run(cli));
    if let Err(e) = std::io::Write::flush(&mut std::io::stdout()) {
        output_failed(e);
    }
    if let Some(why) = OUTPUT_FAILURE.get() {
        // Whatever the command did, its result is lost.
        let see = if audited {
            "; what the command did is on the audit trail (ailab-sandbox audit)"
        } else {
            ""
        };
        err!("error: the result could not be written to standard output ({why}){see}");
        return ExitCode::from(EXIT_USAGE);
    }
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = failure_code(&e);
            let mut reason = human::safe(&format!("{e:#}"));
            // Another process held a file of the state directory past the wait: a busy
            // peer, refused like one (exit 1), not a command that cannot run.
            let busy = code == ReasonCode::Conflict.as_str();
            if busy {
                reason.push_str(
                    ": another process holds it (a stopped or hung one?); try again, or raise limits.lock_wait_seconds",
                );
            }
            if json {
                // Pretty, as every other document `--json` prints.
                out!(
                    "{:#}",
                    serde_json::json!({"reason_code": code, "reason": reason})
                );
            }
            err!("error: {reason}");
            ExitCode::from(if busy { EXIT_REFUSED } else { EXIT_USAGE })
        }
    }
}

/// The global options that take a value (`--root`, `--state-dir`…), as the parser knows
/// them.
fn valued_globals() -> Vec<String> {
    use clap::CommandFactory as _;
    Cli::command()
        .get_arguments()
        .filter(|a| a.is_global_set() && a.get_action().takes_values())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// The global option of `valued` given both before and after the subcommand, if any:
/// the parser keeps only the values after it, without a word.
fn given_on_both_sides<'a>(args: &[std::ffi::OsString], valued: &'a [String]) -> Option<&'a str> {
    let words: Vec<std::borrow::Cow<'_, str>> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .collect();
    // The subcommand: the first word that is neither an option nor an option's value.
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        if valued.iter().any(|v| v == w) {
            i += 2;
        } else if w.starts_with('-') {
            i += 1;
        } else {
            break;
        }
    }
    let (before, after) = words.split_at(i.min(words.len()));
    let uses = |part: &[std::borrow::Cow<'_, str>], opt: &str| {
        part.iter()
            .any(|w| w == opt || w.starts_with(&format!("{opt}=")))
    };
    valued
        .iter()
        .map(String::as_str)
        .find(|opt| uses(before, opt) && uses(after, opt))
}

/// Codes of the CLI itself for a command that could not run at all (exit 2), printed with
/// `--json` as `{"reason_code", "reason"}` like any refusal.
mod codes {
    /// Unknown subcommand or flag, a missing or malformed argument.
    pub const INVALID_USAGE: &str = "invalid_usage";
    /// The configuration (flags, `AI_LAB_*` variables, config file) cannot be used.
    pub const INVALID_CONFIG: &str = ailab_sandbox_core::INVALID_CONFIG;
}

/// A plan file or standard input that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {what}: {}", input_io_words(cause))]
struct UnreadablePlan {
    what: String,
    cause: std::io::Error,
}

fn failure_code(e: &anyhow::Error) -> &'static str {
    use ailab_sandbox_core::Error as E;
    for cause in e.chain() {
        if let Some(e) = cause.downcast_ref::<E>() {
            return e.reason_code();
        }
        if cause.is::<ConfigError>() {
            return codes::INVALID_CONFIG;
        }
        if let Some(e) = cause.downcast_ref::<ailab_sandbox_http::ServeError>() {
            return e.reason_code();
        }
        if let Some(e) = cause.downcast_ref::<RefusedToken>() {
            return e.error.reason_code();
        }
        if cause.is::<UnreadablePlan>() {
            return ReasonCode::InvalidPlan.as_str();
        }
    }
    ReasonCode::IoError.as_str()
}

/// The parser's refusal of the command line `e`, with the arguments it quotes shown as
/// `human::safe` shows any text: a terminal control sequence given as an argument is
/// named, neither run by the terminal nor stripped from the message. The arguments are
/// parsed again escaped, which fails the same way; the parse's own error stands if not.
fn with_arguments_escaped(e: clap::Error) -> clap::Error {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let escaped: Vec<String> = args.iter().map(|a| human::safe(a)).collect();
    if escaped == args {
        return e;
    }
    match Cli::try_parse_from(escaped) {
        Err(again) if again.kind() == e.kind() => again,
        _ => e,
    }
}

/// Help and version print as clap prints them; any other parse error is a usage error, in
/// JSON when `--json` is among the arguments (it could not be parsed with the rest).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) || !std::env::args_os()
        .take_while(|a| a != "--")
        .any(|a| a == "--json" || a.to_string_lossy().starts_with("--json="))
    {
        // As `e.exit()` does, but a help text lost on a full disk is no success either.
        let printed = e
            .print()
            .and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
        if let Err(why) = printed
            && why.kind() != std::io::ErrorKind::BrokenPipe
        {
            err!("error: the text could not be written to standard output ({why})");
            return ExitCode::from(EXIT_USAGE);
        }
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE));
    }
    let text = e.render().to_string();
    if named_command().as_deref() == Some("mcp") {
        // Standard output of `mcp` is the JSON-RPC channel: a client reads any line
        // there as a protocol message.
        err!("{}", text.trim_end());
        return ExitCode::from(EXIT_USAGE);
    }
    // The message without clap's usage and help lines, on one line: "the following
    // required arguments were not provided: <PLAN>".
    let reason = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let reason = reason.trim_start_matches("error: ");
    out!(
        "{:#}",
        serde_json::json!({"reason_code": codes::INVALID_USAGE, "reason": human::safe(reason)})
    );
    err!("{}", text.trim_end());
    ExitCode::from(EXIT_USAGE)
}

/// The subcommand the arguments name, read as clap would read them had they parsed: the
/// first word that is neither an option nor the value of one (an unknown option is taken
/// to have none).
fn named_command() -> Option<String> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            return None;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let takes_value = !long.contains('=')
                && cli
                    .get_arguments()
                    .any(|a| a.get_long() == Some(long) && a.get_action().takes_values());
            if takes_value {
                args.next();
            }
        } else if !arg.starts_with('-') || arg == "-" {
            return Some(arg.into_owned());
        }
    }
    None
}

/// A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, whose default action
/// kills the process: a server would die on one large plan, and a log grown to the limit
/// would kill every start in its recovery. Caught, the write fails with EFBIG instead,
/// which the runtime reports and undoes like any I/O error.
fn catch_file_size_signal() {
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGXFSZ, seen) {
        tracing::warn!(error = %e, "could not catch SIGXFSZ; a write past the file-size limit would end the process");
    }
}

/// The variable that sets how much is logged to standard error.
const LOG_VAR: &str = "AI_LAB_SANDBOX_LOG";

/// The log level when `AI_LAB_SANDBOX_LOG` is unset: `info` for a server (`serve`, `mcp`:
/// a line per request or session), `warn` for a command.
fn default_level(server: bool) -> tracing::Level {
    if server {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    }
}

/// The log level `AI_LAB_SANDBOX_LOG` asks for ([`default_level`] when unset).
fn log_level(server: bool) -> Result<tracing::Level, ConfigError> {
    let refused = |what: String| {
        ConfigError(format!(
            "{LOG_VAR} is {what}: give error, warn, info, debug or trace, or leave it unset ({} for this command)",
            default_level(server).as_str().to_ascii_lowercase()
        ))
    };
    match std::env::var(LOG_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(default_level(server)),
        Err(std::env::VarError::NotUnicode(v)) => Err(refused(format!(
            "not UTF-8 ({})",
            v.to_string_lossy().escape_debug()
        ))),
        Ok(v) => match v.to_ascii_lowercase().as_str() {
            "error" => Ok(tracing::Level::ERROR),
            "warn" => Ok(tracing::Level::WARN),
            "info" => Ok(tracing::Level::INFO),
            "debug" => Ok(tracing::Level::DEBUG),
            "trace" => Ok(tracing::Level::TRACE),
            _ => Err(refused(format!(
                "{:?}",
                v.chars().take(64).collect::<String>()
            ))),
        },
    }
}

/// Logs to standard error at the level [`log_level`] gives; at its default when the
/// variable is refused (the refusal is then the command's answer).
fn init_tracing(server: bool) -> Result<(), ConfigError> {
    let asked = log_level(server);
    let level = asked.clone().unwrap_or(default_level(server));
    // The MCP SDK's own INFO lines print its Rust values (`peer_info=Some(...)`): kept
    // for debugging, not for an operator's log.
    let sdk = if level >= tracing::Level::DEBUG {
        level
    } else {
        level.min(tracing::Level::WARN)
    };
    let targets = tracing_subscriber::filter::Targets::new()
        .with_default(level)
        .with_target("rmcp", sdk);
    // A log line lost on a stderr that cannot be written is lost: reporting that on
    // the same stderr would panic and stop the command, or the server.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(level)
        .with_target(false)
        .finish();
    let _ = tracing::subscriber::set_global_default(
        tracing_subscriber::layer::SubscriberExt::with(subscriber, targets),
    );
    asked.map(drop)
}

fn load_config(cli: &Cli) -> Result<Config> {
    let (addr, token, max_body_bytes) = match &cli.command {
        Command::Serve {
            addr,
            token,
            max_body_bytes,
        } => (addr.clone(), token.clone(), *max_body_bytes),
        _ => (None, None, None),
    };
    if token.is_some() {
        err!(
            "warning: --token is visible to every local user in the process list; pass it in AI_LAB_SANDBOX_TOKEN or the config file instead"
        );
    }
    let flags = Overrides {
        roots: cli.roots.clone(),
        state_dir: cli.state_dir.clone(),
        phase: cli.phase.clone(),
        enable_write: cli.enable_write,
        no_dry_run: cli.no_dry_run,
        addr,
        token,
        max_body_bytes,
    };
    // A variable a flag overrides is not read (`--config` too), so neither judged.
    let read = |k: &str| !(flags.overrides(k) || (k == envvars::CONFIG && cli.config.is_some()));
    // A value that is not UTF-8 must not read as unset.
    if let Some(name) = envvars::ALL
        .into_iter()
        .find(|k| read(k) && matches!(std::env::var(k), Err(std::env::VarError::NotUnicode(_))))
    {
        bail!("{name} is not valid UTF-8; unset it, or give a value in UTF-8");
    }
    let env = |k: &str| std::env::var(k).ok().filter(|_| read(k));
    let path = match (&cli.config, env(envvars::CONFIG)) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(p)) if p.is_empty() => bail!(
            "{} is set but empty; unset it to run without a config file, or give the file's path",
            envvars::CONFIG
        ),
        (None, p) => p.map(PathBuf::from),
    };
    let file = match &path {
        Some(p) => {
            // Named by the variable, the message says so: the operator may not know it
            // is set.
            let by = if cli.config.is_some() {
                String::new()
            } else {
                format!(" (named by {})", envvars::CONFIG)
            };
            let named = format!("config file {}{by}", p.display());
            // Read only if no other user could have changed it: it can turn writing on.
            let bytes = ailab_sandbox_core::confine::read_operator_file(p, "config file", MAX_CONFIG_BYTES)
                .map_err(|e| anyhow::anyhow!("{e}{by}"))?
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "cannot read {named}: it is larger than {MAX_CONFIG_BYTES} bytes, the most a config file may be"
                    )
                })?;
            let text = String::from_utf8(bytes).map_err(|_| {
                anyhow::anyhow!(
                    "cannot read {named}: it is not UTF-8 text, which a TOML file must be"
                )
            })?;
            Some(RawConfig::from_toml(&text).with_context(|| named.clone())?)
        }
        None => None,
    };
    Ok(Config::resolve(file, &env, &flags)?)
}

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    out!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Standard error says why whether or not `--json` puts the reason on standard output,
/// as for a command that cannot run at all.
fn refusal_exit(json: bool, r: &Refusal, code: u8) -> Result<u8> {
    if json {
        print_json(&serde_json::json!({"reason_code": r.reason_code, "reason": r.reason}))?;
    }
    err!("refused ({}): {}", r.reason_code, human::safe(&r.reason));
    Ok(code)
}

/// The exit code of a refusal: a malformed id or plan is the caller's input error (2);
/// anything else was refused on its merits (1).
fn refused_exit_code(code: ReasonCode) -> u8 {
    match code {
        ReasonCode::InvalidId | ReasonCode::InvalidPlan => EXIT_USAGE,
        _ => EXIT_REFUSED,
    }
}

/// Checks an optional `--workflow` filter, so that a malformed one is an input error rather
/// than a silently empty list.
fn check_workflow_filter(workflow: Option<&str>) -> Result<(), Refusal> {
    workflow.map_or(Ok(()), |w| check_id("workflow_id", w))
}

/// An id the command names that cannot be one: refused before the runtime opens, which
/// would make the roots and the state directory for a command that cannot run.
fn malformed_id(command: &Command) -> Option<Refusal> {
    match command {
        Command::Rollback {
            workflow_id,
            action_id,
            ..
        } => check_id("workflow_id", workflow_id)
            .and_then(|()| {
                action_id
                    .as_deref()
                    .map_or(Ok(()), |a| check_id("action_id", a))
            })
            .err(),
        Command::Audit(a) if a.sub.is_none() => check_workflow_filter(a.workflow.as_deref()).err(),
        Command::Artifacts(a) => match &a.sub {
            Some(ArtifactSub::Show { id }) => check_id("artifact_id", id).err(),
            None => check_workflow_filter(a.workflow.as_deref()).err(),
        },
        _ => None,
    }
}

/// The refusal of a command naming a malformed id (`r`), as the command would have
/// printed it: a rollback's report, or the refusal alone.
fn malformed_id_exit(command: &Command, r: &Refusal, json: bool) -> Result<u8> {
    match command {
        Command::Rollback {
            workflow_id,
            action_id,
            ..
        } => show_rollback(
            &ailab_sandbox_core::sandbox::RollbackReport {
                workflow_id: workflow_id.clone(),
                status: ailab_sandbox_core::sandbox::RollbackStatus::Refused,
                steps_rolled_back: 0,
                reason_code: Some(r.reason_code),
                reason: Some(r.reason.clone()),
                conflicts: Vec::new(),
                steps: Vec::new(),
            },
            action_id.as_deref(),
            json,
        ),
        _ => refusal_exit(json, r, EXIT_USAGE),
    }
}

fn run(cli: Cli) -> Result<u8> {
    let config = load_config(&cli).map_err(|e| ConfigError(format!("{e:#}")))?;
    if let Command::Ops = cli.command {
        return ops(&config, cli.json);
    }
    if let Command::Serve { token, .. } = &cli.command {
        return serve(config, token_source(token.is_some()));
    }
    let verify_only = matches!(
        &cli.command,
        Command::Audit(a) if matches!(a.sub, Some(AuditSub::Verify))
    );
    let (state_dir, durable) = (config.state_dir.clone(), config.durability.is_durable());
    if let Some(r) = malformed_id(&cli.command) {
        return malformed_id_exit(&cli.command, &r, cli.json);
    }
    // Reading the records of a state directory that is not there (a mistyped path) must
    // neither make one nor call its empty trail intact, or list nothing as if it held
    // nothing: the operator's own path, looked at before the runtime opens anything.
    let missing = explicit_state_dir_missing(&config);
    if missing && matches!(&cli.command, Command::Audit(_) | Command::Artifacts(_)) {
        // A path to correct (`invalid_config`, exit 2), not a trail found broken (exit
        // 1, which a script may take for tampering).
        return Err(no_state_dir_to_read(&state_dir).into());
    }
    // Read before the runtime opens: a plan that cannot be read leaves nothing behind
    // (no root or state directory created).
    let plan_bytes = match &cli.command {
        Command::Run { plan } => Some(read_plan(plan, config.max_body_bytes)?),
        _ => None,
    };
    let mut sandbox = match Sandbox::open(config) {
        Ok(s) => s,
        Err(e) if verify_only && e.allows_read_only_verify() => {
            return verify_read_only(&state_dir, durable, &e, cli.json);
        }
        Err(e) => return Err(e.into()),
    };
    tell_of_start(&mut sandbox, &cli);
    run_command(sandbox, cli.command, plan_bytes, cli.json)
}

/// Runs the command on the opened runtime, each in a function of its own that prints
/// its result and says its exit code.
fn run_command(
    sandbox: Sandbox,
    command: Command,
    plan_bytes: Option<Vec<u8>>,
    json: bool,
) -> Result<u8> {
    match command {
        Command::Run { .. } => run_plan(&sandbox, &plan_bytes.unwrap_or_default(), json),
        Command::Check {
            intent,
            path,
            description,
            size,
            in_root,
        } => check(
            &sandbox,
            &CheckRequest {
                intent: &intent,
                path: &path,
                description: description.as_deref(),
                size,
                root: in_root.as_deref(),
            },
            json,
        ),
        Command::Rollback {
            workflow_id,
            action_id,
            force,
        } => rollback(&sandbox, &workflow_id, action_id, force, json),
        Command::Audit(a) => audit(&sandbox, a, json),
        Command::Artifacts(a) => artifacts(&sandbox, a, json),
        Command::State => state(&sandbox, json),
        Command::Prune { older_than } => prune(&sandbox, older_than, json),
        Command::Mcp => mcp(sandbox),
        Command::Ops | Command::Serve { .. } => Ok(EXIT_OK),
    }
}

/// Whether the state directory was set explicitly and is not there: asked of the path
/// as the operator gave it, since the runtime, once it opens, makes a missing one.
#[allow(clippy::disallowed_methods)]
fn explicit_state_dir_missing(config: &Config) -> bool {
    config.state_dir_explicit
        && matches!(std::fs::symlink_metadata(&config.state_dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// What `audit` and `artifacts` say of a state directory that is not there: a setting to
/// correct that names the path, never an empty trail called intact, nor a broken one.
fn no_state_dir_to_read(state_dir: &Path) -> ConfigError {
    ConfigError(format!(
        "the state directory {} does not exist: there is no audit trail or registry there to read (nothing was made); give the state directory the runtime writes to",
        state_dir.display()
    ))
}

/// Says on standard error what the start noticed, and how the process is confined.
fn tell_of_start(sandbox: &mut Sandbox, cli: &Cli) {
    // With --json too: standard output is the document, standard error is for people
    // (a recovery that could not judge a run must be seen).
    for n in sandbox.notices() {
        err!("note: {}", human::safe(n));
    }
    report_confinement(
        sandbox.confine_process(),
        cli.json || matches!(cli.command, Command::Mcp),
    );
}

/// `run`: the plan's result, exit 0 when it ran or was simulated and 1 when it failed;
/// a plan that cannot be read as one, or whose ids are invalid, is the caller's input
/// error (2).
fn run_plan(sandbox: &Sandbox, bytes: &[u8], json: bool) -> Result<u8> {
    match sandbox.run_plan_json(bytes) {
        Ok(result) => {
            if json {
                print_json(&result)?;
            } else {
                human::run_result(&result);
            }
            Ok(if result.is_success() || result.is_simulated() {
                EXIT_OK
            } else {
                EXIT_REFUSED
            })
        }
        Err(r) => refusal_exit(json, &r, EXIT_USAGE),
    }
}

/// `check`: governance's verdict on one action, exit 1 when it would be refused.
fn check(sandbox: &Sandbox, asked: &CheckRequest<'_>, json: bool) -> Result<u8> {
    let v = sandbox.check(asked);
    if json {
        print_json(&v)?;
    } else {
        human::check(&v);
    }
    Ok(if v.allowed { EXIT_OK } else { EXIT_REFUSED })
}

/// `rollback`: the report, exit 0 when it rolled back or was simulated; a refusal's
/// exit code says whose input was wrong.
fn rollback(
    sandbox: &Sandbox,
    workflow_id: &str,
    action_id: Option<String>,
    force: bool,
    json: bool,
) -> Result<u8> {
    let report = sandbox.rollback_workflow(
        workflow_id,
        &RollbackOptions {
            action_id: action_id.clone(),
            force,
        },
    );
    show_rollback(&report, action_id.as_deref(), json)
}

/// Prints a rollback's report and says its exit code.
fn show_rollback(
    report: &ailab_sandbox_core::sandbox::RollbackReport,
    action_id: Option<&str>,
    json: bool,
) -> Result<u8> {
    if json {
        print_json(report)?;
        // As for any refusal: the reason on standard error too, under the status (a
        // rollback that failed midway restored some of its steps).
        if let (Some(code), Some(why)) = (report.reason_code, &report.reason) {
            err!("{} ({code}): {}", report.status.as_str(), human::safe(why));
        }
    } else {
        human::rollback(report, action_id);
    }
    Ok(if report.is_success() || report.is_simulated() {
        EXIT_OK
    } else {
        report.reason_code.map_or(EXIT_REFUSED, refused_exit_code)
    })
}

/// `audit`: its stats, its verification, or its latest lines (a malformed `--workflow`
/// refused as an input error rather than listing nothing).
fn audit(sandbox: &Sandbox, a: AuditArgs, json: bool) -> Result<u8> {
    match a.sub {
        Some(AuditSub::Stats) => {
            let s = sandbox.audit_stats()?;
            if json {
                print_json(&s)?
            } else {
                human::audit_stats(&s)
            }
            Ok(EXIT_OK)
        }
        Some(AuditSub::Verify) => show_verified(&sandbox.audit_verify()?, json),
        // A malformed `--workflow` was refused before the runtime opened.
        None => {
            let entries = sandbox.audit_entries(a.limit, a.workflow.as_deref())?;
            if json {
                print_json(&entries)?
            } else {
                human::audit(&entries)
            }
            Ok(EXIT_OK)
        }
    }
}

/// `artifacts`: one artifact with its lineage (`show`), or the latest ones; a
/// malformed id or `--workflow` refused as an input error, an unknown id as not found.
fn artifacts(sandbox: &Sandbox, a: ArtifactArgs, json: bool) -> Result<u8> {
    match a.sub {
        // Malformed ids were refused before the runtime opened.
        Some(ArtifactSub::Show { id }) => {
            match sandbox.marked_with_lineage(&id)? {
                Some((artifact, lineage)) => {
                    if json {
                        // A struct, not `json!`: the artifact's fields keep the order
                        // every other document gives them.
                        #[derive(Serialize)]
                        struct Shown {
                            artifact: ListedArtifact,
                            lineage: Vec<ListedArtifact>,
                        }
                        print_json(&Shown { artifact, lineage })?;
                    } else {
                        human::artifact_show(&artifact, &lineage);
                    }
                    Ok(EXIT_OK)
                }
                None => {
                    let r = Refusal::new(
                        ReasonCode::NotFound,
                        format!("no artifact has the id '{}'", id.escape_debug()),
                    );
                    refusal_exit(json, &r, EXIT_REFUSED)
                }
            }
        }
        None => {
            let list = sandbox.marked(sandbox.artifacts(a.limit, a.workflow.as_deref())?)?;
            if json {
                print_json(&list)?
            } else {
                human::artifacts(&list)
            }
            Ok(EXIT_OK)
        }
    }
}

/// `state`: the runtime's state document.
fn state(sandbox: &Sandbox, json: bool) -> Result<u8> {
    let doc = sandbox.state_doc()?;
    if json {
        print_json(&doc)?
    } else {
        human::state(&doc)
    }
    Ok(EXIT_OK)
}

/// `prune`: what was pruned or would be, and each workflow that could not be, which
/// makes the exit code 1 for the operator to see that the next prune tries again.
fn prune(sandbox: &Sandbox, older_than: std::time::Duration, json: bool) -> Result<u8> {
    match sandbox.prune(older_than) {
        Ok(report) => {
            if json {
                print_json(&report)?;
            } else if report.simulated {
                let (why, fix) = report
                    .dry_run_reason
                    .unwrap_or(ailab_sandbox_core::context::DryRunReason::SandboxDisabled)
                    .explained();
                out!(
                    "would prune {}{}, keep {}{}; nothing was removed: {why}; {fix} to prune",
                    workflows(report.workflows_pruned.len()),
                    named(&report.workflows_pruned),
                    report.workflows_kept,
                    not_prunable(&report)
                );
            } else {
                out!(
                    "pruned {}{}, kept {}{}",
                    workflows(report.workflows_pruned.len()),
                    named(&report.workflows_pruned),
                    report.workflows_kept,
                    not_prunable(&report)
                );
            }
            if report.workflows_failed.is_empty() {
                return Ok(EXIT_OK);
            }
            if !json {
                for f in &report.workflows_failed {
                    err!(
                        "could not prune workflow {} ({}): {}; the next prune tries again",
                        human::safe(&f.workflow_id),
                        f.reason_code,
                        human::safe(&f.reason)
                    );
                }
            }
            Ok(EXIT_REFUSED)
        }
        Err(r) => refusal_exit(json, &r, EXIT_REFUSED),
    }
}

/// `audit verify` where the runtime cannot start because it may not write (a read-only
/// copy of the state directory, a read-only mount), a state file it does not read here
/// is of the wrong kind (the seal key), or no root is usable: the trail is checked as it
/// is on disk.
fn verify_read_only(
    state_dir: &std::path::Path,
    durable: bool,
    why: &ailab_sandbox_core::Error,
    json: bool,
) -> Result<u8> {
    let v = ailab_sandbox_core::audit::verify_read_only(state_dir, durable).with_context(|| {
        format!(
            "read the audit trail and registry in {}",
            state_dir.display()
        )
    })?;
    // With --json too, as every notice: standard output holds only the report.
    err!(
        "note: the runtime cannot start here ({}); the trail was verified read-only, without recovery",
        human::safe(&why.to_string())
    );
    show_verified(&v, json)
}

/// Prints an `audit verify` report; exit 1 when the trail is broken.
fn show_verified(v: &ailab_sandbox_core::audit::VerifyReport, json: bool) -> Result<u8> {
    if json {
        print_json(v)?
    } else {
        human::verify(v)
    }
    Ok(if v.ok { EXIT_OK } else { EXIT_REFUSED })
}

/// The workflows a prune could not prune, counted beside those it kept for their age
/// (each is said on its own line, with why).
fn not_prunable(report: &ailab_sandbox_core::sandbox::PruneReport) -> String {
    match report.workflows_failed.len() {
        0 => String::new(),
        n => format!(" and {n} it could not prune (below)"),
    }
}

/// `n` workflow(s), in words.
fn workflows(n: usize) -> String {
    if n == 1 {
        "1 workflow".to_owned()
    } else {
        format!("{n} workflows")
    }
}

/// ` (a, b, c)` after a count, or nothing for none.
fn named(ids: &[String]) -> String {
    // A line a person can read: `--json` lists them all.
    const SHOWN: usize = 20;
    match ids.len() {
        0 => String::new(),
        n if n <= SHOWN => format!(" ({})", ids.join(", ")),
        n => format!(
            " ({}, and {} more: --json lists them all)",
            ids[..SHOWN].join(", "),
            n - SHOWN
        ),
    }
}

/// The plan the operator names: a file (read anywhere, never written), or `-` for stdin;
/// at most `limit` bytes (the server's body limit), so that `run /dev/zero` ends.
fn read_plan(plan: &str, limit: usize) -> Result<Vec<u8>> {
    let what = if plan == "-" {
        "the plan from standard input".to_owned()
    } else {
        format!("plan file {plan}")
    };
    let unreadable = |cause| UnreadablePlan {
        what: what.clone(),
        cause,
    };
    let bytes = if plan == "-" {
        read_bounded(std::io::stdin(), limit as u64)
    } else {
        open_input(Path::new(plan)).and_then(|f| read_bounded(f, limit as u64))
    }
    .map_err(unreadable)?;
    bytes.ok_or_else(|| {
        UnreadablePlan {
            what,
            cause: std::io::Error::other(format!(
                "it is larger than {limit} bytes, the limit max_body_bytes sets"
            )),
        }
        .into()
    })
}

/// The most a config file may hold: far more than any set of roots and lists needs.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The operator's own input file (a plan, the config), opened for reading before
/// confinement starts and never written. A link is followed, as the operator's shell
/// would.
fn open_input(path: &Path) -> std::io::Result<impl Read> {
    #[allow(clippy::disallowed_types)]
    std::fs::File::open(path)
}

/// At most `limit` bytes of the operator's input, `None` if it holds more, so that an
/// input that never ends (`/dev/zero`) is refused at the limit rather than read until
/// memory runs out.
fn read_bounded(source: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    source.take(limit + 1).read_to_end(&mut bytes)?;
    Ok(Some(bytes).filter(|b| b.len() as u64 <= limit))
}

/// [`ailab_sandbox_core::io_words`] for an input file the operator names, opened
/// following links: a loop there is a loop, not a link refused (as the runtime's own
/// opens refuse every link).
fn input_io_words(e: &std::io::Error) -> String {
    if ailab_sandbox_core::is_link_loop(e) {
        "its path goes through symbolic links that lead back to themselves (a loop) or through too many of them".to_owned()
    } else {
        ailab_sandbox_core::io_words(e)
    }
}

#[derive(Serialize)]
struct OpView {
    name: &'static str,
    mutation_class: ailab_sandbox_core::catalog::MutationClass,
    extensions: Vec<String>,
    max_size_bytes: Option<u64>,
    risk_level: ailab_sandbox_core::catalog::RiskLevel,
    requires_governance: bool,
}

/// The catalog, with the extensions each operation may write under the configured lists.
fn ops(config: &Config, json: bool) -> Result<u8> {
    let view: Vec<OpView> = OPERATIONS
        .iter()
        .map(|o| OpView {
            name: o.name,
            mutation_class: o.mutation_class,
            extensions: writable_extensions(o, &config.extensions),
            max_size_bytes: o.max_size_bytes,
            risk_level: o.risk_level,
            requires_governance: o.requires_governance,
        })
        .collect();
    if json {
        print_json(&view)?;
    } else {
        human::ops(&config.extensions);
    }
    Ok(EXIT_OK)
}

/// Where `serve`'s token came from, in the order the configuration reads them: the
/// refusal of a bad one names it, since a variable left set in the environment wins over
/// the config file unseen.
fn token_source(flag: bool) -> &'static str {
    if flag {
        "--token"
    } else if std::env::var_os(envvars::TOKEN).is_some() {
        "the environment's AI_LAB_SANDBOX_TOKEN"
    } else {
        "[server] token in the config file"
    }
}

/// A token `serve` refuses ([`ailab_sandbox_http::ServeError`]), naming where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{error}; this one came from {from}")]
struct RefusedToken {
    error: ailab_sandbox_http::ServeError,
    from: &'static str,
}

fn serve(config: Config, token_from: &'static str) -> Result<u8> {
    let opts = ailab_sandbox_http::ServeOptions {
        addr: config.addr.clone(),
        token: config.token.clone(),
        body_limit_bytes: config.max_body_bytes,
        ..Default::default()
    };
    // Refuse a public address without a token before touching the roots.
    let resolved = ailab_sandbox_http::resolve_addr(&opts.addr)?;
    ailab_sandbox_http::check_exposure(&opts.addr, &resolved, opts.token.as_deref()).map_err(
        |error| match error {
            ailab_sandbox_http::ServeError::EmptyToken
            | ailab_sandbox_http::ServeError::ShortToken
            | ailab_sandbox_http::ServeError::UnsendableToken => anyhow::Error::new(RefusedToken {
                error,
                from: token_from,
            }),
            other => other.into(),
        },
    )?;
    // Bound before the runtime opens: a port another program holds makes no root or
    // state directory.
    let listener = ailab_sandbox_http::bind(&opts)?;
    let mut sandbox = Sandbox::open(config)?;
    for n in sandbox.notices() {
        err!("note: {}", human::safe(n));
    }
    // Before the runtime starts its threads: Landlock binds only threads created later.
    report_confinement(sandbox.confine_process(), false);
    ailab_sandbox_http::run_bound(std::sync::Arc::new(sandbox), opts, listener, |local| {
        // A supervisor that closed its end of stderr must not stop the server.
        err!("listening on http://{local}");
    })?;
    Ok(EXIT_OK)
}

/// Says on stderr when the kernel could not add its confinement (the root handles still
/// confine every write).
fn report_confinement(k: &ailab_sandbox_core::confine::kernel::KernelConfinement, quiet: bool) {
    if !k.is_enforced() && !quiet {
        err!(
            "warning: kernel confinement (Landlock) is not in force: {}",
            k.detail.as_deref().unwrap_or("unknown reason")
        );
    }
}

fn mcp(sandbox: Sandbox) -> Result<u8> {
    ailab_sandbox_mcp::run_stdio(std::sync::Arc::new(sandbox)).context("MCP server")?;
    Ok(EXIT_OK)
}
