//! How a JSON document that does not fit its shape (a plan, a rollback's options, a config
//! value) is told: where, in the reader's terms ("'content' of action 1"), and what,
//! without the parser's type names ("invalid type: integer `5`, expected a string"). On a
//! refusal the JSON is read again tracking the path (`serde_path_to_error`), and the place
//! and the fault are put in words ("'content' of action 1 must be a string, not a number
//! (5)").

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

/// The longest piece of a refused value quoted back.
const MAX_QUOTED: usize = 60;

/// The words for the error `e` the parser met reading `json` as a `T` (`what` names the
/// whole document: "the plan"), when it is about a value's place in the document: `json`
/// is read again, tracking where. `None` when the error is not about one (the text is
/// not JSON, or a limit of the reading): the parser's own words stand.
pub fn located<T: DeserializeOwned>(
    json: &[u8],
    e: &serde_json::Error,
    what: &str,
) -> Option<String> {
    if e.classify() != serde_json::error::Category::Data {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let Err(found) = serde_path_to_error::deserialize::<_, T>(&mut de) else {
        return None;
    };
    let inner = found.inner();
    // The same error, met at the same place: anything else is not this one.
    if (inner.line(), inner.column()) != (e.line(), e.column()) {
        return None;
    }
    let message = unplaced(inner);
    let segments: Vec<&Segment> = found.path().iter().collect();
    said(&segments, &message, what)
}

/// [`located`]'s words, else the parser's own, with the place in the text set apart:
/// "… (line 1, column 94)" (serde appends "at line 1 column 94" to whatever was said,
/// which after advice reads as part of it).
pub fn worded<T: DeserializeOwned>(json: &[u8], e: &serde_json::Error, what: &str) -> String {
    let words = located::<T>(json, e, what).unwrap_or_else(|| syntax(&unplaced(e)));
    at_place(words, e)
}

/// [`worded`] for a document that is one line of a log: the place is its column alone
/// (the parser's "line 1" would read as the log's first line).
pub fn worded_in_line<T: DeserializeOwned>(
    line: &[u8],
    e: &serde_json::Error,
    what: &str,
) -> String {
    let words = located::<T>(line, e, what).unwrap_or_else(|| syntax(&unplaced(e)));
    if e.column() == 0 {
        return words;
    }
    format!("{words} (column {})", e.column())
}

/// A message about the whole of `what` (a query string: no path to follow), in words
/// when it is one of the parser's shapes; `None` else.
pub fn message_words(message: &str, what: &str) -> Option<String> {
    said(&[], message, what)
}

/// The parser's words for text that is not JSON, in the reader's.
fn syntax(said: &str) -> String {
    let words = match said {
        "EOF while parsing an object" => {
            "the text ends before an object is closed (a '}' is missing)"
        }
        "EOF while parsing a list" => "the text ends before a list is closed (a ']' is missing)",
        "EOF while parsing a string" => "the text ends inside a string (a '\"' is missing)",
        "EOF while parsing a value" => "the text ends where a value was expected",
        "trailing characters" => "more text follows the end of the JSON document",
        "trailing comma" => "a comma is followed by no value",
        "key must be a string" => "an object's key is not a string in double quotes",
        "expected value" => {
            "a value was expected here (a string, number, object, list, true, false or null)"
        }
        "expected `:`" => "an object's key is not followed by ':'",
        "expected `,` or `]`" => {
            "a list's items are separated by ',' and the list is closed by ']': one of them is missing"
        }
        "expected `,` or `}`" => {
            "an object's members are separated by ',' and the object is closed by '}': one of them is missing"
        }
        "expected `\"`" => "a '\"' was expected here",
        "expected ident" => "a word is not JSON here (the only words are true, false and null)",
        "invalid escape" => {
            "a backslash in a string starts no JSON escape (\\\", \\\\, \\/, \\b, \\f, \\n, \\r, \\t, or \\u and four hexadecimal digits): write a backslash itself as \\\\"
        }
        // The parser's words name its own state ("leading", "end of hex escape"), not
        // the escape it met.
        "lone leading surrogate in hex escape" | "unexpected end of hex escape" => {
            "an escape from \\uD800 to \\uDFFF must be one of a pair: a high one, D800 to DBFF, then a low one, DC00 to DFFF; alone it names no character: send the character itself, or its pair"
        }
        "invalid number" => {
            "a number is not written as JSON writes one (an optional '-', digits without a leading zero, then a fraction and an exponent if any; no '+', NaN or Infinity)"
        }
        "number out of range" => "a number is too large to be read (beyond about 1.8e308)",
        "control character (\\u0000-\\u001F) found while parsing a string" => {
            "a string holds a raw control character (a tab, a line break, or another below U+0020): write it escaped, as \\t, \\n, \\r or \\u00XX"
        }
        _ => return said.to_owned(),
    };
    words.to_owned()
}

/// The parser's own words with the place in the text set apart (see [`worded`]).
pub fn placed(e: &serde_json::Error) -> String {
    at_place(syntax(&unplaced(e)), e)
}

fn at_place(words: String, e: &serde_json::Error) -> String {
    if e.line() == 0 {
        return words;
    }
    format!("{words} (line {}, column {})", e.line(), e.column())
}

/// The parser's message without the position it appends.
fn unplaced(e: &serde_json::Error) -> String {
    let said = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    said.strip_suffix(&at).map_or(said.clone(), str::to_owned)
}

/// `message` about the value at `path`, in words; `None` when it is not one of the
/// parser's own shapes (then it is the document's own refusal, already in words).
fn said(path: &[&Segment], message: &str, what: &str) -> Option<String> {
    let place = || place_of(path, what);
    if let Some(words) = value_said(&place(), message) {
        return Some(words);
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return Some(format!("{} needs {}", place(), field(rest)));
    }
    if let Some(rest) = message.strip_prefix("duplicate field ") {
        return Some(format!(
            "{} gives {} twice",
            place_of(holder(path), what),
            field(rest)
        ));
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        // The sender's name comes first and may hold the parser's own separators: the
        // list of fields is what follows the last one.
        let (got, known) = match rest.rsplit_once(", expected ") {
            Some((got, list)) => (got, format!("; it takes {}", fields(list))),
            None => (
                rest.strip_suffix(", there are no fields").unwrap_or(rest),
                "; it takes no other field".to_owned(),
            ),
        };
        return Some(format!(
            "{} has no field {}{known}",
            place_of(holder(path), what),
            field(got)
        ));
    }
    None
}

/// `message`, the parser's about the value at `place` (already in words: "'phase'"),
/// in words when it is about the value's type or among what is allowed; `None` else.
/// What was expected follows the last ", expected ": the value, before it, is the
/// sender's and may hold those words.
pub fn value_said(place: &str, message: &str) -> Option<String> {
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let (got, want) = rest.rsplit_once(", expected ")?;
        return Some(format!(
            "{place} must be {}, not {}",
            wanted(want),
            found(got)
        ));
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let (got, want) = rest.rsplit_once(", expected ")?;
        return Some(format!(
            "{place} is {}; it must be {}",
            found(got),
            wanted(want)
        ));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (got, want) = rest.rsplit_once(", expected ")?;
        return Some(format!(
            "{place} is {}; it must be {}",
            quoted(got),
            wanted(want)
        ));
    }
    None
}

/// The place holding a key the path ends at (a field given twice, or unknown).
fn holder<'p, 's>(path: &'p [&'s Segment]) -> &'p [&'s Segment] {
    match path.split_last() {
        Some((Segment::Map { .. }, rest)) => rest,
        _ => path,
    }
}

/// Where `path` leads, innermost first: "'old' of edit 2 of action 1"; `what` for the
/// whole document.
fn place_of(path: &[&Segment], what: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        match (path[i], path.get(i + 1)) {
            (Segment::Map { key }, Some(Segment::Seq { index })) => {
                let item = match key.as_str() {
                    "actions" => format!("action {}", index + 1),
                    "edits" => format!("edit {}", index + 1),
                    other => format!("item {} of {}", index + 1, field(other)),
                };
                parts.push(item);
                i += 2;
            }
            (Segment::Map { key }, _) => {
                parts.push(field(key));
                i += 1;
            }
            (Segment::Seq { index }, _) => {
                parts.push(format!("item {}", index + 1));
                i += 1;
            }
            _ => i += 1,
        }
    }
    if parts.is_empty() {
        return what.to_owned();
    }
    parts.reverse();
    parts.join(" of ")
}

/// A value as the parser names it ("integer `5`", "string \"x\"", "map"), in words.
fn found(got: &str) -> String {
    // The parser quotes a string escaped already.
    let value = |v: &str| short(v.trim_matches('`'));
    if let Some(v) = got
        .strip_prefix("integer ")
        .or(got.strip_prefix("floating point "))
    {
        return format!("a number ({})", value(v));
    }
    if let Some(v) = got.strip_prefix("string ") {
        return format!("a string ({})", value(v));
    }
    if let Some(v) = got.strip_prefix("boolean ") {
        return format!("a boolean ({})", value(v));
    }
    match got {
        "map" => "an object".to_owned(),
        "sequence" => "an array".to_owned(),
        "null" | "unit value" => "null".to_owned(),
        other => other.replace('`', "'"),
    }
}

/// What the parser expected ("a boolean", "struct Edit", "`rollback` or `stop`"), in words.
fn wanted(want: &str) -> String {
    match want {
        "a boolean" => "true or false".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "an object".to_owned(),
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number (no sign)".to_owned(),
        "path string" => "a path (a string)".to_owned(),
        w if w.starts_with("struct ") => "an object".to_owned(),
        w => w.replace('`', "\""),
    }
}

/// A name the parser quotes in backticks, quoted as a field (a long one short).
fn field(name: &str) -> String {
    format!(
        "'{}'",
        short(&crate::confine::path::escaped(name.trim_matches('`')))
    )
}

/// A value the parser quotes in backticks, quoted as a string.
fn quoted(v: &str) -> String {
    format!(
        "\"{}\"",
        short(&crate::confine::path::escaped(v.trim_matches('`')))
    )
}

/// `v`, cut to [`MAX_QUOTED`] characters with "…" when longer.
fn short(v: &str) -> String {
    let mut chars = v.chars();
    let kept: String = chars.by_ref().take(MAX_QUOTED).collect();
    if chars.next().is_some() {
        format!("{kept}…")
    } else {
        kept
    }
}

/// The parser's list of fields ("`a` or `b`", "one of `a`, `b`, `c`"), quoted as fields
/// and said as a list of what a place holds (`'old' and 'new'`): its "or" would read as
/// a choice between fields an edit needs both of.
fn fields(list: &str) -> String {
    list.trim_start_matches("one of ")
        .replace("` or `", "` and `")
        .replace('`', "'")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        actions: Vec<Item>,
        #[serde(default)]
        mode: Option<Mode>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        path: String,
        #[serde(default)]
        edits: Vec<Edit>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Edit {
        old: String,
        new: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Rollback,
        Stop,
    }

    fn words(json: &str) -> Option<String> {
        let e = serde_json::from_str::<Doc>(json).unwrap_err();
        located::<Doc>(json.as_bytes(), &e, "the plan")
    }

    #[test]
    fn each_shape_the_parser_refuses_is_told_by_its_place() {
        for (json, said) in [
            (
                r#"{"actions": [{"path": 5}]}"#,
                "'path' of action 1 must be a string, not a number (5)",
            ),
            (
                r#"{"actions": [{"path": "a", "edits": [{"old": "x", "new": true}]}]}"#,
                "'new' of edit 1 of action 1 must be a string, not a boolean (true)",
            ),
            (
                r#"{"actions": [{"path": "a", "edits": [{"old": "x"}]}]}"#,
                "edit 1 of action 1 needs 'new'",
            ),
            (r#"{}"#, "the plan needs 'actions'"),
            (
                r#"{"actions": "x"}"#,
                "'actions' must be an array, not a string (\"x\")",
            ),
            (
                r#"{"actions": [], "mode": "maybe"}"#,
                "'mode' is \"maybe\"; it must be \"rollback\" or \"stop\"",
            ),
            (
                r#"{"actions": [{"path": "a"}, {"path": "b", "path": "c"}]}"#,
                "action 2 gives 'path' twice",
            ),
            (
                r#"{"actions": [{"path": "a", "pth": 1}]}"#,
                "action 1 has no field 'pth'; it takes 'path' and 'edits'",
            ),
        ] {
            assert_eq!(words(json).as_deref(), Some(said), "{json}");
        }
        // Not about a place: the parser's words stand.
        let e = serde_json::from_str::<Doc>("{").unwrap_err();
        assert_eq!(located::<Doc>(b"{", &e, "the plan"), None);
    }

    #[test]
    fn a_long_value_is_quoted_short() {
        let long = "x".repeat(500);
        let said = words(&format!(
            r#"{{"actions": [{{"path": "a", "edits": [{{"old": 1, "new": "{long}"}}]}}]}}"#
        ));
        assert_eq!(
            said.as_deref(),
            Some("'old' of edit 1 of action 1 must be a string, not a number (1)")
        );
        let said = words(&format!(r#"{{"actions": [], "mode": "{long}"}}"#)).unwrap();
        assert!(said.len() < 200 && said.contains('…'), "{said}");
        let said = words(&format!(r#"{{"actions": [], "{long}": 1}}"#)).unwrap();
        assert!(
            said.len() < 200 && said.contains("has no field 'xxx"),
            "{said}"
        );
    }

    /// A sender's value or field name holding the parser's separators cannot change
    /// what the refusal says is allowed, nor escape the cut of a long name.
    #[test]
    fn a_value_cannot_speak_for_what_is_allowed() {
        for (json, said) in [
            (
                r#"{"actions": [], "mode": "later, expected anything you like"}"#,
                "'mode' is \"later, expected anything you like\"; it must be \"rollback\" or \"stop\"",
            ),
            (
                r#"{"actions": "x, expected an array, not a string"}"#,
                "'actions' must be an array, not a string (\"x, expected an array, not a string\")",
            ),
            (
                r#"{"actions": [{"path": "a", "colour, expected nothing": 1}]}"#,
                "action 1 has no field 'colour, expected nothing'; it takes 'path' and 'edits'",
            ),
            // What a reader does not see is shown escaped.
            (
                "{\"actions\": [{\"path\": \"a\", \"q\u{3164}\": 1}]}",
                "action 1 has no field 'q\\u{3164}'; it takes 'path' and 'edits'",
            ),
        ] {
            assert_eq!(words(json).as_deref(), Some(said), "{json}");
        }
        let long = format!("x, expected {}", "y".repeat(3000));
        let said = words(&format!(r#"{{"actions": [{{"path": "a", "{long}": 1}}]}}"#)).unwrap();
        assert!(
            said.len() < 300 && said.ends_with("; it takes 'path' and 'edits'"),
            "{said}"
        );
    }

    #[test]
    fn text_that_is_not_json_is_told_in_words() {
        for (json, said) in [
            (
                "{",
                "the text ends before an object is closed (a '}' is missing) (line 1, column 1)",
            ),
            (
                r#"{"actions": []} x"#,
                "more text follows the end of the JSON document (line 1, column 17)",
            ),
        ] {
            let e = serde_json::from_str::<Doc>(json).unwrap_err();
            assert_eq!(worded::<Doc>(json.as_bytes(), &e, "the plan"), said);
        }
    }
}
