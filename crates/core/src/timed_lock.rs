//! The in-process lock of a log (the audit trail, the registry), whose waiters give up.
//! The thread that holds it may itself be waiting for the log's file lock, which another
//! process holds (a stopped or hung one): that wait is bounded by
//! `limits.lock_wait_seconds`, and the threads queued behind it must be too, or they
//! would each wait their turn and then their own wait, one after the other.

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A mutex whose [`TimedMutex::lock`] waits at most a set time for other threads.
#[derive(Debug)]
pub(crate) struct TimedMutex<T> {
    data: Mutex<T>,
    /// Whether a guard is out; waiters wait on `freed` for it to come back.
    busy: Mutex<bool>,
    freed: Condvar,
    wait: Duration,
    /// What is locked, for the errors.
    what: &'static str,
}

/// Access to a [`TimedMutex`]'s data, given back on drop.
pub(crate) struct TimedGuard<'a, T> {
    guard: Option<MutexGuard<'a, T>>,
    owner: &'a TimedMutex<T>,
}

impl<T> TimedMutex<T> {
    pub(crate) fn new(data: T, wait: Duration, what: &'static str) -> Self {
        Self {
            data: Mutex::new(data),
            busy: Mutex::new(false),
            freed: Condvar::new(),
            wait,
            what,
        }
    }

    /// The data, once no other thread of this process holds it; `TimedOut` when one
    /// held it for longer than the wait. A panic while it was held (the data may be
    /// half changed) is an error for good.
    pub(crate) fn lock(&self) -> io::Result<TimedGuard<'_, T>> {
        let deadline = Instant::now() + self.wait;
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another thread of this process held {} for {} s, waiting for another process, as a rule",
                        self.what,
                        self.wait.as_secs()
                    ),
                ));
            }
            busy = self
                .freed
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *busy = true;
        drop(busy);
        self.take()
    }

    /// [`TimedMutex::lock`] when no other thread holds it; `None` when one does.
    pub(crate) fn try_lock(&self) -> Option<io::Result<TimedGuard<'_, T>>> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if *busy {
            return None;
        }
        *busy = true;
        drop(busy);
        Some(self.take())
    }

    fn take(&self) -> io::Result<TimedGuard<'_, T>> {
        match self.data.lock() {
            Ok(guard) => Ok(TimedGuard {
                guard: Some(guard),
                owner: self,
            }),
            Err(_) => {
                self.release();
                Err(io::Error::other(format!(
                    "{}'s lock was poisoned by a panic; start the process again",
                    self.what
                )))
            }
        }
    }

    fn release(&self) {
        *self.busy.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.freed.notify_one();
    }
}

impl<T> std::ops::Deref for TimedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl<T> std::ops::DerefMut for TimedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_deref_mut().unwrap_or_else(|| unreachable!())
    }
}

impl<T> Drop for TimedGuard<'_, T> {
    fn drop(&mut self) {
        // The data first: the next holder takes it at once.
        drop(self.guard.take());
        self.owner.release();
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
