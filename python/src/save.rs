//! Saving: the staging copy (host memory by the CPU, CUDA memory by the copy engine), async
//! saves on a thread of their own ([`SaveHandle`]), and [`Writer`], a version filled entry by
//! entry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use vfpoll_store::{CheckpointTx, Store};

use crate::buffer::{Buffer, Place, Range};
use crate::cuda::{Device, Staging};
use crate::errors::{Failure, Kind};
use crate::ffi::host_bytes;
use crate::shared::{lock, SaveState, Shared};

/// `(address, length, place)` and where in the staging memory it goes, for one entry.
pub(crate) struct Item {
    pub(crate) entry: String,
    pub(crate) meta: Vec<u8>,
    pub(crate) range: Range,
    /// Offset in the staging memory when the entry goes through it.
    pub(crate) staged_at: Option<usize>,
}

/// Copies `items`' bytes into `staging` (those with `staged_at`): host memory by the CPU, CUDA
/// memory by each device's copy engine.
pub(crate) fn stage<'a>(
    items: impl IntoIterator<Item = &'a Item> + Clone,
    staging: &mut Staging,
) -> Result<u64, Failure> {
    let mut gpu = 0u64;
    let mut devices: Vec<i32> = Vec::new();
    for it in items.clone() {
        let Some(at) = it.staged_at else { continue };
        match it.range.place {
            Place::Host => {
                // SAFETY: the range is of a buffer the caller keeps alive until staged (see
                // `SaveHandle`, whose holds outlive this copy).
                let src = unsafe { host_bytes(it.range.addr, it.range.len) };
                copy_parallel(staging.bytes_mut(at, it.range.len), src);
            }
            Place::Cuda(d) => {
                if !devices.contains(&d) {
                    devices.push(d);
                }
            }
        }
    }
    for d in devices {
        let dev = Device::open(d)?;
        let mut c = dev.copier(staging)?;
        for it in items.clone() {
            if let (Some(at), Place::Cuda(x)) = (it.staged_at, it.range.place) {
                if x == d && it.range.len > 0 {
                    if let Some(st) = it.range.stream {
                        c.after(st)?;
                    }
                    c.d2h(it.range.addr as u64, at, it.range.len)?;
                    gpu += it.range.len as u64;
                }
            }
        }
        c.finish()?;
    }
    Ok(gpu)
}

/// `dst.copy_from_slice(src)`, on several threads for large copies (one core copies ~10 GB/s;
/// a checkpoint's staging should not be bound by it).
fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    const PIECE: usize = 64 << 20;
    if src.len() < 2 * PIECE {
        dst.copy_from_slice(src);
        return;
    }
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(8);
    let per = src.len().div_ceil(threads).next_multiple_of(4096);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

fn timeout_of(t: Option<f64>) -> PyResult<Option<Duration>> {
    match t {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "timeout {s} is not a number of seconds >= 0"
        ))),
    }
}

fn panicked(what: &str) -> Failure {
    Failure::new(
        Kind::Store,
        format!("internal error: the {what} thread panicked (a bug: please report it)"),
    )
}

/// Staged bytes per batch of a save: the device copies of one batch run while the batches
/// before it are written, so that the disk starts on the first batch as soon as its copy is
/// done instead of after every tensor's (about 8 batches; none under 64 MiB).
fn batch_target(total: usize) -> usize {
    (total / 8).max(64 << 20)
}

/// The body of an async save's thread.
///
/// Timeline: a stager thread copies the tensors into host staging batch by batch (GPU copies
/// by the copy engine, host arrays by the CPU) and says *staged* once the last batch is in;
/// this thread writes each batch as soon as it is there, entry by entry in the caller's order,
/// then commits.
pub(crate) fn run_save(
    shared: &Shared,
    store: Store,
    name: &str,
    mut items: Vec<Item>,
    stage_host: bool,
    state: &SaveState,
    ticket: u64,
) {
    let t0 = Instant::now();
    let mut turn = false;
    // A panic (a bug) must still end the save: its handle waits for staged and durable.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<u64, Failure> {
        // Batches of staged items: (item indices, bytes), offsets within the batch's staging.
        let total: usize = items
            .iter()
            .filter(|it| stage_host || matches!(it.range.place, Place::Cuda(_)))
            .map(|it| it.range.len.next_multiple_of(64))
            .sum();
        let target = batch_target(total);
        let mut batches: Vec<(Vec<usize>, usize)> = Vec::new();
        let mut batch_of: Vec<Option<usize>> = vec![None; items.len()];
        for (i, it) in items.iter_mut().enumerate() {
            if !(stage_host || matches!(it.range.place, Place::Cuda(_))) {
                continue;
            }
            let n = it.range.len.next_multiple_of(64);
            if batches
                .last()
                .is_none_or(|(_, bytes)| *bytes > 0 && bytes + n > target)
            {
                batches.push((Vec::new(), 0));
            }
            let (idx, bytes) = batches.last_mut().ok_or_else(|| panicked("batching"))?;
            it.staged_at = Some(*bytes);
            idx.push(i);
            *bytes += n;
            batch_of[i] = Some(batches.len() - 1);
        }
        let all_staged = items.iter().all(|it| it.staged_at.is_some());
        let mut stagings = Vec::with_capacity(batches.len());
        for (_, bytes) in &batches {
            stagings.push(shared.take_staging(*bytes)?);
        }
        let items = &items;
        let (to_writer, arrived) =
            std::sync::mpsc::sync_channel::<(usize, Staging, Result<u64, Failure>)>(batches.len().max(1));
        let mut ready: Vec<Option<Staging>> = (0..batches.len()).map(|_| None).collect();
        let written = std::thread::scope(|scope| {
            let batches = &batches;
            scope.spawn(move || {
                let mut failed = false;
                for (b, mut st) in stagings.into_iter().enumerate() {
                    let r = if failed {
                        Ok(0)
                    } else {
                        stage(batches[b].0.iter().map(|&i| &items[i]), &mut st)
                    };
                    failed |= r.is_err();
                    if let Ok(gpu) = r {
                        shared.counters.gpu_bytes_staged.fetch_add(gpu, Ordering::Relaxed);
                    }
                    let _ = to_writer.send((b, st, r));
                }
                if all_staged && !failed {
                    state.set_staged(t0);
                }
            });
            (|| -> Result<u64, Failure> {
                shared.wait_turn(ticket);
                turn = true;
                let mut tx = store.begin(name)?;
                let mut bytes = 0u64;
                for (i, it) in items.iter().enumerate() {
                    let data = match batch_of[i] {
                        Some(b) => {
                            while ready[b].is_none() {
                                let (k, st, r) = arrived.recv().map_err(|_| panicked("staging"))?;
                                ready[k] = Some(st);
                                r?;
                            }
                            let st = ready[b].as_ref().ok_or_else(|| panicked("staging"))?;
                            st.bytes(it.staged_at.unwrap_or(0), it.range.len)
                        }
                        // SAFETY: a host buffer the handle keeps alive until staged, which is
                        // set only after this loop for a save that writes from the caller's
                        // memory.
                        None => unsafe { host_bytes(it.range.addr, it.range.len) },
                    };
                    tx.put(&it.entry, &it.meta, data)?;
                    bytes += data.len() as u64;
                }
                state.set_staged(t0);
                let info = tx.commit()?;
                shared.counters.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                shared.counters.saves.fetch_add(1, Ordering::Relaxed);
                Ok(info.version)
            })()
        });
        // The stager has ended (the scope joined it): every staging is in `ready` or the
        // channel; all go back to the pool.
        for st in ready.into_iter().flatten() {
            shared.give_staging(st);
        }
        while let Ok((_, st, _)) = arrived.try_recv() {
            shared.give_staging(st);
        }
        written
    }))
    .unwrap_or_else(|_| Err(panicked("save")));
    if !turn {
        shared.wait_turn(ticket);
    }
    shared.end_turn(ticket);
    // The store's lock goes with its last handle: ours must be gone before `close` (which
    // waits for `finish`) lets go of the store.
    drop(store);
    state.finish(r, t0);
}

/// Turns Python `(entry, buffer, meta)` triples into held buffers and items.
pub(crate) fn collect_items(items: &Bound<'_, PyAny>) -> PyResult<(Vec<Buffer>, Vec<Item>)> {
    let mut holds = Vec::new();
    let mut out = Vec::new();
    for t in items.try_iter()? {
        let (entry, obj, meta): (String, Bound<'_, PyAny>, Vec<u8>) = t?.extract()?;
        let b = Buffer::new(&obj, false, &format!("entry {entry:?}"))?;
        out.push(Item {
            entry,
            meta,
            range: b.range(),
            staged_at: None,
        });
        holds.push(b);
    }
    Ok((holds, out))
}

/// A version being written: `put` entries, then `commit` (or `abort`). A context manager:
/// commits on success, aborts on an exception.
#[pyclass(module = "vfpoll._vfpoll", frozen)]
pub struct Writer {
    shared: Arc<Shared>,
    tx: Mutex<Option<CheckpointTx>>,
    bytes: AtomicU64,
}

impl Writer {
    /// A writer of `tx`.
    pub(crate) fn new(shared: Arc<Shared>, tx: CheckpointTx) -> Writer {
        Writer {
            shared,
            tx: Mutex::new(Some(tx)),
            bytes: AtomicU64::new(0),
        }
    }

    fn take(&self, py: Python<'_>) -> PyResult<CheckpointTx> {
        lock(&self.tx).take().ok_or_else(|| {
            Failure::new(Kind::Closed, "this version was already committed or aborted").to_py(py)
        })
    }
}

#[pymethods]
impl Writer {
    /// Writes entry `entry` from `buf` with metadata `meta`; when it returns, `buf` may change.
    #[pyo3(signature = (entry, buf, meta=None))]
    fn put(
        &self,
        py: Python<'_>,
        entry: String,
        buf: &Bound<'_, PyAny>,
        meta: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let b = Buffer::new(buf, false, &format!("entry {entry:?}"))?;
        let range = b.range();
        let meta = meta.unwrap_or_default();
        let shared = &self.shared;
        let txm = &self.tx;
        let r = py.detach(|| -> Result<(), Failure> {
            shared.store()?;
            let mut g = lock(txm);
            let tx = g
                .as_mut()
                .ok_or_else(|| Failure::new(Kind::Closed, "this version was already committed or aborted"))?;
            match range.place {
                Place::Host => {
                    // SAFETY: `b` holds the buffer until after this section.
                    let data = unsafe { host_bytes(range.addr, range.len) };
                    tx.put(&entry, &meta, data)?;
                }
                Place::Cuda(_) => {
                    let mut s = shared.take_staging(range.len)?;
                    let item = Item {
                        entry: entry.clone(),
                        meta: Vec::new(),
                        range,
                        staged_at: Some(0),
                    };
                    let r = stage(std::slice::from_ref(&item), &mut s).and_then(|_| {
                        tx.put(&entry, &meta, s.bytes(0, range.len))
                            .map_err(Failure::from)
                    });
                    shared.give_staging(s);
                    r?;
                }
            }
            Ok(())
        });
        drop(b);
        r.map_err(|e| e.to_py(py))?;
        self.bytes.fetch_add(range.len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Commits; returns the version id once it is durable.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        let tx = self.take(py)?;
        let shared = &self.shared;
        let r = py.detach(|| -> Result<u64, Failure> {
            shared.store()?;
            Ok(tx.commit()?.version)
        });
        let v = r.map_err(|e| e.to_py(py))?;
        let c = &self.shared.counters;
        c.bytes_written
            .fetch_add(self.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        c.saves.fetch_add(1, Ordering::Relaxed);
        Ok(v)
    }

    /// Commits on a thread of its own (every entry is staged already): a handle to wait on.
    fn commit_async(&self, py: Python<'_>) -> PyResult<SaveHandle> {
        let tx = self.take(py)?;
        let state = SaveState::new();
        let st = state.clone();
        let shared = self.shared.clone();
        let bytes = self.bytes.load(Ordering::Relaxed);
        let t0 = Instant::now();
        st.set_staged(t0);
        std::thread::Builder::new()
            .name("vfpoll-commit".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tx.commit()))
                    .unwrap_or_else(|_| Err(vfpoll_store::StoreError::Internal("the commit panicked".into())))
                    .map(|i| i.version)
                    .map_err(Failure::from);
                if r.is_ok() {
                    shared.counters.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                    shared.counters.saves.fetch_add(1, Ordering::Relaxed);
                }
                st.finish(r, t0);
            })
            .map_err(|e| {
                Failure::new(Kind::Store, format!("cannot start the commit thread: {e}")).to_py(py)
            })?;
        lock(&self.shared.saves).push(state.clone());
        Ok(SaveHandle::new(state, None))
    }

    /// Drops the version: nothing of it becomes visible, its space is given back.
    fn abort(&self, py: Python<'_>) {
        if let Some(tx) = lock(&self.tx).take() {
            py.detach(|| tx.abort());
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.abort(py);
        } else if lock(&self.tx).is_some() {
            self.commit(py)?;
        }
        Ok(false)
    }
}

/// An async save: `staged()` when the caller's memory may change again, `wait()` for the
/// version id once durable.
#[pyclass(module = "vfpoll._vfpoll", frozen)]
pub struct SaveHandle {
    state: Arc<SaveState>,
    /// The caller's buffers, held (and exported) until staged.
    holds: Mutex<Option<Vec<Buffer>>>,
}

impl SaveHandle {
    /// A handle on `state`, holding the caller's buffers until staged.
    pub(crate) fn new(state: Arc<SaveState>, holds: Option<Vec<Buffer>>) -> SaveHandle {
        SaveHandle {
            state,
            holds: Mutex::new(holds),
        }
    }

    fn release_if_staged(&self) {
        if lock(&self.state.m).staged {
            lock(&self.holds).take();
        }
    }
}

#[pymethods]
impl SaveHandle {
    /// Waits (at most `timeout` seconds; `None`: as long as it takes) until the arrays are
    /// staged; whether they are. A save that failed counts as staged (`wait` raises its error).
    #[pyo3(signature = (timeout=None))]
    fn staged(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let t = timeout_of(timeout)?;
        let state = &self.state;
        let ok = py.detach(|| state.wait_for(t, |p| p.staged));
        self.release_if_staged();
        Ok(ok)
    }

    /// Waits (at most `timeout` seconds) until the save is durable; returns the version id, or
    /// raises the save's error (`TimeoutError` when the time runs out first).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        let t = timeout_of(timeout)?;
        let state = &self.state;
        let ok = py.detach(|| state.wait_done(t));
        self.release_if_staged();
        if !ok {
            return Err(PyTimeoutError::new_err("the save is not durable yet"));
        }
        match lock(&self.state.m).done.as_ref() {
            Some(Ok(v)) => Ok(*v),
            Some(Err(f)) => Err(f.to_py(py)),
            None => Err(PyTimeoutError::new_err("the save is not durable yet")),
        }
    }

    /// Whether the save has finished (durable or failed).
    fn done(&self) -> bool {
        self.release_if_staged();
        lock(&self.state.m).done.is_some()
    }

    /// The version id once durable, else `None`.
    #[getter]
    fn version(&self) -> Option<u64> {
        match lock(&self.state.m).done {
            Some(Ok(v)) => Some(v),
            _ => None,
        }
    }

    /// `(seconds to staged, seconds to durable)` from the start, once known (else `None`s).
    #[getter]
    fn timings(&self) -> (Option<f64>, Option<f64>) {
        let p = lock(&self.state.m);
        (
            p.staged.then_some(p.staged_s),
            p.done.is_some().then_some(p.durable_s),
        )
    }

    fn __repr__(&self) -> String {
        let p = lock(&self.state.m);
        let what = match &p.done {
            Some(Ok(v)) => format!("durable, version {v}"),
            Some(Err(_)) => "failed".to_string(),
            None if p.staged => "staged".to_string(),
            None => "staging".to_string(),
        };
        format!("SaveHandle({what})")
    }
}

impl Drop for SaveHandle {
    fn drop(&mut self) {
        // The save thread reads the buffers until staged: they must not go before (it needs no
        // GIL for that, so waiting here cannot deadlock).
        if lock(&self.holds).is_some() {
            self.state.wait_for(None, |p| p.staged);
        }
    }
}
