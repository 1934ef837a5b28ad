//! Where a character readers do not see has a use in a name: the joiners and selectors that
//! scripts and emoji sequences need (a joiner after a virama, the tag letters of a
//! subdivision flag). Anywhere else such a character only makes one name look like another
//! (`no\u{200B}tes.md`, `caf\u{E9}\u{FE0F}.md`).

use super::path::is_unseen;

/// The first character of `path` readers do not show ([`is_unseen`]) that stands
/// where no script or emoji sequence needs it.
pub(crate) fn first_unseen(path: &str) -> Option<char> {
    // Most names hold none: they are not copied.
    if !path.chars().any(is_unseen) {
        return None;
    }
    let chars: Vec<char> = path.chars().collect();
    chars.iter().enumerate().find_map(|(i, &c)| {
        let next = chars.get(i + 1).copied();
        (is_unseen(c) && !needed(c, &chars[..i], next)).then_some(c)
    })
}

/// Whether the unseen `c`, after `before` and before `next`, does what it is for.
fn needed(c: char, before: &[char], next: Option<char>) -> bool {
    let Some((&p, earlier)) = before.split_last() else {
        return false;
    };
    let next_is = |f: fn(char) -> bool| next.is_some_and(f);
    match u32::from(c) {
        // A joiner or non-joiner: a half form or conjunct asked for after a virama
        // (Devanagari, Bengali's ya-phala, Sinhala's fused letters) or before one
        // (Bengali's ya-phala without a reph, Kannada, Sinhala's touching letters),
        // Malayalam's chillu at a word's end, a join a joining script makes or breaks
        // (Arabic, Persian, Syriac, Mongolian; vowel marks may sit on the letter before),
        // an emoji sequence (a family, a rainbow flag: joiners only). A virama's letter
        // may carry a nukta.
        0x200C | 0x200D => {
            let virama_on_letter = is_virama(p) && base_letter(earlier).is_some();
            let letter = base_letter(before);
            (virama_on_letter && (next_is(is_letter) || (c == '\u{200D}' && p == '\u{D4D}')))
                || (letter.is_some() && next_is(is_virama))
                || (letter.is_some_and(joins) && next_is(joins))
                || (c == '\u{200D}' && ends_emoji(p) && next_is(is_pictographic))
        }
        // Text or emoji presentation, once, of a pictograph or a keycap's base.
        0xFE0E | 0xFE0F => {
            is_pictographic(p) || (matches!(p, '0'..='9' | '#' | '*') && next == Some('\u{20E3}'))
        }
        // Standardized variants: of Han compatibility ideographs, Myanmar letters,
        // mathematical symbols, Phags-pa.
        0xFE00..=0xFE0D => {
            is_han(p)
                || matches!(u32::from(p),
                    0x1000..=0x109F | 0x2200..=0x22FF | 0x2A00..=0x2AFF | 0xA840..=0xA877)
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

/// A virama, or a sign that acts as one (Unicode's canonical combining class 9), of
/// every script that joins consonants through one.
fn is_virama(c: char) -> bool {
    unicode_normalization::char::canonical_combining_class(c) == 9
}

/// The letter the marks at the end of `chars` sit on (a nukta, an Arabic vowel mark),
/// or the last character if it is a letter.
fn base_letter(chars: &[char]) -> Option<char> {
    chars
        .iter()
        .rev()
        .find(|&&c| unicode_normalization::char::canonical_combining_class(c) == 0)
        .copied()
        .filter(|&c| is_letter(c))
}

/// A letter beyond ASCII that a mark may sit on.
fn is_letter(c: char) -> bool {
    !c.is_ascii()
        && c.is_alphabetic()
        && unicode_normalization::char::canonical_combining_class(c) == 0
}

/// Letters of the scripts whose letters join each other (a joiner or non-joiner between
/// two of them changes how they are drawn): not their digits, marks or punctuation.
fn joins(c: char) -> bool {
    is_letter(c)
        && matches!(u32::from(c),
            0x620..=0x6FF | 0x700..=0x74F | 0x750..=0x77F | 0x7C0..=0x7FF | 0x840..=0x85F
            | 0x860..=0x89F | 0x8A0..=0x8FF | 0x1820..=0x18AA | 0xA840..=0xA877
            | 0xFB50..=0xFDFF | 0xFE70..=0xFEFC | 0x10AC0..=0x10AFF | 0x10B80..=0x10BAF
            | 0x10D00..=0x10D3F | 0x10EC0..=0x10EFF | 0x10F30..=0x10FDF | 0x1E900..=0x1E95F)
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
