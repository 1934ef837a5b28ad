//! When a call may take a thread of the blocking pool. The runtime serialises a
//! workflow's runs and rollbacks with a lock that a waiting call polls from its thread,
//! for up to `limits.lock_wait_seconds`; a change waits so for the locks of its targets,
//! and a change or a read for the audit trail or the registry, when another process
//! holds them. Calls piling up on one busy workflow (held by a stopped CLI run, say), or
//! many calls waiting for a lock another process holds, would fill the pool and stall
//! every route. So a workflow's calls take turns, and the pool is shared out
//! ([`Shares`]): at most three quarters of its threads run changes, fewer than the rest
//! run reads, and the few left serve `/metrics` (which waits for no lock) and the short
//! work of reading a plan's text. Calls beyond their share wait without a thread.
//!
//! A plan or rollback takes its workflow's turn (one call per workflow on the pool), then,
//! after its data's room, room to run; a read of the logs takes room to read. A call beyond
//! its share waits at most `limits.lock_wait_seconds` in all, then is answered 503
//! `server_busy` (or 400 for a plan that is not valid).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How a blocking pool's threads are shared out among the calls that may wait for locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shares {
    /// Plans and rollbacks running at once: three quarters of the threads (one at least).
    pub writing: usize,
    /// Reads of the logs running at once: the rest but a sixteenth of the threads (one
    /// at least), which is kept for the calls that wait for nothing.
    pub reading: usize,
}

impl Shares {
    /// The shares of a pool of `threads` threads; one of 64 keeps 48 for changes, 12 for
    /// reads and 4 free, one of 5 to 7 keeps one free. A pool of 4 or fewer (a tight
    /// open-file limit) keeps none free, the shares of one at least each taking it all
    /// (a pool of one shares its thread between a change and a read): the calls that wait
    /// for nothing then queue behind them.
    pub(crate) fn of_pool(threads: usize) -> Self {
        let writing = (threads * 3 / 4).max(1);
        let free = (threads / 16).max(1);
        Self {
            writing,
            reading: threads.saturating_sub(writing + free).max(1),
        }
    }
}

/// The turns of the workflows that have calls under way or waiting, and the room for
/// changes and reads running at once.
#[derive(Debug)]
pub(crate) struct Turns {
    by_workflow: Mutex<HashMap<String, Arc<Semaphore>>>,
    shares: Shares,
    writing: Arc<Semaphore>,
    reading: Arc<Semaphore>,
}

/// What a call waited for in vain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Its workflow's turn (this one): the workflow's other calls kept it.
    Workflow(String),
    /// Room among the changes running at once (this many).
    Writing(usize),
    /// Room among the reads running at once (this many).
    Reading(usize),
    /// Anything, when the server began to stop.
    Stopping,
}

/// Whether the server is stopping ([`crate::serve_with`] says so to every request): a
/// call still waiting for its turn or room then gives up at once, rather than start a
/// change its client may not hear the end of (one that finds them free goes on, as
/// every request in flight). Never, for a router served otherwise.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stopping(pub Option<tokio::sync::watch::Receiver<bool>>);

/// Read from the request: what [`crate::serve_with`] put there, or never.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Stopping {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned().unwrap_or_default())
    }
}

impl Stopping {
    async fn begun(&self) {
        if let Some(rx) = &self.0
            && rx.clone().wait_for(|s| *s).await.is_ok()
        {
            return;
        }
        // Never told (the server went without a word): wait on.
        std::future::pending().await
    }
}

/// A workflow's turn, and once taken ([`Turn::room`]) its room to run, held until the
/// call ends; the last one out forgets the workflow.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    /// `None` for a plan that names no workflow: the runtime makes it a new one, which no
    /// other call can share.
    workflow_id: Option<String>,
    permit: Option<OwnedSemaphorePermit>,
    room: Option<OwnedSemaphorePermit>,
}

/// Waits for a permit of `semaphore` until `deadline` (one free is taken even past it),
/// or until the server stops (`Busy::Stopping`), else `busy`. Takes the semaphore: a
/// workflow's, held by nothing else, is then forgotten when the wait is dropped (see
/// [`Turns::take`]).
async fn permit(
    semaphore: Arc<Semaphore>,
    deadline: Instant,
    stopping: &Stopping,
    busy: impl FnOnce() -> Busy,
) -> Result<OwnedSemaphorePermit, Busy> {
    tokio::select! {
        // A permit free now is taken even once the stop began: a request still arriving
        // then is served, as every request in flight; only waits are cut short.
        biased;
        // The semaphores are never closed.
        got = tokio::time::timeout_at(deadline, semaphore.acquire_owned()) => {
            got.ok().and_then(Result::ok).ok_or_else(busy)
        }
        () = stopping.begun() => Err(Busy::Stopping),
    }
}

impl Turns {
    /// Turns for a blocking pool of `threads` threads.
    pub(crate) fn for_pool(threads: usize) -> Self {
        let shares = Shares::of_pool(threads);
        Self {
            by_workflow: Mutex::default(),
            shares,
            writing: Arc::new(Semaphore::new(shares.writing)),
            reading: Arc::new(Semaphore::new(shares.reading)),
        }
    }

    /// Waits for `workflow_id`'s turn until `deadline` (none to wait for without one).
    pub(crate) async fn take(
        self: &Arc<Self>,
        workflow_id: Option<&str>,
        deadline: Instant,
        stopping: &Stopping,
    ) -> Result<Turn, Busy> {
        let Some(workflow_id) = workflow_id else {
            return Ok(Turn {
                turns: Arc::clone(self),
                workflow_id: None,
                permit: None,
                room: None,
            });
        };
        let gate = {
            let mut map = self.by_workflow.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(
                map.entry(workflow_id.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(1))),
            )
        };
        // Made before the wait, so that a wait given up still forgets the workflow: its
        // hold on the semaphore, in the wait's future, goes first (a temporary).
        let mut turn = Turn {
            turns: Arc::clone(self),
            workflow_id: Some(workflow_id.to_owned()),
            permit: None,
            room: None,
        };
        turn.permit = Some(
            permit(gate, deadline, stopping, || {
                Busy::Workflow(workflow_id.to_owned())
            })
            .await?,
        );
        Ok(turn)
    }

    /// Room for a read, waited for until `deadline`.
    pub(crate) async fn reading(
        &self,
        deadline: Instant,
        stopping: &Stopping,
    ) -> Result<OwnedSemaphorePermit, Busy> {
        let at_once = self.shares.reading;
        permit(Arc::clone(&self.reading), deadline, stopping, || {
            Busy::Reading(at_once)
        })
        .await
    }

    #[cfg(test)]
    fn known(&self) -> usize {
        self.by_workflow.lock().map_or(0, |m| m.len())
    }
}

impl Turn {
    /// Room among the changes running at once, waited for until `deadline`. Taken once
    /// the turn is (a workflow's waiting calls hold none), and once the plan's data has
    /// room: a plan waiting for that holds no thread, so no room either.
    pub(crate) async fn room(
        &mut self,
        deadline: Instant,
        stopping: &Stopping,
    ) -> Result<(), Busy> {
        let at_once = self.turns.shares.writing;
        let room = permit(Arc::clone(&self.turns.writing), deadline, stopping, || {
            Busy::Writing(at_once)
        });
        self.room = Some(room.await?);
        Ok(())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop((self.room.take(), self.permit.take()));
        let Some(workflow_id) = &self.workflow_id else {
            return;
        };
        let mut map = self
            .turns
            .by_workflow
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Only the map holds it: no call holds or awaits this turn.
        if map
            .get(workflow_id)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            map.remove(workflow_id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    static NEVER: Stopping = Stopping(None);

    fn within(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn one_turn_per_workflow_and_none_kept_once_all_end() {
        let turns = Arc::new(Turns::for_pool(64));
        let a = turns
            .take(Some("wf_a"), within(1000), &NEVER)
            .await
            .unwrap();
        let b = turns
            .take(Some("wf_b"), within(1000), &NEVER)
            .await
            .unwrap();
        assert_eq!(
            turns.take(Some("wf_a"), within(50), &NEVER).await.err(),
            Some(Busy::Workflow("wf_a".to_owned())),
            "wf_a's turn is taken"
        );
        assert_eq!(turns.known(), 2, "a wait given up forgets nothing in use");
        drop(a);
        let again = turns
            .take(Some("wf_a"), within(1000), &NEVER)
            .await
            .unwrap();
        drop((again, b));
        assert_eq!(turns.known(), 0);
    }

    /// A wait dropped before its end (the client hung up) forgets the workflow too.
    #[tokio::test]
    async fn a_wait_dropped_midway_is_forgotten() {
        let turns = Arc::new(Turns::for_pool(64));
        let held = turns
            .take(Some("wf_a"), within(1000), &NEVER)
            .await
            .unwrap();
        let waiting = turns.take(Some("wf_a"), within(60_000), &NEVER);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), waiting)
                .await
                .is_err()
        );
        drop(held);
        assert_eq!(turns.known(), 0);
        // The last one left: its turn came while it was not polled, and it is dropped.
        let held = turns
            .take(Some("wf_a"), within(1000), &NEVER)
            .await
            .unwrap();
        let mut waiting = Box::pin(turns.take(Some("wf_a"), within(60_000), &NEVER));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut waiting)
                .await
                .is_err()
        );
        drop(held);
        drop(waiting);
        assert_eq!(turns.known(), 0);
    }

    #[test]
    fn the_pool_is_shared_out_with_threads_left_free() {
        let shares = |t| {
            let s = Shares::of_pool(t);
            (s.writing, s.reading)
        };
        assert_eq!(shares(64), (48, 12));
        assert_eq!(shares(16), (12, 3));
        assert_eq!(shares(8), (6, 1));
        assert_eq!(shares(5), (3, 1));
        assert_eq!(shares(4), (3, 1));
        assert_eq!(shares(1), (1, 1));
    }

    /// Changes of other workflows wait for room once their share of the pool runs
    /// changes, and the room freed goes to them; a call that found none keeps no turn.
    /// Reads have a share of their own.
    #[tokio::test]
    async fn changes_and_reads_wait_for_their_share() {
        let turns = Arc::new(Turns::for_pool(8));
        let mut running = Vec::new();
        for i in 0..6 {
            let mut t = turns
                .take(Some(&format!("wf_{i}")), within(1000), &NEVER)
                .await
                .unwrap();
            t.room(within(1000), &NEVER).await.unwrap();
            running.push(t);
        }
        let mut late = turns
            .take(Some("wf_late"), within(1000), &NEVER)
            .await
            .unwrap();
        assert_eq!(
            late.room(within(50), &NEVER).await.err(),
            Some(Busy::Writing(6))
        );
        drop(late);
        assert_eq!(turns.known(), 6, "a call that found no room keeps no turn");
        let read = turns.reading(within(50), &NEVER).await.unwrap();
        assert_eq!(
            turns.reading(within(50), &NEVER).await.err(),
            Some(Busy::Reading(1))
        );
        drop(read);
        let waiting = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move {
                let mut t = turns
                    .take(Some("wf_late"), within(60_000), &NEVER)
                    .await
                    .unwrap();
                t.room(within(60_000), &NEVER).await.is_ok()
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(running.pop());
        assert!(
            waiting.await.unwrap(),
            "the room freed went to the call waiting"
        );
    }
}
