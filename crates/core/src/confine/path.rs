//! String-level path checks. They run before any I/O and produce the reason codes; the
//! root directory handle (see [`super::root`]) is what actually guarantees confinement.
//!
//! `detect_path_traversal`, `check_path_depth`, `resolve_sandbox_path`,
//! `is_within_sandbox`, `check_reserved` and `ExtensionPolicy` judge a path as written;
//! `detect_misleading_name` refuses a name that reads otherwise than it is written, with
//! `unseen` saying where an invisible character belongs to a script or an emoji sequence
//! and where it only hides.

use crate::catalog::shown_ext;
use crate::reason::{ReasonCode, Refusal, Verdict};
use std::path::{Component, Path, PathBuf};

/// Default `MAX_PATH_DEPTH` (SPEC §2).
pub const MAX_PATH_DEPTH: usize = 8;
/// Longest file name in bytes (the usual `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// The reserved snapshot folder present in every root.
pub const ROLLBACK_DIR: &str = ".rollback";
/// Marker inside the names of the runtime's own temporary files. Agents may not create
/// such names: start-up recovery removes them.
pub const TEMP_MARKER: &str = ".ailab-tmp-";

/// A path relative to a sandbox root that passed the lexical checks: no `..`, no `.`, no
/// empty components, no control characters, each name within `MAX_NAME_BYTES`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath {
    components: Vec<String>,
}

impl RelPath {
    /// The components, first to last.
    pub fn components(&self) -> &[String] {
        &self.components
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.components.len()
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.components.last().map_or("", String::as_str)
    }

    /// All but the last component.
    pub fn parent_components(&self) -> &[String] {
        let n = self.components.len().saturating_sub(1);
        &self.components[..n]
    }

    /// The path as a `/`-joined string, the form shown to users and stored in records.
    pub fn as_string(&self) -> String {
        self.components.join("/")
    }

    /// The path for `Dir` calls.
    pub fn to_path_buf(&self) -> PathBuf {
        self.components.iter().collect()
    }

    /// Builds from components that were validated elsewhere (records the runtime wrote).
    pub fn from_components(components: Vec<String>) -> Self {
        Self { components }
    }

    /// Builds from a path as the runtime records it (components joined by `/`, validated
    /// when it was recorded).
    pub fn from_recorded(path: &str) -> Self {
        Self::from_components(path.split('/').map(str::to_owned).collect())
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_string())
    }
}

/// Refuses a path that reads otherwise than it is written: one holding a bidirectional
/// formatting character (`a\u{202E}txt.sh` shows as `ahs.txt`), or a character readers
/// do not show where it has no use (`no\u{200B}tes.md` shows as `notes.md`, another
/// file). Asked of every path a caller gives ([`resolve_sandbox_path`]), not of the
/// records of writes already made: an earlier version wrote such names, and their
/// snapshots still restore.
pub fn detect_misleading_name(path: &str) -> Verdict {
    if let Some(c) = path.chars().find(|c| is_bidi_control(*c)) {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            format!(
                "the path {} contains the bidirectional formatting character U+{:04X}, which makes a name read otherwise than it is written (`a\\u{{202E}}txt.sh` shows as `ahs.txt`); paths may not contain them (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069): remove it",
                shown_path(path),
                c as u32
            ),
        )
        .malformed());
    }
    if let Some(c) = path.chars().find(|c| is_separator_lookalike(*c)) {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            format!(
                "the path {} contains U+{:04X}, which looks like a path separator, so that a name reads as folders (`..\\u{{2215}}etc` shows as `../etc`); paths may not contain slash or backslash look-alikes (U+2044, U+2215, U+2216, U+2571, U+2572, U+27CB, U+27CD, U+29F5 to U+29F9, U+2AFB, U+2AFD, U+FE68, U+FF0F, U+FF3C, U+1F67C, U+1F67D, other scripts' strokes drawn so, and the combining solidus overlays U+0337, U+0338, U+20E5): name folders with `/`, and use another character within a name",
                shown_path(path),
                c as u32
            ),
        )
        .malformed());
    }
    if let Some(part) = path.split('/').find(|part| reads_as_dot_component(part)) {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            format!(
                "the path {} has a component written with dot look-alikes ({}), which reads as `.` or `..` (`\\u{{2024}}\\u{{2024}}/etc` shows as `../etc`); a path may not have such a component: remove it, or give the name other characters",
                shown_path(path),
                part.chars()
                    .map(|c| format!("U+{:04X}", c as u32))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        )
        .malformed());
    }
    let Some(c) = super::unseen::first_unseen(path) else {
        return Ok(());
    };
    Err(Refusal::new(
        ReasonCode::PathTraversal,
        format!(
            "the path {} contains U+{:04X}, a character readers do not show, so that two names look the same (`no\\u{{200B}}tes.md` shows as `notes.md`); paths may not contain zero-width characters, fillers, line or paragraph separators or other invisible ones, except where a script or an emoji sequence needs one (a joiner after or before a virama, between letters of a joining script such as Arabic or between emoji; a variation selector after an emoji, a Han character or a Mongolian letter; a flag's tags): remove it",
            shown_path(path),
            c as u32
        ),
    )
    .malformed())
}

/// Whether `c` looks like `/` or `\` (the fraction and division slashes, the set minus,
/// the fullwidth and small forms, the mathematical, box-drawing and ornamental
/// diagonals and solidi).
fn is_separator_lookalike(c: char) -> bool {
    matches!(
        c,
        '\u{2044}'
            | '\u{2215}'
            | '\u{2216}'
            | '\u{2571}'
            | '\u{2572}'
            | '\u{27CB}'
            | '\u{27CD}'
            | '\u{29F5}'
            | '\u{29F6}'
            | '\u{29F7}'
            | '\u{29F8}'
            | '\u{29F9}'
            | '\u{2AFB}'
            | '\u{2AFD}'
            | '\u{FE68}'
            | '\u{FF0F}'
            | '\u{FF3C}'
            | '\u{1F67C}'
            | '\u{1F67D}'
            // Strokes and signs of other scripts drawn as one, and the combining
            // solidus overlays (`..\u{338}etc` shows as `../etc`).
            | '\u{1735}'
            | '\u{2041}'
            | '\u{2CC6}'
            | '\u{2F02}'
            | '\u{2F03}'
            | '\u{3033}'
            | '\u{31D3}'
            | '\u{31D4}'
            | '\u{1D20F}'
            | '\u{1D23A}'
            | '\u{1D23B}'
            | '\u{0337}'
            | '\u{0338}'
            | '\u{20E5}'
    )
}

/// Whether a component is written with dot look-alikes (the leaders, the ellipsis, the
/// small and fullwidth full stops, other scripts' dots) and shows one or two dots: it
/// reads as `.` or `..` while being a name.
fn reads_as_dot_component(part: &str) -> bool {
    let mut dots = 0;
    let mut lookalike = false;
    for c in part.chars() {
        dots += match c {
            '.' => 1,
            '\u{2025}' => 2,
            '\u{2026}' => 3,
            c if is_rare_dot(c) => 1,
            '\u{FF0E}' | '\u{FF61}' | '\u{00B7}' | '\u{30FB}' | '\u{FF65}' => 1,
            // A space beside the dots is not seen: `..\u{A0}` shows as `..`.
            c if c.is_whitespace() => 0,
            _ => return false,
        };
        lookalike |= c != '.';
    }
    lookalike && (1..=2).contains(&dots)
}

/// Dots other than `.` seldom met in a name (the one and two dot leaders, small and
/// raised stops, other scripts' full stops and word separators): escaped wherever a
/// name is shown. The fullwidth stops and the middle dot, common in CJK and Catalan
/// names, are not.
fn is_rare_dot(c: char) -> bool {
    matches!(
        c,
        '\u{2024}'
            | '\u{2025}'
            | '\u{2027}'
            | '\u{FE52}'
            | '\u{0387}'
            | '\u{0701}'
            | '\u{0702}'
            | '\u{1427}'
            | '\u{16EB}'
            | '\u{2219}'
            | '\u{22C5}'
            | '\u{2E31}'
            | '\u{2E33}'
            | '\u{A4F8}'
            | '\u{A60E}'
            | '\u{A78F}'
            | '\u{10101}'
            | '\u{10A50}'
            | '\u{1D16D}'
    )
}

/// Whether `c` is a bidirectional formatting character: an embedding, override or
/// isolate, or a mark (Unicode's `Bidi_Control`).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Refuses NUL and control characters, `~` at the start, `..` and `.` components, empty
/// components and backslashes. The string is taken literally: never decoded, expanded or
/// trimmed.
pub fn detect_path_traversal(path: &str) -> Verdict {
    let shown = shown_path(path);
    // Refused for how it is written; an escape attempt only if it also aims out.
    let aims_out = path.starts_with(['/', '~']) || path.split(['/', '\\']).any(|c| c == "..");
    let slip = |r: Refusal| if aims_out { r } else { r.malformed() };
    if path.is_empty() {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            "the path is empty; give the path of the file or directory relative to a sandbox root, e.g. notes/hello.md or notes",
        )
        .malformed());
    }
    if path.contains('\0') {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            format!(
                "the path {shown} contains a NUL byte; paths may not contain control characters"
            ),
        ));
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(slip(Refusal::new(
            ReasonCode::PathTraversal,
            format!("the path {shown} contains a control character; paths may not contain them"),
        )));
    }
    if path.starts_with('~') {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            format!(
                "the path {shown} starts with '~'; home-directory expansion is never done, give a path relative to a sandbox root"
            ),
        ));
    }
    if path.contains('\\') {
        return Err(slip(Refusal::new(
            ReasonCode::PathTraversal,
            format!("the path {shown} contains a backslash; use '/' as the only separator"),
        )));
    }
    if path == "/" {
        return Err(Refusal::new(
            ReasonCode::PathTraversal,
            "the path '/' names no file, only the top of the filesystem; give a path relative to a sandbox root, such as \"notes/todo.md\"",
        )
        .malformed());
    }
    let body = path.strip_prefix('/').unwrap_or(path);
    for comp in body.split('/') {
        match comp {
            ".." => {
                return Err(Refusal::new(
                    ReasonCode::PathTraversal,
                    format!(
                        "the path {shown} contains a '..' component; paths must stay inside the sandbox root"
                    ),
                ));
            }
            "." => {
                return Err(slip(Refusal::new(
                    ReasonCode::PathTraversal,
                    format!("the path {shown} contains a '.' component; write the path without it"),
                )));
            }
            "" => {
                let comps: Vec<&str> = body.split('/').collect();
                let trailing = comps.len() > 1 && body.ends_with('/');
                let doubled = comps[..comps.len() - 1].iter().any(|c| c.is_empty());
                let (what, fix) = match (doubled, trailing) {
                    (true, true) => (
                        "'//' and a trailing '/'",
                        "write one '/' between names and none at the end",
                    ),
                    (false, true) => ("a trailing '/'", "write it without, for a directory too"),
                    _ => (
                        "'//'",
                        "write each directory once, with one '/' between names",
                    ),
                };
                return Err(slip(Refusal::new(
                    ReasonCode::PathTraversal,
                    format!("the path {shown} has an empty component ({what}); {fix}"),
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Refuses more than `max` components and names longer than 255 bytes.
pub fn check_path_depth(path: &RelPath, max: usize) -> Verdict {
    if path.depth() > max {
        return Err(Refusal::new(
            ReasonCode::DepthExceeded,
            format!(
                "the path {} has {} components; at most {max} are allowed",
                shown_path(&path.as_string()),
                path.depth()
            ),
        ));
    }
    Ok(())
}

/// Splits a lexically clean relative path (after [`detect_path_traversal`]).
pub(crate) fn split_relative(path: &str) -> Verdict<RelPath> {
    let mut components = Vec::new();
    for comp in path.split('/') {
        if comp.len() > MAX_NAME_BYTES {
            return Err(Refusal::new(
                ReasonCode::PathTraversal,
                format!(
                    "the name {} in the path is {} bytes long; names may have at most {MAX_NAME_BYTES} bytes",
                    shown_path(comp),
                    comp.len()
                ),
            )
            .malformed());
        }
        components.push(comp.to_owned());
    }
    Ok(RelPath { components })
}

/// Lexical containment: whether `abs` equals `root` or lies beneath it, compared
/// component by component (so `/srv/root_evil` is not inside `/srv/root`). A path with a
/// `..` component is never inside (`/srv/root/../etc` would pass a prefix test).
pub fn is_within_sandbox(abs: &Path, root: &Path) -> bool {
    abs.starts_with(root) && !abs.components().any(|c| c == Component::ParentDir)
}

/// Which root a path belongs to, and the path relative to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Index of the root in the configured list.
    pub root_index: usize,
    /// The path relative to that root.
    pub rel: RelPath,
}

/// The refusal of an absolute `path` outside every root in use.
fn outside_roots(path: &str, roots: &[PathBuf]) -> Refusal {
    Refusal::new(
        ReasonCode::OutsideSandbox,
        format!(
            "the absolute path {} is not inside a sandbox root in use (a configured root that could not be used at start is skipped: the operator's state document, `state` or `GET /agentic/state`, says why in skipped_roots); roots in use: {}",
            shown_path(path),
            list_roots(roots)
        ),
    )
}

/// Resolves an action's path to a root and a relative path, lexically.
///
/// A relative path belongs to `root_hint` (a configured root, given by its path) or else
/// to the first root. An absolute path is accepted only if it lies inside a root (and
/// inside `root_hint` when one is given). No symlink is resolved here: that is the root
/// handle's job.
pub fn resolve_sandbox_path(
    path: &str,
    roots: &[PathBuf],
    root_hint: Option<&str>,
    max_depth: usize,
) -> Verdict<Resolved> {
    detect_path_traversal(path).map_err(|r| {
        // An absolute path refused for its spelling alone (`//`, a trailing `/`, `./`)
        // that still names a place in a root, or `/` itself, is a slip, not an attempt.
        if r.malformed || !path.starts_with('/') {
            return r;
        }
        let mut comps = path.split('/').filter(|c| !c.is_empty() && *c != ".");
        if path.split(['/', '\\']).any(|c| c == "..") || path.contains('\0') {
            return r;
        }
        let cleaned: PathBuf = std::iter::once("/").chain(&mut comps).collect();
        if cleaned == Path::new("/") || roots.iter().any(|root| is_within_sandbox(&cleaned, root)) {
            r.malformed()
        } else {
            // Outside every root, however it is spelt: counted and said as the way out
            // it is (`//etc/passwd` is `/etc/passwd`), so that what watches for
            // `outside_sandbox` sees it.
            outside_roots(path, roots)
        }
    })?;
    // A relative path's depth is known before its root: judged first, as SPEC §5
    // orders depth before the root (an absolute path's depth is counted from its root).
    let relative = if path.starts_with('/') {
        None
    } else {
        let rel = split_relative(path)?;
        check_path_depth(&rel, max_depth)?;
        Some(rel)
    };
    let hinted = match root_hint {
        None => None,
        Some(hint) => Some(find_root(hint, roots)?),
    };
    let (root_index, rel) = if let Some(rel) = relative {
        if roots.is_empty() {
            return Err(Refusal::new(
                ReasonCode::OutsideSandbox,
                "no sandbox root is configured; set roots in the config, AI_LAB_SANDBOX_ROOTS or --root",
            )
            .malformed());
        }
        (hinted.unwrap_or(0), rel)
    } else {
        let abs = Path::new(path);
        let first_inside = (0..roots.len()).find(|&i| is_within_sandbox(abs, &roots[i]));
        let found = match hinted {
            Some(h) => is_within_sandbox(abs, &roots[h]).then_some(h),
            None => first_inside,
        };
        let Some(i) = found else {
            if let (Some(h), Some(other)) = (hinted, first_inside) {
                // Inside a root, only not the one named: a mistake, not an escape.
                return Err(Refusal::new(
                    ReasonCode::OutsideSandbox,
                    format!(
                        "the absolute path {} lies in root {}, not in the root the action names ({}); name that root, or none",
                        shown_path(path),
                        shown_path(&roots[other].display().to_string()),
                        shown_path(&roots[h].display().to_string())
                    ),
                )
                .malformed());
            }
            return Err(outside_roots(path, roots));
        };
        let rest = abs
            .strip_prefix(&roots[i])
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if rest.is_empty() {
            return Err(Refusal::new(
                ReasonCode::OutsideSandbox,
                format!(
                    "the path {} is the sandbox root itself; name a file or directory inside it",
                    shown_path(path)
                ),
            )
            .malformed());
        }
        let rel = split_relative(&rest)?;
        check_path_depth(&rel, max_depth)?;
        (i, rel)
    };
    // Last: a path that also aims out is refused for that, and counted so.
    detect_misleading_name(path)?;
    detect_replacement_character(path, &rel)?;
    Ok(Resolved { root_index, rel })
}

/// Refuses a path (`rel` inside its root, `path` as given) holding U+FFFD, the character
/// listings show in place of the bytes of a name that are not UTF-8: such a path would
/// name another file than the one listed. A root's own path, the operator's, may.
fn detect_replacement_character(path: &str, rel: &RelPath) -> Verdict {
    if !rel.components().iter().any(|c| c.contains('\u{FFFD}')) {
        return Ok(());
    }
    Err(Refusal::new(
        ReasonCode::PathTraversal,
        format!(
            "the path {} contains U+FFFD, the replacement character, which listings show in place of the bytes of a name that are not UTF-8 (`bad\\u{{FFFD}}.md` may be listed for a file whose name is not text, which no path can name); paths may not contain it: remove it, or use another character",
            shown_path(path)
        ),
    )
    .malformed())
}

fn find_root(hint: &str, roots: &[PathBuf]) -> Verdict<usize> {
    let bare = hint.strip_suffix('/').unwrap_or(hint);
    let wanted = Path::new(bare);
    // Named as listed: a `.` or an empty component, which a path may not have, would
    // name it as well once the path is read.
    let as_listed = !bare
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..");
    roots
        .iter()
        .position(|r| as_listed && r.as_path() == wanted)
        .ok_or_else(|| {
            let r = Refusal::new(
                ReasonCode::OutsideSandbox,
                format!(
                    "the root {} is not a sandbox root in use{} (a configured root that could not be used at start is skipped: the operator's state document, `state` or `GET /agentic/state`, says why in skipped_roots); roots in use: {}",
                    shown_path(hint),
                    if wanted.is_absolute() {
                        ""
                    } else {
                        ": a root is named by its absolute path, as listed"
                    },
                    list_roots(roots)
                ),
            );
            // A folder of a root given as the root (or a relative name, or none) is a
            // mistake; any other absolute path, an attempt.
            if !wanted.is_absolute() || roots.iter().any(|r| is_within_sandbox(wanted, r)) {
                r.malformed()
            } else {
                r
            }
        })
}

fn list_roots(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "(none)".to_owned();
    }
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A name as a filesystem that folds case could take it: folded by Unicode's rules
/// (the Kelvin sign is a `k`, the long s an `s`, `ß` is `ss`, the ligature `ﬆ` is `st`)
/// without the code points such filesystems ignore (zero-width characters, variation
/// selectors, bidirectional marks, soft hyphen), and without the trailing dots and
/// spaces FAT filesystems drop. On such a root `.rollbac\u{212a}`, `.roll\u{200b}back`
/// or `.rollback.` would open the snapshot store, and `x.\u{17f}ervice.d` hold a unit's
/// drop-ins.
pub(crate) fn folded(name: &str) -> String {
    // Most names: no code point to drop or fold beyond ASCII's case.
    if name.is_ascii() {
        let mut kept = name.trim_end_matches(['.', ' ']).to_owned();
        kept.make_ascii_lowercase();
        return kept;
    }
    folded_by_unicode(name)
}

/// [`folded`] for any name, by Unicode's rules.
fn folded_by_unicode(name: &str) -> String {
    let mut kept = String::with_capacity(name.len());
    for c in name.chars().filter(|&c| !is_ignorable(c)) {
        // Full case folding where it differs from lower case, for the letters that do.
        match c {
            '\u{17f}' => kept.push('s'),
            '\u{df}' | '\u{1e9e}' => kept.push_str("ss"),
            '\u{fb00}' => kept.push_str("ff"),
            '\u{fb01}' => kept.push_str("fi"),
            '\u{fb02}' => kept.push_str("fl"),
            '\u{fb03}' => kept.push_str("ffi"),
            '\u{fb04}' => kept.push_str("ffl"),
            '\u{fb05}' | '\u{fb06}' => kept.push_str("st"),
            c => kept.extend(c.to_lowercase()),
        }
    }
    kept.trim_end_matches(['.', ' ']).to_owned()
}

/// Whether `c`, in a name, makes it read otherwise than it is written where it is shown:
/// a character readers do not see (a control, bidirectional or invisible one), a
/// look-alike of `/` or `\`, or a dot seldom met in a name (`\u{2024}\u{2024}` shows as
/// `..`): a name shown as folders. A listing escapes such a name.
pub fn shows_otherwise(c: char) -> bool {
    is_unseen(c) || is_separator_lookalike(c) || is_rare_dot(c)
}

/// Whether `c` is not seen where it is shown: a control character, a bidirectional
/// formatting character, a line or paragraph separator, or a code point readers do not
/// show (zero-width ones, fillers).
pub(crate) fn is_unseen(c: char) -> bool {
    c.is_control() || is_bidi_control(c) || matches!(c, '\u{2028}' | '\u{2029}') || hides_in_text(c)
}

/// Code points a filesystem that folds names ignores, and text readers do not show.
pub(crate) fn is_ignorable(c: char) -> bool {
    matches!(u32::from(c),
        0xAD | 0x34F | 0x61C | 0x115F..=0x1160 | 0x17B4..=0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164
        | 0xFE00..=0xFE0F | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFF8 | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0000..=0xE0FFF)
}

/// [`is_ignorable`], and the format characters that hide in a line of text without being
/// ignored by a filesystem (annotations, number signs, hieroglyph controls, a braille
/// blank).
fn hides_in_text(c: char) -> bool {
    is_ignorable(c)
        || matches!(u32::from(c),
            0xFFF9..=0xFFFB | 0x600..=0x605 | 0x6DD | 0x70F | 0x8E2 | 0x110BD | 0x110CD
            | 0x13430..=0x1343F | 0x2800)
}

/// Refuses a `.rollback` component (any case) at any depth, and the runtime's temporary
/// names, as a filesystem that folds case would read them (see `folded`). Only the top
/// one of a root holds its snapshots, but a deeper one may be another root's seen
/// through a bind mount, so the name is refused wherever it appears.
pub fn check_reserved(rel: &RelPath) -> Verdict {
    let folded: Vec<String> = rel.components().iter().map(|c| folded(c)).collect();
    // With white space of any kind at its end too: `.rollback` and a no-break space
    // reads as the store's name, though no filesystem drops it.
    if folded
        .iter()
        .any(|c| c.trim_end_matches(|ch: char| ch == '.' || ch.is_whitespace()) == ROLLBACK_DIR)
    {
        return Err(Refusal::new(
            ReasonCode::ReservedPath,
            format!(
                "the path {} has a '.rollback' component: that name holds snapshots and is reserved for the runtime, never read or written by actions, at any depth",
                shown_path(&rel.as_string())
            ),
        ));
    }
    if folded.iter().any(|c| c.contains(TEMP_MARKER)) {
        return Err(Refusal::new(
            ReasonCode::ReservedPath,
            format!(
                "the path {} uses the runtime's temporary-file marker '{TEMP_MARKER}'; choose another name",
                shown_path(&rel.as_string())
            ),
        ));
    }
    Ok(())
}

/// The extension of a file name, normalised for checks as a filesystem that folds names
/// would read it (see `folded`): any case, trailing dots and spaces and invisible code
/// points ignored (`X.SERVICE`, `x.service.`, `x.service `, `x.ser\u{200b}vice` and
/// `x.\u{17f}ervice` all give `.service`). A name without a dot after its first
/// character has no extension (`""`).
pub fn normalize_extension(file_name: &str) -> String {
    let name = folded(file_name);
    match name.rfind('.') {
        Some(i) if i > 0 => name[i..].to_owned(),
        _ => String::new(),
    }
}

/// The extension allow-list and block-list (SPEC §2). The block-list always wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionPolicy {
    allowed: Vec<String>,
    blocked: Vec<String>,
}

/// The suffixes of the folders systemd reads a unit's drop-ins (`.d`) and dependencies
/// from, normalised as extensions.
const UNIT_FOLDER_SUFFIXES: [&str; 4] = [".d", ".wants", ".requires", ".upholds"];

/// Default allow-list: `.txt`, `.md`, `.markdown`, `.rst`, `.json`, `.jsonl`, `.yaml`,
/// `.yml`, `.toml`, `.ini`, `.cfg`, `.conf`, `.csv`, `.tsv`, `.log`, `.xml`, `.html`,
/// `.css`, `.js`, `.ts`, `.py`, `.sh`, `.sql`, `.diff`, `.patch` (files are never made
/// executable, whatever their extension).
pub const DEFAULT_ALLOWED_EXTENSIONS: [&str; 25] = [
    ".txt",
    ".md",
    ".markdown",
    ".rst",
    ".json",
    ".jsonl",
    ".yaml",
    ".yml",
    ".toml",
    ".ini",
    ".cfg",
    ".conf",
    ".csv",
    ".tsv",
    ".log",
    ".xml",
    ".html",
    ".css",
    ".js",
    ".ts",
    ".py",
    ".sh",
    ".sql",
    ".diff",
    ".patch",
];

/// Default block-list: systemd unit types and loadable binaries (`.service`, `.socket`,
/// `.device`, `.mount`, `.automount`, `.swap`, `.target`, `.path`, `.timer`, `.slice`,
/// `.scope`, `.so`, `.dll`, `.dylib`, `.exe`, `.ko`).
pub const DEFAULT_BLOCKED_EXTENSIONS: [&str; 16] = [
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
    ".so",
    ".dll",
    ".dylib",
    ".exe",
    ".ko",
];

impl Default for ExtensionPolicy {
    fn default() -> Self {
        Self::new(None, &[])
    }
}

impl ExtensionPolicy {
    /// `allowed` replaces the default allow-list when given; `extra_blocked` is added to
    /// the default block-list.
    pub fn new(allowed: Option<&[String]>, extra_blocked: &[String]) -> Self {
        let norm = |e: &str| {
            let e = e.trim_end_matches(['.', ' ']).to_ascii_lowercase();
            if e.starts_with('.') {
                e
            } else {
                format!(".{e}")
            }
        };
        let allowed = match allowed {
            Some(list) => list.iter().map(|e| norm(e)).collect(),
            None => DEFAULT_ALLOWED_EXTENSIONS.iter().map(|e| norm(e)).collect(),
        };
        let mut blocked: Vec<String> = DEFAULT_BLOCKED_EXTENSIONS.iter().map(|e| norm(e)).collect();
        for e in extra_blocked {
            let e = norm(e);
            if !blocked.contains(&e) {
                blocked.push(e);
            }
        }
        Self { allowed, blocked }
    }

    /// The allow-list, normalised.
    pub fn allowed(&self) -> &[String] {
        &self.allowed
    }

    /// The block-list, normalised.
    pub fn blocked(&self) -> &[String] {
        &self.blocked
    }

    /// Whether a normalised extension is on the block-list.
    pub fn is_extension_blocked(&self, ext: &str) -> bool {
        self.blocked.iter().any(|b| b == ext)
    }

    /// Whether a normalised extension is on the allow-list (and not blocked).
    pub fn is_extension_allowed(&self, ext: &str) -> bool {
        !self.is_extension_blocked(ext) && self.allowed.iter().any(|a| a == ext)
    }

    /// Refuses the first of `dirs` (directory names) whose extension is blocked: the
    /// block-list always wins, so a name such as `x.service` is never made a directory
    /// either, nor written beneath. Nor is a folder named after one with a suffix systemd
    /// reads units' drop-ins and dependencies from (`x.service.d`, `x.timer.wants`): a
    /// file there changes the unit as surely as the unit file. Directories have no
    /// allow-list.
    pub fn check_directories(&self, dirs: &[String]) -> Verdict {
        for name in dirs {
            let ext = normalize_extension(name);
            if self.is_extension_blocked(&ext) {
                return Err(Refusal::new(
                    ReasonCode::BlockedExtension,
                    format!(
                        "the directory name {} has the blocked extension {}; a name with a blocked extension is never written, as a file or as a directory, nor beneath one (blocked: {})",
                        shown_path(name),
                        shown_ext(&ext),
                        self.blocked.join(" ")
                    ),
                ));
            }
            let Some(suffix) = UNIT_FOLDER_SUFFIXES.iter().find(|s| **s == ext) else {
                continue;
            };
            let name_folded = folded(name);
            let stem = &name_folded[..name_folded.len() - suffix.len()];
            // `service.d` holds drop-ins for every unit of the type, `x.service.d` for one
            // (and `.service.d`, which a name with an invisible first character is on a
            // filesystem that drops it, is read as the type's).
            let unit = match normalize_extension(stem) {
                e if e.is_empty() => format!(".{}", stem.trim_start_matches('.')),
                e => e,
            };
            if self.is_extension_blocked(&unit) {
                return Err(Refusal::new(
                    ReasonCode::BlockedExtension,
                    format!(
                        "the directory name {} is a {} folder of a name with the blocked extension {} (systemd reads drop-ins and dependencies of units from such folders); it is never made, nor written beneath (blocked: {})",
                        shown_path(name),
                        shown_ext(suffix),
                        shown_ext(&unit),
                        self.blocked.join(" ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses blocked extensions first, then ones missing from the allow-list.
    pub fn check(&self, ext: &str) -> Verdict {
        if self.is_extension_blocked(ext) {
            return Err(Refusal::new(
                ReasonCode::BlockedExtension,
                format!(
                    "the extension {} is blocked and can never be written (blocked: {})",
                    shown_ext(ext),
                    self.blocked.join(" ")
                ),
            ));
        }
        if !self.is_extension_allowed(ext) {
            return Err(Refusal::new(
                ReasonCode::ExtensionNotAllowed,
                format!(
                    "{} is not on the allow-list; allowed: {}",
                    shown_ext(ext),
                    // An extension both allowed and blocked is blocked.
                    self.allowed
                        .iter()
                        .filter(|e| !self.is_extension_blocked(e))
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            ));
        }
        Ok(())
    }
}

/// Quotes a user-supplied path for a sentence, escaping control characters and cutting
/// very long values so a message stays one readable line. A long path keeps its start
/// (which root, which folder) and its end (the file name, which tells paths in a list
/// apart); the middle gives way.
pub fn shown_path(path: &str) -> String {
    const HEAD: usize = 48;
    const TAIL: usize = 71;
    let escaped = escaped(path);
    if escaped.chars().count() <= HEAD + 1 + TAIL {
        return format!("'{escaped}'");
    }
    // Cut between whole escapes, never between a character and the marks on it.
    let units = shown_units(&escaped);
    let within = |limit: usize, units: &mut dyn Iterator<Item = &&str>| {
        let mut taken = 0;
        units
            .take_while(|u| {
                taken += u.chars().count();
                taken <= limit
            })
            .count()
    };
    let head = within(HEAD, &mut units.iter());
    let tail = within(TAIL, &mut units.iter().rev());
    format!(
        "'{}…{}'",
        units[..head].concat(),
        units[units.len() - tail..].concat()
    )
}

/// `escaped` (see [`escaped`]) in the pieces a shortened path may be cut between: an
/// escape whole, or a character with the combining marks that follow it (one character
/// at a time past eight marks, lest a pile of them leave nothing to show).
fn shown_units(escaped: &str) -> Vec<&str> {
    const MARKS: usize = 8;
    let mut units = Vec::new();
    let mut rest = escaped;
    while let Some(c) = rest.chars().next() {
        let mut end = c.len_utf8();
        if c == '\\' {
            end += match rest[end..].chars().next() {
                Some('u') => rest[end..].find('}').map_or(rest.len() - end, |at| at + 1),
                Some(n) => n.len_utf8(),
                None => 0,
            };
        } else {
            end += rest[end..]
                .chars()
                .take_while(|&m| unicode_normalization::char::is_combining_mark(m))
                .map(char::len_utf8)
                .sum::<usize>();
        }
        let (unit, after) = rest.split_at(end);
        if c != '\\' && unit.chars().count() > MARKS + 1 {
            units.extend(
                unit.char_indices()
                    .map(|(at, c)| &unit[at..at + c.len_utf8()]),
            );
        } else {
            units.push(unit);
        }
        rest = after;
    }
    units
}

/// `text` escaped as Rust escapes a string for debugging, and every character readers
/// do not see ([`shows_otherwise`]: a filler, a joiner, which Rust deems printable) too;
/// combining marks stay as written (Rust escapes each one met alone), so that Hindi or
/// Arabic names read as they are, except one right after an escape, where it would sit
/// on the escape's brace.
pub(crate) fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.find(shows_otherwise).unwrap_or(rest.len());
        out.extend(rest[..cut].escape_debug());
        let mut tail = rest[cut..].chars();
        match tail.next() {
            Some(c) if c.is_control() => out.extend(c.escape_debug()),
            Some(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            None => {}
        }
        rest = tail.as_str();
    }
    out
}

/// Joins a root and a relative path for display and lexical checks.
pub fn join_display(root: &Path, rel: &RelPath) -> PathBuf {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
    }
    p
}

/// Normalises `..` and `.` lexically; `None` if the path climbs above its start.
pub(crate) fn lexical_normalize(parts: impl IntoIterator<Item = String>) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        match p.as_str() {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            _ => out.push(p),
        }
    }
    Some(out)
}

/// Components of a path as strings (lossy for non-UTF-8, which never reaches here from
/// a validated action).
pub(crate) fn path_strings(p: &Path) -> Vec<String> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_owned()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed step is a failed test
mod tests {
    /// A shortened path is cut between whole escapes and never splits a character from
    /// its combining marks.
    #[test]
    fn a_shortened_path_is_cut_between_whole_escapes() {
        for path in [
            format!("{}ab.md", "\u{1}".repeat(250)),
            format!("{}{}.md", "\u{202e}".repeat(60), "x".repeat(10)),
            format!("{}.md", "a\u{7f}".repeat(130)),
            format!("{}.md", "e\u{301}\u{302}".repeat(100)),
        ] {
            let shown = super::shown_path(&path);
            let (head, tail) = shown.split_once('…').unwrap();
            for part in [&head[1..], &tail[..tail.len() - 1]] {
                let units = super::shown_units(part);
                assert_eq!(units.concat(), part);
                for u in units {
                    let whole = !u.starts_with('\\')
                        || (u.len() == 2 && !u.ends_with('u'))
                        || (u.starts_with("\\u{") && u.ends_with('}'));
                    assert!(whole, "{u:?} in {shown}");
                    let first = u.chars().next().unwrap();
                    assert!(
                        !unicode_normalization::char::is_combining_mark(first),
                        "{u:?} in {shown}"
                    );
                }
            }
        }
        // An escape of ten characters stays whole.
        let wide = format!(
            "{}\u{FFFD}{}{}.md",
            "a".repeat(44),
            "\u{100000}".repeat(3),
            "b".repeat(80)
        );
        let shown = super::shown_path(&wide);
        assert!(
            !shown.contains("\\u{…") && !shown.contains("\\…"),
            "{shown}"
        );
        // A pile of marks on one letter is cut inside, not hidden whole.
        let piled = format!("a{}.md", "\u{301}".repeat(300));
        let shown = super::shown_path(&piled);
        assert!(shown.starts_with("'a\u{301}"), "{shown}");
        assert!(shown.chars().count() > 100, "{shown}");
        for path in ["\\", "\\u", "a\\", "\u{301}\u{301}"] {
            super::shown_path(&path.repeat(80));
        }
    }

    /// A backslash ending the text (no escape follows) is a piece of its own.
    #[test]
    fn shown_units_do_not_panic_on_a_trailing_backslash() {
        for text in ["\\", "\\u", "\\u{", "x\\u{12"] {
            assert_eq!(super::shown_units(text).concat(), text);
        }
    }

    /// The ASCII shortcut folds as Unicode's rules do.
    #[test]
    fn ascii_names_fold_as_by_unicode_rules() {
        let mut names: Vec<String> = (0u8..128).map(|b| format!("a{}Z", b as char)).collect();
        names.extend(
            [
                ".RollBack",
                ".rollback. . ",
                "X.SERVICE",
                "  ",
                "...",
                "Ab.Cd .",
                "",
            ]
            .map(str::to_owned),
        );
        for name in names {
            assert_eq!(
                super::folded(&name),
                super::folded_by_unicode(&name),
                "{name:?}"
            );
        }
    }

    use super::*;

    #[test]
    fn a_long_path_is_shown_with_its_start_and_its_file_name() {
        let deep = format!(
            "/srv/sandbox/{}/report-2026-final.md",
            "nested-folder/".repeat(20)
        );
        let shown = shown_path(&deep);
        assert!(shown.starts_with("'/srv/sandbox/nested-folder/"), "{shown}");
        assert!(shown.ends_with("/report-2026-final.md'"), "{shown}");
        assert!(shown.contains('…'), "{shown}");
        assert_eq!(shown.chars().count(), 122, "{shown}");
        // Short enough: whole, with control characters escaped.
        assert_eq!(shown_path("a/b\nc.txt"), "'a/b\\nc.txt'");
        let exact = "x".repeat(120);
        assert_eq!(shown_path(&exact), format!("'{exact}'"));
    }

    #[test]
    fn extension_normalisation_ignores_case_and_trailing_junk() {
        assert_eq!(normalize_extension("X.SERVICE"), ".service");
        assert_eq!(normalize_extension("x.service."), ".service");
        assert_eq!(normalize_extension("x.service "), ".service");
        assert_eq!(normalize_extension(".bashrc"), "");
        assert_eq!(normalize_extension("Makefile"), "");
        assert_eq!(normalize_extension("a.tar.gz"), ".gz");
    }

    #[test]
    fn reserved_names_are_refused_as_a_case_folding_filesystem_reads_them() {
        let refused = |p: &str| {
            let rel = RelPath::from_recorded(p);
            check_reserved(&rel).map_err(|r| r.reason_code)
        };
        for p in [
            ".rollback/x.txt",
            "a/.ROLLBACK",
            ".rollbac\u{212a}/x.txt",
            ".roll\u{200b}back/x.txt",
            "d/\u{feff}.Rollback\u{fe0f}/x.txt",
            ".rollback. ./x.txt",
            // White space no filesystem drops, which reads as none.
            ".rollback\u{a0}/x.txt",
            ".rollback\u{3000}./x.txt",
            "x.ailab\u{ad}-tmp-1",
            "x.AILAB-TMP-1",
        ] {
            assert_eq!(refused(p), Err(ReasonCode::ReservedPath), "{p:?}");
        }
        for p in [
            ".rollbacks/x.txt",
            ".roll-back/x.txt",
            "rollback/x.txt",
            "x.ailab-tmp",
        ] {
            assert_eq!(refused(p), Ok(()), "{p:?}");
        }
    }

    /// Extensions are read as a filesystem that folds names reads them: a blocked one
    /// spelt with a long s, the Kelvin sign or an invisible code point is still blocked,
    /// for files and for the folders systemd reads drop-ins from.
    #[test]
    fn blocked_extensions_are_read_as_a_case_folding_filesystem_reads_them() {
        let policy = ExtensionPolicy::new(None, &[]);
        for name in [
            "x.\u{17f}ervice",
            "x.ser\u{200b}vice",
            "mod.\u{212a}o",
            "x.SERVICE. ",
        ] {
            let ext = normalize_extension(name);
            assert!(policy.is_extension_blocked(&ext), "{name:?}: {ext}");
        }
        for dir in [
            "x.\u{17f}ervice.d",
            "x.ser\u{200b}vice.d",
            "x.\u{17f}ocket.d",
            "mod.\u{212a}o",
            "\u{200b}.service.d",
            "service.d",
        ] {
            let r = policy.check_directories(&[dir.to_owned()]);
            assert_eq!(
                r.map_err(|r| r.reason_code),
                Err(ReasonCode::BlockedExtension),
                "{dir:?}"
            );
        }
        assert_eq!(normalize_extension("notes.MD"), ".md");
        assert_eq!(normalize_extension("stra\u{df}e.txt"), ".txt");
        assert!(policy.check_directories(&["notes.d".to_owned()]).is_ok());
    }

    #[test]
    fn lexical_normalize_refuses_climbing() {
        assert_eq!(
            lexical_normalize(["a".into(), "..".into(), "b".into()]),
            Some(vec!["b".to_owned()])
        );
        assert_eq!(lexical_normalize(["..".into()]), None);
    }
}
