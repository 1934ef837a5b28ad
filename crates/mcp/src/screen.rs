//! The session's input, screened line by line before rmcp reads it.
//!
//! rmcp parses each message into `serde_json` values, which hold numbers as 64-bit
//! integers or doubles, and keep one value of a key given twice: `12345678901234567890123`,
//! `0.1000000000000000000001` or `{"k": 1, "k": 2}` would reach a `write_json` file
//! changed, and the tool would report success. It also builds every value of a message
//! before any handler sees it, so arguments far past what a plan may hold
//! ([`ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN`]) would take gigabytes. Only the
//! message's text says what was sent, so [`pump`] reads each line whole and checks a
//! `tools/call`'s text ([`ailab_sandbox_core::plan::check_numbers_kept`],
//! [`ailab_sandbox_core::plan::check_unique_keys`], which stops counting at the limit).
//! A call that fails is passed on without its arguments, its refusal under
//! [`REFUSED_META_KEY`] in `params._meta`: the handler answers with it (`invalid_plan`, as
//! the same plan is refused over HTTP and the CLI), whatever the number of such calls in
//! flight. A refusal a client puts there itself only refuses its own call. Any other
//! message that fails never reaches rmcp as sent either: a request goes on without its
//! parameters, anything else is dropped. Lines are read past a byte order mark, as rmcp
//! reads them, and a line too long for rmcp is dropped here, never passed on unscreened.
//!
//! rmcp also ends a session whose first message is a notification; notifications are never
//! answered, so the pump drops those sent before `initialize`.

use ailab_sandbox_core::plan::{check_numbers_kept, check_unique_keys};
use ailab_sandbox_core::reason::Refusal;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The `params._meta` key carrying the refusal of a call whose text failed the screen.
pub(crate) const REFUSED_META_KEY: &str = "ailab-sandbox/refused";

/// The refusal the screen handed over in a call's `_meta`, if any.
pub(crate) fn refusal_in(meta: &serde_json::Map<String, Value>) -> Option<Refusal> {
    let noted = meta.get(REFUSED_META_KEY)?;
    Some(
        Refusal::deserialize(noted).unwrap_or_else(|_| {
            Refusal::new(
                ailab_sandbox_core::ReasonCode::InvalidPlan,
                format!("the call's _meta holds '{REFUSED_META_KEY}', a key reserved for the server's own refusals"),
            )
        }),
    )
}

/// What a message says of itself, read without building its other values. A key given
/// twice keeps its last value, as rmcp reads it.
#[derive(Default)]
struct Head {
    jsonrpc: Option<Value>,
    method: Option<String>,
    id: Option<Value>,
    /// `params.name`.
    name: Option<String>,
    /// `params._meta`, as sent.
    meta: Option<Box<serde_json::value::RawValue>>,
}

/// A JSON value kept when it is a string or a number (what a method, a version, an id or
/// a tool name may be), skipped unbuilt otherwise.
struct Scalar(Option<Value>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(s))))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(n))))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(n))))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(n))))
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(b))))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::Null)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl Scalar {
    fn text(self) -> Option<String> {
        match self.0 {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    }
}

/// A message's `params` (an object, else the message is not read), of which `name` and
/// `_meta` are kept: `_meta` as text, so that a large one is never built.
#[derive(Default)]
struct Params {
    name: Option<String>,
    meta: Option<Box<serde_json::value::RawValue>>,
}

impl<'de> Deserialize<'de> for Params {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Params;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Params, A::Error> {
                let mut params = Params::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => params.name = map.next_value::<Scalar>()?.text(),
                        "_meta" => params.meta = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(params)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Head;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
                let mut head = Head::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "jsonrpc" => head.jsonrpc = map.next_value::<Scalar>()?.0,
                        "method" => head.method = map.next_value::<Scalar>()?.text(),
                        "id" => head.id = map.next_value::<Scalar>()?.0,
                        "params" => {
                            let p = map.next_value::<Params>()?;
                            (head.name, head.meta) = (p.name, p.meta);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(head)
            }
        }
        d.deserialize_map(V)
    }
}

impl Head {
    fn of(line: &[u8]) -> Option<Head> {
        serde_json::from_slice(line).ok()
    }

    fn is_notification(&self) -> bool {
        self.method.is_some() && self.id.is_none()
    }
}

/// What the pump passes on for one whole line: the line itself, another message in its
/// place, or nothing.
enum Pass {
    Line,
    Instead(Vec<u8>),
    Drop,
}

/// The most of a client's `params._meta` kept on a message passed on in another's place
/// (rmcp needs it from clients that skip `initialize`); a larger one is left out.
const MAX_META_BYTES: usize = 64 * 1024;

/// Screens one whole line (one JSON-RPC message, without a byte order mark).
/// `initialized`: an `initialize` request has been passed on, and is set when this line
/// is one.
fn screen(line: &[u8], initialized: &mut bool) -> Pass {
    if !*initialized && let Some(head) = Head::of(line) {
        if head.is_notification() {
            tracing::debug!(method = ?head.method, "a notification before initialize, dropped");
            return Pass::Drop;
        }
        *initialized = head.method.as_deref() == Some("initialize");
    }
    // The whole message, so that neither an escaped method name (`tools\/call`) nor a
    // second `arguments` hides the call from the check.
    let Err(refusal) = check_numbers_kept(line).and_then(|()| check_unique_keys(line)) else {
        return Pass::Line;
    };
    // From here on the message never reaches rmcp as sent: rmcp would build all its
    // values (however many), or read other ones than were sent.
    let Some(head) = Head::of(line) else {
        // Not a JSON object: rmcp would not answer it either.
        tracing::debug!("a message that is not a JSON object, dropped");
        return Pass::Drop;
    };
    let (Some(method), Some(id)) = (head.method, head.id) else {
        // A notification or a response (the server asks the client nothing): never
        // answered.
        tracing::debug!("a notification or response that failed the screen, dropped");
        return Pass::Drop;
    };
    let mut meta = head
        .meta
        .filter(|m| m.get().len() <= MAX_META_BYTES)
        .and_then(|m| serde_json::from_str::<serde_json::Map<String, Value>>(m.get()).ok())
        .unwrap_or_default();
    let mut params = serde_json::Map::new();
    if method == "tools/call" {
        // Answered by the handler with the refusal, as a tool result.
        meta.insert(REFUSED_META_KEY.into(), serde_json::json!(refusal));
        params.insert("name".into(), head.name.unwrap_or_default().into());
    }
    if !meta.is_empty() {
        params.insert("_meta".into(), Value::Object(meta));
    }
    // Any other request goes on without its parameters: rmcp answers it as such.
    let mut message = serde_json::Map::new();
    if let Some(v) = head.jsonrpc {
        message.insert("jsonrpc".into(), v);
    }
    message.insert("id".into(), id);
    message.insert("method".into(), method.into());
    if !params.is_empty() {
        message.insert("params".into(), Value::Object(params));
    }
    Pass::Instead(Value::Object(message).to_string().into_bytes())
}

/// Copies `reader` to `out` a line at a time, screening each line (see the module); a
/// line longer than `max_line` bytes (its newline aside) is dropped, as rmcp would drop
/// it, and a last line without a newline is passed on with one, so that rmcp reads it.
/// rmcp must accept lines of `max_line` bytes and a newline. Ends at the end of `reader`,
/// a read error, or when `out` is closed.
pub(crate) async fn pump<R, W>(mut reader: R, mut out: W, max_line: usize)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    let mut line = Vec::new();
    // The current line is longer than `max_line`: dropped as it comes.
    let mut too_long = false;
    let mut initialized = false;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        loop {
            let newline = chunk.iter().position(|&b| b == b'\n');
            let (head, rest) = chunk.split_at(newline.unwrap_or(chunk.len()));
            if !too_long && line.len() + head.len() > max_line {
                too_long = true;
                line = Vec::new();
                tracing::warn!(max_line, "a message longer than the limit, dropped");
            } else if !too_long {
                line.extend_from_slice(head);
            }
            if newline.is_none() {
                break;
            }
            if !too_long && !pass(&mut out, &line, &mut initialized).await {
                return;
            }
            line.clear();
            too_long = false;
            chunk = &rest[1..];
        }
    }
    if !too_long && !line.is_empty() && !pass(&mut out, &line, &mut initialized).await {
        return;
    }
    let _ = out.shutdown().await;
}

/// Passes on what [`screen`] makes of `line` and a newline; false when `out` is closed.
async fn pass<W: AsyncWrite + Unpin>(out: &mut W, line: &[u8], initialized: &mut bool) -> bool {
    // rmcp reads past a byte order mark; the screen's parsers would stop at it.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let written = match screen(line, initialized) {
        Pass::Drop => return true,
        Pass::Line => out.write_all(line).await,
        Pass::Instead(message) => out.write_all(&message).await,
    };
    written.is_ok() && out.write_all(b"\n").await.is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ailab_sandbox_core::ReasonCode;

    fn call(id: &str, data: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"a.json","data":{data}}}}}}}"#
        )
    }

    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;

    async fn pumped(input: &str, max_line: usize) -> Vec<String> {
        let mut out = Vec::new();
        pump(input.as_bytes(), &mut out, max_line).await;
        String::from_utf8(out)
            .unwrap()
            .split('\n')
            .map(str::to_owned)
            .collect()
    }

    fn refusal_of(line: &str) -> (Value, Refusal) {
        let msg: Value = serde_json::from_str(line).unwrap();
        let meta = msg["params"]["_meta"].as_object().unwrap();
        (msg.clone(), refusal_in(meta).unwrap())
    }

    #[tokio::test]
    async fn calls_kept_as_sent_pass_unchanged_and_others_carry_their_refusal() {
        let lossy_meta = r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"_meta":{"progressToken":3},"name":"read_file","arguments":{"path":"a","path":"b"}}}"#;
        let lines = [
            INITIALIZE.to_owned(),
            call("1", "[1.5, 2]"),
            call("\"a\\u0062\"", "12345678901234567890123"),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"x":0.1000000000000000000001}}"#
                .to_owned(),
            format!("\u{feff}{}", call("5", "[1]")),
            lossy_meta.to_owned(),
            call("4", r#"{"k": 1, "k": 2}"#),
        ];
        let input = format!(
            "{}\n{}\n{}\r\n{}\n{}\n{}\n{}",
            lines[0], lines[1], lines[2], lines[3], lines[4], lines[5], lines[6]
        );
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out.len(), 8, "{out:?}");
        assert_eq!(out[0], lines[0]);
        assert_eq!(out[1], lines[1]);
        let (msg, r) = refusal_of(&out[2]);
        assert_eq!(msg["id"], "ab");
        assert_eq!(msg["method"], "tools/call");
        assert_eq!(msg["params"]["name"], "write_json");
        assert!(msg["params"].get("arguments").is_none(), "{msg}");
        assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
        assert!(r.reason.contains("12345678901234567890123"), "{}", r.reason);
        // Another request that fails goes on without its parameters.
        assert_eq!(out[3], r#"{"id":3,"jsonrpc":"2.0","method":"tools/list"}"#);
        // A byte order mark is read past, as rmcp does.
        assert_eq!(out[4], call("5", "[1]"));
        // The client's `_meta` stays.
        let (msg, r) = refusal_of(&out[5]);
        assert_eq!(msg["params"]["_meta"]["progressToken"], 3, "{msg}");
        assert!(r.reason.contains("'path' appears twice"), "{}", r.reason);
        // The last line has no newline: it is screened, and passed on with one.
        let (msg, r) = refusal_of(&out[6]);
        assert_eq!(msg["id"], 4);
        assert!(r.reason.contains("'k' appears twice"), "{}", r.reason);
        assert_eq!(out[7], "");
    }

    /// A message that fails the screen and is not a request never reaches rmcp.
    #[tokio::test]
    async fn failing_notifications_responses_and_non_objects_are_dropped() {
        let input = format!(
            "{INITIALIZE}\n{}\n{}\n{}\n{}\n",
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write_json","arguments":{"data":1e400}}}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{"k":1,"k":2}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":1e400}}]"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
        );
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(
            out,
            [
                INITIALIZE,
                r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
                ""
            ]
        );
    }

    /// However many refused calls are in flight, each carries its own refusal.
    #[tokio::test]
    async fn every_refused_call_of_a_burst_carries_its_refusal() {
        let input: Vec<String> = std::iter::once(INITIALIZE.to_owned())
            .chain((0..500).map(|i| call(&i.to_string(), "12345678901234567890123")))
            .collect();
        let out = pumped(&input.join("\n"), 1 << 20).await;
        assert_eq!(out.len(), 502);
        for (i, line) in out[1..501].iter().enumerate() {
            let (msg, r) = refusal_of(line);
            assert_eq!(msg["id"], i);
            assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
        }
    }

    #[tokio::test]
    async fn arguments_past_the_plan_limit_are_refused_unbuilt() {
        let zeros = vec!["0"; ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN + 1].join(",");
        let input = format!("{INITIALIZE}\n{}\n", call("9", &format!("[{zeros}]")));
        let out = pumped(&input, 64 << 20).await;
        let (msg, r) = refusal_of(&out[1]);
        assert_eq!(msg["id"], 9);
        assert!(r.reason.contains("values"), "{}", r.reason);
        assert!(out[1].len() < 1000, "the arguments were passed on");
    }

    #[tokio::test]
    async fn notifications_before_initialize_are_dropped() {
        let cancelled =
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#;
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let ping = r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
        let input = format!("{cancelled}\n{initialized}\n{ping}\n{INITIALIZE}\n{initialized}\n");
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out, [ping, INITIALIZE, initialized, ""]);
    }

    #[tokio::test]
    async fn lines_over_the_limit_are_dropped() {
        let line = call("7", "12345678901234567890123");
        let fits = call("8", "[1]");
        let input = format!("{INITIALIZE}\n{line}\n{fits}\n{line}");
        let out = pumped(&input, line.len() - 1).await;
        assert_eq!(out, [INITIALIZE, fits.as_str(), ""]);
    }

    #[test]
    fn a_refusal_a_client_writes_refuses_its_own_call() {
        let meta = serde_json::json!({ REFUSED_META_KEY: "anything" });
        let r = refusal_in(meta.as_object().unwrap()).unwrap();
        assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
        assert!(refusal_in(&serde_json::Map::new()).is_none());
    }
}
