//! `detect_chmod_intent`: recognises requests to change permissions or set an execute bit.
//! Such an action is always blocked, whatever else it asks for. The text is read as a
//! person reads it: case and the punctuation around words do not hide a pattern.

/// One recognised pattern.
struct Pattern {
    name: &'static str,
    matches: fn(&str, &[&str]) -> bool,
}

const SYMBOLIC_EXEC_MODES: [&str; 9] = [
    "+x", "a+x", "u+x", "g+x", "o+x", "ug+x", "ugo+x", "+rwx", "u+rwx",
];

const PATTERNS: [Pattern; 17] = [
    Pattern {
        name: "chmod with a symbolic mode (+x, u+w, g+s…)",
        matches: |_, w| after_word(w, "chmod", |m| m.contains("+") || m.contains("=")),
    },
    Pattern {
        name: "chmod with an octal mode (755, 775, 777, 0755…)",
        matches: |_, w| after_word(w, "chmod", is_octal_mode),
    },
    Pattern {
        name: "a chmod command",
        // "chmod", and "chmod+x", "chmod0755", "chmod=x" written without a space; not a
        // word that merely begins with the letters ("chmodless").
        matches: |_, w| {
            w.iter().any(|x| {
                x.strip_prefix("chmod")
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphabetic()))
            })
        },
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
                || t.contains("setpermissions")
                || t.contains("setposixfilepermissions")
                || t.contains("setexecutable")
                || t.contains("set_executable")
                || t.contains("set-executable")
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
                "execution permission",
                "x permission",
                "execute right",
                "exec right",
                "execute access",
            ]
            .iter()
            .any(|p| t.contains(p))
                || has_x_bit(w)
        },
    },
    Pattern {
        name: "permissions or a mode set to an executable octal mode (permissions 0755)",
        matches: |_, w| {
            let w = keyword_split(w);
            let exec_mode = |m: &&str| {
                is_octal_mode(m) && m.chars().any(|c| matches!(c, '1' | '3' | '5' | '7'))
            };
            // The mode after the word ("permissions 0755") or just before it ("755
            // permissions").
            w.iter().enumerate().any(|(i, x)| {
                matches!(*x, "permissions" | "permission" | "mode" | "perms")
                    && (w[i + 1..].iter().take(5).any(exec_mode)
                        || w[i.saturating_sub(1)..i].iter().any(exec_mode))
            })
        },
    },
    Pattern {
        name: "a symbolic mode string with an execute bit (rwxr-xr-x)",
        matches: |_, w| w.iter().any(|x| is_symbolic_mode_with_exec(x)),
    },
    Pattern {
        name: "an executable flag set (executable: true)",
        matches: |_, w| {
            keyword_split(w).windows(2).any(|p| {
                matches!(
                    p[0],
                    "executable" | "is_executable" | "executable_bit" | "exec_bit"
                ) && matches!(p[1], "true" | "yes" | "on" | "1")
            })
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
        matches: |_, w| {
            keyword_split(w)
                .iter()
                .any(|x| is_octal_literal_with_exec(x))
        },
    },
    Pattern {
        name: "a mode argument with execute bits for its owner (0755, 0700…)",
        // Four digits with a leading zero, as C, Go and shells write modes; the owner may
        // read and run (5 or 7), which a count or a year does not spell, nor a time of
        // day ("at 0700 hours", "0530 UTC").
        matches: |_, w| {
            w.iter().enumerate().any(|(i, x)| {
                let b = x.as_bytes();
                let time = w.get(i + 1).is_some_and(|n| TIME_AFTER.contains(n))
                    || i.checked_sub(1)
                        .is_some_and(|p| TIME_BEFORE.contains(&w[p]));
                b.len() == 4
                    && b[0] == b'0'
                    && matches!(b[1], b'5' | b'7')
                    && b[2..].iter().all(|c| (b'0'..=b'7').contains(c))
                    && !time
            })
        },
    },
    Pattern {
        name: "install -m MODE",
        matches: |_, w| {
            w.windows(2)
                .any(|p| p[0] == "install" && p[1].starts_with("-m"))
        },
    },
    Pattern {
        name: "setuid / setgid bits or file capabilities (setuid, u+s, setcap)",
        matches: |_, w| {
            let bit = |x: &str| matches!(x, "bit" | "bits" | "root" | "flag" | "binary");
            // `suid` alone is a request (`mark it SUID`); before these, a thing's name
            // (`the suid column`, `SUID binaries` to list).
            let named = |x: &str| {
                matches!(
                    x,
                    "value"
                        | "values"
                        | "column"
                        | "columns"
                        | "field"
                        | "fields"
                        | "binaries"
                        | "list"
                        | "audit"
                        | "report"
                )
            };
            w.iter().enumerate().any(|(i, x)| {
                [
                    "setuid",
                    "setgid",
                    "setcap",
                    "u+s",
                    "g+s",
                    "ug+s",
                    "s_isuid",
                    "s_isgid",
                    "set-user-id",
                    "set-group-id",
                    "suid-root",
                    "sgid-bit",
                    "suid-bit",
                    "setuid-root",
                    "setgid-root",
                    "set-uid",
                    "set-gid",
                ]
                .contains(x)
                    || (matches!(*x, "suid" | "sgid") && !w.get(i + 1).is_some_and(|n| named(n)))
            }) || w
                .windows(3)
                .any(|p| p[0] == "set" && matches!(p[1], "uid" | "gid") && bit(p[2]))
        },
    },
    Pattern {
        name: "setfacl / chattr",
        matches: |_, w| w.contains(&"setfacl") || w.contains(&"chattr"),
    },
];

/// Words after a four-digit number that make it a time of day, not a mode.
const TIME_AFTER: [&str; 7] = ["hours", "hrs", "hr", "h", "utc", "gmt", "z"];

/// Words before a four-digit number that make it a time of day, not a mode.
const TIME_BEFORE: [&str; 8] = [
    "at", "by", "until", "till", "before", "after", "since", "from",
];

/// Number of recognised pattern families.
pub const CHMOD_PATTERN_COUNT: usize = PATTERNS.len();

/// Returns the name of the first chmod pattern found in `text`, if any. Matching ignores
/// case and punctuation around words.
pub fn detect_chmod_intent(text: &str) -> Option<&'static str> {
    let lower = plain(text).to_lowercase();
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

/// `text` as a reader sees it, so that a request cannot hide from the patterns behind
/// look-alike letters: invisible code points dropped (`ch\u{200d}mod`), compatibility
/// forms read as the letters they are drawn as (full-width `ｃｈｍｏｄ`, mathematical bold,
/// circled), accents dropped (`chmód`), and the Cyrillic and Greek letters and the small
/// capitals drawn like Latin ones read as those (`сhmod` with a Cyrillic `с`, `ᴄʜᴍᴏᴅ`).
pub(crate) fn plain(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization as _;
    // Compatibility decomposition reads full-width forms, mathematical and circled
    // letters, superscripts and ligatures as the letters they are drawn as (`𝐜𝐡𝐦𝐨𝐝`,
    // `ｃｈｍｏｄ`, `ⓒhmod`); the marks it splits off accented letters are dropped.
    read_as_drawn(
        text.nfkd()
            .filter(|&c| !unicode_normalization::char::is_combining_mark(c)),
    )
}

/// [`plain`] with accented letters kept as they are: a tool's name is matched word by
/// word against names of shells and interpreters, and an accented word is another word
/// (the Vietnamese `sự` and `bún` are not `su` and `bun`).
pub(crate) fn plain_keeping_accents(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization as _;
    read_as_drawn(text.nfkc())
}

/// The code points of a normalized text read as a person reads them: invisible ones
/// dropped, the ideographic space a space, look-alike letters as the Latin ones.
fn read_as_drawn(chars: impl Iterator<Item = char>) -> String {
    chars
        .filter(|&c| !crate::confine::path::is_ignorable(c))
        .map(|c| match c {
            '\u{3000}' => ' ',
            _ => look_alike(c).unwrap_or(c),
        })
        .collect()
}

/// The Latin letter a Cyrillic or Greek one is drawn like, if any.
fn look_alike(c: char) -> Option<char> {
    Some(match c {
        'а' | 'α' => 'a',
        'в' => 'b',
        'с' | 'ϲ' => 'c',
        'ԁ' => 'd',
        'е' | 'ε' => 'e',
        'һ' => 'h',
        'і' | 'ι' => 'i',
        'ј' => 'j',
        'к' | 'κ' => 'k',
        'м' => 'm',
        'п' | 'η' => 'n',
        'о' | 'ο' | 'σ' => 'o',
        'р' | 'ρ' => 'p',
        'ѕ' => 's',
        'т' | 'τ' => 't',
        'υ' => 'u',
        'ν' => 'v',
        'ԝ' => 'w',
        'х' | 'χ' => 'x',
        'у' | 'γ' => 'y',
        'А' | 'Α' => 'A',
        'В' | 'Β' => 'B',
        'С' | 'Ϲ' => 'C',
        'Е' | 'Ε' => 'E',
        'Н' | 'Η' => 'H',
        'І' | 'Ι' => 'I',
        'К' | 'Κ' => 'K',
        'М' | 'Μ' => 'M',
        'О' | 'Ο' => 'O',
        'Р' | 'Ρ' => 'P',
        'Ѕ' => 'S',
        'Т' | 'Τ' => 'T',
        'Х' | 'Χ' => 'X',
        'У' | 'Υ' => 'Y',
        // Small capitals, which no decomposition reads as letters.
        'ᴀ' => 'a',
        'ʙ' => 'b',
        'ᴄ' => 'c',
        'ᴅ' => 'd',
        'ᴇ' => 'e',
        'ꜰ' => 'f',
        'ɢ' => 'g',
        'ʜ' => 'h',
        'ɪ' => 'i',
        'ᴊ' => 'j',
        'ᴋ' => 'k',
        'ʟ' => 'l',
        'ᴍ' => 'm',
        'ɴ' => 'n',
        'ᴏ' => 'o',
        'ᴘ' => 'p',
        'ʀ' => 'r',
        'ꜱ' => 's',
        'ᴛ' => 't',
        'ᴜ' => 'u',
        'ᴠ' => 'v',
        'ᴡ' => 'w',
        'ʏ' => 'y',
        'ᴢ' => 'z',
        _ => return None,
    })
}

/// "make / mark X executable" with X at most three words ("mark the script as
/// executable", "make scripts/deploy.sh executable", "make them all exec"), and "be /
/// become executable" ending a clause ("it must be executable, or cron fails"). Read
/// clause by clause (a full stop, comma, semicolon, colon, dash or line ends one), word by
/// word (a path is one word; "executable/runnable" holds the word). Prose that names an
/// executable is not a request: after an article or possessive it is a noun ("make sure
/// your executable is signed"), as after a quantifier unless it ends the clause ("make
/// every executable smaller", but "make them all executable"); a preposition between the verb and it ("a list of
/// executable targets", "made by exec committee") or "make sure" rules the verb out.
fn make_executable(text: &str) -> bool {
    const VERBS: [&str; 9] = [
        "make", "makes", "making", "made", "mark", "marks", "marking", "marked", "render",
    ];
    const WANTED: [&str; 4] = ["executable", "exec", "runnable", "executible"];
    const NOUN_MARKERS: [&str; 10] = [
        "the", "a", "an", "your", "our", "my", "their", "his", "her", "its",
    ];
    const QUANTIFIERS: [&str; 10] = [
        "each", "every", "all", "any", "some", "both", "this", "that", "these", "those",
    ];
    const PREPOSITIONS: [&str; 12] = [
        "of", "for", "on", "in", "with", "about", "from", "by", "to", "at", "into", "than",
    ];
    // Words that may follow "be executable" and still end what it says of the file.
    const CLAUSE_ENDS: [&str; 14] = [
        "and", "or", "so", "then", "please", "now", "too", "by", "for", "to", "again", "when",
        "after", "before",
    ];
    let wanted = |w: &str| w.split('/').any(|part| WANTED.contains(&part));
    // "make_executable", "make-executable": identifiers spell the words joined.
    let text = text.replace(['_', '-'], " ");
    clauses(&text).any(|clause| {
        // "Ensure the script is executable": a request, where "is" alone describes.
        let asked = clause
            .split_whitespace()
            .any(|w| matches!(w, "ensure" | "sure"));
        let words: Vec<&str> = clause
            .split_whitespace()
            .map(|w| {
                w.trim_matches(|c: char| {
                    !c.is_alphanumeric() && !matches!(c, '/' | '.' | '_' | '-')
                })
            })
            .filter(|w| !w.is_empty())
            .collect();
        words.iter().enumerate().any(|(i, w)| {
            if !wanted(w) || i == 0 {
                return false;
            }
            let prev = words[i - 1];
            let ends_clause = words
                .get(i + 1)
                .is_none_or(|next| CLAUSE_ENDS.contains(next));
            let is_said = (matches!(prev, "be" | "become" | "becomes")
                || (asked && matches!(prev, "is" | "are" | "it's" | "they're" | "it’s")))
                && matches!(*w, "executable" | "executible")
                && ends_clause;
            let made = (i.saturating_sub(4)..i)
                .rev()
                .find(|&v| VERBS.contains(&words[v]))
                .is_some_and(|v| {
                    let between = &words[v + 1..i];
                    !NOUN_MARKERS.contains(&prev)
                        && (!QUANTIFIERS.contains(&prev) || ends_clause)
                        && between.first() != Some(&"sure")
                        && !between.iter().any(|b| PREPOSITIONS.contains(b))
                });
            made || is_said
        })
    })
}

/// The clauses of `text`: cut at a full stop followed by white space or the end (not the
/// dot of "deploy.sh"), and at commas, semicolons, colons, question and exclamation
/// marks, dashes and line ends.
fn clauses(text: &str) -> impl Iterator<Item = &str> {
    let mut cuts = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_none_or(|(_, n)| n.is_whitespace());
        if matches!(
            c,
            ',' | ';' | ':' | '!' | '?' | '\n' | '\u{2014}' | '\u{2013}'
        ) || (c == '.' && next_is_space)
        {
            cuts.push((i, c.len_utf8()));
        }
    }
    let mut start = 0;
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    for (at, len) in cuts {
        pieces.push(&text[start..at]);
        start = at + len;
    }
    pieces.push(&text[start..]);
    pieces.into_iter()
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

/// The words with keyword arguments taken apart: "mode=0755" as "mode 0755".
fn keyword_split<'a>(words: &[&'a str]) -> Vec<&'a str> {
    words
        .iter()
        .flat_map(|x| x.split('='))
        .filter(|m| !m.is_empty())
        .collect()
}

fn is_octal_mode(m: &str) -> bool {
    (3..=4).contains(&m.len()) && m.chars().all(|c| ('0'..='7').contains(&c))
}

/// `rwxr-xr-x`, `-rwxr-xr-x`, `rwsr-x---`: nine permission letters (a file type letter
/// may lead), one of them an execute bit.
fn is_symbolic_mode_with_exec(w: &str) -> bool {
    let b = w.as_bytes();
    let b = if b.len() == 10 { &b[1..] } else { b };
    b.len() == 9
        && b.chunks(3).all(|t| {
            matches!(t[0], b'r' | b'-')
                && matches!(t[1], b'w' | b'-')
                && matches!(t[2], b'x' | b's' | b't' | b'-' | b'S' | b'T')
        })
        && b.chunks(3).any(|t| matches!(t[2], b'x' | b's' | b't'))
}

fn is_octal_literal_with_exec(w: &str) -> bool {
    let Some(digits) = w.strip_prefix("0o") else {
        return false;
    };
    (3..=4).contains(&digits.len())
        && digits.chars().all(|c| ('0'..='7').contains(&c))
        && digits.chars().any(|c| matches!(c, '1' | '3' | '5' | '7'))
}
