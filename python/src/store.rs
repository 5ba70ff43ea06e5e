//! The class `Store` and the records `VersionInfo` and `EntryInfo`; saving is in
//! [`crate::save`] (`Writer`, `SaveHandle`), KV pools in [`crate::kv`].
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use vfpoll_store::{
    Backend, EvictionPolicy, FormatOptions, ReadOptions, Store, StoreError, StoreOptions, VersionReader,
};

use crate::buffer::{Buffer, Place, Range};
use crate::cuda::{Device, Staging};
use crate::errors::{py_err, Failure, Kind};
use crate::ffi::host_bytes_mut;
use crate::kv::{kv_stats, KvPool};
use crate::save::{collect_items, run_save, SaveHandle, Writer};
use crate::shared::{lock, Counters, SaveState, Shared, READ_THREADS};

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

/// The keyword arguments of `Store.format` and `Store.open` that make the store's options.
struct OpenArgs<'a> {
    lock_dir: Option<String>,
    allow_buffered_io: bool,
    queue_depth: Option<u32>,
    io_buffers: Option<usize>,
    iommu: &'a str,
    io_channels: Option<usize>,
    copy_threads: Option<usize>,
    poll_spin_us: Option<u64>,
    kv_eviction: Option<&'a str>,
}

fn store_options(py: Python<'_>, a: OpenArgs<'_>) -> PyResult<StoreOptions> {
    let d = StoreOptions::default();
    let invalid = |msg: String| py_err(py, StoreError::Invalid(msg));
    let iommu = a.iommu.parse::<Backend>().map_err(|_| {
        invalid(format!(
            "iommu={:?}: use one of {}",
            a.iommu,
            Backend::NAMES.join(", ")
        ))
    })?;
    let kv_eviction = match a.kv_eviction {
        None => d.kv_eviction,
        Some(p) => p.parse::<EvictionPolicy>().map_err(|_| {
            invalid(format!(
                "kv_eviction={p:?}: use one of {}",
                EvictionPolicy::NAMES.join(", ")
            ))
        })?,
    };
    Ok(StoreOptions {
        lock_dir: a.lock_dir.map(Into::into),
        allow_buffered_io: a.allow_buffered_io,
        queue_depth: a.queue_depth.unwrap_or(d.queue_depth),
        io_buffers: a.io_buffers.unwrap_or(d.io_buffers).max(1),
        iommu,
        io_channels: a.io_channels.unwrap_or(d.io_channels),
        copy_threads: a.copy_threads.unwrap_or(d.copy_threads),
        poll_spin: a
            .poll_spin_us
            .map_or(d.poll_spin, std::time::Duration::from_micros),
        kv_eviction,
        ..d
    })
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
    #[pyo3(signature = (specs, *, chunk_size=None, label=None, force=false, size=None, lock_dir=None, allow_buffered_io=false, queue_depth=None, io_buffers=None, iommu="auto", io_channels=None, copy_threads=None, poll_spin_us=None, kv_eviction=None))]
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
        io_buffers: Option<usize>,
        iommu: &str,
        io_channels: Option<usize>,
        copy_threads: Option<usize>,
        poll_spin_us: Option<u64>,
        kv_eviction: Option<&str>,
    ) -> PyResult<PyStore> {
        let d = FormatOptions::default();
        let args = OpenArgs {
            lock_dir,
            allow_buffered_io,
            queue_depth,
            io_buffers,
            iommu,
            io_channels,
            copy_threads,
            poll_spin_us,
            kv_eviction,
        };
        let o = FormatOptions {
            chunk_size: chunk_size.unwrap_or(d.chunk_size),
            label: label.unwrap_or_default(),
            force,
            file_size: size,
            store: store_options(py, args)?,
        };
        let s = py
            .detach(|| Store::format(&specs, &o))
            .map_err(|e| py_err(py, e))?;
        Ok(PyStore::new(s, specs))
    }

    /// Opens the store on `specs`.
    #[staticmethod]
    #[pyo3(signature = (specs, *, lock_dir=None, allow_buffered_io=false, queue_depth=None, io_buffers=None, iommu="auto", io_channels=None, copy_threads=None, poll_spin_us=None, kv_eviction=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        specs: Vec<String>,
        lock_dir: Option<String>,
        allow_buffered_io: bool,
        queue_depth: Option<u32>,
        io_buffers: Option<usize>,
        iommu: &str,
        io_channels: Option<usize>,
        copy_threads: Option<usize>,
        poll_spin_us: Option<u64>,
        kv_eviction: Option<&str>,
    ) -> PyResult<PyStore> {
        let args = OpenArgs {
            lock_dir,
            allow_buffered_io,
            queue_depth,
            io_buffers,
            iommu,
            io_channels,
            copy_threads,
            poll_spin_us,
            kv_eviction,
        };
        let o = store_options(py, args)?;
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
        d.set_item("io_channels", i.io_channels)?;
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
        Ok(Writer::new(self.shared.clone(), tx))
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
        saves.retain(|s| !s.is_done());
        saves.push(state.clone());
        Ok(SaveHandle::new(state, Some(holds)))
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
        Ok(KvPool::new(
            self.shared.clone(),
            pool.info().name,
            pool.block_size(),
        ))
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
    // Entries are read by a few threads at once, each taking the next entry: one entry's reads
    // (and crc checks) alone leave the device's queue half empty at entry boundaries and on
    // small entries; CUDA entries go through a staging buffer per thread (read, then copied to
    // the device while the other threads read).
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let threads = wanted.len().clamp(1, READ_THREADS);
    let results: Vec<Result<u64, Failure>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let r = read_worker(shared, &reader, wanted, off, &o, &next, &failed);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(Failure::new(
                        Kind::Store,
                        "internal error: a read thread panicked (a bug: please report it)",
                    ))
                })
            })
            .collect()
    });
    let mut total = 0u64;
    for r in results {
        total += r?;
    }
    shared.counters.bytes_read.fetch_add(total, Ordering::Relaxed);
    shared
        .counters
        .reads
        .fetch_add(wanted.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// One thread of [`read_entries`]: reads entries (taking the next index from `next`) until none
/// is left or another thread failed; returns the bytes it read.
fn read_worker(
    shared: &Shared,
    reader: &VersionReader,
    wanted: &[(String, Range)],
    off: u64,
    o: &ReadOptions,
    next: &AtomicUsize,
    failed: &AtomicBool,
) -> Result<u64, Failure> {
    let mut staging: Option<Staging> = None;
    let r = (|| -> Result<u64, Failure> {
        let mut total = 0u64;
        loop {
            if failed.load(Ordering::Relaxed) {
                return Ok(total);
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((entry, r)) = wanted.get(i) else {
                return Ok(total);
            };
            match r.place {
                Place::Host => {
                    // SAFETY: the range is of a writable buffer the caller holds until
                    // `read_entries` returns, and no other thread reads into it (each index is
                    // taken once).
                    let dst = unsafe { host_bytes_mut(r.addr, r.len) };
                    reader.read_range(entry, off, dst, o)?;
                }
                Place::Cuda(d) => {
                    if r.len > 0 {
                        if staging.as_ref().is_none_or(|s| s.capacity() < r.len) {
                            if let Some(s) = staging.take() {
                                shared.give_staging(s);
                            }
                            // Sized for the largest CUDA entry, so that one buffer (registered
                            // with CUDA once) serves the thread.
                            let largest = wanted
                                .iter()
                                .filter(|(_, r)| matches!(r.place, Place::Cuda(_)))
                                .map(|(_, r)| r.len)
                                .max()
                                .unwrap_or(r.len);
                            staging = Some(shared.take_staging(largest.max(r.len))?);
                        }
                        let s = staging
                            .as_mut()
                            .ok_or_else(|| Failure::new(Kind::Store, "no staging"))?;
                        reader.read_range(entry, off, s.bytes_mut(0, r.len), o)?;
                        let dev = Device::open(d)?;
                        let mut c = dev.copier(s)?;
                        if let Some(st) = r.stream {
                            c.after(st)?;
                        }
                        c.h2d(0, r.addr as u64, r.len)?;
                        c.finish()?;
                    }
                }
            }
            total += r.len as u64;
        }
    })();
    if let Some(s) = staging {
        shared.give_staging(s);
    }
    r
}
