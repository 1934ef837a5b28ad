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
//! A call that fails is passed on without its arguments (but for the few, small strings a
//! probe's audit line takes, when it asks for what is never allowed), its refusal under
//! [`REFUSED_META_KEY`] in `params._meta`: the handler answers with it (`invalid_plan`, as
//! the same plan is refused over HTTP and the CLI), whatever the number of such calls in
//! flight. A refusal a client puts there itself only refuses its own call. Any other
//! message that fails never reaches rmcp as sent either: a request goes on without its
//! parameters, anything else is dropped. Lines are read past a byte order mark, as rmcp
//! reads them, and a line too long for rmcp is dropped here, never passed on unscreened
//! (a call among them is answered from its first 4 KiB, when they name its id). A
//! `tools/call` that rmcp could not read (its text not UTF-8, its parameters of the wrong
//! type) is refused too, passed on without its arguments.
//!
//! rmcp also ends a session at a notification or response that comes before
//! `initialize` (other requests it answers); notifications and responses are never
//! answered, so the pump drops those sent before `initialize`.
//!
//! rmcp reads every message as soon as it can and holds each call, arguments and all,
//! until the handler has served it; at the end of its input it gives the calls still
//! running 5 s, then cancels them. So the pump paces the calls by [`Flow`]: it passes on
//! no more while [`MAX_QUEUED_CALLS`] it passed on are unanswered, nor a call whose text
//! could hold more data than those leave room for ([`DATA_ROOM`]; calls taking none pass
//! it), and holds the next ones
//! as sent (their text, a fraction of what rmcp builds of them), reading on up to
//! [`MAX_HELD_BYTES`] of them, so that other messages, cancellations above all, still go
//! through at once. A call cancelled while held is passed on in its turn with a
//! cancellation of the pump's own right behind it, so that the handler sees it cancelled
//! before it starts (and still audits a forbidden tool). At the end of the client's input
//! the pump closes rmcp's only once every call has been passed on and answered, and the
//! answers flushed (rmcp would also drop answers not yet written once its input ends).
//!
//! Requests of every kind are paced by their answers too (see [`crate::answers`]): while
//! too many passed on wait for their answer to be written, the next ones are held as
//! sent, within the same [`MAX_HELD_BYTES`].

use crate::answers::MAX_UNANSWERED;
use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::plan::{check_numbers_kept, check_unique_keys};
use ailab_sandbox_core::reason::Refusal;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most tool calls passed on to rmcp and not yet answered: twice those that run at once
/// ([`crate::MAX_CONCURRENT_CALLS`]), so that the next ones are ready when a call ends
/// while a burst of calls holds at most this many arguments in memory.
pub(crate) const MAX_QUEUED_CALLS: u64 = 2 * crate::MAX_CONCURRENT_CALLS as u64;

/// How long a call passed on may go unseen by the handler before the pump takes it that
/// rmcp answered it itself (a call it cannot read never reaches the handler; the screen
/// refuses those it can tell, see [`check_request_shape`]).
pub(crate) const SETTLE: Duration = Duration::from_secs(5);

/// Most bytes of calls the pump holds before it stops reading (it always reads at least
/// the line it is on, up to the message limit).
pub(crate) const MAX_HELD_BYTES: usize = 16 << 20;

/// Room for the data of the calls passed on and not yet answered, in values as the core
/// counts them: twice the most one plan may hold
/// ([`ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN`], some 150 MiB parsed, and rmcp's
/// own copy beside it). Calls are paced by their number alone until then, and that number
/// of calls at the value limit each would hold gigabytes. A call whose text could hold
/// more values than are free waits, held as sent, until calls before it are answered;
/// with none passed on it always goes.
pub(crate) const DATA_ROOM: usize = 2 * ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN;

/// Calls whose text could hold fewer values than this (a few MiB parsed, in rmcp and in
/// the handler) take no room: they never wait behind large ones.
pub(crate) const SMALL_CALL_DATA: usize = ailab_sandbox_core::plan::SMALL_DATA_VALUES;

/// The room a call of text `message` takes (see [`DATA_ROOM`]).
fn data_room_of(message: &[u8]) -> usize {
    let values = ailab_sandbox_core::plan::data_values_bound(message);
    if values < SMALL_CALL_DATA { 0 } else { values }
}

/// Tool calls the pump passed on to rmcp, and those the handler began and finished.
#[derive(Debug)]
pub(crate) struct Flow {
    count: Mutex<Count>,
    changed: tokio::sync::Notify,
    settle: Duration,
    /// Every request passed on, calls and others, until its answer is written.
    pub(crate) answers: crate::answers::Answers,
}

#[derive(Debug, Default)]
struct Count {
    passed: u64,
    finished: u64,
    /// Each call passed on and not yet begun by the handler: when it was passed on, its
    /// request id and the room it takes, oldest first. rmcp starts each call in a task of
    /// its own, so a later one may begin first: the handler names the call it begins.
    unbegun: std::collections::VecDeque<Unbegun>,
    /// The room taken by the calls passed on and not finished (see [`DATA_ROOM`]).
    room_taken: usize,
    /// The ids of the calls the handler serves now, each once per call.
    running: Vec<Value>,
}

/// A call passed on that the handler has not begun.
#[derive(Debug)]
struct Unbegun {
    at: Instant,
    id: Value,
    room: usize,
    /// The client cancelled it while the pump held it: it must not start, whatever
    /// rmcp does before the pump's own cancellation reaches it.
    cancelled: bool,
}

impl Count {
    fn fits(&self, room: usize) -> bool {
        self.room_taken == 0 || self.room_taken + room <= DATA_ROOM
    }
}

impl Default for Flow {
    fn default() -> Self {
        Self::settling_in(SETTLE)
    }
}

/// A call the handler is serving, with the room it took and whether it was cancelled
/// while held, when it is one the pump passed on and still counts; finished when
/// dropped (also when rmcp drops the call).
pub(crate) struct Serving {
    flow: Arc<Flow>,
    counted: Option<(usize, bool)>,
    id: Option<Value>,
}

impl Serving {
    /// Whether the client cancelled the call while the pump held it: the call is then
    /// not run. The pump's own cancellation follows the call, but rmcp may read a long
    /// call and begin it before that cancellation is even written.
    pub(crate) fn cancelled_before_start(&self) -> bool {
        self.counted.is_some_and(|(_, cancelled)| cancelled)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // A call no longer counted (taken as settled, or never passed on) was let go
        // of already: counting it finished would let one more than the most through.
        let (counted, id) = (self.counted, self.id.take());
        self.flow.note(|c| {
            if let Some((room, _)) = counted {
                c.finished += 1;
                c.room_taken -= room;
            }
            if let Some(at) = id
                .as_ref()
                .and_then(|id| c.running.iter().position(|r| r == id))
            {
                c.running.swap_remove(at);
            }
        });
        if let Some(id) = &id {
            self.flow.answers.ended(id);
        }
    }
}

impl Flow {
    /// Taking a request that gets no answer as settled after `settle` (see
    /// [`crate::answers`]).
    pub(crate) fn settling_in(settle: Duration) -> Self {
        Self {
            count: Mutex::new(Count::default()),
            changed: tokio::sync::Notify::new(),
            settle,
            answers: crate::answers::Answers::settling_in(settle),
        }
    }

    fn note(&self, change: impl FnOnce(&mut Count)) {
        change(&mut self.count.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_waiters();
    }

    /// The pump passed on call `id`, which takes `room` (see [`DATA_ROOM`]).
    fn passed(&self, id: Value, room: usize, cancelled: bool) {
        self.note(|c| {
            c.passed += 1;
            c.room_taken += room;
            c.unbegun.push_back(Unbegun {
                at: Instant::now(),
                id,
                room,
                cancelled,
            });
        });
    }

    /// The handler begins call `id` (as rmcp reads ids; `None` for the oldest; of two
    /// calls a client gave one id, the older). An id no call awaiting its start has is a
    /// call taken as settled (see [`Flow::below`]) or one the pump did not pass on: it
    /// takes no other call's entry, whose room and cancellation are that call's.
    pub(crate) fn serve(self: &Arc<Self>, id: Option<&Value>) -> Serving {
        let mut taken = None;
        self.note(|c| {
            let at = match id {
                Some(id) => c.unbegun.iter().position(|u| &u.id == id),
                None => (!c.unbegun.is_empty()).then_some(0),
            };
            taken = at
                .and_then(|at| c.unbegun.remove(at))
                .map(|u| (u.room, u.cancelled));
            c.running.extend(id.cloned());
        });
        Serving {
            flow: Arc::clone(self),
            counted: taken,
            id: id.cloned(),
        }
    }

    /// Whether a call of id `id` was passed on and has not ended: waiting for the
    /// handler, or served (also past the time its answer stops being counted).
    pub(crate) fn under_way(&self, id: &Value) -> bool {
        let c = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        c.running.contains(id) || c.unbegun.iter().any(|u| u.id == *id)
    }

    /// Whether `id` names a request passed on that is unanswered or a call under way:
    /// one more of that id would run beside it in rmcp, one of them unanswered.
    fn id_taken(&self, id: &Value) -> bool {
        self.answers.pending(id) || self.under_way(id)
    }

    /// Whether a call taking `room` fits beside those passed on (see [`DATA_ROOM`]).
    fn fits(&self, room: usize) -> bool {
        self.count
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fits(room)
    }

    /// Returns once fewer than `most` calls passed on are unanswered and a call taking
    /// `room` fits beside them (see [`DATA_ROOM`]).
    async fn below(&self, most: u64, room: usize) {
        let settle = self.settle;
        wait_for(&self.count, &self.changed, |c| {
            // A call passed on that the handler has not begun for `settle` never will
            // be: rmcp answered it itself.
            while let Some(u) = c.unbegun.front()
                && u.at.elapsed() >= settle
            {
                c.room_taken -= u.room;
                c.unbegun.pop_front();
                c.passed -= 1;
            }
            // The handler may also serve calls that did not come through the pump.
            if c.passed.saturating_sub(c.finished) < most && c.fits(room) {
                return None;
            }
            // Asked again when the oldest unbegun would be let go of.
            Some(
                c.unbegun
                    .front()
                    .map_or(settle, |u| settle.saturating_sub(u.at.elapsed())),
            )
        })
        .await;
    }
}

/// Returns once `ready` gives `None` of the state under `lock`, asked again at each
/// change `changed` announces and, when it gives `Some(d)`, after `d` at the latest
/// (what it lets go of with time: a fresh wait does not start the time again).
pub(crate) async fn wait_for<T>(
    lock: &Mutex<T>,
    changed: &tokio::sync::Notify,
    mut ready: impl FnMut(&mut T) -> Option<Duration>,
) {
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(wait) = ready(&mut lock.lock().unwrap_or_else(PoisonError::into_inner)) else {
            return;
        };
        let _ = tokio::time::timeout(wait, notified).await;
    }
}

/// What the pump needs to know of a message it passes on.
enum Kind {
    /// A tool call, with its id.
    Call(Value),
    /// `notifications/cancelled`, with the id of the request it cancels.
    Cancel(Value),
    /// Any other request, with its id as rmcp reads it (`None`: one it cannot read).
    Request(Option<Value>),
    Other,
}

/// A request id as the SDK reads it: a string, or a whole number (`100`, `100.0` and
/// `1e2` name one request).
pub(crate) fn request_id(text: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(text).ok()? {
        Value::String(s) => Some(Value::String(s)),
        // The SDK holds ids as i64.
        Value::Number(n) if n.is_i64() => Some(Value::Number(n)),
        Value::Number(n) if n.is_u64() => None,
        Value::Number(n) => {
            let f = n.as_f64()?;
            // Whole, and exact as an integer (below 2^53).
            (f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0).then(|| Value::from(f as i64))
        }
        _ => None,
    }
}

fn kind_of(message: &[u8]) -> Kind {
    // `params` is picked (copied) only for a cancellation: a call's may be megabytes.
    let Some([method, id, version, result, error]) =
        pick(message, ["method", "id", "jsonrpc", "result", "error"])
    else {
        return Kind::Other;
    };
    let method = method.and_then(|m| serde_json::from_str::<String>(m.get()).ok());
    // rmcp refuses a request whose envelope is not one (a version other than "2.0", a
    // `result` or `error` beside its method) with `-32600` and no id: its answer names
    // no request, and it runs nothing.
    let version = version.and_then(|v| serde_json::from_str::<String>(v.get()).ok());
    if method.is_some()
        && id.is_some()
        && (version.as_deref() != Some("2.0") || result.is_some() || error.is_some())
    {
        return Kind::Request(None);
    }
    match (method.as_deref(), id) {
        (Some("tools/call"), Some(id)) => request_id(id.get()).map_or(Kind::Other, Kind::Call),
        (Some("notifications/cancelled"), None) => pick(message, ["params"])
            .and_then(|[p]| pick(p?.get().as_bytes(), ["requestId"]))
            .and_then(|[r]| request_id(r?.get()))
            .map_or(Kind::Other, Kind::Cancel),
        (Some(_), Some(id)) => Kind::Request(request_id(id.get())),
        _ => Kind::Other,
    }
}

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

/// A piece of a message as sent.
type Raw = Box<serde_json::value::RawValue>;

/// The values of `keys` in the JSON object `text`, as sent and without building them; a
/// key given twice keeps its last value, as rmcp reads it. `None` when `text` is not one
/// JSON object.
fn pick<const N: usize>(text: &[u8], keys: [&str; N]) -> Option<[Option<Raw>; N]> {
    pick_all(text, keys).map(|all| all.map(|mut values| values.pop()))
}

/// Every value of each of `keys` in the JSON object `text`, as sent and in order (see
/// [`pick`]).
fn pick_all<const N: usize>(text: &[u8], keys: [&str; N]) -> Option<[Vec<Raw>; N]> {
    struct Pick<'k, const N: usize>(&'k [&'k str; N]);
    impl<'de, const N: usize> DeserializeSeed<'de> for Pick<'_, N> {
        type Value = [Vec<Raw>; N];
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, const N: usize> Visitor<'de> for Pick<'_, N> {
        type Value = [Vec<Raw>; N];
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut picked = std::array::from_fn(|_| Vec::new());
            while let Some(key) = map.next_key::<String>()? {
                match self.0.iter().position(|k| *k == key) {
                    Some(i) => picked[i].push(map.next_value()?),
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(picked)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let picked = Pick(&keys).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(picked)
}

/// What a message says of itself, kept as sent (see [`pick`]).
struct Head {
    jsonrpc: Option<Raw>,
    method: Option<Raw>,
    id: Option<Raw>,
    /// The last `params`, the one rmcp reads.
    params: Option<Raw>,
    /// The `params` given before it, if the key was given more than once.
    earlier_params: Vec<Raw>,
    /// It has a `result` or an `error`: a response, whatever else it has.
    answer: bool,
    /// Its `jsonrpc`, `method` or `id` is given more than once.
    repeated: bool,
}

impl Head {
    fn of(line: &[u8]) -> Option<Head> {
        let [jsonrpc, method, id, mut earlier_params, result, error] = pick_all(
            line,
            ["jsonrpc", "method", "id", "params", "result", "error"],
        )?;
        let params = earlier_params.pop();
        let repeated = [&jsonrpc, &method, &id].iter().any(|v| v.len() > 1);
        let last = |mut v: Vec<Raw>| v.pop();
        Some(Head {
            jsonrpc: last(jsonrpc),
            method: last(method),
            id: last(id),
            params,
            earlier_params,
            answer: !result.is_empty() || !error.is_empty(),
            repeated,
        })
    }

    /// The method, when it is a string.
    fn method(&self) -> Option<String> {
        self.method
            .as_ref()
            .and_then(|m| serde_json::from_str(m.get()).ok())
    }

    /// A request as rmcp reads one: a string method, an id that is a string or an
    /// integer, no result or error.
    fn is_request(&self) -> bool {
        let id_fits = self.id.as_ref().is_some_and(|id| {
            let t = id.get();
            serde_json::from_str::<String>(t).is_ok() || request_id(t).is_some()
        });
        self.method().is_some() && id_fits && !self.answer
    }

    /// `params.name` (when a string) and `params._meta` (when an object of at most
    /// [`MAX_META_BYTES`]), as sent; a key given twice keeps its last value.
    fn name_and_meta(&self) -> (Option<Raw>, Option<Raw>) {
        let Some([name, meta]) = self
            .params
            .as_ref()
            .and_then(|p| pick(p.get().as_bytes(), ["name", "_meta"]))
        else {
            return (None, None);
        };
        let name = name.filter(|n| serde_json::from_str::<String>(n.get()).is_ok());
        // Copied as sent, so it must be small: its values are not counted apart.
        let meta = meta.filter(|m| m.get().starts_with('{') && m.get().len() <= MAX_META_BYTES);
        (name, meta)
    }

    /// What a refused `tools/call` asks for that is never allowed, among every value of
    /// its keys given twice (one reader keeps the first, another the last: a probe for a
    /// forbidden tool or a permission change hides behind neither): the name of a
    /// forbidden tool, and the arguments its audit line takes (a description asking for
    /// a permission change, the path, the workflow), as an object's text to pass on.
    /// Only strings are copied, as sent: a name, path or workflow only when small.
    fn probe(&self) -> (Option<Raw>, Option<String>) {
        let mut names = Vec::new();
        let mut fields: [Vec<Raw>; 3] = Default::default();
        for params in self.earlier_params.iter().chain(&self.params) {
            let Some([name, arguments]) = pick_all(params.get().as_bytes(), ["name", "arguments"])
            else {
                continue;
            };
            names.extend(name);
            for a in arguments {
                let found = pick_all(a.get().as_bytes(), ["description", "path", "workflow_id"]);
                for (all, more) in fields.iter_mut().zip(found.into_iter().flatten()) {
                    all.extend(more);
                }
            }
        }
        let text = |r: &Raw, most: usize| {
            (r.get().len() <= most)
                .then(|| serde_json::from_str::<String>(r.get()).ok())
                .flatten()
        };
        let forbidden = names.into_iter().find(|n| {
            text(n, MAX_COPIED_PART)
                .is_some_and(|n| ailab_sandbox_core::policy::never_allowed(&n, None))
        });
        let [descriptions, paths, workflows] = fields;
        // Whatever its length (a plan's is not bounded): copied as sent, it makes the
        // message passed on no longer than the one sent, which held it and another.
        let chmod = descriptions.into_iter().find(|d| {
            text(d, usize::MAX)
                .is_some_and(|d| ailab_sandbox_core::policy::detect_chmod_intent(&d).is_some())
        });
        if forbidden.is_none() && chmod.is_none() {
            return (None, None);
        }
        let last = |v: Vec<Raw>| {
            v.into_iter()
                .rev()
                .find(|r| text(r, MAX_COPIED_PART).is_some())
        };
        let members: Vec<String> = [
            ("description", chmod),
            ("path", last(paths)),
            ("workflow_id", last(workflows)),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("\"{k}\":{}", v.get())))
        .collect();
        (forbidden, Some(format!("{{{}}}", members.join(","))))
    }

    /// Whether `params._meta` names the protocol version and the client's capabilities,
    /// which lets a request open a session without `initialize`.
    /// (Whatever the size of `_meta`: the SDK reads it all.) A version the SDK does not
    /// serve still counts.
    fn names_inline_version(&self) -> bool {
        self.inline_version().is_some()
    }

    /// The two `_meta` members that open a session without `initialize`, as sent (a
    /// string version, object capabilities).
    fn inline_version(&self) -> Option<(Raw, Raw)> {
        const KEYS: [&str; 2] = [
            "io.modelcontextprotocol/protocolVersion",
            "io.modelcontextprotocol/clientCapabilities",
        ];
        let [meta] = pick(self.params.as_ref()?.get().as_bytes(), ["_meta"])?;
        let [version, capabilities] = pick(meta?.get().as_bytes(), KEYS)?;
        let (version, capabilities) = (version?, capabilities?);
        (serde_json::from_str::<String>(version.get()).is_ok()
            && capabilities.get().starts_with('{'))
        .then_some((version, capabilities))
    }

    /// Whether the id and version are plain values (a string or a number), which are
    /// copied as sent into a message passed on in this one's place.
    fn scalar_envelope(&self) -> bool {
        let scalar = |r: &Raw| !r.get().starts_with(['[', '{']);
        self.id.as_ref().is_some_and(scalar) && self.jsonrpc.as_ref().is_none_or(scalar)
    }
}

/// What stands for each bad sequence of a line that is not UTF-8: a noncharacter, not
/// U+FFFD, so that a U+FFFD the client sent (in an id, say) is told from a bad byte.
const REPLACED: char = '\u{fdd0}';

/// `line` as text, each sequence that is not UTF-8 replaced by [`REPLACED`].
fn replaced_text(line: &[u8]) -> String {
    let mut text = String::with_capacity(line.len());
    for chunk in line.utf8_chunks() {
        text.push_str(chunk.valid());
        if !chunk.invalid().is_empty() {
            text.push(REPLACED);
        }
    }
    text
}

/// The longest id, method, version or tool name copied onto a message passed on in the
/// place of one that is not UTF-8 (where each bad byte became three) or too long to read
/// (no real one is near it).
const MAX_COPIED_PART: usize = 1024;

/// Refuses (`invalid_plan`) a request whose parameters rmcp cannot read: `params`, or
/// `params._meta`, that is not an object (any request: rmcp answers it `-32600` without
/// the request's id, which no client can match), and for a `tools/call` `params` missing or not an
/// object, `name` missing or not a string, `arguments` or `inputResponses` neither an
/// object nor null, `requestState` neither a string nor null (rmcp answers such a call
/// "method not found", naming nothing). None of them would reach the handler. Read as
/// sent; nothing is built.
fn check_request_shape(line: &[u8]) -> Result<(), Refusal> {
    // Not an object: other rules (and rmcp) answer it.
    let Ok(envelope) = serde_json::from_slice::<Envelope>(line) else {
        return Ok(());
    };
    let call = envelope
        .method
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
        .is_some_and(|m| m == "tools/call");
    let params = match envelope.params {
        Some(p) if p.get().starts_with('{') => p,
        None if call => {
            return refuse_shape(format!("a tools/call needs 'params', {WANTED_PARAMS}"));
        }
        Some(p) if call => {
            return refuse_shape(format!(
                "'params' of a tools/call must be {WANTED_PARAMS}, not {}",
                shown(p)
            ));
        }
        // rmcp answers another request whose parameters are neither an object nor null
        // `-32600` without its id, which no client can match: such a request goes on
        // without them, as any other that fails.
        Some(p) if p.get() != "null" => {
            return refuse_shape(format!(
                "'params' of a request must be an object, not {}",
                shown(p)
            ));
        }
        _ => return Ok(()),
    };
    let Ok(p) = serde_json::from_str::<Params>(params.get()) else {
        return Ok(());
    };
    if !absent_null_or(p.meta, '{') {
        return refuse_shape(format!(
            "'_meta' of a request must be an object, not {}",
            p.meta.map_or(String::new(), shown)
        ));
    }
    if !call {
        return Ok(());
    }
    check_call_params(&p)
}

/// What [`check_request_shape`] asks further of a `tools/call`'s `params`, read as an
/// object: its tool's name, then the members rmcp reads beside it.
fn check_call_params(p: &Params) -> Result<(), Refusal> {
    match p.name {
        None => {
            return refuse_shape(format!(
                "'params' of a tools/call has no 'name'; it must be {WANTED_PARAMS}"
            ));
        }
        Some(n) if !n.get().starts_with('"') => {
            return refuse_shape(format!(
                "'name' of a tools/call must be a string, the tool's name, not {}",
                shown(n)
            ));
        }
        Some(_) => {}
    }
    for (key, raw, first, what) in [
        (
            "arguments",
            p.arguments,
            '{',
            "an object of the tool's arguments",
        ),
        ("inputResponses", p.input_responses, '{', "an object"),
        ("requestState", p.request_state, '"', "a string"),
    ] {
        if !absent_null_or(raw, first) {
            return refuse_shape(format!(
                "'{key}' of a tools/call must be {what}, not {}",
                raw.map_or(String::new(), shown)
            ));
        }
    }
    Ok(())
}

/// A member given, null included (`Option` alone would read null as absent).
fn given<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The members of a request that [`check_request_shape`] reads, as sent.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given")]
    params: Option<&'a RawValue>,
}

/// The members of a request's `params` that [`check_request_shape`] reads, as sent.
#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default, deserialize_with = "given")]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given")]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given", rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given", rename = "inputResponses")]
    input_responses: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given", rename = "requestState")]
    request_state: Option<&'a RawValue>,
}

/// What a `tools/call`'s `params` must be, as its refusals say it.
const WANTED_PARAMS: &str =
    "an object with the tool's 'name' (a string) and its 'arguments' (an object)";

/// What a value is, for a sentence: its kind and, when short, itself.
fn shown(raw: &RawValue) -> String {
    let (t, kind) = (raw.get(), crate::tools::json_type_of_text(raw.get()));
    if t == "null" || t.len() > 40 {
        kind.to_owned()
    } else {
        format!("{kind} ({t})")
    }
}

/// Whether a member is absent, null, or a value whose text starts with `first`.
fn absent_null_or(raw: Option<&RawValue>, first: char) -> bool {
    raw.is_none_or(|r| r.get().starts_with(first) || r.get() == "null")
}

/// A request refused for a shape rmcp cannot read.
fn refuse_shape(why: String) -> Result<(), Refusal> {
    Err(Refusal::new(ReasonCode::InvalidPlan, why))
}

/// The most of a client's `params._meta` copied onto a message passed on in another's
/// place (rmcp needs it from clients that skip `initialize`); a larger one is left out.
const MAX_META_BYTES: usize = 64 << 10;

/// What the pump passes on for one whole line: the line itself, another message in its
/// place, or nothing.
enum Pass {
    Line,
    Instead(Vec<u8>),
    Drop,
}

/// How much longer than the line it replaces a message [`screen`] passes on may be: it
/// copies parts of the line as sent and adds a refusal, whose text is short. rmcp must
/// take lines that much longer.
pub(crate) const MAX_GROWTH: usize = 64 << 10;

/// Screens one whole line (one JSON-RPC message, without a byte order mark). `started`:
/// `initialize` has been passed on (rmcp ends a session at a notification or response
/// that comes before it), and is set when this line is it.
fn screen(line: &[u8], started: &mut bool) -> Pass {
    // rmcp drops a line that is not UTF-8 unanswered: its request is read from the text
    // with each bad sequence replaced, and answered with the refusal.
    let lossy;
    let (line, not_text) = match std::str::from_utf8(line) {
        Ok(_) => (line, None),
        Err(e) => {
            lossy = replaced_text(line);
            (lossy.as_bytes(), Some(e.valid_up_to()))
        }
    };
    let was_started = *started;
    // Read before the first request, and again only when the check fails.
    let mut first = None;
    if !*started {
        let Some(head) = head_before_start(line, started) else {
            return Pass::Drop;
        };
        first = Some(head);
    }
    let checked = check_message(line, not_text).and_then(|()| match &first {
        Some(head) => check_opening(head),
        None => Ok(()),
    });
    let Err(refusal) = checked else {
        return Pass::Line;
    };
    // From here on the message never reaches rmcp as sent: rmcp would build all its
    // values (however many), or read other ones than were sent.
    let Some(head) = first.or_else(|| Head::of(line)) else {
        // Not JSON a parser reads whole: rmcp would not answer it, and the client would
        // wait for good. A call whose id and method come before the fault is refused.
        // Text that is not UTF-8 is not read so: its id, bytes replaced, would not be
        // the id sent, and could grow past what rmcp takes.
        if let Some(m) =
            unreadable_call(line, &refusal).filter(|_| was_started && not_text.is_none())
        {
            return Pass::Instead(m);
        }
        tracing::debug!("a message that is not a JSON object, dropped");
        return Pass::Drop;
    };
    refused_request(&head, &refusal, not_text, was_started, started)
}

/// For the fuzz targets: screens one line (no `\n`) as [`pump`] does, and checks what it
/// would pass on in the line's place: one line of JSON, no longer than the line by more
/// than [`MAX_GROWTH`], that the screen passes (see below). Panics when it is not.
#[cfg(feature = "internals")]
#[allow(clippy::expect_used, clippy::panic)]
pub fn fuzz_screen(line: &[u8], max_line: usize, started: &mut bool) {
    let was_started = *started;
    match screened(line, false, max_line, started) {
        None => {}
        Some(std::borrow::Cow::Borrowed(passed)) => {
            assert!(
                std::str::from_utf8(passed).is_ok(),
                "passed on as sent, not text"
            );
        }
        Some(std::borrow::Cow::Owned(m)) => {
            assert!(m.len() <= line.len() + MAX_GROWTH, "grew past MAX_GROWTH");
            assert!(!m.contains(&b'\n'), "a replacement spans lines");
            let v: Value = serde_json::from_slice(&m).expect("a replacement is JSON");
            assert!(v.is_object(), "a replacement is an object");
            // Screened again, it passes, or (an `initialize` the SDK cannot take, sent
            // on without its parameters) is replaced by itself, or fails for its id
            // alone, copied as sent (`-0`, `1.0000000000000000001`: rmcp reads the id
            // as the client's own parser does).
            let mut again = was_started;
            let id_not_kept = || {
                Head::of(&m)
                    .and_then(|h| h.id)
                    .is_some_and(|id| check_numbers_kept(id.get().as_bytes()).is_err())
            };
            match screen(&m, &mut again) {
                Pass::Line => {}
                Pass::Instead(n) if n == m => {}
                _ if id_not_kept() => {}
                _ => panic!(
                    "a replacement fails the screen: {}",
                    String::from_utf8_lossy(&m)
                ),
            }
        }
    }
}

/// The head of a message read before the session opens; `None` when the message is
/// dropped. Sets `started` when the message opens the session.
fn head_before_start(line: &[u8], started: &mut bool) -> Option<Head> {
    let Some(head) = Head::of(line) else {
        // Not a JSON object: rmcp would not answer it, only build its values.
        tracing::debug!("a message that is not a JSON object, dropped");
        return None;
    };
    if !head.is_request() {
        tracing::debug!("a notification or response before `initialize`, dropped");
        return None;
    }
    // rmcp answers other requests before `initialize`, but ends the session at a
    // notification or response that comes before it: those wait for `initialize`,
    // or for a request that opens the session without one (its `_meta` names the
    // protocol version, as clients of the 2026-07-28 protocol send it).
    if head.method().as_deref() == Some("initialize") || head.names_inline_version() {
        *started = true;
    }
    Some(head)
}

/// Refuses an `initialize` (before the session opens) whose parameters the SDK cannot
/// take: it would answer with words about another request's `_meta`, yet take the
/// `initialize` as sent, and end the session at the client's next notification
/// (`notifications/initialized`). Refused here, it goes on without its parameters and
/// opens nothing: the session waits for an `initialize` it can take.
fn check_opening(head: &Head) -> Result<(), Refusal> {
    if head.method().as_deref() != Some("initialize") {
        return Ok(());
    }
    let params = head.params.as_ref().map_or("null", |p| p.get());
    match serde_json::from_str::<rmcp::model::InitializeRequestParams>(params) {
        Ok(_) => Ok(()),
        Err(e) => {
            let refusal = Refusal::new(
                ReasonCode::InvalidPlan,
                format!(
                    "the initialize request's params are not what the protocol asks ({e}): protocolVersion (a string), capabilities (an object) and clientInfo (an object with the strings name and version); the session stays unopened until one is"
                ),
            );
            tracing::warn!(reason = %refusal.reason, "an initialize the session cannot open with");
            Err(refusal)
        }
    }
}

/// What [`screen`] checks of a whole line; `not_text`: where a line that is not UTF-8
/// stops being UTF-8.
fn check_message(line: &[u8], not_text: Option<usize>) -> Result<(), Refusal> {
    // The whole message, so that neither an escaped method name (`tools\/call`) nor a
    // second `arguments` hides the call from the check.
    match not_text {
        Some(at) => Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the message is not UTF-8 text (byte {at} starts no UTF-8 character); JSON-RPC messages are UTF-8: send text (the tools write text, so a file's content must be text too)"
            ),
        )),
        None => check_numbers_kept(line)
            .and_then(|()| check_unique_keys(line))
            .and_then(|()| check_request_shape(line)),
    }
}

/// What [`screen`] passes on in place of a message (`head`) that failed with `refusal`:
/// a request whose answer can name it as sent goes on without its parameters (a call
/// with its refusal); anything else is dropped. `not_text`: see [`check_message`].
fn refused_request(
    head: &Head,
    refusal: &Refusal,
    not_text: Option<usize>,
    was_started: bool,
    started: &mut bool,
) -> Pass {
    let (Some(method), Some(id)) = (head.method(), head.id.as_ref()) else {
        // A notification or a response (the server asks the client nothing): never
        // answered.
        tracing::debug!("a notification or response that failed the screen, dropped");
        return Pass::Drop;
    };
    if !head.scalar_envelope() {
        // An id or version rmcp would refuse, and might hold any number of values.
        tracing::debug!("a request with an id or version that is not a plain value, dropped");
        // A dropped `initialize` opens nothing.
        *started = was_started;
        return Pass::Drop;
    }
    if head.repeated {
        // Which id, method or version was meant cannot be told: answered under the last
        // id (which the client may not wait for), or run as the last method (a ping for
        // a tool call), it would mislead.
        tracing::warn!("a request naming its id, method or version twice, dropped unanswered");
        *started = was_started;
        return Pass::Drop;
    }
    if not_text.is_some() && !copyable_from_lossy(head, id) {
        tracing::debug!("a request that is not UTF-8 whose id cannot be answered as sent, dropped");
        return Pass::Drop;
    }
    // Built from the line's own text: a re-serialised value could come out longer
    // (`1e15` as `1000000000000000.0`) than rmcp takes.
    let (name, meta) = head.name_and_meta();
    // Nor a name no parser reads as a string (a lone surrogate): rmcp would drop the call.
    let name = name
        .filter(|n| not_text.is_none() || n.get().len() <= MAX_COPIED_PART)
        .filter(|n| serde_json::from_str::<String>(n.get()).is_ok());
    let meta = meta.filter(|m| not_text.is_none() && copyable(m));
    let mut params = Vec::new();
    if method == "tools/call" {
        // What the call asks for that is never allowed goes on too, so that the handler
        // audits it as a probe whatever else is wrong with the call.
        let (forbidden, probe_arguments) = match not_text {
            None => head.probe(),
            Some(_) => (None, None),
        };
        params.push(format!(
            "\"name\":{}",
            forbidden
                .as_ref()
                .or(name.as_ref())
                .map_or("\"\"", |n| n.get())
        ));
        params.extend(probe_arguments.map(|a| format!("\"arguments\":{a}")));
    }
    // For a call the refusal, answered by the handler as a tool result.
    let refused = (method == "tools/call").then(|| {
        format!(
            "\"{REFUSED_META_KEY}\":{}",
            serde_json::to_string(refusal).unwrap_or_else(|_| "{}".to_owned())
        )
    });
    // rmcp drops unanswered a message it cannot read: a `_meta` that is itself what
    // failed the screen (a number past the float range, a lone surrogate, nesting past
    // the parser's limit) goes on left out, and so, if need be, do the members that
    // open a session.
    for (meta, may_open) in [(meta, true), (None, true), (None, false)] {
        let (message, opens) = instead(head, id, &params, meta, refused.as_deref(), may_open);
        if serde_json::from_slice::<serde_json::Value>(&message).is_ok() || !may_open {
            if !opens {
                *started = was_started;
            }
            return Pass::Instead(message);
        }
    }
    unreachable!("the last try is always returned")
}

/// Whether a value of the client's may be copied as sent into a message passed on in a
/// refused one's place: it passes the screen's checks of keys and numbers (else rmcp would
/// read another value than was sent), and, an object, gives no refusal of its own (else
/// the message would give the key twice, and rmcp read the last).
fn copyable(raw: &RawValue) -> bool {
    let text = raw.get().as_bytes();
    check_numbers_kept(text).is_ok()
        && check_unique_keys(text).is_ok()
        && serde_json::from_str::<std::collections::HashMap<String, IgnoredAny>>(raw.get())
            .is_ok_and(|members| !members.contains_key(REFUSED_META_KEY))
}

/// Whether the id, method and version of a request read from text that is not UTF-8 may
/// be copied into the message passed on in its place.
fn copyable_from_lossy(head: &Head, id: &Raw) -> bool {
    // From text that is not UTF-8 only short parts are copied (the message passed on
    // must stay within what rmcp takes), and no id with a replaced byte: its answer
    // would name another id than was sent, the same for every bad byte.
    // Nor a version with one: the SDK would answer it without an id.
    let copyable = |r: Option<&Raw>| r.is_none_or(|r| r.get().len() <= MAX_COPIED_PART);
    let replaced = |r: Option<&Raw>| r.is_some_and(|r| r.get().contains(REPLACED));
    copyable(head.jsonrpc.as_ref())
        && copyable(head.method.as_ref())
        && copyable(Some(id))
        && !replaced(Some(id))
        && !replaced(head.jsonrpc.as_ref())
}

/// The message passed on in place of a request that failed the screen: its id and
/// method as sent, `params` (the call's tool name), the client's `_meta` members (rmcp
/// needs them from clients that skip `initialize`), and for a call the refusal (answered
/// by the handler as a tool result). Also whether it opens a session.
fn instead(
    head: &Head,
    id: &Raw,
    params: &[String],
    meta: Option<Raw>,
    refused: Option<&str>,
    may_open: bool,
) -> (Vec<u8>, bool) {
    let mut params = params.to_vec();
    // A `_meta` too large to copy still gives the two members that open a session
    // without `initialize`, so that the SDK answers the refusal rather than ask for them.
    let inline = head.inline_version().filter(|_| may_open);
    let opening = inline
        .as_ref()
        .filter(|(v, c)| {
            meta.is_none() && v.get().len() + c.get().len() <= MAX_META_BYTES && copyable(c)
        })
        .map(|(v, c)| {
            format!(
                "\"io.modelcontextprotocol/protocolVersion\":{},\"io.modelcontextprotocol/clientCapabilities\":{}",
                v.get(),
                c.get()
            )
        });
    let inner = meta
        .as_ref()
        .map(|m| {
            let t = m.get().trim();
            t[1..t.len() - 1].trim()
        })
        .or(opening.as_deref());
    // What goes on in this one's place opens a session only when it keeps the `_meta`
    // members that do (an `initialize` without its parameters opens none): else the
    // session waits as before.
    let opens = head.method().as_deref() != Some("initialize")
        && inline.is_some()
        && (meta.is_some() || opening.is_some());
    // Last, so that the refusal is the one read if the client gave the key too.
    let fields: Vec<&str> = inner
        .into_iter()
        .filter(|i| !i.is_empty())
        .chain(refused)
        .collect();
    if inner.is_some() || refused.is_some() {
        params.push(format!("\"_meta\":{{{}}}", fields.join(",")));
    }
    // Any other request goes on without its parameters: rmcp answers it as such. The id
    // goes on as sent, so that the answer names the request the client sent.
    let mut message = String::from("{");
    if let Some(v) = &head.jsonrpc {
        message.push_str(&format!("\"jsonrpc\":{},", v.get()));
    }
    message.push_str(&format!(
        "\"id\":{},\"method\":{}",
        id.get(),
        head.method.as_ref().map_or("\"\"", |m| m.get())
    ));
    if !params.is_empty() {
        message.push_str(&format!(",\"params\":{{{}}}", params.join(",")));
    }
    message.push('}');
    (message.into_bytes(), opens)
}

/// A byte order mark, which rmcp reads past.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The lines of the client's input. Its state lives here, so that a read cancelled by
/// the pump's `select!` loses nothing.
struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    /// Read, not yet split into lines: `pending[at..]`.
    pending: Vec<u8>,
    at: usize,
    line: Vec<u8>,
    /// The current line is longer than `most`: dropped as it comes.
    too_long: bool,
    most: usize,
    ended: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(reader: R, most: usize) -> Self {
        Self {
            reader,
            buf: vec![0u8; 64 * 1024],
            pending: Vec::new(),
            at: 0,
            line: Vec::new(),
            too_long: false,
            most,
            ended: false,
        }
    }

    fn take(&mut self, head_len: usize) {
        let head = &self.pending[self.at..self.at + head_len];
        if !self.too_long && self.line.len() + head.len() > self.most {
            // Its start is kept, where a request's id and method are written (see
            // [`oversized_call`]); the rest is dropped as it comes.
            self.too_long = true;
            self.line.truncate(KEPT_OF_TOO_LONG);
            self.line.shrink_to_fit();
        }
        let room = if self.too_long {
            KEPT_OF_TOO_LONG.saturating_sub(self.line.len())
        } else {
            head.len()
        };
        self.line.extend_from_slice(&head[..room.min(head.len())]);
    }

    /// The next line without its newline, and whether it was too long; `None` at the end
    /// of the input (a last line without a newline is a line, but not one cut off by a
    /// read that failed: a session asked to stop reads so, its sender still writing).
    async fn next(&mut self) -> Option<(Vec<u8>, bool)> {
        loop {
            let rest = &self.pending[self.at..];
            if let Some(n) = rest.iter().position(|&b| b == b'\n') {
                self.take(n);
                self.at += n + 1;
                return Some((
                    std::mem::take(&mut self.line),
                    std::mem::take(&mut self.too_long),
                ));
            }
            self.take(rest.len());
            self.pending.clear();
            self.at = 0;
            if self.ended {
                return (self.too_long || !self.line.is_empty()).then(|| {
                    (
                        std::mem::take(&mut self.line),
                        std::mem::take(&mut self.too_long),
                    )
                });
            }
            match self.reader.read(&mut self.buf).await {
                Ok(0) => self.ended = true,
                Err(_) => {
                    self.line.clear();
                    self.too_long = false;
                    self.ended = true;
                }
                Ok(n) => self.pending.extend_from_slice(&self.buf[..n]),
            }
        }
    }
}

/// The room the next call passed on needs: none when a held call takes none (it may
/// pass a large one waiting for room), else the oldest's.
fn next_room(held: &std::collections::VecDeque<Held>) -> usize {
    if held.iter().any(|h| h.room == 0) {
        0
    } else {
        held.front().map_or(0, |h| h.room)
    }
}

/// A call read and not yet passed on.
struct Held {
    id: Value,
    text: Vec<u8>,
    /// What it takes of [`DATA_ROOM`].
    room: usize,
    /// The client cancelled it: passed on in its turn with a cancellation right behind
    /// it, so that the handler sees it cancelled before it starts (and still audits a
    /// forbidden tool), whatever the client's own cancellation looked like.
    cancelled: bool,
}

/// What [`pump`] read and holds, not yet passed on.
#[derive(Default)]
struct Waiting {
    calls: std::collections::VecDeque<Held>,
    /// Other requests held while too many are unanswered (see `answers`), with their ids.
    requests: std::collections::VecDeque<(Option<Value>, Vec<u8>)>,
    /// Of calls and requests together, against [`MAX_HELD_BYTES`].
    bytes: usize,
}

/// Copies `reader` to `out` a line at a time, screening each line (see the module). A
/// message longer than `max_line` bytes (a leading byte order mark and a `\r` before the
/// newline aside) is dropped, as rmcp drops an over-long line, and a last line without a
/// newline is passed on with one, so that rmcp reads it. rmcp must take lines of
/// `max_line` + [`MAX_GROWTH`] bytes and a newline. Calls are paced by `flow` (see the
/// module). Ends at the end of `reader` (once every call is answered), a read error, or
/// when `out` is closed.
pub(crate) async fn pump<R, W>(reader: R, mut out: W, max_line: usize, flow: &Flow)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // What a line may hold while it is read: the message, a mark and a `\r`.
    let mut lines = Lines::new(reader, max_line + BOM.len() + 1);
    let mut started = false;
    let mut waiting = Waiting::default();
    let mut ended = false;
    let answered = &flow.answers;
    loop {
        let may_read = !ended && waiting.bytes < MAX_HELD_BYTES;
        let call_room = async {
            flow.below(MAX_QUEUED_CALLS, next_room(&waiting.calls))
                .await;
            answered.below(MAX_UNANSWERED).await;
        };
        tokio::select! {
            biased;
            () = call_room, if !waiting.calls.is_empty() => {
                if !pass_held_call(&mut out, flow, &mut waiting).await {
                    return;
                }
            }
            () = answered.below(MAX_UNANSWERED), if !waiting.requests.is_empty() => {
                if !pass_held_request(&mut out, flow, &mut waiting).await {
                    return;
                }
            }
            next = lines.next(), if may_read => {
                let Some((line, too_long)) = next else {
                    ended = true;
                    continue;
                };
                note_cancelled(&mut waiting.calls, &line, too_long);
                let Some(message) = screened(&line, too_long, max_line, &mut started) else {
                    continue;
                };
                if !pass_or_hold(message, started, &mut waiting, &mut out, flow).await {
                    return;
                }
            }
            else => break,
        }
    }
    // Every call answered, and every answer flushed to the client, before rmcp hears
    // that the input ended: it then gives the answers still on their way a few seconds
    // only, which a client slow to read may need more than.
    flow.below(1, 0).await;
    answered.all_answered().await;
    let _ = out.shutdown().await;
}

/// Passes on the call [`pump`] holds that goes next, if one may; false when `out` is
/// closed.
async fn pass_held_call<W: AsyncWrite + Unpin>(
    out: &mut W,
    flow: &Flow,
    waiting: &mut Waiting,
) -> bool {
    let answered = &flow.answers;
    // The oldest call, unless it waits for room: then the oldest that takes
    // none, so that small calls never wait behind large ones.
    let at = if flow.fits(waiting.calls.front().map_or(0, |h| h.room)) {
        Some(0)
    } else {
        waiting.calls.iter().position(|h| h.room == 0)
    };
    if let Some(h) = at.and_then(|at| waiting.calls.remove(at)) {
        waiting.bytes -= h.text.len();
        if flow.id_taken(&h.id) {
            reused(&h.id);
            return true;
        }
        // Noted before rmcp can read it: the handler may begin it at once.
        flow.passed(h.id.clone(), h.room, h.cancelled);
        answered.asked(Some(h.id.clone()));
        if !forward(out, &h.text).await {
            return false;
        }
        if h.cancelled {
            if !forward(out, &cancellation(&h.id)).await {
                return false;
            }
            answered.cancelled(&h.id);
        }
    }
    true
}

/// Passes on the oldest request [`pump`] holds; false when `out` is closed.
async fn pass_held_request<W: AsyncWrite + Unpin>(
    out: &mut W,
    flow: &Flow,
    waiting: &mut Waiting,
) -> bool {
    let answered = &flow.answers;
    if let Some((id, text)) = waiting.requests.pop_front() {
        waiting.bytes -= text.len();
        if let Some(id) = id.as_ref().filter(|id| flow.id_taken(id)) {
            reused(id);
            return true;
        }
        answered.asked(id);
        if !forward(out, &text).await {
            return false;
        }
    }
    true
}

/// Marks a held call cancelled when `line` cancels it.
fn note_cancelled(held: &mut std::collections::VecDeque<Held>, line: &[u8], too_long: bool) {
    // A held call the client cancels never runs, even when the cancellation
    // itself does not pass the screen (a lossy number in its `_meta`, say).
    if !held.is_empty()
        && !too_long
        && let Kind::Cancel(id) = kind_of(line.strip_prefix(BOM).unwrap_or(line))
        && let Some(h) = held.iter_mut().find(|h| h.id == id)
    {
        h.cancelled = true;
    }
}

/// Holds a `message` that passed the screen, or passes it on at once when it is neither
/// a call nor another request; false when `out` is closed.
async fn pass_or_hold<W: AsyncWrite + Unpin>(
    message: std::borrow::Cow<'_, [u8]>,
    started: bool,
    waiting: &mut Waiting,
    out: &mut W,
    flow: &Flow,
) -> bool {
    let answered = &flow.answers;
    let kind = match kind_of(&message) {
        // A call before `initialize` is answered at once, with an error.
        Kind::Call(id) if !started => Kind::Request(Some(id)),
        kind => kind,
    };
    match kind {
        Kind::Call(id) => {
            waiting.bytes += message.len();
            let room = data_room_of(&message);
            waiting.calls.push_back(Held {
                id,
                text: message.into_owned(),
                room,
                cancelled: false,
            });
        }
        Kind::Request(id) => {
            waiting.bytes += message.len();
            waiting.requests.push_back((id, message.into_owned()));
        }
        Kind::Cancel(id) => {
            if !forward(out, &message).await {
                return false;
            }
            answered.cancelled(&id);
        }
        Kind::Other => {
            if !forward(out, &message).await {
                return false;
            }
        }
    }
    true
}

/// A request whose id is that of one passed on and still unanswered is dropped unrun:
/// JSON-RPC ids name one request, and rmcp, keeping one entry per id, would run both and
/// send one answer (a write made and audited that the client never hears of).
fn reused(id: &Value) {
    tracing::warn!(%id, "a request reusing the id of one still unanswered, dropped unrun");
}

/// How much of the start of a line too long to read is kept, to answer its call.
const KEPT_OF_TOO_LONG: usize = 4 << 10;

/// A call too long to read, refused: its id and method, when its start (`text`) holds
/// them before any other large member, give it a refusal the handler answers (as any
/// screened call, `size_exceeded`), so that the client does not wait for good. `None`
/// for anything else (a notification, a response, another request, a start that does not
/// name them), dropped unanswered as rmcp drops it: nothing says what to answer.
fn oversized_call(text: &[u8], max_line: usize) -> Option<Vec<u8>> {
    refused_call(
        text,
        &Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "the message is longer than the {max_line} bytes a message may be, so none of it was read; send less (a file's content over several calls: create_file, then append_file)"
            ),
        ),
    )
}

/// A call no parser reads whole (`NaN`, a trailing comma, a raw control character in a
/// string, a line cut short), refused as [`oversized_call`] refuses one too long to
/// read: `invalid_plan`, with the parser's words (`said`) and how strict JSON differs.
/// Its id and method are found by the object's structure, wherever the fault lies.
fn unreadable_call(text: &[u8], said: &Refusal) -> Option<Vec<u8>> {
    refused_call(
        text,
        &Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "{}; the message must be strict JSON (RFC 8259): no NaN or Infinity (send null, or the number as a string), no comma before a closing bracket, control characters in strings escaped (\\n, \\t)",
                said.reason
            ),
        ),
    )
}

/// A call its `refusal` answers, built from its start (`text`) when that names its id
/// and method before any other large member; `None` otherwise.
fn refused_call(text: &[u8], refusal: &Refusal) -> Option<Vec<u8>> {
    let [id, method, params] = members_before_cut(text, ["id", "method", "params"])?;
    let id = whole(text, id)?;
    request_id(id)?;
    if serde_json::from_str::<String>(whole(text, method)?).ok()? != "tools/call" {
        return None;
    }
    // The tool's name, when it comes before the cut too: a forbidden one is then audited
    // as such, and the refusal speaks of the tool.
    let name = params
        .and_then(|(at, _)| {
            let inner = &text[at..];
            let [name] = members_before_cut(inner, ["name"])?;
            whole(inner, name)
        })
        .filter(|n| n.len() <= MAX_COPIED_PART && serde_json::from_str::<String>(n).is_ok())
        .unwrap_or("\"\"");
    Some(
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":{name},\"_meta\":{{\"{REFUSED_META_KEY}\":{}}}}}}}",
            serde_json::to_string(&refusal).ok()?
        )
        .into_bytes(),
    )
}

/// Where a member lies in a text: its value's start, and its end when it ends before the
/// text does.
type Place = Option<(usize, Option<usize>)>;

/// The text of a member found whole (see [`members_before_cut`]).
fn whole(text: &[u8], place: Place) -> Option<&str> {
    let (start, end) = place?;
    std::str::from_utf8(&text[start..end?]).ok()
}

/// Where the members `keys` of the JSON object that `text` starts (and may be cut short
/// of ending) lie, as sent: a member cut short has a start and no end, one after the
/// cut is not found; a member given twice keeps its last place. `None` when `text` does
/// not start an object.
fn members_before_cut<const N: usize>(text: &[u8], keys: [&str; N]) -> Option<[Place; N]> {
    let ws = |i: &mut usize| {
        while text.get(*i).is_some_and(u8::is_ascii_whitespace) {
            *i += 1;
        }
    };
    let mut found = [None; N];
    let mut i = 0;
    ws(&mut i);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        ws(&mut i);
        if text.get(i) != Some(&b'"') {
            break;
        }
        let Some(key_end) = value_end(text, i) else {
            break;
        };
        let key = serde_json::from_slice::<String>(&text[i..key_end]).ok();
        i = key_end;
        ws(&mut i);
        if text.get(i) != Some(&b':') {
            break;
        }
        i += 1;
        ws(&mut i);
        let start = i;
        let end = value_end(text, start);
        if let Some(k) = key.and_then(|k| keys.iter().position(|w| *w == k)) {
            found[k] = Some((start, end));
        }
        let Some(end) = end else {
            break;
        };
        i = end;
        ws(&mut i);
        if text.get(i) != Some(&b',') {
            break;
        }
        i += 1;
    }
    Some(found)
}

/// Where the JSON value starting at `text[start]` ends (one past it); `None` when `text`
/// ends first. Not a validation: what it spans is read again by a parser.
fn value_end(text: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut i) = (0usize, start);
    loop {
        match *text.get(i)? {
            b'"' => {
                i += 1;
                loop {
                    match *text.get(i)? {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                i += 1;
            }
            _ if depth == 0 => {
                // A scalar: it ends where a delimiter or white space begins.
                while !matches!(
                    *text.get(i)?,
                    b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n'
                ) {
                    i += 1;
                }
                return Some(i);
            }
            _ => i += 1,
        }
        if depth == 0 {
            return Some(i);
        }
    }
}

/// What [`screen`] makes of `line`, to be passed on; `None` when it is dropped.
fn screened<'l>(
    line: &'l [u8],
    too_long: bool,
    max_line: usize,
    started: &mut bool,
) -> Option<std::borrow::Cow<'l, [u8]>> {
    let line = line.strip_prefix(BOM).unwrap_or(line);
    let message = line.strip_suffix(b"\r").unwrap_or(line);
    if too_long || message.len() > max_line {
        // Before `initialize` nothing is answered (see `screen`).
        let refused = started.then(|| oversized_call(message, max_line)).flatten();
        if refused.is_none() {
            tracing::warn!(max_line, "a message longer than the limit, dropped");
        }
        return refused.map(std::borrow::Cow::Owned);
    }
    match screen(line, started) {
        Pass::Drop => None,
        Pass::Line => Some(std::borrow::Cow::Borrowed(line)),
        Pass::Instead(m) => Some(std::borrow::Cow::Owned(m)),
    }
}

/// The cancellation of the call `id`, as the SDK takes it.
fn cancellation(id: &Value) -> Vec<u8> {
    serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": id},
    })
    .to_string()
    .into_bytes()
}

/// Writes `message` and a newline to `out`; false when `out` is closed.
async fn forward<W: AsyncWrite + Unpin>(out: &mut W, message: &[u8]) -> bool {
    out.write_all(message).await.is_ok() && out.write_all(b"\n").await.is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use ailab_sandbox_core::ReasonCode;
    use serde_json::json;

    fn call(id: &str, data: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"a.json","data":{data}}}}}}}"#
        )
    }

    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

    async fn pumped(input: &str, max_line: usize) -> Vec<String> {
        let mut out = Vec::new();
        pump(
            input.as_bytes(),
            &mut out,
            max_line,
            &Flow::settling_in(Duration::ZERO),
        )
        .await;
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

    /// A call keeps its id taken from the time it is passed on until the handler ends
    /// it, however long it waits (on a lock, say) and whether or not its answer is still
    /// counted: a request reusing the id meanwhile would run beside it in rmcp.
    #[tokio::test]
    async fn a_call_is_under_way_from_its_passing_on_to_its_end() {
        let flow = Arc::new(Flow::settling_in(Duration::ZERO));
        flow.passed(json!(7), 0, false);
        assert!(flow.under_way(&json!(7)));
        assert!(!flow.under_way(&json!(8)));
        let serving = flow.serve(Some(&json!(7)));
        assert!(flow.under_way(&json!(7)));
        drop(serving);
        assert!(!flow.under_way(&json!(7)));
    }

    /// A request rmcp refuses for its envelope is answered with no id: it is counted as
    /// one whose answer names no request.
    #[test]
    fn requests_refused_for_their_envelope_are_taken_as_answered_without_an_id() {
        for refused in [
            r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#,
            r#"{"id":7,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"ping","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","error":{}}"#,
        ] {
            assert!(
                matches!(kind_of(refused.as_bytes()), Kind::Request(None)),
                "{refused}"
            );
        }
        let ping = kind_of(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert!(matches!(ping, Kind::Request(Some(id)) if id == json!(7)));
        let call = kind_of(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#);
        assert!(matches!(call, Kind::Call(id) if id == json!(7)));
    }

    /// A request naming its id, method or version twice is dropped: answered under the
    /// last id, or run as the last method, it misled (`"method":"tools/call"` then
    /// `"ping"` got a ping's empty success). One whose `params` repeat a key still goes
    /// on, refused, under its one id.
    #[tokio::test]
    async fn a_request_naming_its_id_method_or_version_twice_is_dropped() {
        let repeated = [
            r#"{"jsonrpc":"2.0","id":"d1","id":"d2","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":"m1","method":"tools/call","method":"ping","params":{"name":"create_file","arguments":{"path":"a.md","content":"x"}}}"#,
            r#"{"jsonrpc":"2.0","id":"m2","method":"ping","method":"tools/call","params":{"name":"create_file","arguments":{"path":"a.md","content":"x"}}}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":"v1","method":"ping"}"#,
        ];
        let input = format!(
            "{INITIALIZE}\n{}\n{}",
            repeated.join("\n"),
            call("9", r#"{"k": 1, "k": 2}"#)
        );
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0], INITIALIZE);
        let (msg, r) = refusal_of(&out[1]);
        assert_eq!(msg["id"], 9);
        assert!(r.reason.contains("'k' appears twice"), "{}", r.reason);
        // Before `initialize`, a repeated one opens nothing: what follows is not passed.
        let twice = INITIALIZE.replacen(r#""id":0"#, r#""id":0,"id":1"#, 1);
        let out = pumped(
            &format!("{twice}\n{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}}"),
            1 << 20,
        )
        .await;
        assert_eq!(out, [""], "{out:?}");
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
        assert_eq!(out[3], r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
        // A byte order mark is read past, as rmcp does.
        assert_eq!(out[4], call("5", "[1]"));
        // The client's `_meta` stays, as sent.
        assert!(
            out[5].contains(r#""_meta":{"progressToken":3,"ailab-sandbox/refused":"#),
            "{}",
            out[5]
        );
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
        // So would a request rmcp does not take as one, followed by a notification.
        for first in [
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#,
        ] {
            let out = pumped(&format!("{first}\n{cancelled}\n{INITIALIZE}\n"), 1 << 20).await;
            assert_eq!(out, [INITIALIZE, ""], "{first}");
        }
        // A response first would end the session too.
        let response = r#"{"jsonrpc":"2.0","id":77,"result":{}}"#;
        let out = pumped(&format!("{response}\n{INITIALIZE}\n{response}\n"), 1 << 20).await;
        assert_eq!(out, [INITIALIZE, response, ""]);
        // Nor does anything that is not a JSON object, however many values it holds.
        let zeros = vec!["0"; 100].join(",");
        let out = pumped(
            &format!(
                "{{\"id\":1,\"method\":\"ping\",\"params\":[{zeros}]}} x\n[{zeros}]\n{INITIALIZE}\n"
            ),
            1 << 20,
        )
        .await;
        assert_eq!(out, [INITIALIZE, ""]);
    }

    /// A request that fails keeps its id as sent, and goes on whatever its `params`.
    #[tokio::test]
    async fn a_failing_request_keeps_its_id_as_sent() {
        let input = format!(
            "{INITIALIZE}\n{}\n{}\n{}\n{}\n{}\n",
            r#"{"jsonrpc":"2.0","id":1.0000000000000000001,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"a","content":"x"}}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"ping","params":[1e400]}"#,
            r#"{"jsonrpc":"2.0","id":"s","method":"tools/list","params":null,"x":{"a":1,"a":2}}"#,
            // Parameters rmcp would answer without the id: the request goes on without.
            r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":[]}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":null}"#,
        );
        let out = pumped(&input, 1 << 20).await;
        // Not a number a parser keeps: rmcp answers it as the invalid id it is.
        assert!(
            out[1].starts_with(
                r#"{"jsonrpc":"2.0","id":1.0000000000000000001,"method":"tools/call","params":{"#
            ),
            "{}",
            out[1]
        );
        assert!(out[1].contains(REFUSED_META_KEY), "{}", out[1]);
        assert_eq!(out[2], r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
        assert_eq!(
            out[3],
            r#"{"jsonrpc":"2.0","id":"s","method":"tools/list"}"#
        );
        assert_eq!(out[4], r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert_eq!(
            out[5],
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":null}"#
        );
    }

    /// A request whose `_meta` is what failed the screen (rmcp could not read it) goes on
    /// without it, so that it is answered, a call with its refusal.
    #[tokio::test]
    async fn a_meta_no_parser_reads_is_left_out() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let metas = [
            r#"{"a":1e400}"#.to_owned(),
            r#"{"progressToken":-1E400}"#.to_owned(),
            r#"{"a":"\ud800"}"#.to_owned(),
            format!(r#"{{"a":{deep}}}"#),
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"x":1e400}}"#.to_owned(),
        ];
        let mut input = format!("{INITIALIZE}\n");
        for (i, meta) in metas.iter().enumerate() {
            input.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"_meta":{meta},"name":"delete_file","arguments":{{}}}}}}"#
            ));
            input.push('\n');
            input.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":"l{i}","method":"tools/list","params":{{"_meta":{meta}}}}}"#
            ));
            input.push('\n');
        }
        input.push_str(
            r#"{"jsonrpc":"2.0","id":"n","method":"tools/call","params":{"name":"\ud800","arguments":{"x":1e400}}}"#,
        );
        input.push('\n');
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out.len(), 2 + 2 * metas.len() + 1, "{out:?}");
        for (i, _) in metas.iter().enumerate() {
            let (msg, r) = refusal_of(&out[1 + 2 * i]);
            assert_eq!(msg["id"], i, "{msg}");
            assert_eq!(msg["params"]["name"], "delete_file", "{msg}");
            assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
            assert_eq!(
                out[2 + 2 * i],
                format!(r#"{{"jsonrpc":"2.0","id":"l{i}","method":"tools/list"}}"#)
            );
        }
        let (msg, _) = refusal_of(&out[1 + 2 * metas.len()]);
        assert_eq!(msg["params"]["name"], "", "{msg}");
    }

    /// A refused call's `_meta` is copied as sent only when rmcp would read it as sent
    /// and it gives no refusal of its own: the message passed on then holds each key
    /// once, and the refusal read is the screen's.
    #[tokio::test]
    async fn a_meta_is_copied_only_when_it_reads_as_sent() {
        let metas = [
            (
                r#"{"progressToken":1,"ailab-sandbox/refused":{"reason_code":"io_error","reason":"mine"}}"#,
                false,
            ),
            (
                r#"{"progressToken":1,"ailab-sandbox\/refused":{"reason_code":"io_error","reason":"mine"}}"#,
                false,
            ),
            (r#"{"progressToken":1,"progressToken":2}"#, false),
            (r#"{"progressToken":12345678901234567890123}"#, false),
            (r#"{"progressToken":1}"#, true),
        ];
        let mut input = format!("{INITIALIZE}\n");
        for (i, (meta, _)) in metas.iter().enumerate() {
            // Refused for the key given twice in its arguments.
            input.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"_meta":{meta},"name":"create_file","arguments":{{"path":"a.md","path":"b.md"}}}}}}"#
            ));
            input.push('\n');
        }
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out.len(), 2 + metas.len(), "{out:?}");
        for (i, (_, kept)) in metas.iter().enumerate() {
            let line = &out[1 + i];
            check_unique_keys(line.as_bytes()).unwrap();
            check_numbers_kept(line.as_bytes()).unwrap();
            let (msg, r) = refusal_of(line);
            assert_eq!(msg["id"], i, "{msg}");
            assert_eq!(r.reason_code, ReasonCode::InvalidPlan, "{msg}");
            assert_eq!(
                msg["params"]["_meta"].get("progressToken").is_some(),
                *kept,
                "{msg}"
            );
        }
    }

    /// What is copied as sent onto a refused request is bounded: a large `_meta` is left
    /// out, an id or version that is not a plain value drops the request, and a key given
    /// twice keeps its last value.
    #[tokio::test]
    async fn a_rebuilt_request_copies_only_small_plain_parts() {
        let big_meta = format!("{{\"v\":[{}]}}", vec!["0"; 40_000].join(","));
        let first = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"_meta":{big_meta},"name":"write_json","arguments":{{"data":1e400}}}}}}"#
        );
        let input = format!(
            "{INITIALIZE}\n{first}\n{}\n{}\n{}\n",
            r#"{"jsonrpc":"2.0","id":[0,0],"method":"tools/call","params":{"name":"write_json","arguments":{"data":1e400}}}"#,
            r#"{"jsonrpc":["2.0"],"id":3,"method":"ping","params":{"x":1e400}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","name":"write_json","arguments":{"data":1}}}"#,
        );
        let out = pumped(&input, 1 << 20).await;
        assert_eq!(out.len(), 4, "{out:?}");
        let (msg, _) = refusal_of(&out[1]);
        assert_eq!(msg["id"], 1);
        assert_eq!(
            msg["params"]["_meta"].as_object().unwrap().len(),
            1,
            "{msg}"
        );
        let (msg, r) = refusal_of(&out[2]);
        assert_eq!(
            (msg["id"].clone(), msg["params"]["name"].clone()),
            (json!(4), json!("write_json"))
        );
        assert!(r.reason.contains("'name' appears twice"), "{}", r.reason);
        assert_eq!(out[3], "");
    }

    /// The limit is the message's: a byte order mark and a `\r` before the newline aside.
    #[tokio::test]
    async fn the_limit_leaves_a_mark_and_a_carriage_return_aside() {
        let fits = call("8", "[1]");
        let over = call("9", "[10]");
        assert_eq!(over.len(), fits.len() + 1);
        let input = format!("{fits}\n\u{feff}{fits}\r\n{over}\n{over}\r\n{fits}");
        let out = pumped(&input, fits.len()).await;
        let cr = format!("{fits}\r");
        assert_eq!(out, [fits.as_str(), cr.as_str(), fits.as_str(), ""]);
    }

    /// A call over the limit is answered with its refusal when its start names its id
    /// and method, whether the line was read whole or only its start was kept; anything
    /// else over the limit is dropped, as rmcp drops it.
    #[tokio::test]
    async fn lines_over_the_limit_are_refused_or_dropped() {
        // Longer than `initialize`, which must fit.
        let line = call("7", &format!("{}12345678901234567890123", " ".repeat(100)));
        let fits = call("8", "[1]");
        assert!(INITIALIZE.len() < line.len());
        let input = format!("{INITIALIZE}\n{line}\n{fits}\n{line}");
        let out = pumped(&input, line.len() - 1).await;
        assert_eq!(out.len(), 5, "{out:?}");
        assert_eq!(
            (out[0].as_str(), out[2].as_str(), out[4].as_str()),
            (INITIALIZE, fits.as_str(), "")
        );
        for refused in [&out[1], &out[3]] {
            let (msg, r) = refusal_of(refused);
            assert_eq!(msg["id"], 7, "{msg}");
            assert_eq!(r.reason_code, ReasonCode::SizeExceeded);
            assert!(
                r.reason.contains(&format!("{} bytes", line.len() - 1)),
                "{}",
                r.reason
            );
        }
        // Lines far past the limit: only their start is kept.
        let big = format!("\"{}\"", "x".repeat(3 * KEPT_OF_TOO_LONG));
        let params =
            format!(r#"{{"name":"write_json","arguments":{{"path":"a.json","data":{big}}}}}"#);
        let lines = [
            format!(r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{params}}}"#),
            format!(
                r#"{{ "\u0069d" : 13 , "method":"tools\/call","params":{params},"jsonrpc":"2.0"}}"#
            ),
            format!(r#"{{"jsonrpc":"2.0","method":"tools/call","params":{params},"id":12}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":14,"method":"ping","params":{{"x":{big}}}}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"x":{big}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":{{"n":1}},"method":"tools/call","params":{params}}}"#
            ),
        ];
        let input = format!("{INITIALIZE}\n{}\n{fits}\n", lines.join("\n"));
        let out = pumped(&input, 2 * KEPT_OF_TOO_LONG).await;
        assert_eq!(out.len(), 5, "{out:?}");
        let ids: Vec<Value> = out[1..3]
            .iter()
            .map(|l| refusal_of(l).0["id"].clone())
            .collect();
        assert_eq!(ids, [json!("a"), json!(13)]);
        // The tool's name, read before the cut, goes on with the refusal.
        for line in &out[1..3] {
            assert_eq!(refusal_of(line).0["params"]["name"], "write_json", "{line}");
        }
        assert_eq!((out[3].as_str(), out[4].as_str()), (fits.as_str(), ""));
    }

    /// From a line that is not UTF-8 only short parts are copied, and a call whose id
    /// held a bad byte is dropped: its answer could not name the id sent.
    #[tokio::test]
    async fn a_line_that_is_not_utf8_gives_only_short_plain_parts() {
        let mut input = format!("{INITIALIZE}\n").into_bytes();
        let long_id = format!("\"{}\"", "i".repeat(MAX_COPIED_PART));
        for (id, meta) in [
            ("1", r#"{"k":"m"}"#),
            // A U+FFFD the client sent is no bad byte: answered.
            ("\"r\u{fffd}\"", "{}"),
            ("\"a\u{ff}\"", "{}"),
            (long_id.as_str(), "{}"),
        ] {
            let id = id.replace("\u{ff}", "\u{1}");
            input.extend_from_slice(
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{meta},"name":"read_file","arguments":{{"path":"x"#)
                    .as_bytes(),
            );
            input.extend_from_slice(b"\xff\"}}}\n");
        }
        // The id with a bad byte of its own.
        let at = input.iter().position(|&b| b == 1).unwrap();
        input[at] = 0xfe;
        // A version with one.
        input.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\xff\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"x\"}}\n",
        );
        let mut out = Vec::new();
        pump(
            &input[..],
            &mut out,
            1 << 20,
            &Flow::settling_in(Duration::ZERO),
        )
        .await;
        let out = String::from_utf8(out).unwrap();
        let out: Vec<&str> = out.split('\n').collect();
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(refusal_of(out[2]).0["id"], "r\u{fffd}", "{}", out[2]);
        let (msg, r) = refusal_of(out[1]);
        assert_eq!(msg["id"], 1);
        assert_eq!(msg["params"]["name"], "read_file");
        assert!(msg["params"]["_meta"].get("k").is_none(), "{msg}");
        assert!(r.reason.contains("not UTF-8"), "{}", r.reason);
    }

    #[test]
    fn members_are_found_before_a_cut() {
        let found = |t: &str| {
            members_before_cut(t.as_bytes(), ["id", "method"]).map(|[i, m]| {
                let text = t.as_bytes();
                (
                    whole(text, i).map(str::to_owned),
                    whole(text, m).map(str::to_owned),
                )
            })
        };
        let some = |i: &str, m: &str| Some((Some(i.to_owned()), Some(m.to_owned())));
        assert_eq!(
            found(r#"{"id":1,"method":"x","params":{"a":[1,{"b":"}"}]}}"#),
            some("1", r#""x""#)
        );
        assert_eq!(
            found(r#"{"params":{"a":"\"}"},"id":"q\"","method":"m"}"#),
            some(r#""q\"""#, r#""m""#)
        );
        assert_eq!(
            found(r#"{"id":1,"id":2,"method":"m","params":{"cut"#),
            some("2", r#""m""#)
        );
        let only_method = Some((None, Some(r#""m""#.to_owned())));
        assert_eq!(found(r#"{"method":"m","params":{"cut"#), only_method);
        // A scalar the cut may have shortened is not taken.
        assert_eq!(found(r#"{"method":"m","id":12"#), only_method);
        assert_eq!(found(r#"{"method":"m"#), Some((None, None)));
        assert_eq!(found(r#"[{"id":1}]"#), None);
        assert_eq!(found(""), None);
        // A member cut short has its start: what it holds before the cut can be read.
        let t = br#"{"id":1,"params":{"name":"write_json","arguments":{"data":"xx"#;
        let [params] = members_before_cut(t, ["params"]).unwrap();
        let (at, end) = params.unwrap();
        assert_eq!(end, None);
        let [name] = members_before_cut(&t[at..], ["name"]).unwrap();
        assert_eq!(whole(&t[at..], name), Some(r#""write_json""#));
    }

    /// Whether `f` is done at its first poll.
    fn ready_at_once(f: impl std::future::Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }

    /// A pump of `input` running with `flow`, and what it passes on, a line at a time.
    struct Pumping {
        task: tokio::task::JoinHandle<()>,
        lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::DuplexStream>>,
    }

    impl Pumping {
        fn of(input: String, flow: &Arc<Flow>) -> Self {
            let input: &'static [u8] = Box::leak(input.into_bytes().into_boxed_slice());
            let (to_rmcp, from_pump) = tokio::io::duplex(1 << 20);
            let flow = Arc::clone(flow);
            Self {
                task: tokio::spawn(async move { pump(input, to_rmcp, 1 << 20, &flow).await }),
                lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(from_pump)),
            }
        }

        async fn next(&mut self) -> String {
            tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
                .await
                .expect("the pump passes a line on")
                .unwrap()
                .unwrap()
        }
    }

    /// Calls whose data could fill the room wait for the ones passed on before them to
    /// be answered; small calls pass beside them, and a large call with none before it
    /// always goes.
    #[tokio::test]
    async fn large_calls_wait_for_room_for_their_data() {
        let flow = Arc::new(Flow::settling_in(Duration::from_secs(3600)));
        let zeros = vec!["0"; 1_500_000].join(",");
        let big = data_room_of(call("1", &format!("[{zeros}]")).as_bytes());
        assert!(big > DATA_ROOM / 3 && big < DATA_ROOM / 2, "{big}");
        assert_eq!(data_room_of(call("2", "[1, 2, 3]").as_bytes()), 0);
        assert!(ready_at_once(flow.below(MAX_QUEUED_CALLS, big)));
        flow.passed(json!("1"), big, false);
        // Two fit, not three.
        assert!(ready_at_once(flow.below(MAX_QUEUED_CALLS, big)));
        flow.passed(json!(2), big, false);
        assert!(!ready_at_once(flow.below(MAX_QUEUED_CALLS, big)));
        assert!(ready_at_once(flow.below(MAX_QUEUED_CALLS, 0)));
        flow.passed(json!("3"), 0, false);
        // The handler may begin them in another order: each call gives back its own.
        let small = flow.serve(Some(&json!("3")));
        drop(small);
        assert!(!ready_at_once(flow.below(MAX_QUEUED_CALLS, big)));
        let second = flow.serve(Some(&json!(2)));
        let _first = flow.serve(None);
        drop(second);
        assert!(ready_at_once(flow.below(MAX_QUEUED_CALLS, big)));
        // One the handler never begins gives its room back once taken as settled.
        let settled = Flow::settling_in(Duration::ZERO);
        settled.passed(json!("4"), big, false);
        assert!(ready_at_once(settled.below(MAX_QUEUED_CALLS, big)));
    }

    /// A call that waits for room for its data does not hold up the small calls behind
    /// it: they are passed on first.
    #[tokio::test]
    async fn small_calls_pass_a_large_one_waiting_for_room() {
        let flow = Arc::new(Flow::settling_in(Duration::from_secs(3600)));
        // A large call in flight holds the room.
        flow.passed(json!("0"), DATA_ROOM, false);
        let zeros = vec!["0"; 100_000].join(",");
        let input = format!(
            "{INITIALIZE}\n{}\n{}\n",
            call("1", &format!("[{zeros}]")),
            call("2", "[1]")
        );
        let mut pumped = Pumping::of(input, &flow);
        assert_eq!(pumped.next().await, INITIALIZE);
        assert_eq!(pumped.next().await, call("2", "[1]"));
        pumped.task.abort();
    }

    /// A held call the client cancels is marked so when passed on: the handler does not
    /// start it even when rmcp begins it before the pump's own cancellation arrives (a
    /// long call is read and begun while that cancellation is still to be written).
    #[tokio::test]
    async fn a_held_call_cancelled_is_passed_on_marked_cancelled() {
        let flow = Arc::new(Flow::settling_in(Duration::from_secs(3600)));
        flow.passed(json!("0"), DATA_ROOM, false);
        let zeros = vec!["0"; 100_000].join(",");
        let held = call("1", &format!("[{zeros}]"));
        let cancel =
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#;
        let input = format!("{INITIALIZE}\n{held}\n{cancel}\n");
        let mut pumped = Pumping::of(input, &flow);
        assert_eq!(pumped.next().await, INITIALIZE);
        assert_eq!(pumped.next().await, cancel);
        // The room comes free once the call in flight is served and done.
        let in_flight = flow.serve(Some(&json!("0")));
        assert!(!in_flight.cancelled_before_start());
        drop(in_flight);
        assert_eq!(pumped.next().await, held);
        assert!(flow.serve(Some(&json!(1))).cancelled_before_start());
        pumped.task.abort();
    }

    /// A call the handler begins after it was taken as settled takes neither another
    /// call's cancellation nor its place in the count.
    #[tokio::test]
    async fn a_call_begun_after_it_settled_takes_no_other_calls_entry() {
        let flow = Arc::new(Flow::settling_in(Duration::from_secs(2)));
        flow.passed(json!("late"), 0, false);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        flow.passed(json!("cancelled"), 0, true);
        // Takes "late" as settled: one call counted, "cancelled".
        assert!(ready_at_once(flow.below(2, 0)));
        assert!(!ready_at_once(flow.below(1, 0)));
        let late = flow.serve(Some(&json!("late")));
        assert!(!late.cancelled_before_start());
        drop(late);
        assert!(!ready_at_once(flow.below(1, 0)));
        let cancelled = flow.serve(Some(&json!("cancelled")));
        assert!(cancelled.cancelled_before_start());
        drop(cancelled);
        assert!(ready_at_once(flow.below(1, 0)));
    }

    #[test]
    fn a_refusal_a_client_writes_refuses_its_own_call() {
        let meta = serde_json::json!({ REFUSED_META_KEY: "anything" });
        let r = refusal_in(meta.as_object().unwrap()).unwrap();
        assert_eq!(r.reason_code, ReasonCode::InvalidPlan);
        assert!(refusal_in(&serde_json::Map::new()).is_none());
    }
}
