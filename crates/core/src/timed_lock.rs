//! The in-process lock of a log (the audit trail, the registry), whose waiters give up.
//! The thread that holds it may itself be waiting for the log's file lock, which another
//! process holds (a stopped or hung one): that wait is bounded by
//! `limits.lock_wait_seconds`, and the threads queued behind it must be too, or they
//! would each wait their turn and then their own wait, one after the other; and a call
//! that goes through several steps under the lock would wait a whole time at each. So a
//! log's two locks share one [`Stall`]: once a whole wait for either ran out, the waits
//! for either under way then, and those begun within a wait's length, end a second from
//! then. Its part that guards no data, [`Gate`], is also the turn to record held
//! restores.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a wait for a stalled log lasts.
const CUT: Duration = Duration::from_secs(1);

/// How often a waiter looks again at its deadline, which a stall marked meanwhile by the
/// log's other lock may bring nearer.
const LOOK_AGAIN: Duration = Duration::from_millis(200);

/// Whether a log looks stuck: a whole wait for one of its locks ran out, and no wait
/// since had it, its holder most likely a stopped or hung process. Shared by the log's
/// file lock and its owner's in-process lock. It lapses a wait after the last wait for
/// the log that ran out, whole or cut.
#[derive(Debug)]
pub(crate) struct Stall {
    wait: Duration,
    /// When the whole wait that marked it ran out, and when the last wait did.
    at: Mutex<Option<(Instant, Instant)>>,
}

impl Stall {
    /// No stall yet, for waits of `wait` (`limits.lock_wait_seconds`).
    pub(crate) fn new(wait: Duration) -> Self {
        Self {
            wait,
            at: Mutex::new(None),
        }
    }

    /// A whole wait.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    fn mark(&self) -> MutexGuard<'_, Option<(Instant, Instant)>> {
        self.at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mark, while it is live at `now`.
    fn live(&self, now: Instant) -> Option<(Instant, Instant)> {
        self.mark().filter(|(_, last)| *last + self.wait > now)
    }

    /// When a wait begun at `start` ends: a whole wait after it, or, while the log
    /// stalls, a second after the later of its start and the whole wait that marked it
    /// (so that the waits under way then end together, whatever runs out after).
    pub(crate) fn deadline(&self, start: Instant) -> Instant {
        let whole = start + self.wait;
        match self.live(start) {
            Some((first, _)) => whole.min(first.max(start) + CUT),
            None => whole,
        }
    }

    /// A wait ran out: a whole one marks the log stalled, and any keeps a mark live.
    pub(crate) fn ran_out(&self, whole: bool) {
        let now = Instant::now();
        let live = self.live(now);
        let mut at = self.mark();
        *at = match live {
            Some((first, _)) => Some((first, now)),
            None if whole => Some((now, now)),
            None => None,
        };
    }

    /// The log's holder let go (a cut wait had the file lock): waits are whole again.
    pub(crate) fn cleared(&self) {
        *self.mark() = None;
    }
}

/// One thread at a time, the others waiting for their turn no longer than they are
/// told: the part of [`TimedMutex`] that guards no data (a turn to take).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    /// Whether a pass is out; waiters wait on `freed` for it to come back.
    busy: Mutex<bool>,
    freed: Condvar,
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
    /// [`Gate::wake`] too, and every [`LOOK_AGAIN`]): it may come nearer while the waiter
    /// waits.
    fn enter_by(&self, deadline: impl Fn() -> Instant) -> Option<Pass<'_>> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            let left = deadline()
                .checked_duration_since(Instant::now())?
                .min(LOOK_AGAIN);
            busy = self
                .freed
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *busy = true;
        Some(Pass(self))
    }

    /// Has every waiter look at its deadline again.
    fn wake(&self) {
        // Under the lock, so that no waiter between its look and its wait misses it.
        let _busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        self.freed.notify_all();
    }

    /// The pass when no other thread holds it.
    fn try_enter(&self) -> Option<Pass<'_>> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if *busy {
            return None;
        }
        *busy = true;
        Some(Pass(self))
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.0.freed.notify_one();
    }
}

/// A mutex whose [`TimedMutex::lock`] waits at most a set time for other threads.
#[derive(Debug)]
pub(crate) struct TimedMutex<T> {
    data: Mutex<T>,
    /// Taken before `data`, which is then never waited for.
    gate: Gate,
    /// The log's, shared with its file lock.
    stall: Arc<Stall>,
    /// What is locked, for the errors.
    what: &'static str,
}

/// Access to a [`TimedMutex`]'s data, given back on drop (the data first, then the
/// pass: the next holder takes the data at once).
pub(crate) struct TimedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    _pass: Pass<'a>,
}

impl<T> TimedMutex<T> {
    pub(crate) fn new(data: T, stall: Arc<Stall>, what: &'static str) -> Self {
        Self {
            data: Mutex::new(data),
            gate: Gate::default(),
            stall,
            what,
        }
    }

    /// The data, once no other thread of this process holds it; `TimedOut` when one
    /// held it for longer than the wait, or for a second while the log stalls (see
    /// [`Stall`]). A panic while it was held (the data may be half changed) is an error
    /// for good.
    pub(crate) fn lock(&self) -> io::Result<TimedGuard<'_, T>> {
        let start = Instant::now();
        let whole = start + self.stall.wait();
        let Some(pass) = self.gate.enter_by(|| self.stall.deadline(start)) else {
            let cut = self.stall.deadline(start) < whole;
            self.stall.ran_out(!cut);
            let held_for = if cut {
                format!(
                    "for {} ms (a whole wait of {} s for the log ran out less than {} s ago, so this one was cut short)",
                    start.elapsed().as_millis(),
                    self.stall.wait().as_secs(),
                    self.stall.wait().as_secs()
                )
            } else {
                // The others waiting now give up within a second.
                self.gate.wake();
                format!("for {} s", self.stall.wait().as_secs())
            };
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "another thread of this process held {} {held_for}, waiting for another process, as a rule",
                    self.what
                ),
            ));
        };
        // A pass had says nothing of the other process, which the thread that had it may
        // now wait for in turn: the mark stays until it lapses or the file lock is had.
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

    fn stall(wait: Duration) -> Arc<Stall> {
        Arc::new(Stall::new(wait))
    }

    #[test]
    fn a_waiter_gives_up_after_the_wait_and_gets_it_once_free() {
        let m = std::sync::Arc::new(TimedMutex::new(
            0u32,
            stall(Duration::from_millis(50)),
            "the log",
        ));
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

    /// Once a whole wait ran out, the next waiters give up within a second, and say
    /// so, until a wait's length has passed since the last ran out: waits are whole
    /// again.
    #[test]
    fn after_a_whole_wait_ran_out_the_next_waits_are_short() {
        let m = std::sync::Arc::new(TimedMutex::new(
            0u32,
            stall(Duration::from_secs(2)),
            "the log",
        ));
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
        // A wait after the last that ran out.
        std::thread::sleep(Duration::from_millis(2500));
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
        let m = std::sync::Arc::new(TimedMutex::new(
            0u32,
            stall(Duration::from_secs(2)),
            "the log",
        ));
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
        let m = std::sync::Arc::new(TimedMutex::new(
            0u32,
            stall(Duration::from_millis(50)),
            "the log",
        ));
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
