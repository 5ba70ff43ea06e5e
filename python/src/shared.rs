//! What the other modules share, at the bottom of the crate's imports: the state of one open
//! store that its Python objects share ([`Shared`]), an async save's progress ([`SaveState`]),
//! and [`lock`]. `store`, `save` and `kv` import from here and never from one another upward
//! (`shared` <- `save` <- `kv` <- `store`).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use vfpoll_store::Store;

use crate::cuda::Staging;
use crate::errors::{Failure, Kind};

/// Threads that read the entries of one `read_many` at once.
pub(crate) const READ_THREADS: usize = 4;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Byte and operation counters of the binding since open.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_written: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) saves: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) gpu_bytes_staged: AtomicU64,
}

/// What the Python objects of one open store share.
pub(crate) struct Shared {
    pub(crate) store: RwLock<Option<Store>>,
    pub(crate) pools: Mutex<HashMap<String, vfpoll_store::KvPool>>,
    pub(crate) saves: Mutex<Vec<Arc<SaveState>>>,
    pub(crate) staging: Mutex<Vec<Staging>>,
    pub(crate) counters: Counters,
    pub(crate) specs: Vec<String>,
    /// Async saves write and commit in the order they were started: a ticket per save, and the
    /// ticket now served.
    pub(crate) next_ticket: AtomicU64,
    pub(crate) serving: Mutex<u64>,
    pub(crate) turn: Condvar,
}

/// Staging buffers kept for reuse (their CUDA registration is the expensive part).
const KEEP_STAGING: usize = 16 + READ_THREADS;

impl Shared {
    pub(crate) fn store(&self) -> Result<Store, Failure> {
        self.store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Failure::new(Kind::Closed, "the store is closed"))
    }

    pub(crate) fn take_staging(&self, len: usize) -> Result<Staging, Failure> {
        let mut free = lock(&self.staging);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, s)| s.capacity() >= len)
            .min_by_key(|(_, s)| s.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => Ok(free.swap_remove(i)),
            None => {
                drop(free);
                // Round up, so that slightly larger checkpoints reuse it.
                Ok(Staging::new(len.max(1).next_multiple_of(2 << 20))?)
            }
        }
    }

    pub(crate) fn give_staging(&self, s: Staging) {
        let mut free = lock(&self.staging);
        free.push(s);
        if free.len() > KEEP_STAGING {
            free.sort_by_key(|s| std::cmp::Reverse(s.capacity()));
            free.truncate(KEEP_STAGING);
        }
    }

    /// Waits for the turn of save `ticket`.
    pub(crate) fn wait_turn(&self, ticket: u64) {
        let mut s = lock(&self.serving);
        while *s != ticket {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the turn of save `ticket`.
    pub(crate) fn end_turn(&self, ticket: u64) {
        let mut s = lock(&self.serving);
        *s = ticket + 1;
        self.turn.notify_all();
    }

    pub(crate) fn wait_saves(&self) {
        let saves: Vec<_> = lock(&self.saves).drain(..).collect();
        for s in saves {
            s.wait_done(None);
        }
    }
}

/// Progress of an async save, shared by its thread and its handle.
pub(crate) struct SaveState {
    pub(crate) m: Mutex<Progress>,
    cv: Condvar,
}

#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) staged: bool,
    pub(crate) done: Option<Result<u64, Failure>>,
    /// Seconds from the start to staged and to durable.
    pub(crate) staged_s: f64,
    pub(crate) durable_s: f64,
}

impl SaveState {
    /// Whether the save has finished (durable or failed).
    pub(crate) fn is_done(&self) -> bool {
        lock(&self.m).done.is_some()
    }

    pub(crate) fn new() -> Arc<SaveState> {
        Arc::new(SaveState {
            m: Mutex::new(Progress::default()),
            cv: Condvar::new(),
        })
    }

    pub(crate) fn set_staged(&self, t0: Instant) {
        let mut p = lock(&self.m);
        if !p.staged {
            p.staged = true;
            p.staged_s = t0.elapsed().as_secs_f64();
        }
        self.cv.notify_all();
    }

    pub(crate) fn finish(&self, r: Result<u64, Failure>, t0: Instant) {
        let mut p = lock(&self.m);
        if !p.staged {
            p.staged = true;
            p.staged_s = t0.elapsed().as_secs_f64();
        }
        p.durable_s = t0.elapsed().as_secs_f64();
        p.done = Some(r);
        self.cv.notify_all();
    }

    /// Waits until `cond` holds or `timeout` passes; whether it holds.
    pub(crate) fn wait_for(&self, timeout: Option<Duration>, cond: impl Fn(&Progress) -> bool) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut p = lock(&self.m);
        while !cond(&p) {
            match deadline {
                None => p = self.cv.wait(p).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    p = self
                        .cv
                        .wait_timeout(p, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        true
    }

    pub(crate) fn wait_done(&self, timeout: Option<Duration>) -> bool {
        self.wait_for(timeout, |p| p.done.is_some())
    }
}
