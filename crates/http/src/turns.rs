//! When a plan or rollback may take a thread of the blocking pool. The runtime serialises
//! a workflow's runs and rollbacks with a lock that a waiting call polls from its thread,
//! for up to `limits.lock_wait_seconds`, and a change waits so for the locks of its
//! targets, the audit trail and the registry when another process holds them. Calls
//! piling up on one busy workflow (held by a stopped CLI run, say), or many workflows'
//! calls waiting for a lock another process holds, would fill the pool and stall every
//! route. So a workflow's calls take turns, and at most [`writing_calls`] of the pool's
//! threads run changes at once: the others wait without a thread, and reads, `/metrics`
//! and probes always find one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many of a blocking pool of `threads` threads may run changes at once: three
/// quarters, the rest kept for reads (one at least for changes).
pub(crate) fn writing_calls(threads: usize) -> usize {
    (threads - threads / 4).max(1)
}

/// The turns of the workflows that have calls under way or waiting, and the room for
/// changes running at once.
#[derive(Debug)]
pub(crate) struct Turns {
    by_workflow: Mutex<HashMap<String, Arc<Semaphore>>>,
    writing: Arc<Semaphore>,
    writing_at_once: usize,
}

/// What a call waited for in vain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Its workflow's turn: the workflow's other calls kept it.
    Workflow,
    /// Room among the changes running at once (this many).
    Writing(usize),
}

/// A workflow's turn and its room to run, held until the call ends; the last one out
/// forgets the workflow.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    workflow_id: String,
    permit: Option<OwnedSemaphorePermit>,
    room: Option<OwnedSemaphorePermit>,
}

impl Turns {
    /// Turns for a blocking pool of `threads` threads.
    pub(crate) fn for_pool(threads: usize) -> Self {
        let writing_at_once = writing_calls(threads);
        Self {
            by_workflow: Mutex::default(),
            writing: Arc::new(Semaphore::new(writing_at_once)),
            writing_at_once,
        }
    }

    /// Waits for `workflow_id`'s turn, then for room to run, both within `wait`.
    pub(crate) async fn take(
        self: &Arc<Self>,
        workflow_id: &str,
        wait: Duration,
    ) -> Result<Turn, Busy> {
        let deadline = tokio::time::Instant::now() + wait;
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
            workflow_id: workflow_id.to_owned(),
            permit: None,
            room: None,
        };
        // The semaphores are never closed.
        let permit = tokio::time::timeout_at(deadline, gate.acquire_owned()).await;
        turn.permit = Some(permit.ok().and_then(Result::ok).ok_or(Busy::Workflow)?);
        // After the turn: a workflow's waiting calls hold no room.
        let room =
            tokio::time::timeout_at(deadline, Arc::clone(&self.writing).acquire_owned()).await;
        turn.room = Some(
            room.ok()
                .and_then(Result::ok)
                .ok_or(Busy::Writing(self.writing_at_once))?,
        );
        Ok(turn)
    }

    #[cfg(test)]
    fn known(&self) -> usize {
        self.by_workflow.lock().map_or(0, |m| m.len())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop((self.room.take(), self.permit.take()));
        let mut map = self
            .turns
            .by_workflow
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Only the map holds it: no call holds or awaits this turn.
        if map
            .get(&self.workflow_id)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            map.remove(&self.workflow_id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_turn_per_workflow_and_none_kept_once_all_end() {
        let turns = Arc::new(Turns::for_pool(64));
        let a = turns.take("wf_a", Duration::from_secs(1)).await.unwrap();
        let b = turns.take("wf_b", Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            turns.take("wf_a", Duration::from_millis(50)).await.err(),
            Some(Busy::Workflow),
            "wf_a's turn is taken"
        );
        assert_eq!(turns.known(), 2, "a wait given up forgets nothing in use");
        drop(a);
        let again = turns.take("wf_a", Duration::from_secs(1)).await.unwrap();
        drop((again, b));
        assert_eq!(turns.known(), 0);
    }

    /// A wait dropped before its end (the client hung up) forgets the workflow too.
    #[tokio::test]
    async fn a_wait_dropped_midway_is_forgotten() {
        let turns = Arc::new(Turns::for_pool(64));
        let held = turns.take("wf_a", Duration::from_secs(1)).await.unwrap();
        let waiting = turns.take("wf_a", Duration::from_secs(60));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), waiting)
                .await
                .is_err()
        );
        drop(held);
        assert_eq!(turns.known(), 0);
        // The last one left: its turn came while it was not polled, and it is dropped.
        let held = turns.take("wf_a", Duration::from_secs(1)).await.unwrap();
        let mut waiting = Box::pin(turns.take("wf_a", Duration::from_secs(60)));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut waiting)
                .await
                .is_err()
        );
        drop(held);
        drop(waiting);
        assert_eq!(turns.known(), 0);
    }

    /// Changes of other workflows wait for room once three quarters of the pool run
    /// changes, within the same wait as for their turn, and the room freed goes to them.
    #[tokio::test]
    async fn a_quarter_of_the_pool_is_kept_from_changes() {
        assert_eq!(
            [1, 2, 3, 4, 64].map(writing_calls),
            [1, 2, 3, 3, 48],
            "changes at once, for pools of 1, 2, 3, 4 and 64 threads"
        );
        let turns = Arc::new(Turns::for_pool(4));
        let mut running = Vec::new();
        for wf in ["wf_a", "wf_b", "wf_c"] {
            running.push(turns.take(wf, Duration::from_secs(1)).await.unwrap());
        }
        assert_eq!(
            turns.take("wf_d", Duration::from_millis(50)).await.err(),
            Some(Busy::Writing(3))
        );
        assert_eq!(turns.known(), 3, "a call that found no room keeps no turn");
        let waiting = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move { turns.take("wf_d", Duration::from_secs(60)).await.is_ok() }
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
