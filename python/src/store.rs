//! The store's Python classes: `Store`, `Writer` (a version being written), `SaveHandle` (an
//! async save), `KvPool`, and the records `VersionInfo` and `EntryInfo`.
//!
//! Every call that touches a namespace or a GPU runs with the GIL released (`py.detach`); Rust
//! locks are taken only inside those sections, so a thread waiting for one never holds the GIL.
//!
//! Data paths: host buffers go to and from the store straight from their memory (the store
//! copies them into its DMA buffers). CUDA buffers go through staging memory (`cuda::Staging`), host memory
//! registered with CUDA, by the GPU's copy engine in the device's primary context. An async
//! save (`Store.save`) runs on a thread of its own: with `stage` (default) it first copies
//! every buffer into staging memory and reports *staged* (the caller's memory is free again),
//! then writes the entries and commits; without it, host buffers are written straight from the
//! caller's memory and *staged* comes after the last write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use vfpoll_store::{CheckpointTx, FormatOptions, ReadOptions, Store, StoreOptions};

use crate::buffer::{Buffer, Place, Range};
use crate::cuda::{Device, Staging};
use crate::errors::{py_err, Failure, Kind};
use crate::ffi::{host_bytes, host_bytes_mut};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Byte and operation counters of the binding since open.
#[derive(Default)]
struct Counters {
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    saves: AtomicU64,
    reads: AtomicU64,
    gpu_bytes_staged: AtomicU64,
}

/// What the Python objects of one open store share.
struct Shared {
    store: RwLock<Option<Store>>,
    pools: Mutex<HashMap<String, vfpoll_store::KvPool>>,
    saves: Mutex<Vec<Arc<SaveState>>>,
    staging: Mutex<Vec<Staging>>,
    counters: Counters,
    specs: Vec<String>,
    /// Async saves write and commit in the order they were started: a ticket per save, and the
    /// ticket now served.
    next_ticket: AtomicU64,
    serving: Mutex<u64>,
    turn: Condvar,
}

/// Staging buffers kept for reuse (their CUDA registration is the expensive part).
const KEEP_STAGING: usize = 2;

impl Shared {
    fn store(&self) -> Result<Store, Failure> {
        self.store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Failure::new(Kind::Closed, "the store is closed"))
    }

    fn take_staging(&self, len: usize) -> Result<Staging, Failure> {
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

    fn give_staging(&self, s: Staging) {
        let mut free = lock(&self.staging);
        free.push(s);
        if free.len() > KEEP_STAGING {
            free.sort_by_key(|s| std::cmp::Reverse(s.capacity()));
            free.truncate(KEEP_STAGING);
        }
    }

    /// Waits for the turn of save `ticket`.
    fn wait_turn(&self, ticket: u64) {
        let mut s = lock(&self.serving);
        while *s != ticket {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the turn of save `ticket`.
    fn end_turn(&self, ticket: u64) {
        let mut s = lock(&self.serving);
        *s = ticket + 1;
        self.turn.notify_all();
    }

    fn wait_saves(&self) {
        let saves: Vec<_> = lock(&self.saves).drain(..).collect();
        for s in saves {
            s.wait_done(None);
        }
    }
}

/// `(address, length, place)` and where in the staging memory it goes, for one entry.
struct Item {
    entry: String,
    meta: Vec<u8>,
    range: Range,
    /// Offset in the staging memory when the entry goes through it.
    staged_at: Option<usize>,
}

/// Copies `items`' bytes into `staging` (those with `staged_at`): host memory by the CPU, CUDA
/// memory by each device's copy engine.
fn stage(items: &[Item], staging: &mut Staging) -> Result<u64, Failure> {
    let mut gpu = 0u64;
    let mut devices: Vec<i32> = Vec::new();
    for it in items {
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
        for it in items {
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

/// Progress of an async save, shared by its thread and its handle.
struct SaveState {
    m: Mutex<Progress>,
    cv: Condvar,
}

#[derive(Default)]
struct Progress {
    staged: bool,
    done: Option<Result<u64, Failure>>,
    /// Seconds from the start to staged and to durable.
    staged_s: f64,
    durable_s: f64,
}

impl SaveState {
    fn new() -> Arc<SaveState> {
        Arc::new(SaveState {
            m: Mutex::new(Progress::default()),
            cv: Condvar::new(),
        })
    }

    fn set_staged(&self, t0: Instant) {
        let mut p = lock(&self.m);
        if !p.staged {
            p.staged = true;
            p.staged_s = t0.elapsed().as_secs_f64();
        }
        self.cv.notify_all();
    }

    fn finish(&self, r: Result<u64, Failure>, t0: Instant) {
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
    fn wait_for(&self, timeout: Option<Duration>, cond: impl Fn(&Progress) -> bool) -> bool {
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

    fn wait_done(&self, timeout: Option<Duration>) -> bool {
        self.wait_for(timeout, |p| p.done.is_some())
    }
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

/// The body of an async save's thread.
fn run_save(
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
    let r = (|| -> Result<u64, Failure> {
        let mut total = 0usize;
        for it in &mut items {
            if stage_host || matches!(it.range.place, Place::Cuda(_)) {
                it.staged_at = Some(total);
                total += it.range.len.next_multiple_of(64);
            }
        }
        let mut staging = if total > 0 {
            Some(shared.take_staging(total)?)
        } else {
            None
        };
        if let Some(s) = staging.as_mut() {
            let gpu = stage(&items, s)?;
            shared.counters.gpu_bytes_staged.fetch_add(gpu, Ordering::Relaxed);
        }
        if items.iter().all(|it| it.staged_at.is_some()) {
            state.set_staged(t0);
        }
        shared.wait_turn(ticket);
        turn = true;
        let mut tx = store.begin(name)?;
        let mut bytes = 0u64;
        for it in &items {
            let data = match (it.staged_at, staging.as_ref()) {
                (Some(at), Some(s)) => s.bytes(at, it.range.len),
                // SAFETY: a host buffer the handle keeps alive until staged, which is set only
                // after this loop for a save that writes from the caller's memory.
                _ => unsafe { host_bytes(it.range.addr, it.range.len) },
            };
            tx.put(&it.entry, &it.meta, data)?;
            bytes += data.len() as u64;
        }
        state.set_staged(t0);
        let info = tx.commit()?;
        shared.counters.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        shared.counters.saves.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = staging {
            shared.give_staging(s);
        }
        Ok(info.version)
    })();
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
fn collect_items(items: &Bound<'_, PyAny>) -> PyResult<(Vec<Buffer>, Vec<Item>)> {
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

/// A committed version: `id`, `committed` (Unix ns), `bytes`, `entries`.
#[pyclass(module = "vfpoll._vfpoll", frozen, get_all)]
#[derive(Clone)]
pub struct VersionInfo {
    /// Version id (store-wide unique, increasing).
    id: u64,
    /// Commit time, Unix nanoseconds.
    committed: u64,
    /// Bytes of data.
    bytes: u64,
    /// Entries.
    entries: u32,
}

#[pymethods]
impl VersionInfo {
    fn __repr__(&self) -> String {
        format!(
            "VersionInfo(id={}, committed={}, bytes={}, entries={})",
            self.id, self.committed, self.bytes, self.entries
        )
    }
}

/// One entry of a version: `name`, `size` (bytes), `meta` (the bytes given at save).
#[pyclass(module = "vfpoll._vfpoll", frozen)]
pub struct EntryInfo {
    name: String,
    size: u64,
    meta: Vec<u8>,
}

#[pymethods]
impl EntryInfo {
    /// Entry name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// Length in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }
    /// The metadata bytes given at save.
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.meta)
    }
    fn __repr__(&self) -> String {
        format!(
            "EntryInfo(name={:?}, size={}, meta=<{} bytes>)",
            self.name,
            self.size,
            self.meta.len()
        )
    }
}

/// An open store (see `vfpoll.Store`, the Python class around it).
#[pyclass(name = "Store", module = "vfpoll._vfpoll", frozen)]
pub struct PyStore {
    shared: Arc<Shared>,
}

fn store_options(
    lock_dir: Option<String>,
    allow_buffered_io: bool,
    queue_depth: Option<u32>,
) -> StoreOptions {
    let d = StoreOptions::default();
    StoreOptions {
        lock_dir: lock_dir.map(Into::into),
        allow_buffered_io,
        queue_depth: queue_depth.unwrap_or(d.queue_depth),
        ..d
    }
}

impl PyStore {
    fn new(store: Store, specs: Vec<String>) -> PyStore {
        PyStore {
            shared: Arc::new(Shared {
                store: RwLock::new(Some(store)),
                pools: Mutex::new(HashMap::new()),
                saves: Mutex::new(Vec::new()),
                staging: Mutex::new(Vec::new()),
                counters: Counters::default(),
                specs,
                next_ticket: AtomicU64::new(0),
                serving: Mutex::new(0),
                turn: Condvar::new(),
            }),
        }
    }

    /// Runs `f` on the store with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Store) -> Result<T, Failure> + Send,
    ) -> PyResult<T> {
        let shared = &self.shared;
        py.detach(|| {
            let s = shared.store()?;
            f(&s)
        })
        .map_err(|e| py_err(py, e))
    }
}

#[pymethods]
impl PyStore {
    /// Formats `specs` as a new store and opens it.
    #[staticmethod]
    #[pyo3(signature = (specs, *, chunk_size=None, label=None, force=false, size=None, lock_dir=None, allow_buffered_io=false, queue_depth=None))]
    #[allow(clippy::too_many_arguments)]
    fn format(
        py: Python<'_>,
        specs: Vec<String>,
        chunk_size: Option<u32>,
        label: Option<String>,
        force: bool,
        size: Option<u64>,
        lock_dir: Option<String>,
        allow_buffered_io: bool,
        queue_depth: Option<u32>,
    ) -> PyResult<PyStore> {
        let d = FormatOptions::default();
        let o = FormatOptions {
            chunk_size: chunk_size.unwrap_or(d.chunk_size),
            label: label.unwrap_or_default(),
            force,
            file_size: size,
            store: store_options(lock_dir, allow_buffered_io, queue_depth),
        };
        let s = py
            .detach(|| Store::format(&specs, &o))
            .map_err(|e| py_err(py, e))?;
        Ok(PyStore::new(s, specs))
    }

    /// Opens the store on `specs`.
    #[staticmethod]
    #[pyo3(signature = (specs, *, lock_dir=None, allow_buffered_io=false, queue_depth=None))]
    fn open(
        py: Python<'_>,
        specs: Vec<String>,
        lock_dir: Option<String>,
        allow_buffered_io: bool,
        queue_depth: Option<u32>,
    ) -> PyResult<PyStore> {
        let o = store_options(lock_dir, allow_buffered_io, queue_depth);
        let s = py.detach(|| Store::open(&specs, &o)).map_err(|e| py_err(py, e))?;
        Ok(PyStore::new(s, specs))
    }

    /// Waits for async saves in flight, then closes (idempotent).
    fn close(&self, py: Python<'_>) {
        let shared = &self.shared;
        py.detach(|| {
            shared.wait_saves();
            lock(&shared.pools).clear();
            shared.store.write().unwrap_or_else(|p| p.into_inner()).take();
            lock(&shared.staging).clear();
        });
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared
            .store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "Store({}{})",
            self.shared.specs.join(", "),
            if self.closed() { ", closed" } else { "" }
        )
    }

    /// Geometry and usage.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.with(py, |s| Ok(s.info()))?;
        let d = PyDict::new(py);
        d.set_item("uuid", &i.uuid)?;
        d.set_item("label", &i.label)?;
        d.set_item("format_version", i.format_version)?;
        d.set_item("members", i.members.len())?;
        let members: Vec<Bound<'py, PyDict>> = i
            .members
            .iter()
            .map(|m| {
                let md = PyDict::new(py);
                md.set_item("index", m.index)?;
                md.set_item("device", &m.device)?;
                md.set_item("capacity", m.capacity)?;
                md.set_item("block_size", m.block_size)?;
                md.set_item("volatile_write_cache", m.volatile_write_cache)?;
                Ok(md)
            })
            .collect::<PyResult<_>>()?;
        d.set_item("namespaces", members)?;
        d.set_item("chunk_size", i.chunk_size)?;
        d.set_item("capacity", i.capacity)?;
        d.set_item("free", i.free)?;
        d.set_item("used", i.capacity.saturating_sub(i.free))?;
        d.set_item("generation", i.generation)?;
        d.set_item("checkpoints", i.checkpoints)?;
        d.set_item("versions", i.versions)?;
        d.set_item("data_bytes", i.data_bytes)?;
        d.set_item("pools", i.pools)?;
        d.set_item("lock_file", &i.lock_file)?;
        Ok(d)
    }

    /// Counters since open, and per open KV pool its counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.closed() {
            return Err(Failure::new(Kind::Closed, "the store is closed").to_py(py));
        }
        let c = &self.shared.counters;
        let d = PyDict::new(py);
        d.set_item("bytes_written", c.bytes_written.load(Ordering::Relaxed))?;
        d.set_item("bytes_read", c.bytes_read.load(Ordering::Relaxed))?;
        d.set_item("saves", c.saves.load(Ordering::Relaxed))?;
        d.set_item("reads", c.reads.load(Ordering::Relaxed))?;
        d.set_item("gpu_bytes_staged", c.gpu_bytes_staged.load(Ordering::Relaxed))?;
        let pools = PyDict::new(py);
        for (name, p) in lock(&self.shared.pools).iter() {
            pools.set_item(name, kv_stats(py, &p.stats())?)?;
        }
        d.set_item("kv_pools", pools)?;
        Ok(d)
    }

    /// Checkpoint names, sorted.
    fn checkpoints(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.with(py, |s| {
            let mut v: Vec<String> = s.checkpoints().into_iter().map(|c| c.name).collect();
            v.sort();
            Ok(v)
        })
    }

    /// Committed versions of `name`, oldest first.
    fn versions(&self, py: Python<'_>, name: String) -> PyResult<Vec<VersionInfo>> {
        self.with(py, |s| {
            Ok(s.checkpoint(&name)?
                .versions
                .into_iter()
                .map(|v| VersionInfo {
                    id: v.id,
                    committed: v.committed,
                    bytes: v.bytes,
                    entries: v.entries,
                })
                .collect())
        })
    }

    /// Entries of a version (default: the newest).
    #[pyo3(signature = (name, version=None))]
    fn entries(&self, py: Python<'_>, name: String, version: Option<u64>) -> PyResult<Vec<EntryInfo>> {
        self.with(py, |s| {
            Ok(s.open_version(&name, version)?
                .entries()
                .into_iter()
                .map(|e| EntryInfo {
                    name: e.name,
                    size: e.len,
                    meta: e.meta,
                })
                .collect())
        })
    }

    /// The id of `version` of `name` (default: the newest), checked to exist.
    #[pyo3(signature = (name, version=None))]
    fn resolve_version(&self, py: Python<'_>, name: String, version: Option<u64>) -> PyResult<u64> {
        self.with(py, |s| Ok(s.open_version(&name, version)?.version()))
    }

    /// A new version of `name` to fill with `put` and `commit`.
    fn begin(&self, py: Python<'_>, name: String) -> PyResult<Writer> {
        let tx = self.with(py, |s| Ok(s.begin(&name)?))?;
        Ok(Writer {
            shared: self.shared.clone(),
            tx: Mutex::new(Some(tx)),
            bytes: AtomicU64::new(0),
        })
    }

    /// Saves `items`, `(entry, buffer, meta)` triples, as a new version of `name` on a thread
    /// of its own; see the module docs for `stage`.
    #[pyo3(signature = (name, items, *, stage=true))]
    fn save(
        &self,
        py: Python<'_>,
        name: String,
        items: &Bound<'_, PyAny>,
        stage: bool,
    ) -> PyResult<SaveHandle> {
        let (holds, items) = collect_items(items)?;
        let store = self.shared.store().map_err(|e| e.to_py(py))?;
        let state = SaveState::new();
        let shared = self.shared.clone();
        let st = state.clone();
        let ticket = self.shared.next_ticket.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("vfpoll-save".into())
            .spawn(move || run_save(&shared, store, &name, items, stage, &st, ticket));
        if let Err(e) = spawned {
            // Its turn must not block the saves after it.
            let shared = &self.shared;
            py.detach(|| {
                shared.wait_turn(ticket);
                shared.end_turn(ticket);
            });
            return Err(Failure::new(Kind::Store, format!("cannot start the save thread: {e}")).to_py(py));
        }
        let mut saves = lock(&self.shared.saves);
        saves.retain(|s| lock(&s.m).done.is_none());
        saves.push(state.clone());
        Ok(SaveHandle {
            state,
            holds: Mutex::new(Some(holds)),
        })
    }

    /// Reads whole entries of one version into buffers: `reads` is `(entry, buffer)` pairs,
    /// each buffer exactly the entry's size.
    #[pyo3(signature = (name, version, reads, verify=true))]
    fn read_many(
        &self,
        py: Python<'_>,
        name: String,
        version: Option<u64>,
        reads: &Bound<'_, PyAny>,
        verify: bool,
    ) -> PyResult<()> {
        let mut bufs = Vec::new();
        let mut wanted = Vec::new();
        for t in reads.try_iter()? {
            let (entry, obj): (String, Bound<'_, PyAny>) = t?.extract()?;
            let b = Buffer::new(&obj, true, &format!("buffer for entry {entry:?}"))?;
            wanted.push((entry, b.range()));
            bufs.push(b);
        }
        let shared = self.shared.clone();
        let r = py.detach(move || read_entries(&shared, &name, version, &wanted, None, verify));
        drop(bufs);
        r.map_err(|e| e.to_py(py))
    }

    /// Reads entry `entry` into `out`: all of it (`out` exactly its size) without `offset`,
    /// else `len(out)` bytes from `offset`.
    #[pyo3(signature = (name, entry, out, *, version=None, offset=None, verify=true))]
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        name: String,
        entry: String,
        out: &Bound<'_, PyAny>,
        version: Option<u64>,
        offset: Option<u64>,
        verify: bool,
    ) -> PyResult<()> {
        let b = Buffer::new(out, true, "out")?;
        let wanted = [(entry, b.range())];
        let shared = self.shared.clone();
        let r = py.detach(move || read_entries(&shared, &name, version, &wanted, offset, verify));
        drop(b);
        r.map_err(|e| e.to_py(py))
    }

    /// Deletes a version of `name`, or the whole checkpoint.
    #[pyo3(signature = (name, version=None))]
    fn delete(&self, py: Python<'_>, name: String, version: Option<u64>) -> PyResult<()> {
        self.with(py, |s| {
            match version {
                Some(v) => s.delete_version(&name, v)?,
                None => drop(s.delete_checkpoint(&name)?),
            }
            Ok(())
        })
    }

    /// Keeps the newest `n` versions of `name`; returns the ids deleted.
    fn keep_last(&self, py: Python<'_>, name: String, n: usize) -> PyResult<Vec<u64>> {
        self.with(py, |s| Ok(s.keep_last(&name, n)?))
    }

    /// KV pool `name`: opened, or created when `block_size` and `slots` are given and it does
    /// not exist.
    #[pyo3(signature = (name, *, block_size=None, slots=None))]
    fn kv_pool(
        &self,
        py: Python<'_>,
        name: String,
        block_size: Option<u32>,
        slots: Option<u64>,
    ) -> PyResult<KvPool> {
        let shared = self.shared.clone();
        let pool = py
            .detach(|| -> Result<vfpoll_store::KvPool, Failure> {
                let s = shared.store()?;
                if let Some(p) = lock(&shared.pools).get(&name) {
                    return Ok(p.clone());
                }
                let p = match s.pool(&name) {
                    Ok(p) => p,
                    Err(vfpoll_store::StoreError::NotFound(_)) if block_size.is_some() && slots.is_some() => {
                        s.create_pool(&name, block_size.unwrap_or(0), slots.unwrap_or(0))?
                    }
                    Err(vfpoll_store::StoreError::NotFound(what)) => {
                        return Err(Failure::new(
                            Kind::NotFound,
                            format!("{what} not found: give block_size and slots to create it"),
                        ))
                    }
                    Err(e) => return Err(e.into()),
                };
                lock(&shared.pools).insert(name.clone(), p.clone());
                Ok(p)
            })
            .map_err(|e| e.to_py(py))?;
        Ok(KvPool {
            shared: self.shared.clone(),
            name: pool.info().name,
            block_size: pool.block_size(),
        })
    }

    /// KV pool names.
    fn kv_pools(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.with(py, |s| Ok(s.pools().into_iter().map(|p| p.name).collect()))
    }

    /// Deletes KV pool `name`.
    fn delete_kv_pool(&self, py: Python<'_>, name: String) -> PyResult<()> {
        let shared = self.shared.clone();
        self.with(py, move |s| {
            lock(&shared.pools).remove(&name);
            Ok(s.delete_pool(&name)?)
        })
    }

    /// Checks everything, data crcs included: `{"clean": bool, "findings": [(object, detail)]}`.
    fn fsck<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.with(py, |s| Ok(s.fsck()?))?;
        let d = PyDict::new(py);
        d.set_item("clean", r.is_clean())?;
        let f: Vec<(String, String)> = r
            .findings
            .iter()
            .map(|f| (f.object.clone(), f.detail.clone()))
            .collect();
        d.set_item("findings", f)?;
        Ok(d)
    }
}

/// Reads `wanted` entries of one version (pinned for the whole batch). Host buffers are read
/// into straight; CUDA buffers through staging, two at a time so that the read of one overlaps
/// the copy of the other.
fn read_entries(
    shared: &Shared,
    name: &str,
    version: Option<u64>,
    wanted: &[(String, Range)],
    offset: Option<u64>,
    verify: bool,
) -> Result<(), Failure> {
    let store = shared.store()?;
    let reader = store.open_version(name, version)?;
    let o = ReadOptions { verify };
    let mut sizes = Vec::with_capacity(wanted.len());
    for (entry, r) in wanted {
        let e = reader.entry(entry)?;
        match offset {
            None if e.len != r.len as u64 => {
                return Err(Failure::new(
                    Kind::Spec,
                    format!(
                        "entry {entry:?} of checkpoint {name:?} version {} holds {} bytes; the buffer has {}",
                        reader.version(),
                        e.len,
                        r.len
                    ),
                ))
            }
            Some(off) if off.checked_add(r.len as u64).is_none_or(|end| end > e.len) => {
                return Err(Failure::new(
                    Kind::Spec,
                    format!(
                        "bytes {off}..+{} are outside entry {entry:?} ({} bytes)",
                        r.len, e.len
                    ),
                ))
            }
            _ => {}
        }
        sizes.push(e.len);
    }
    let off = offset.unwrap_or(0);
    let mut total = 0u64;
    let mut gpu: Vec<(usize, i32)> = Vec::new();
    for (i, (entry, r)) in wanted.iter().enumerate() {
        match r.place {
            Place::Host => {
                // SAFETY: the range is of a writable buffer the caller holds until this returns.
                let dst = unsafe { host_bytes_mut(r.addr, r.len) };
                reader.read_range(entry, off, dst, &o)?;
                total += r.len as u64;
            }
            Place::Cuda(d) => gpu.push((i, d)),
        }
    }
    if !gpu.is_empty() {
        let largest = gpu.iter().map(|&(i, _)| wanted[i].1.len).max().unwrap_or(0);
        let mut bufs = [shared.take_staging(largest)?, shared.take_staging(largest)?];
        let r = (|| -> Result<(), Failure> {
            for (n, &(i, d)) in gpu.iter().enumerate() {
                let (entry, r) = &wanted[i];
                if r.len == 0 {
                    continue;
                }
                let s = &mut bufs[n % 2];
                reader.read_range(entry, off, s.bytes_mut(0, r.len), &o)?;
                let dev = Device::open(d)?;
                let mut c = dev.copier(s)?;
                if let Some(st) = r.stream {
                    c.after(st)?;
                }
                c.h2d(0, r.addr as u64, r.len)?;
                c.finish()?;
                total += r.len as u64;
            }
            Ok(())
        })();
        for s in bufs {
            shared.give_staging(s);
        }
        r?;
    }
    shared.counters.bytes_read.fetch_add(total, Ordering::Relaxed);
    shared
        .counters
        .reads
        .fetch_add(wanted.len() as u64, Ordering::Relaxed);
    Ok(())
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
                let r = tx.commit().map(|i| i.version).map_err(Failure::from);
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
        Ok(SaveHandle {
            state,
            holds: Mutex::new(None),
        })
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

fn kv_stats<'py>(py: Python<'py>, s: &vfpoll_store::KvStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("puts", s.puts)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("bad_blocks", s.bad_blocks)?;
    d.set_item("deallocated", s.deallocated)?;
    Ok(d)
}

/// A key: an int in 0..2**128 or 16 bytes (little-endian).
fn key_of(k: &Bound<'_, PyAny>) -> PyResult<u128> {
    if let Ok(b) = k.cast::<PyBytes>() {
        let a: [u8; 16] = b.as_bytes().try_into().map_err(|_| {
            PyValueError::new_err(format!("a bytes key is 16 bytes, not {}", b.as_bytes().len()))
        })?;
        return Ok(u128::from_le_bytes(a));
    }
    k.extract::<u128>()
        .map_err(|_| PyValueError::new_err(format!("key {k} is not an int in 0..2**128 or 16 bytes")))
}

/// A KV block pool (fixed block size, 128-bit keys, LRU eviction).
#[pyclass(module = "vfpoll._vfpoll", frozen)]
pub struct KvPool {
    shared: Arc<Shared>,
    name: String,
    block_size: u32,
}

impl KvPool {
    fn pool(&self) -> Result<vfpoll_store::KvPool, Failure> {
        self.shared.store()?;
        lock(&self.shared.pools).get(&self.name).cloned().ok_or_else(|| {
            Failure::new(
                Kind::Closed,
                format!("KV pool {:?} was closed or deleted", self.name),
            )
        })
    }

    fn keys_and_bufs(
        &self,
        keys: &Bound<'_, PyAny>,
        bufs: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<(Vec<u128>, Vec<Buffer>)> {
        let keys: Vec<u128> = keys.try_iter()?.map(|k| key_of(&k?)).collect::<PyResult<_>>()?;
        let mut out = Vec::with_capacity(keys.len());
        for (i, b) in bufs.try_iter()?.enumerate() {
            let b = Buffer::new(&b?, writable, &format!("block {i}"))?;
            if !writable && (b.range().len == 0 || b.range().len > self.block_size as usize) {
                return Err(PyValueError::new_err(format!(
                    "block {i} has {} bytes: a block of pool {:?} is 1 to {} bytes",
                    b.range().len,
                    self.name,
                    self.block_size
                )));
            }
            out.push(b);
        }
        if keys.len() != out.len() {
            return Err(PyValueError::new_err(format!(
                "{} keys and {} buffers",
                keys.len(),
                out.len()
            )));
        }
        Ok((keys, out))
    }
}

#[pymethods]
impl KvPool {
    /// Stores `bufs[i]` under `keys[i]` in one submission burst (evicting the least recently
    /// used blocks when full). Not durable until `sync()`.
    fn put_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, bufs: &Bound<'_, PyAny>) -> PyResult<()> {
        let (keys, holds) = self.keys_and_bufs(keys, bufs, false)?;
        let ranges: Vec<Range> = holds.iter().map(Buffer::range).collect();
        let r = py.detach(|| -> Result<(), Failure> {
            let pool = self.pool()?;
            let gpu_len: usize = ranges
                .iter()
                .filter(|r| r.place != Place::Host)
                .map(|r| r.len.next_multiple_of(64))
                .sum();
            let mut staging = if gpu_len > 0 {
                Some(self.shared.take_staging(gpu_len)?)
            } else {
                None
            };
            let mut items = Vec::new();
            let mut at = 0;
            for r in &ranges {
                let staged_at = (r.place != Place::Host).then(|| {
                    let a = at;
                    at += r.len.next_multiple_of(64);
                    a
                });
                items.push(Item {
                    entry: String::new(),
                    meta: Vec::new(),
                    range: *r,
                    staged_at,
                });
            }
            if let Some(s) = staging.as_mut() {
                stage(&items, s)?;
            }
            let slices: Vec<&[u8]> = items
                .iter()
                .map(|it| match (it.staged_at, staging.as_ref()) {
                    (Some(a), Some(s)) => s.bytes(a, it.range.len),
                    // SAFETY: `holds` keeps the buffers until this section ends.
                    _ => unsafe { host_bytes(it.range.addr, it.range.len) },
                })
                .collect();
            let r = pool.put_many(&keys, &slices);
            drop(slices);
            if let Some(s) = staging {
                self.shared.give_staging(s);
            }
            Ok(r?)
        });
        drop(holds);
        r.map_err(|e| e.to_py(py))
    }

    /// Reads the blocks of `keys` into `bufs` (each at least a block long) in one burst; per
    /// key the block's length for a hit, `None` for a miss (a block failing its crc is a miss).
    fn get_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        bufs: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let (keys, holds) = self.keys_and_bufs(keys, bufs, true)?;
        let ranges: Vec<Range> = holds.iter().map(Buffer::range).collect();
        let r = py.detach(|| -> Result<Vec<Option<usize>>, Failure> {
            let pool = self.pool()?;
            let gpu: Vec<usize> = (0..ranges.len())
                .filter(|&i| ranges[i].place != Place::Host)
                .collect();
            let per = self.block_size as usize;
            let mut staging = if gpu.is_empty() {
                None
            } else {
                Some(self.shared.take_staging(per * gpu.len())?)
            };
            let hits = {
                let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
                let mut chunks = staging
                    .as_mut()
                    .map(|s| s.bytes_mut(0, per * gpu.len()).chunks_mut(per));
                for r in &ranges {
                    if r.place == Place::Host {
                        // SAFETY: `holds` keeps the writable buffers until this section ends;
                        // keeping the buffers of one call apart is the caller's part.
                        dsts.push(unsafe { host_bytes_mut(r.addr, r.len) });
                    } else {
                        let c: &mut [u8] = chunks.as_mut().and_then(|c| c.next()).unwrap_or_default();
                        let n = r.len.min(c.len());
                        dsts.push(&mut c[..n]);
                    }
                }
                pool.get_many(&keys, &mut dsts)?
            };
            if let Some(s) = staging.as_mut() {
                let mut groups: HashMap<i32, Vec<(usize, usize)>> = HashMap::new();
                for (n, &i) in gpu.iter().enumerate() {
                    if let (Some(len), Place::Cuda(d)) = (hits[i], ranges[i].place) {
                        groups.entry(d).or_default().push((n, len.min(ranges[i].len)));
                    }
                }
                for (d, list) in groups {
                    let dev = Device::open(d)?;
                    let mut c = dev.copier(s)?;
                    for (n, len) in list {
                        if let Some(st) = ranges[gpu[n]].stream {
                            c.after(st)?;
                        }
                        c.h2d(n * per, ranges[gpu[n]].addr as u64, len)?;
                    }
                    c.finish()?;
                }
            }
            if let Some(s) = staging {
                self.shared.give_staging(s);
            }
            Ok(hits)
        });
        drop(holds);
        r.map_err(|e| e.to_py(py))
    }

    /// Whether `key` is held.
    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = key_of(key)?;
        self.pool().map(|p| p.contains(k)).map_err(|e| e.to_py(py))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.contains(py, key)
    }

    /// Removes `keys`; returns how many were held.
    fn remove_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys: Vec<u128> = keys.try_iter()?.map(|k| key_of(&k?)).collect::<PyResult<_>>()?;
        py.detach(|| -> Result<usize, Failure> { Ok(self.pool()?.remove_many(&keys)?) })
            .map_err(|e| e.to_py(py))
    }

    /// Makes every put so far durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| -> Result<(), Failure> { Ok(self.pool()?.sync()?) })
            .map_err(|e| e.to_py(py))
    }

    /// Hits, misses, evictions, puts, bad blocks and deallocations since opened here.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.pool().map_err(|e| e.to_py(py))?;
        kv_stats(py, &p.stats())
    }

    /// Block size in bytes.
    #[getter]
    fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Slots.
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<u64> {
        self.pool().map(|p| p.info().slots).map_err(|e| e.to_py(py))
    }

    /// The pool's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.pool().map(|p| p.len() as usize).map_err(|e| e.to_py(py))
    }

    fn __repr__(&self) -> String {
        format!("KvPool({:?}, block_size={})", self.name, self.block_size)
    }
}
