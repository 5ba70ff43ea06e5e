//! The background writer of a checkpoint transaction ([`crate::CheckpointTx::background`]):
//! puts copy their data into host staging windows and return (the caller's memory, host or
//! GPU, is free again: the *staged* point), and one thread per transaction writes the windows
//! to the namespaces. At most `budget` bytes wait in staging; a put that would exceed it waits
//! for writes to finish (back-pressure, never unbounded memory).

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::{Result, StoreError};
use crate::io::Job;
use crate::store::Store;

/// One staged window: its bytes and where each piece goes (logical page, offset, length).
pub(crate) struct Window {
    pub data: Vec<u8>,
    pub pieces: Vec<(u64, usize, usize)>,
}

#[derive(Default)]
struct State {
    in_flight: u64,
    /// The first write error, until someone takes it.
    error: Option<StoreError>,
    /// Set once a write failed (the error may have been taken already).
    failed: Option<String>,
    free: Vec<Vec<u8>>,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
    budget: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn failure(st: &mut State) -> Option<StoreError> {
    st.error.take().or_else(|| {
        st.failed
            .as_ref()
            .map(|m| StoreError::Invalid(format!("an earlier background write failed: {m}")))
    })
}

/// The writer thread and its staging budget.
pub(crate) struct Writer {
    send: Option<mpsc::Sender<Window>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Writer {
    /// Starts the thread for `store` with `budget` bytes of staging.
    pub fn start(store: Store, budget: u64) -> Result<Self> {
        let shared = Arc::new(Shared {
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
            budget,
        });
        let (send, recv) = mpsc::channel::<Window>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vfpoll-store-writer".into())
            .spawn(move || {
                while let Ok(w) = recv.recv() {
                    let failed = sh.lock().failed.is_some();
                    if !failed {
                        let mut jobs: Vec<Job<'_>> = w
                            .pieces
                            .iter()
                            .map(|&(page, at, len)| Job::Write {
                                page,
                                data: &w.data[at..at + len],
                            })
                            .collect();
                        let r = store.io().run(&mut jobs);
                        drop(jobs);
                        if let Err(e) = r {
                            let mut st = sh.lock();
                            st.failed = Some(e.to_string());
                            st.error.get_or_insert(e);
                        }
                    }
                    let mut st = sh.lock();
                    st.in_flight -= w.data.len() as u64;
                    if st.free.len() < 4 {
                        st.free.push(w.data);
                    }
                    sh.cv.notify_all();
                }
            })
            .map_err(|e| StoreError::Internal(format!("cannot start the background writer: {e}")))?;
        Ok(Writer {
            send: Some(send),
            thread: Some(thread),
            shared,
        })
    }

    /// The staging budget.
    pub fn budget(&self) -> u64 {
        self.shared.budget
    }

    /// A buffer of `n` bytes, once the budget allows it (one window may always be in flight);
    /// the first background write error instead, if one happened.
    pub fn take_buffer(&self, n: usize) -> Result<Vec<u8>> {
        let mut st = self.shared.lock();
        loop {
            if let Some(e) = failure(&mut st) {
                return Err(e);
            }
            if st.in_flight == 0 || st.in_flight + n as u64 <= self.shared.budget {
                break;
            }
            st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.in_flight += n as u64;
        let mut b = st.free.pop().unwrap_or_default();
        drop(st);
        b.resize(n, 0);
        Ok(b)
    }

    /// Gives back a buffer that will not be sent (a fill failed).
    pub fn untake(&self, b: Vec<u8>) {
        let mut st = self.shared.lock();
        st.in_flight -= b.len() as u64;
        self.shared.cv.notify_all();
    }

    /// Queues a window for writing.
    pub fn send(&self, w: Window) -> Result<()> {
        let n = w.data.len() as u64;
        match self.send.as_ref().map(|s| s.send(w)) {
            Some(Ok(())) => Ok(()),
            _ => {
                let mut st = self.shared.lock();
                st.in_flight -= n;
                Err(StoreError::Internal("the background writer stopped".into()))
            }
        }
    }

    /// Waits until every queued window is written; the first write error, if any.
    pub fn drain(&self) -> Result<()> {
        let mut st = self.shared.lock();
        while st.in_flight > 0 {
            st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        failure(&mut st).map_or(Ok(()), Err)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.send.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the background writer panicked");
            }
        }
    }
}
