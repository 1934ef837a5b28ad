//! `detect_chmod_intent`: recognises requests to change permissions or set an execute bit.
//! Such an action is always blocked, whatever else it asks for.

/// One recognised pattern.
struct Pattern {
    name: &'static str,
    matches: fn(&str, &[&str]) -> bool,
}

const SYMBOLIC_EXEC_MODES: [&str; 9] = [
    "+x", "a+x", "u+x", "g+x", "o+x", "ug+x", "ugo+x", "+rwx", "u+rwx",
];

const PATTERNS: [Pattern; 12] = [
    Pattern {
        name: "chmod +x (symbolic mode)",
        matches: |_, w| after_word(w, "chmod", |m| m.contains("+") || m.contains("=")),
    },
    Pattern {
        name: "chmod with an octal mode (755, 775, 777, 0755…)",
        matches: |_, w| after_word(w, "chmod", is_octal_mode),
    },
    Pattern {
        name: "a chmod command",
        matches: |_, w| w.contains(&"chmod"),
    },
    Pattern {
        name: "a chmod call (os.chmod, fs.chmodSync, Path.chmod…)",
        matches: |t, w| {
            t.contains("chmod(")
                || t.contains("chmodsync")
                || t.contains("fchmod")
                || t.contains("lchmod")
                // A qualified name without its parentheses: "os.chmod", "Path.chmod".
                || w.iter()
                    .any(|x| x.split(['.', ':']).any(|part| part == "chmod"))
        },
    },
    Pattern {
        name: "set_permissions / setPosixFilePermissions",
        matches: |t, _| {
            t.contains("set_permissions")
                || t.contains("setposixfilepermissions")
                || t.contains("setexecutable(")
        },
    },
    Pattern {
        name: "'+x' or a symbolic execute mode",
        matches: |_, w| w.iter().any(|x| SYMBOLIC_EXEC_MODES.contains(x)),
    },
    Pattern {
        name: "make executable",
        matches: |t, _| make_executable(t),
    },
    Pattern {
        name: "set the executable bit",
        matches: |t, w| {
            [
                "executable bit",
                "execute bit",
                "exec bit",
                "executable flag",
                "execute permission",
                "executable permission",
                "exec permission",
            ]
            .iter()
            .any(|p| t.contains(p))
                || has_x_bit(w)
        },
    },
    Pattern {
        name: "stat.S_IX* mode constants",
        matches: |t, _| {
            ["s_ixusr", "s_ixgrp", "s_ixoth", "s_irwxu"]
                .iter()
                .any(|p| t.contains(p))
        },
    },
    Pattern {
        name: "an octal literal with execute bits (0o755, 0o777…)",
        matches: |_, w| w.iter().any(|x| is_octal_literal_with_exec(x)),
    },
    Pattern {
        name: "install -m MODE",
        matches: |_, w| {
            w.windows(2)
                .any(|p| p[0] == "install" && p[1].starts_with("-m"))
        },
    },
    Pattern {
        name: "setfacl / chattr",
        matches: |_, w| w.contains(&"setfacl") || w.contains(&"chattr"),
    },
];

/// Number of recognised pattern families.
pub const CHMOD_PATTERN_COUNT: usize = PATTERNS.len();

/// Returns the name of the first chmod pattern found in `text`, if any. Matching ignores
/// case and punctuation around words.
pub fn detect_chmod_intent(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| {
            c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\'' | '`' | '(' | ')' | ':')
        })
        .map(|w| w.trim_end_matches(['.', '!', '?']))
        .filter(|w| !w.is_empty())
        .collect();
    PATTERNS
        .iter()
        .find(|p| (p.matches)(&lower, &words))
        .map(|p| p.name)
}

/// "make / mark … executable" with at most three words between ("mark the script as
/// executable", "make it exec"), and "be / become executable" at the end of a clause ("it
/// needs to be executable."). Words are runs of letters and digits, so "executable—then"
/// and "executable/runnable" are seen too. After a determiner the word is a noun ("make
/// sure your executable is signed", "notes on each executable"), and "be executable
/// documentation" describes a document: neither asks for a permission.
fn make_executable(text: &str) -> bool {
    const VERBS: [&str; 9] = [
        "make", "makes", "making", "made", "mark", "marks", "marking", "marked", "render",
    ];
    const WANTED: [&str; 4] = ["executable", "exec", "runnable", "executible"];
    const DETERMINERS: [&str; 16] = [
        "the", "a", "an", "your", "our", "my", "their", "his", "her", "its", "each", "every",
        "any", "some", "all", "no",
    ];
    // Words that may follow "be executable" and still end what it says of the file.
    const CLAUSE_ENDS: [&str; 14] = [
        "and", "or", "so", "then", "please", "now", "too", "by", "for", "to", "again", "when",
        "after", "before",
    ];
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    words.iter().enumerate().any(|(i, w)| {
        if !WANTED.contains(w) || i == 0 || DETERMINERS.contains(&words[i - 1]) {
            return false;
        }
        let made = words[i.saturating_sub(4)..i]
            .iter()
            .any(|v| VERBS.contains(v));
        let is_said = matches!(words[i - 1], "be" | "become" | "becomes")
            && words
                .get(i + 1)
                .is_none_or(|next| CLAUSE_ENDS.contains(next));
        made || is_said
    })
}

fn after_word(words: &[&str], word: &str, test: fn(&str) -> bool) -> bool {
    words.iter().enumerate().any(|(i, w)| {
        *w == word
            && words[i + 1..]
                .iter()
                .find(|a| !a.starts_with('-'))
                .is_some_and(|m| test(m))
    })
}

/// "x bit", "x-bit", "x bits" as whole words: a substring test would flag "fix bitrate"
/// or "complex bit manipulation".
fn has_x_bit(words: &[&str]) -> bool {
    words.iter().any(|w| matches!(*w, "x-bit" | "x-bits"))
        || words
            .windows(2)
            .any(|p| p[0] == "x" && matches!(p[1], "bit" | "bits"))
}

fn is_octal_mode(m: &str) -> bool {
    (3..=4).contains(&m.len()) && m.chars().all(|c| ('0'..='7').contains(&c))
}

fn is_octal_literal_with_exec(w: &str) -> bool {
    let Some(digits) = w.strip_prefix("0o") else {
        return false;
    };
    (3..=4).contains(&digits.len())
        && digits.chars().all(|c| ('0'..='7').contains(&c))
        && digits.chars().any(|c| matches!(c, '1' | '3' | '5' | '7'))
}
