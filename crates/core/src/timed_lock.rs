//! The in-process lock of a log (the audit trail, the registry), whose waiters give up.
//! The thread that holds it may itself be waiting for the log's file lock, which another
//! process holds (a stopped or hung one): that wait is bounded by
//! `limits.lock_wait_seconds`, and the threads queued behind it must be too, or they
//! would each wait their turn and then their own wait, one after the other; and a call
//! that goes through several steps under the lock would wait a whole time at each. So,
//! as for the log's file lock, once a whole wait ran out the waits of the next wait's
//! length last a second at most. Its part that guards no data, [`Gate`], is also the
//! turn to record held restores.

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One thread at a time, the others waiting for their turn no longer than they are
/// told: the part of [`TimedMutex`] that guards no data (a turn to take).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    /// Whether a pass is out, and how many threads wait on `freed` for it to come back.
    state: Mutex<GateState>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    busy: bool,
    /// Counted so that a pass given back with nobody waiting wakes nobody: a condition
    /// variable's notice is a system call even then, several per action otherwise.
    waiting: usize,
}

/// A thread's way through a [`Gate`], given back when dropped (by a panic too).
pub(crate) struct Pass<'a>(&'a Gate);

impl Gate {
    /// The pass, once no other thread holds it; `None` when one held it for `wait`.
    pub(crate) fn enter(&self, wait: Duration) -> Option<Pass<'_>> {
        let deadline = Instant::now() + wait;
        self.enter_by(|| deadline)
    }

    /// [`Gate::enter`] until `deadline()`, looked at again whenever the waiter wakes (a
    /// [`Gate::wake`] too): it may come nearer while the waiter waits.
    fn enter_by(&self, deadline: impl Fn() -> Instant) -> Option<Pass<'_>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.busy {
            let left = deadline().checked_duration_since(Instant::now())?;
            state.waiting += 1;
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.waiting -= 1;
        }
        state.busy = true;
        Some(Pass(self))
    }

    /// Has every waiter look at its deadline again.
    fn wake(&self) {
        // Under the lock, so that no waiter between its look and its wait misses it.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.waiting > 0 {
            self.freed.notify_all();
        }
    }

    /// The pass when no other thread holds it.
    fn try_enter(&self) -> Option<Pass<'_>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.busy {
            return None;
        }
        state.busy = true;
        Some(Pass(self))
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.busy = false;
        if state.waiting > 0 {
            self.0.freed.notify_one();
        }
    }
}

/// A mutex whose [`TimedMutex::lock`] waits at most a set time for other threads.
#[derive(Debug)]
pub(crate) struct TimedMutex<T> {
    data: Mutex<T>,
    /// Taken before `data`, which is then never waited for.
    gate: Gate,
    wait: Duration,
    /// What is locked, for the errors.
    what: &'static str,
    /// When a whole wait for it last ran out: the holder is most likely waiting for
    /// another process, and the threads that come after give up within a second.
    stalled: Mutex<Option<Instant>>,
}

/// Access to a [`TimedMutex`]'s data, given back on drop (the data first, then the
/// pass: the next holder takes the data at once).
pub(crate) struct TimedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    _pass: Pass<'a>,
}

impl<T> TimedMutex<T> {
    pub(crate) fn new(data: T, wait: Duration, what: &'static str) -> Self {
        Self {
            data: Mutex::new(data),
            gate: Gate::default(),
            wait,
            what,
            stalled: Mutex::new(None),
        }
    }

    /// The data, once no other thread of this process holds it; `TimedOut` when one
    /// held it for longer than the wait, or for a second while a whole wait for it ran
    /// out less than a wait ago. A panic while it was held (the data may be half
    /// changed) is an error for good.
    pub(crate) fn lock(&self) -> io::Result<TimedGuard<'_, T>> {
        let stalled = || *self.stalled.lock().unwrap_or_else(PoisonError::into_inner);
        let start = Instant::now();
        let whole = start + self.wait;
        // A whole wait that ran out less than a wait ago, before this one began or while
        // it goes on, leaves it a second from then.
        let deadline = || match stalled() {
            Some(at) if at + self.wait > start => whole.min(at.max(start) + Duration::from_secs(1)),
            _ => whole,
        };
        let Some(pass) = self.gate.enter_by(deadline) else {
            let ended = deadline();
            let held_for = if ended < whole {
                format!(
                    "for {} ms (a whole wait of {} s for it ran out less than {} s ago, so this one was cut short)",
                    start.elapsed().as_millis(),
                    self.wait.as_secs(),
                    self.wait.as_secs()
                )
            } else {
                // A live mark stays: the waits it cut end a second from it, not from each
                // whole wait that runs out after (waiters begun less than a second apart
                // would otherwise push one another on for good).
                let mut at = self.stalled.lock().unwrap_or_else(PoisonError::into_inner);
                if !at.is_some_and(|a| a.elapsed() < self.wait) {
                    *at = Some(Instant::now());
                }
                drop(at);
                // The others waiting now give up within a second.
                self.gate.wake();
                format!("for {} s", self.wait.as_secs())
            };
            return Err(crate::confine::state::LockBusy::error(format!(
                "another thread of this process held {} {held_for}, waiting for another process, as a rule",
                self.what
            )));
        };
        // The mark stays until it expires: a pass had says nothing of the other
        // process, which the thread that had it may now wait for in turn.
        self.take(pass)
    }

    /// [`TimedMutex::lock`] when no other thread holds it; `None` when one does.
    pub(crate) fn try_lock(&self) -> Option<io::Result<TimedGuard<'_, T>>> {
        Some(self.take(self.gate.try_enter()?))
    }

    fn take<'a>(&'a self, pass: Pass<'a>) -> io::Result<TimedGuard<'a, T>> {
        match self.data.lock() {
            Ok(guard) => Ok(TimedGuard { guard, _pass: pass }),
            Err(_) => Err(io::Error::other(format!(
                "{}'s lock was poisoned by a panic; start the process again",
                self.what
            ))),
        }
    }
}

impl<T> std::ops::Deref for TimedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for TimedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_gives_up_after_the_wait_and_gets_it_once_free() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, Duration::from_millis(50), "the log"));
        let mut held = m.lock().unwrap();
        *held += 1;
        let other = std::sync::Arc::clone(&m);
        let refused = std::thread::spawn(move || other.lock().err().map(|e| e.kind()))
            .join()
            .unwrap();
        assert_eq!(refused, Some(io::ErrorKind::TimedOut));
        assert!(m.try_lock().is_none());
        drop(held);
        assert_eq!(*m.lock().unwrap(), 1);
        assert!(m.try_lock().is_some());
    }

    /// A waiter is woken as soon as the lock is given back, not at the end of its wait:
    /// the holder's release must see it waiting.
    #[test]
    fn a_waiter_is_woken_when_the_lock_is_given_back() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, Duration::from_secs(3600), "the log"));
        let held = m.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = std::sync::Arc::clone(&m);
        std::thread::spawn(move || {
            let got = other.lock().map(|g| *g).map_err(|e| e.kind());
            let _ = tx.send(got);
        });
        while m.gate.state.lock().unwrap().waiting == 0 {
            std::thread::yield_now();
        }
        drop(held);
        // An hour's wait: a release that woke nobody would leave it asleep far beyond this.
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(Ok(0)));
    }

    /// Once a whole wait ran out, the next waiters give up within a second, and say
    /// so, until a wait's length has passed: waits are whole again.
    #[test]
    fn after_a_whole_wait_ran_out_the_next_waits_are_short() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, Duration::from_secs(2), "the log"));
        let held = m.lock().unwrap();
        let wait = |m: &std::sync::Arc<TimedMutex<u32>>| {
            let other = std::sync::Arc::clone(m);
            std::thread::spawn(move || other.lock().err().map(|e| e.to_string()))
                .join()
                .unwrap()
        };
        let whole = wait(&m).unwrap();
        assert!(whole.contains("for 2 s,"), "{whole}");
        let short = wait(&m).unwrap();
        assert!(short.contains("cut short"), "{short}");
        drop(held);
        drop(m.lock().unwrap());
        std::thread::sleep(Duration::from_secs(2));
        let held = m.lock().unwrap();
        let whole = wait(&m).unwrap();
        assert!(whole.contains("for 2 s,"), "{whole}");
        drop(held);
    }

    /// Waiters that queued one after the other behind a holder that does not let go:
    /// once the first whole wait ran out, those still waiting end a second from then,
    /// not each after its own whole wait (the mark is not moved by the whole waits that
    /// run out after it).
    #[test]
    fn waits_under_way_end_a_second_after_the_first_whole_wait_ran_out() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, Duration::from_secs(2), "the log"));
        let held = m.lock().unwrap();
        let waiters: Vec<_> = (0..8)
            .map(|i| {
                std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 250 }));
                let other = std::sync::Arc::clone(&m);
                std::thread::spawn(move || other.lock().err().map(|e| e.to_string()))
            })
            .collect();
        let said: Vec<String> = waiters
            .into_iter()
            .map(|w| w.join().unwrap().unwrap())
            .collect();
        assert!(said[0].contains("for 2 s,"), "{said:#?}");
        // Begun 1.75 s after the first, its whole wait would end 0.75 s after the
        // first's ran out.
        assert!(said[7].contains("cut short"), "{said:#?}");
        drop(held);
    }

    #[test]
    fn a_panic_while_held_is_an_error_for_good() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, Duration::from_millis(50), "the log"));
        let other = std::sync::Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = other.lock().unwrap();
            panic!("half changed");
        })
        .join();
        let e = m.lock().err().unwrap();
        assert!(e.to_string().contains("poisoned"), "{e}");
    }
}
