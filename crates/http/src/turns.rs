//! One call at a time per workflow on the blocking pool. The runtime serialises a
//! workflow's runs and rollbacks with a lock that a waiting call polls from its thread,
//! for up to `limits.lock_wait_seconds`: calls piling up on one busy workflow (held by a
//! stopped CLI process, say) would fill the pool and stall every route. Here they wait
//! for their turn without a thread, and only the call whose turn it is takes one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The turns of the workflows that have calls under way or waiting.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    by_workflow: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// A workflow's turn, held until the call ends; the last one out forgets the workflow.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    workflow_id: String,
    permit: Option<OwnedSemaphorePermit>,
}

impl Turns {
    /// Waits for `workflow_id`'s turn, at most `wait`; `None` past it.
    pub(crate) async fn take(self: &Arc<Self>, workflow_id: &str, wait: Duration) -> Option<Turn> {
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
        };
        let permit = tokio::time::timeout(wait, gate.acquire_owned()).await;
        // The semaphore is never closed.
        turn.permit = Some(permit.ok()?.ok()?);
        Some(turn)
    }

    #[cfg(test)]
    fn known(&self) -> usize {
        self.by_workflow.lock().map_or(0, |m| m.len())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
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
        let turns = Arc::new(Turns::default());
        let a = turns.take("wf_a", Duration::from_secs(1)).await.unwrap();
        let b = turns.take("wf_b", Duration::from_secs(1)).await.unwrap();
        assert!(
            turns
                .take("wf_a", Duration::from_millis(50))
                .await
                .is_none(),
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
        let turns = Arc::new(Turns::default());
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
}
