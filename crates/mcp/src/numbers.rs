//! Numbers and keys a tool call would not get back as sent.
//!
//! rmcp parses each message into `serde_json` values, which hold numbers as 64-bit
//! integers or doubles, and keep one value of a key given twice: `12345678901234567890123`,
//! `0.1000000000000000000001` or `{"k": 1, "k": 2}` would reach a `write_json` file
//! changed, and the tool would report success. Only the message's text says what was sent,
//! so the session's input passes through [`pump`], which checks each `tools/call` line
//! before rmcp sees it and notes the calls whose arguments hold such a number or key; the
//! call is then refused as `invalid_plan`, as the same plan is over HTTP and the CLI
//! ([`ailab_sandbox_core::plan::check_numbers_kept`],
//! [`ailab_sandbox_core::plan::check_unique_keys`]).

use ailab_sandbox_core::plan::{check_numbers_kept, check_unique_keys};
use ailab_sandbox_core::reason::Refusal;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// At most this many noted calls are kept: a call rmcp refuses before it reaches the
/// handler never takes its note, and must not make the list grow for ever.
const MAX_NOTED: usize = 64;

/// The `tools/call` requests of one session whose arguments hold a number that would
/// not be kept, by request id (its JSON text, canonical).
#[derive(Debug, Default)]
pub(crate) struct LossyCalls {
    noted: Mutex<VecDeque<(String, Refusal)>>,
}

impl LossyCalls {
    /// Takes the note of the request `id`, if it has one.
    pub(crate) fn take(&self, id: &impl serde::Serialize) -> Option<Refusal> {
        let key = serde_json::to_string(id).ok()?;
        let mut noted = self.lock();
        let at = noted.iter().position(|(k, _)| *k == key)?;
        noted.remove(at).map(|(_, r)| r)
    }

    fn note(&self, key: String, refusal: Refusal) {
        let mut noted = self.lock();
        if noted.len() == MAX_NOTED {
            noted.pop_front();
        }
        noted.push_back((key, refusal));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Refusal)>> {
        self.noted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes the request on `line` (one JSON-RPC message) if it is a `tools/call` holding
    /// a number that would not be kept or an object that gives a key twice.
    fn inspect(&self, line: &[u8]) {
        // The whole message, so that neither an escaped method name (`tools\/call`) nor a
        // second `arguments` hides the call from the check.
        let Err(refusal) = check_numbers_kept(line).and_then(|()| check_unique_keys(line)) else {
            return;
        };
        // As rmcp reads it: the last of duplicated keys.
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        if msg.get("method").and_then(serde_json::Value::as_str) != Some("tools/call") {
            return;
        }
        // The id as the handler will see it, written back by serde_json.
        let Some(key) = msg.get("id").and_then(|id| serde_json::to_string(id).ok()) else {
            return;
        };
        self.note(key, refusal);
    }
}

/// Copies `reader` to `out` unchanged, inspecting each line (up to `max_line` bytes)
/// before its newline is passed on, so that a note is made before rmcp can parse the
/// message. Ends at the end of `reader`, a read error, or when `out` is closed.
pub(crate) async fn pump<R, W>(mut reader: R, mut out: W, calls: &LossyCalls, max_line: usize)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    let mut line = Vec::new();
    // The current line is longer than `max_line`: rmcp refuses it, nothing to inspect.
    let mut too_long = false;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = chunk.split_at(at);
            if !too_long && line.len() + head.len() <= max_line {
                line.extend_from_slice(head);
                calls.inspect(&line);
            }
            line.clear();
            too_long = false;
            if out.write_all(head).await.is_err() || out.write_all(b"\n").await.is_err() {
                return;
            }
            chunk = &rest[1..];
        }
        if !too_long {
            if line.len() + chunk.len() > max_line {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        if out.write_all(chunk).await.is_err() {
            return;
        }
    }
    // A last message without a newline is still read by rmcp.
    if !too_long && !line.is_empty() {
        calls.inspect(&line);
    }
    let _ = out.shutdown().await;
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

    #[tokio::test]
    async fn lines_pass_unchanged_and_lossy_calls_are_noted() {
        let input = format!(
            "{}\n{}\r\n{}\n{}",
            call("1", "[1.5, 2]"),
            call("\"a\\u0062\"", "12345678901234567890123"),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"x":0.1000000000000000000001}}"#,
            call("4", "{\"p\": 0.1000000000000000000001}"),
        );
        let calls = LossyCalls::default();
        let mut out = Vec::new();
        pump(input.as_bytes(), &mut out, &calls, 1 << 20).await;
        assert_eq!(out, input.as_bytes());
        assert!(calls.take(&1).is_none());
        assert!(calls.take(&3).is_none(), "not a tools/call");
        let r = calls.take(&"ab").unwrap();
        assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
        assert!(r.reason.contains("12345678901234567890123"), "{}", r.reason);
        // The last line has no newline and is still inspected.
        assert!(calls.take(&4).is_some());
        assert!(calls.take(&4).is_none(), "a note is taken once");
    }

    #[tokio::test]
    async fn lines_over_the_limit_pass_uninspected() {
        let line = call("7", "12345678901234567890123");
        let calls = LossyCalls::default();
        let mut out = Vec::new();
        pump(
            format!("{line}\n").as_bytes(),
            &mut out,
            &calls,
            line.len() - 1,
        )
        .await;
        assert_eq!(out, format!("{line}\n").as_bytes());
        assert!(calls.take(&7).is_none());
    }
}
