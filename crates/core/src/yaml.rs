//! YAML for `write_yaml` and `generate_config`: JSON data written so that every YAML
//! reader, YAML 1.1 ones included (PyYAML, go-yaml v2, Ruby, Ansible), reads back the
//! values that were sent. A string goes out plain only when it cannot be read as
//! anything else (`yes`, `off`, `2020-01-01`, `1_000`, `12:30:00` and `=` are all
//! quoted); every other string is double-quoted with escapes, so that no character in it
//! can end the scalar or the line.

use serde_json::{Number, Value};
use std::fmt::Write;

/// The document for `v`, ending in a newline.
pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => mapping(m, 0, &mut out),
        Value::Array(a) if !a.is_empty() => sequence(a, 0, &mut out),
        _ => {
            out.push_str(&scalar(v));
            out.push('\n');
        }
    }
    out
}

/// A scalar, or the flow form of an empty collection.
fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => number(n),
        Value::String(s) => string(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => false,
    }
}

/// YAML limits an implicit key to 1024 characters.
const MAX_IMPLICIT_KEY: usize = 1000;

fn mapping(m: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    for (k, v) in m {
        let key = string(k);
        out.push_str(&" ".repeat(indent));
        if key.len() > MAX_IMPLICIT_KEY {
            // Too long for an implicit key: the explicit form, "? key" then ": value".
            out.push_str("? ");
            out.push_str(&key);
            out.push('\n');
            out.push_str(&" ".repeat(indent));
        } else {
            out.push_str(&key);
        }
        out.push(':');
        if is_block(v) {
            out.push('\n');
            block(v, indent + 2, out);
        } else {
            out.push(' ');
            out.push_str(&scalar(v));
            out.push('\n');
        }
    }
}

fn sequence(a: &[Value], indent: usize, out: &mut String) {
    for v in a {
        if is_block(v) {
            // The item's first line goes after the dash: "- key: value" / "- - x". The
            // dash takes the place of that line's last two spaces of indentation, in
            // place: an item rendered apart and copied would be copied again at each
            // level of nesting.
            let at = out.len();
            block(v, indent + 2, out);
            out.replace_range(at + indent..at + indent + 2, "- ");
        } else {
            out.push_str(&" ".repeat(indent));
            out.push_str("- ");
            out.push_str(&scalar(v));
            out.push('\n');
        }
    }
}

fn block(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Object(m) => mapping(m, indent, out),
        Value::Array(a) => sequence(a, indent, out),
        _ => {}
    }
}

/// A number as YAML 1.1 reads it too: a float in exponent form needs a dot in its
/// mantissa and a sign in its exponent there (`1e300` would be a string).
fn number(n: &Number) -> String {
    let s = n.to_string();
    let Some(e) = s.find(['e', 'E']) else {
        return s;
    };
    let (mantissa, exponent) = (&s[..e], &s[e + 1..]);
    let dot = if mantissa.contains('.') { "" } else { ".0" };
    let sign = if exponent.starts_with(['-', '+']) {
        ""
    } else {
        "+"
    };
    format!("{mantissa}{dot}e{sign}{exponent}")
}

/// Words that YAML 1.1 or 1.2 reads as booleans or null, compared case-insensitively.
const SPECIAL_WORDS: [&str; 9] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null"];

/// A string that no YAML reader takes for anything else can go out plain: it starts
/// with a letter, `_` or `/`, holds only letters, digits, spaces and `_ . / -`, does
/// not end in a space and is not a special word. Anything else is double-quoted.
fn string(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '.' | '/' | '-'))
        && !s.ends_with(' ')
        && !SPECIAL_WORDS.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            // YAML's printable set; NEL, LS and PS are line breaks to a YAML reader and
            // would be folded, so they are escaped too.
            '\u{20}'..='\u{7e}' | '\u{a0}'..='\u{2027}' | '\u{202a}'..='\u{d7ff}' => out.push(c),
            '\u{e000}'..='\u{fefe}' | '\u{ff00}'..='\u{fffd}' | '\u{10000}'.. => out.push(c),
            _ => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::to_string;
    use serde_json::{Value, json};

    fn read_back(text: &str) -> Value {
        yaml_serde::from_str(text).unwrap()
    }

    #[test]
    fn strings_a_yaml_1_1_reader_would_retype_are_quoted() {
        for s in [
            "yes",
            "No",
            "ON",
            "off",
            "y",
            "true",
            "False",
            "null",
            "~",
            "2020-01-01",
            "1_000",
            "12:30:00",
            "=",
            "<<",
            "123",
            "1.5",
            "0x1F",
            ".inf",
            ".NaN",
            "",
            " lead",
            "trail ",
            "a: b",
            "a #b",
            "#c",
            "-",
            "- x",
            "-x",
            "@x",
            "`x",
            "!x",
            "&a",
            "*a",
            "%x",
            "|",
            ">",
            "'q'",
            "\"q\"",
            "{a}",
            "[a]",
            "a,b",
        ] {
            let text = to_string(&json!({ "k": s }));
            assert!(text.starts_with("k: \""), "{s:?} went out plain: {text}");
            assert_eq!(read_back(&text), json!({ "k": s }), "{text}");
        }
        for s in [
            "x",
            "hello world",
            "/usr/bin",
            "v1.2-rc_3",
            "Yesterday",
            "nothing",
        ] {
            assert_eq!(to_string(&json!({ "k": s })), format!("k: {s}\n"));
        }
    }

    #[test]
    fn no_character_can_end_a_string_early() {
        let s = "line1\nline2\r\t\"q\" \\ \u{0}\u{7}\u{1b}[31m\u{7f}\u{85}\u{2028}\u{2029}\u{feff}é中🙂";
        let text = to_string(&json!({ s: s }));
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.contains('\u{85}') && !text.contains('\u{2028}'),
            "{text}"
        );
        assert_eq!(read_back(&text), json!({ s: s }));
    }

    #[test]
    fn nested_data_reads_back_as_sent() {
        let v = json!({
            "name": "svc",
            "server": {"port": 8080, "debug": false, "hosts": ["a", "b"], "tls": null},
            "empty": {}, "none": [],
            "list": [{"a": 1, "b": {"c": [1, [2, [3, []]]]}}, [], {}, [{"x": "yes"}], "on"],
            "floats": [0.1, -2.5, 1e300, 1.5e-7, -1e-300],
            "ints": [18446744073709551615u64, -9223372036854775808i64, 0]
        });
        let text = to_string(&v);
        assert_eq!(read_back(&text), v, "{text}");
        assert!(
            text.contains("1.0e+300") && text.contains("1.5e-7"),
            "{text}"
        );
        let long = "k".repeat(5000);
        let v = json!({ &long: {"a": 1}, "list": [{ &long: "yes" }] });
        assert_eq!(read_back(&to_string(&v)), v);
        for top in [
            json!([]),
            json!({}),
            json!("yes"),
            json!(3),
            json!([[1], {"a": [2]}]),
        ] {
            assert_eq!(read_back(&to_string(&top)), top);
        }
    }
}
