//! Group commit: callers that need a sync at about the same time share one. Each caller
//! takes a ticket once its writes are made; a sync covers every ticket taken before it
//! started. One sync runs at a time: callers that arrive meanwhile wait for it, and the
//! first of those it does not cover runs the next one for all of them.
//!
//! After a failed sync every later ticket fails too: the kernel may have dropped the pages
//! it could not write, so a later sync proves nothing. Used by the journals' `fdatasync`
//! and by `batched`'s `syncfs` (one `GroupCommit` for the filesystems a sandbox writes to).

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The tickets and syncs of one thing synced (a journal, a set of filesystems).
#[derive(Debug, Default)]
pub struct GroupCommit {
    state: Mutex<State>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Tickets taken so far.
    taken: u64,
    /// Tickets covered by a finished sync.
    covered: u64,
    running: bool,
    /// A failed sync, which no later one can make up for: the kernel may have dropped
    /// the pages it could not write, so a later sync could succeed with them lost.
    failed: Option<(io::ErrorKind, String)>,
    /// Syncs made (tests and benchmarks).
    made: u64,
    /// Callers waiting for a running sync: a sync that ends with none wakes nobody (a
    /// condition variable's notice is a system call even then, two per action otherwise).
    waiting: usize,
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters, consistent at every step: a panic elsewhere poisons nothing
        // that matters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ticket for writes just made. Take it before later writes can be made, so that
    /// tickets follow the order of the writes.
    pub fn ticket(&self) -> u64 {
        let mut s = self.lock();
        s.taken += 1;
        s.taken
    }

    /// Returns once `ticket` is covered by a finished sync, running `sync` when no sync
    /// running or finished covers it. After a failed sync, every ticket not covered
    /// before it fails too.
    pub fn wait(&self, ticket: u64, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut s = self.lock();
        loop {
            if s.covered >= ticket {
                return Ok(());
            }
            if let Some(e) = failure(&s) {
                return Err(e);
            }
            if !s.running {
                break;
            }
            s.waiting += 1;
            s = self.done.wait(s).unwrap_or_else(PoisonError::into_inner);
            s.waiting -= 1;
        }
        s.running = true;
        let upto = s.taken;
        drop(s);
        // Whatever way the sync ends, a panic included, the waiters learn of it.
        let mut ended = Ended {
            group: self,
            upto,
            result: Err(io::Error::other("the sync panicked")),
        };
        ended.result = sync();
        match &ended.result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// The error every later wait returns, once a sync has failed.
    pub fn failed(&self) -> Option<io::Error> {
        failure(&self.lock())
    }

    /// Syncs made so far, each covering one ticket or more.
    pub fn syncs_made(&self) -> u64 {
        self.lock().made
    }
}

fn failure(s: &State) -> Option<io::Error> {
    s.failed.as_ref().map(|(kind, why)| {
        io::Error::new(
            *kind,
            format!(
                "an earlier sync failed ({why}): nothing written since can be made durable, so this process writes nothing more; restart the runtime so that its recovery checks what reached the disk"
            ),
        )
    })
}

/// The end of a running sync, recorded when dropped.
struct Ended<'a> {
    group: &'a GroupCommit,
    upto: u64,
    result: io::Result<()>,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        let mut s = self.group.lock();
        s.running = false;
        s.made += 1;
        match &self.result {
            Ok(()) => s.covered = s.covered.max(self.upto),
            Err(e) => s.failed = Some((e.kind(), e.to_string())),
        }
        if s.waiting > 0 {
            self.group.done.notify_all();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::GroupCommit;
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    fn no_sync_expected() -> io::Result<()> {
        panic!("this append was durable already")
    }

    #[test]
    fn a_sync_covers_every_append_written_before_it_started() {
        let g = GroupCommit::default();
        let (first, second) = (g.ticket(), g.ticket());
        g.wait(second, || Ok(())).unwrap();
        g.wait(first, no_sync_expected).unwrap();
        g.wait(second, no_sync_expected).unwrap();
        assert_eq!(g.syncs_made(), 1);
    }

    #[test]
    fn an_append_written_during_a_sync_waits_for_it_then_syncs_again() {
        let g = Arc::new(GroupCommit::default());
        let first = g.ticket();
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let first_done = Arc::new(AtomicBool::new(false));
        let leader = {
            let (g, first_done) = (g.clone(), first_done.clone());
            std::thread::spawn(move || {
                g.wait(first, || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    first_done.store(true, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        started.recv().unwrap();
        // Written while the first sync runs: that sync may not cover it.
        let second = g.ticket();
        let follower = {
            let (g, first_done) = (g.clone(), first_done.clone());
            std::thread::spawn(move || {
                g.wait(second, || {
                    assert!(first_done.load(Ordering::SeqCst), "two syncs ran at once");
                    Ok(())
                })
            })
        };
        // Covered by the running sync: waits for it without a sync of its own.
        let covered = {
            let g = g.clone();
            std::thread::spawn(move || g.wait(first, no_sync_expected))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        release.send(()).unwrap();
        leader.join().unwrap().unwrap();
        follower.join().unwrap().unwrap();
        covered.join().unwrap().unwrap();
        assert_eq!(g.syncs_made(), 2);
    }

    #[test]
    fn a_sync_that_panics_fails_its_waiters_instead_of_hanging_them() {
        let g = Arc::new(GroupCommit::default());
        let first = g.ticket();
        let panicked = {
            let g = g.clone();
            std::thread::spawn(move || g.wait(first, || panic!("injected"))).join()
        };
        assert!(panicked.is_err());
        let (done, rx) = mpsc::channel();
        let later = g.ticket();
        let g2 = g.clone();
        std::thread::spawn(move || done.send(g2.wait(later, || Ok(()))).unwrap());
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a wait after a panicked sync never returned")
            .unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert!(g.failed().is_some());
    }

    #[test]
    fn after_a_failed_sync_no_later_append_is_reported_durable() {
        let g = GroupCommit::default();
        let before = g.ticket();
        g.wait(before, || Ok(())).unwrap();
        let lost = g.ticket();
        let e = g
            .wait(lost, || Err(io::Error::other("disk gone")))
            .unwrap_err();
        assert!(e.to_string().contains("disk gone"), "{e}");
        let later = g.ticket();
        for ticket in [lost, later] {
            let e = g.wait(ticket, || Ok(())).unwrap_err();
            assert!(e.to_string().contains("an earlier sync"), "{e}");
        }
        // What was durable before the failure stays so.
        g.wait(before, no_sync_expected).unwrap();
    }
}
