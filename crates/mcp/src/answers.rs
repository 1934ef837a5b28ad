//! The requests passed on to rmcp and not yet answered on the session's output.
//!
//! rmcp reads every request as soon as it can and sends each answer from a task of its
//! own, however slowly the client reads: a client that sends requests faster than it
//! reads the answers (or never reads them) would have the answers pile up in memory, some
//! 25 KB for each `tools/list`, gigabytes for a flood. So the pump passes on no request
//! while [`MAX_UNANSWERED`] it passed on are unanswered, and the session's output tells
//! [`Answers`] each answer it writes: the start of each line is read for its `id` (rmcp
//! writes `{"jsonrpc":"2.0","id":…` first), and the answer counts once a flush after it
//! completes: standard output takes a write into a buffer of its own at once, whether
//! or not the client reads; it is its flush (rmcp flushes after each message) that
//! waits. A request rmcp answers with no id of its own (a parse error's `null`) takes
//! the place of the oldest unanswered one without a readable id. A request unanswered
//! once [`SETTLE`] has passed since it was handed over and since the output last moved
//! is let go of (a tool call that runs long is paced by [`crate::screen::Flow`] until it
//! ends, and a request rmcp gets no answer to takes no room); a cancelled call once it
//! has ended, another cancelled request [`SETTLE`] after its cancellation (rmcp drops
//! their answers). A client that stops reading holds its requests back, and one that
//! reads slowly has no more handed over than it reads.

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Most requests passed on and not yet answered: the calls the pump lets through at
/// once (see [`crate::screen::MAX_QUEUED_CALLS`]) and as many other requests again and
/// more, so that a `ping` or `tools/list` is never held back by calls under way.
pub(crate) const MAX_UNANSWERED: usize = 4 * crate::screen::MAX_QUEUED_CALLS as usize;

/// How long a request that gets no answer (see the module) counts.
pub(crate) const SETTLE: Duration = crate::screen::SETTLE;

/// How much of the start of an answer's line is kept to read its `id`: an id longer
/// than this is not read (its request is answered in the place of the oldest one whose
/// id was too long to keep).
const ID_PREFIX: usize = 512;

impl Waiting {
    /// The output took `bytes` (`None`: a write waits for the client).
    fn took(&mut self, bytes: Option<&[u8]>) {
        let Some(mut bytes) = bytes else {
            self.stalled = true;
            return;
        };
        self.progress = Some(Instant::now());
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            keep_start(&mut self.line, &bytes[..end]);
            // An id too long to have been kept when asked is matched as those were.
            let id = id_of(&self.line).filter(kept);
            self.line.clear();
            self.unflushed.push(id);
            bytes = &bytes[end + 1..];
        }
        keep_start(&mut self.line, bytes);
    }
}

/// One request passed on.
#[derive(Debug)]
struct Asked {
    /// Its id as rmcp reads it, `None` when it has none rmcp reads or too long to match.
    id: Option<Value>,
    at: Instant,
    cancelled: Option<Instant>,
}

#[derive(Debug, Default)]
struct Waiting {
    asked: VecDeque<Asked>,
    /// Requests passed on since the session began.
    passed: u64,
    /// A write or flush to the client waits for it to read.
    stalled: bool,
    /// The start of the line being written, up to [`ID_PREFIX`] bytes.
    line: Vec<u8>,
    /// The ids of the answers written whole and not yet flushed.
    unflushed: Vec<Option<Value>>,
    /// When the output last took or flushed anything (`None`: not yet).
    progress: Option<Instant>,
}

/// See the module.
#[derive(Debug)]
pub(crate) struct Answers {
    waiting: Mutex<Waiting>,
    changed: tokio::sync::Notify,
    settle: Duration,
}

impl Default for Answers {
    fn default() -> Self {
        Self::settling_in(SETTLE)
    }
}

impl Answers {
    pub(crate) fn settling_in(settle: Duration) -> Self {
        Self {
            waiting: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            settle,
        }
    }

    fn note<T>(&self, change: impl FnOnce(&mut Waiting) -> T) -> T {
        let out = change(&mut self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_waiters();
        out
    }

    /// The pump passed on a request of id `id` (`None`: none rmcp reads).
    pub(crate) fn asked(&self, id: Option<Value>) {
        let id = id.filter(kept);
        self.note(|w| {
            w.passed += 1;
            w.asked.push_back(Asked {
                id,
                at: Instant::now(),
                cancelled: None,
            });
        });
    }

    /// Whether a request of id `id` was passed on and has no answer written yet: rmcp
    /// keeps one entry per id, so a second request of that id would run and its answer
    /// be lost. An answer the output took counts here before its flush completes: the
    /// client may read it, and send the id again, meanwhile.
    pub(crate) fn pending(&self, id: &Value) -> bool {
        let w = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let asked = w.asked.iter().filter(|a| a.id.as_ref() == Some(id)).count();
        let written = w
            .unflushed
            .iter()
            .filter(|u| u.as_ref() == Some(id))
            .count();
        asked > written
    }

    /// The call of id `id` ended: if it was cancelled, its answer never comes (rmcp
    /// drops it), and it stops counting at once rather than 5 s after its cancellation.
    pub(crate) fn ended(&self, id: &Value) {
        self.note(|w| {
            if let Some(at) = w
                .asked
                .iter()
                .position(|a| a.cancelled.is_some() && a.id.as_ref() == Some(id))
            {
                w.asked.remove(at);
            }
        });
    }

    /// The pump passed on a cancellation of request `id`: its answer may never come.
    pub(crate) fn cancelled(&self, id: &Value) {
        self.note(|w| {
            if let Some(a) = w
                .asked
                .iter_mut()
                .find(|a| a.cancelled.is_none() && a.id.as_ref() == Some(id))
            {
                a.cancelled = Some(Instant::now());
            }
        });
    }

    /// The session's output took `bytes` (`None`: a write waits for the client). They
    /// count once flushed.
    #[cfg(test)]
    pub(crate) fn written(&self, bytes: Option<&[u8]>) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .took(bytes);
    }

    /// Has the session's output take `buf` through `write`, and notes what it took under
    /// the lock [`Answers::pending`] takes: the client can read an answer only once the
    /// output took it, and by then it is noted, so that a request the client sends after
    /// reading it never finds its id still pending (it would be dropped as a reuse).
    /// `write` must not wait (a poll).
    pub(crate) fn write_noted(
        &self,
        buf: &[u8],
        write: impl FnOnce() -> std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut w = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let polled = write();
        match &polled {
            std::task::Poll::Ready(Ok(n)) => w.took(buf.get(..*n)),
            std::task::Poll::Pending => w.took(None),
            std::task::Poll::Ready(Err(_)) => {}
        }
        polled
    }

    /// The session's output flushed what it took (`false`: the flush waits for the
    /// client).
    pub(crate) fn flushed(&self, done: bool) {
        if !done {
            self.waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stalled = true;
            return;
        }
        self.note(|w| {
            w.stalled = false;
            w.progress = Some(Instant::now());
            for id in std::mem::take(&mut w.unflushed) {
                answered(&mut w.asked, id.as_ref());
            }
        });
    }

    /// How many requests were passed on since the session began.
    #[cfg(test)]
    pub(crate) fn passed(&self) -> u64 {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .passed
    }

    /// Returns once fewer than `most` requests passed on are unanswered.
    pub(crate) async fn below(&self, most: usize) {
        self.below_counting(most, true).await;
    }

    /// Returns once every request passed on and not cancelled is answered: the answer
    /// of a cancelled one never comes (rmcp drops it).
    pub(crate) async fn all_answered(&self) {
        self.below_counting(1, false).await;
    }

    async fn below_counting(&self, most: usize, cancelled_count: bool) {
        let settle = self.settle;
        crate::screen::wait_for(&self.waiting, &self.changed, |w| {
            let (stalled, progress) = (w.stalled, w.progress);
            // How long each request still counts; `None` while the client reads nothing
            // (until a change is announced). One not cancelled counts until the output
            // has been idle for `settle` since it was handed over: answers still on
            // their way (a slow reader's) keep the output busy.
            let left = |a: &Asked| match a.cancelled {
                Some(at) => Some(settle.saturating_sub(at.elapsed())),
                None if stalled => None,
                None => {
                    let since = progress.map_or(a.at, |p| p.max(a.at));
                    Some(settle.saturating_sub(since.elapsed()))
                }
            };
            w.asked.retain(|a| left(a).is_none_or(|d| !d.is_zero()));
            let counted = w
                .asked
                .iter()
                .filter(|a| cancelled_count || a.cancelled.is_none())
                .count();
            if counted < most {
                return None;
            }
            // Asked again when the first still counted would be let go of.
            Some(w.asked.iter().filter_map(left).min().unwrap_or(settle))
        })
        .await;
    }
}

/// Whether an id is short enough to be matched with its answer (see [`ID_PREFIX`]).
fn kept(id: &Value) -> bool {
    id.to_string().len() <= ID_PREFIX / 2
}

/// Adds to `line` what of `bytes` fits in [`ID_PREFIX`].
fn keep_start(line: &mut Vec<u8>, bytes: &[u8]) {
    let room = ID_PREFIX.saturating_sub(line.len());
    line.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// The id an answer's line starts with, as rmcp reads ids; `None` when it has none that
/// can be read there.
fn id_of(line: &[u8]) -> Option<Value> {
    const KEY: &[u8] = b"\"id\":";
    let at = line.windows(KEY.len()).position(|w| w == KEY)?;
    let rest = &line[at + KEY.len()..];
    let raw = serde_json::Deserializer::from_slice(rest)
        .into_iter::<&serde_json::value::RawValue>()
        .next()?
        .ok()?;
    crate::screen::request_id(raw.get())
}

/// Takes the request `id` answers off `asked`: the oldest of that id, or, for an answer
/// with no id read, the oldest whose id is unknown.
fn answered(asked: &mut VecDeque<Asked>, id: Option<&Value>) {
    let at = match id {
        Some(id) => asked.iter().position(|a| a.id.as_ref() == Some(id)),
        None => asked.iter().position(|a| a.id.is_none()),
    };
    if let Some(at) = at {
        asked.remove(at);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ready_at_once(f: impl std::future::Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }

    /// An answer the output takes is noted before anyone else can look at its id: the
    /// client may read it as soon as it is taken and send the id again, and that request
    /// must not be dropped as the reuse of an id still pending.
    #[test]
    fn an_answer_is_noted_as_the_output_takes_it() {
        let a = std::sync::Arc::new(Answers::settling_in(Duration::from_secs(3600)));
        a.asked(Some(json!(1)));
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n";
        let (tx, rx) = std::sync::mpsc::channel();
        let polled = a.write_noted(line, || {
            // The pump looks at the id while the output is still in its write.
            let (a, tx) = (std::sync::Arc::clone(&a), tx.clone());
            std::thread::spawn(move || tx.send(a.pending(&json!(1))).unwrap());
            std::thread::sleep(Duration::from_millis(100));
            std::task::Poll::Ready(Ok(line.len()))
        });
        assert!(matches!(polled, std::task::Poll::Ready(Ok(n)) if n == line.len()));
        assert!(
            !rx.recv().unwrap(),
            "the id was pending after its answer was taken"
        );
        // A write that takes nothing notes nothing.
        a.asked(Some(json!(2)));
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n";
        let polled = a.write_noted(line, || std::task::Poll::Pending);
        assert!(polled.is_pending());
        assert!(a.pending(&json!(2)));
    }

    #[tokio::test]
    async fn answers_are_matched_by_the_id_their_line_starts_with() {
        let a = Answers::settling_in(Duration::from_secs(3600));
        a.asked(Some(json!(1)));
        a.asked(Some(json!("two")));
        a.asked(None);
        assert!(!ready_at_once(a.below(3)));
        // In pieces, as the output writes them, two answers in one write; each counts
        // once flushed.
        a.written(Some(br#"{"jsonrpc":"2.0","i"#));
        a.written(Some(
            b"d\":\"two\",\"result\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":1.0,",
        ));
        assert!(!ready_at_once(a.below(3)), "taken, not yet flushed");
        a.flushed(false);
        assert!(!ready_at_once(a.below(3)), "the flush waits for the client");
        a.flushed(true);
        assert!(ready_at_once(a.below(3)));
        assert!(!ready_at_once(a.below(2)));
        a.written(Some(b"\"result\":{}}\n"));
        a.flushed(true);
        assert!(ready_at_once(a.below(2)));
        assert!(!ready_at_once(a.below(1)), "the unknown id is still asked");
        a.written(Some(b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{}}\n"));
        a.flushed(true);
        assert!(ready_at_once(a.below(1)));
        // An answer to no request passed on takes nothing.
        a.asked(Some(json!(5)));
        a.written(Some(b"{\"jsonrpc\":\"2.0\",\"id\":6,\"result\":{}}\n"));
        a.flushed(true);
        assert!(!ready_at_once(a.below(1)));
    }

    /// A request's id is free again once its answer is written, before its flush
    /// completes (the client may already have read it); a cancelled call stops counting
    /// once it ended, its answer never to come.
    #[tokio::test]
    async fn ids_are_freed_by_a_written_answer_and_cancelled_calls_by_their_end() {
        let a = Answers::settling_in(Duration::from_secs(3600));
        a.asked(Some(json!(7)));
        assert!(a.pending(&json!(7)));
        a.written(Some(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n"));
        assert!(!a.pending(&json!(7)), "answered, not yet flushed");
        a.flushed(true);
        assert!(!a.pending(&json!(7)));
        a.asked(Some(json!(8)));
        a.asked(Some(json!(9)));
        a.ended(&json!(8));
        assert!(
            !ready_at_once(a.below(2)),
            "an uncancelled call's answer is still to come"
        );
        a.cancelled(&json!(9));
        a.ended(&json!(9));
        assert!(ready_at_once(a.below(2)));
        assert!(!a.pending(&json!(9)));
    }

    /// An answer whose id was too long to keep when its request was asked takes the place
    /// of the oldest such request, as its request was kept without one.
    #[tokio::test]
    async fn an_answer_with_a_long_id_answers_a_request_kept_without_one() {
        let a = Answers::settling_in(Duration::from_secs(3600));
        let long = "i".repeat(300);
        a.asked(Some(json!(long)));
        a.written(Some(
            format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{long}\",\"result\":{{}}}}\n").as_bytes(),
        ));
        a.flushed(true);
        assert!(ready_at_once(a.below(1)));
    }

    /// A request with no answer is let go of `settle` after it was passed on, however
    /// recently a wait for room began (the pump begins one at each line it reads).
    #[tokio::test]
    async fn a_request_is_let_go_of_on_time_by_a_wait_begun_late() {
        let a = Answers::settling_in(Duration::from_millis(600));
        a.asked(Some(json!(1)));
        a.written(Some(b""));
        a.flushed(true);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let waited = tokio::time::timeout(Duration::from_millis(450), a.below(1)).await;
        assert!(
            waited.is_ok(),
            "let go of a full settle after the wait began"
        );
    }

    #[tokio::test]
    async fn requests_with_no_answer_are_let_go_of_unless_the_client_reads_nothing() {
        let a = Answers::settling_in(Duration::ZERO);
        a.asked(Some(json!(1)));
        a.asked(Some(json!(2)));
        assert!(ready_at_once(a.below(1)));
        // While a write or a flush waits for the client, nothing settles but
        // cancellations.
        for stall in [
            |a: &Answers| a.written(None),
            |a: &Answers| a.flushed(false),
        ] {
            a.asked(Some(json!(3)));
            a.asked(Some(json!(4)));
            stall(&a);
            assert!(!ready_at_once(a.below(2)));
            a.cancelled(&json!(3));
            assert!(ready_at_once(a.below(2)));
            assert!(!ready_at_once(a.below(1)));
            a.written(Some(b""));
            a.flushed(true);
            assert!(ready_at_once(a.below(1)));
        }
    }
}
