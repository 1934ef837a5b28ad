//! Where a character readers do not see has a use in a name: the joiners and selectors
//! that scripts and emoji sequences need. Anywhere else such a character only makes one
//! name look like another (`no\u{200B}tes.md`, `caf\u{E9}\u{FE0F}.md`).

use super::path::shows_otherwise;

/// The first character of `path` readers do not show ([`shows_otherwise`]) that stands
/// where no script or emoji sequence needs it.
pub(crate) fn first_unseen(path: &str) -> Option<char> {
    // Most names hold none: they are not copied.
    if !path.chars().any(shows_otherwise) {
        return None;
    }
    let chars: Vec<char> = path.chars().collect();
    chars.iter().enumerate().find_map(|(i, &c)| {
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1).copied();
        (shows_otherwise(c) && !needed(c, prev, next)).then_some(c)
    })
}

/// Whether the unseen `c`, between `prev` and `next`, does what it is for.
fn needed(c: char, prev: Option<char>, next: Option<char>) -> bool {
    let Some(p) = prev else {
        return false;
    };
    let next_is = |f: fn(char) -> bool| next.is_some_and(f);
    match u32::from(c) {
        // A joiner: an emoji sequence (a family, a rainbow flag), a half form or
        // conjunct after a virama (Devanagari, Bengali's ya-phala, Malayalam's chillu
        // at a word's end, Sinhala), a join a joining script makes or breaks (Arabic,
        // Persian, Syriac, Mongolian).
        0x200D => {
            (ends_emoji(p) && next_is(is_pictographic))
                || is_virama(p)
                || (joins(p) && next_is(joins))
        }
        0x200C => is_virama(p) || (joins(p) && next_is(joins)),
        // Text or emoji presentation, once, of a pictograph or a keycap's base.
        0xFE0E | 0xFE0F => {
            is_pictographic(p) || (matches!(p, '0'..='9' | '#' | '*') && next == Some('\u{20E3}'))
        }
        0xE0100..=0xE01EF => is_han(p),
        0x180B..=0x180D | 0x180F => is_mongolian_letter(p),
        // Mongolian's vowel separator, before a word's final vowel.
        0x180E => is_mongolian_letter(p) && next_is(is_mongolian_letter),
        // A subdivision flag: the black flag, tag letters, the cancel tag ending them.
        0xE0020..=0xE007E => {
            (p == '\u{1F3F4}' || is_tag(p)) && next_is(|n| is_tag(n) || n == '\u{E007F}')
        }
        0xE007F => is_tag(p),
        _ => false,
    }
}

/// Pictographs that emoji sequences are made of (skin tones among them).
fn is_pictographic(c: char) -> bool {
    matches!(u32::from(c),
        0xA9 | 0xAE | 0x203C | 0x2049 | 0x2122 | 0x2139 | 0x2190..=0x21FF | 0x2300..=0x23FF
        | 0x24C2 | 0x25A0..=0x25FF | 0x2600..=0x27BF | 0x2934..=0x2935 | 0x2B00..=0x2BFF
        | 0x3030 | 0x303D | 0x3297 | 0x3299 | 0x1F000..=0x1FAFF)
}

/// What may end one emoji of a sequence before a joiner.
fn ends_emoji(c: char) -> bool {
    is_pictographic(c) || matches!(c, '\u{FE0F}' | '\u{20E3}' | '\u{E007F}')
}

/// The viramas (and like signs) of the scripts that join consonants through them.
fn is_virama(c: char) -> bool {
    matches!(
        u32::from(c),
        0x94D
            | 0x9CD
            | 0xA4D
            | 0xACD
            | 0xB4D
            | 0xBCD
            | 0xC4D
            | 0xCCD
            | 0xD3B
            | 0xD3C
            | 0xD4D
            | 0xDCA
            | 0xE3A
            | 0xEBA
            | 0xF84
            | 0x1039
            | 0x103A
            | 0x1714
            | 0x1734
            | 0x17D2
            | 0x1A60
            | 0x1B44
            | 0x1BAA
            | 0x1BAB
            | 0xA806
            | 0xA8C4
            | 0xA953
            | 0xA9C0
            | 0xAAF6
            | 0xABED
    )
}

/// Letters of the scripts whose letters join each other (a joiner or non-joiner between
/// two of them changes how they are drawn).
fn joins(c: char) -> bool {
    matches!(u32::from(c),
        0x620..=0x6FF | 0x700..=0x74F | 0x750..=0x77F | 0x7C0..=0x7FF | 0x840..=0x85F
        | 0x8A0..=0x8FF | 0x1820..=0x18AA | 0xA840..=0xA877 | 0xFB50..=0xFDFF
        | 0xFE70..=0xFEFC | 0x10AC0..=0x10AFF | 0x10B80..=0x10BAF | 0x10D00..=0x10D3F
        | 0x10F30..=0x10F6F | 0x1E900..=0x1E95F)
}

fn is_han(c: char) -> bool {
    matches!(u32::from(c),
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x3FFFF)
}

fn is_mongolian_letter(c: char) -> bool {
    matches!(u32::from(c), 0x1820..=0x18AA)
}

fn is_tag(c: char) -> bool {
    matches!(u32::from(c), 0xE0020..=0xE007E)
}
