//! Checkpoints: named versions of many named tensors or buffers, committed all or nothing, and
//! read back by name (whole or a byte range) with every extent's crc32c checked.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::background::{Window, Writer};
use crate::error::{Result, StoreError};
use crate::format::{
    copy_crc, crc32c, encode_blob, BlobKind, CheckpointRec, Entry, Extent, Manifest, VersionRec,
    MAX_ENTRY_NAME, MAX_META, MAX_NAME, PAGE,
};
use crate::io::Job;
use crate::store::{now_ns, Change, Store};

mod peer;

/// A committed version of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// Version id (store-wide unique, increasing with every commit).
    pub id: u64,
    /// Commit time, Unix nanoseconds.
    pub committed: u64,
    /// Bytes of data.
    pub bytes: u64,
    /// Entries.
    pub entries: u32,
}

/// A checkpoint and its committed versions, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Name.
    pub name: String,
    /// Versions, oldest first.
    pub versions: Vec<VersionInfo>,
}

/// One entry of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Name.
    pub name: String,
    /// Length in bytes.
    pub len: u64,
    /// The caller's opaque bytes (dtype, shape).
    pub meta: Vec<u8>,
}

/// What a commit made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// Checkpoint name.
    pub checkpoint: String,
    /// The new version's id.
    pub version: u64,
    /// Entries.
    pub entries: u32,
    /// Bytes of data.
    pub bytes: u64,
    /// The root generation that made it durable.
    pub generation: u64,
    /// Versions deleted by `keep_last` in the same commit.
    pub deleted: Vec<u64>,
}

/// How a read checks what it reads.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Check every extent's crc32c (on by default). A range read then reads the whole extents
    /// at its ends (at most one chunk each) to check them.
    pub verify: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { verify: true }
    }
}

fn version_info(v: &VersionRec) -> VersionInfo {
    VersionInfo {
        id: v.id,
        committed: v.committed,
        bytes: v.bytes,
        entries: v.entries,
    }
}

fn check_name(what: &str, name: &str, max: usize) -> Result<()> {
    if name.is_empty() || name.len() > max {
        return Err(StoreError::Invalid(format!(
            "{what} {name:?}: names are 1 to {max} bytes"
        )));
    }
    Ok(())
}

impl Store {
    /// The checkpoints, with their committed versions.
    pub fn checkpoints(&self) -> Vec<CheckpointInfo> {
        let m = self.meta();
        m.catalog
            .checkpoints
            .iter()
            .map(|c| CheckpointInfo {
                name: c.name.clone(),
                versions: c.versions.iter().map(version_info).collect(),
            })
            .collect()
    }

    /// One checkpoint.
    pub fn checkpoint(&self, name: &str) -> Result<CheckpointInfo> {
        self.checkpoints()
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| StoreError::NotFound(format!("checkpoint {name:?}")))
    }

    /// Begins a new version of checkpoint `name` (created by its first commit). Nothing is
    /// visible to readers until [`CheckpointTx::commit`]; dropping the transaction aborts it.
    ///
    /// ```
    /// # use vfpoll_store::{device::MemDevice, FormatOptions, Store, ReadOptions};
    /// # fn main() -> Result<(), vfpoll_store::StoreError> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let mut opts = FormatOptions::default();
    /// # opts.store.lock_dir = Some(dir.path().into());
    /// let store = Store::format(&["mem:64M"], &opts)?;
    /// let weights: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    /// let mut tx = store.begin("model")?;
    /// tx.put("layer0.weight", b"f32[250,100]", &weights)?;
    /// tx.put("step", b"", &7u64.to_le_bytes())?;
    /// let c = tx.commit()?;
    ///
    /// let r = store.open_version("model", None)?; // the latest; pinned while `r` lives
    /// assert_eq!(r.version(), c.version);
    /// assert_eq!(r.read_to_vec("layer0.weight")?, weights);
    /// let mut part = [0u8; 10];
    /// r.read_range("layer0.weight", 1000, &mut part, &ReadOptions::default())?;
    /// assert_eq!(&part[..], &weights[1000..1010]);
    /// # Ok(()) }
    /// ```
    pub fn begin(&self, name: &str) -> Result<CheckpointTx> {
        check_name("checkpoint", name, MAX_NAME)?;
        Ok(CheckpointTx {
            store: self.clone(),
            name: name.to_string(),
            entries: Vec::new(),
            names: HashSet::new(),
            allocated: Vec::new(),
            keep_last: None,
            done: false,
            bg: None,
        })
    }

    /// Opens version `version` of checkpoint `name` (`None`: the latest) for reading. The
    /// version is pinned while the reader lives: deleting it (or `keep_last`) takes it out of
    /// the catalog, but its space is reused only after the last reader is gone.
    pub fn open_version(&self, name: &str, version: Option<u64>) -> Result<VersionReader> {
        let mut m = self.meta();
        let c = m
            .catalog
            .checkpoints
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| StoreError::NotFound(format!("checkpoint {name:?}")))?;
        let v = match version {
            None => c.versions.last(),
            Some(id) => c.versions.iter().find(|v| v.id == id),
        }
        .ok_or_else(|| match version {
            Some(id) => StoreError::NotFound(format!("checkpoint {name:?} version {id}")),
            None => StoreError::NotFound(format!("a committed version of checkpoint {name:?}")),
        })?;
        let info = version_info(v);
        let manifest = m
            .manifests
            .get(&v.id)
            .cloned()
            .ok_or_else(|| StoreError::Internal(format!("no manifest loaded for version {}", v.id)))?;
        *m.pins.entry(info.id).or_insert(0) += 1;
        Ok(VersionReader {
            store: self.clone(),
            checkpoint: name.to_string(),
            info,
            manifest,
        })
    }

    /// Deletes version `version` of checkpoint `name` (the checkpoint goes when its last
    /// version does). Committed like a checkpoint.
    pub fn delete_version(&self, name: &str, version: u64) -> Result<()> {
        self.delete_where(name, |v, _| v.id == version, true).map(drop)
    }

    /// Deletes checkpoint `name` and all its versions.
    pub fn delete_checkpoint(&self, name: &str) -> Result<Vec<u64>> {
        self.delete_where(name, |_, _| true, true)
    }

    /// Keeps the newest `n` versions of checkpoint `name` and deletes the others; returns the
    /// ids deleted.
    pub fn keep_last(&self, name: &str, n: usize) -> Result<Vec<u64>> {
        self.delete_where(name, |_, from_end| from_end >= n, false)
    }

    fn delete_where(
        &self,
        name: &str,
        doomed: impl Fn(&VersionRec, usize) -> bool,
        must: bool,
    ) -> Result<Vec<u64>> {
        self.commit_catalog(|meta, cat| {
            let Some(ci) = cat.checkpoints.iter().position(|c| c.name == name) else {
                return Err(StoreError::NotFound(format!("checkpoint {name:?}")));
            };
            let frees = remove_versions(meta, &mut cat.checkpoints[ci], &doomed);
            if must && frees.is_empty() {
                return Err(StoreError::NotFound(format!(
                    "the version of checkpoint {name:?}"
                )));
            }
            if cat.checkpoints[ci].versions.is_empty() {
                cat.checkpoints.remove(ci);
            }
            let ids: Vec<u64> = frees.iter().map(|(id, _)| *id).collect();
            let pages = frees
                .into_iter()
                .flat_map(|(id, p)| p.into_iter().map(move |(a, n)| (a, n, Some(id))))
                .collect();
            Ok(Change {
                out: ids,
                writes: Vec::new(),
                taken: Vec::new(),
                frees: pages,
            })
        })
    }
}

/// Takes the versions `doomed(version, position from the newest)` selects out of `c`; returns
/// their ids and pages (manifest and extents), and forgets their manifests.
fn remove_versions(
    meta: &mut crate::store::Meta,
    c: &mut CheckpointRec,
    doomed: &dyn Fn(&VersionRec, usize) -> bool,
) -> Vec<(u64, Vec<(u64, u64)>)> {
    let n = c.versions.len();
    let mut out = Vec::new();
    let mut keep = Vec::with_capacity(n);
    for (i, v) in c.versions.drain(..).enumerate() {
        if doomed(&v, n - 1 - i) {
            let mut pages = vec![(v.manifest.page, v.manifest.pages())];
            if let Some(m) = meta.manifests.get(&v.id) {
                for e in &m.entries {
                    pages.extend(e.extents.iter().map(|x| (x.page, x.pages())));
                }
            }
            out.push((v.id, pages));
        } else {
            keep.push(v);
        }
    }
    c.versions = keep;
    out
}

/// A version being written; see [`Store::begin`].
pub struct CheckpointTx {
    store: Store,
    name: String,
    entries: Vec<Entry>,
    names: HashSet<String>,
    /// Pages taken for this version's data (given back on abort).
    allocated: Vec<(u64, u64)>,
    keep_last: Option<usize>,
    done: bool,
    /// The background writer, once [`CheckpointTx::background`] started it.
    bg: Option<Writer>,
}

impl std::fmt::Debug for CheckpointTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointTx")
            .field("name", &self.name)
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl CheckpointTx {
    /// Writes entry `name` with the caller's `meta` bytes (dtype, shape: opaque to the store)
    /// and `data`. When it returns the data is on the devices (not yet durable) and `data` may
    /// be reused: the *staged* point for this entry.
    pub fn put(&mut self, name: &str, meta: &[u8], data: &[u8]) -> Result<()> {
        self.put_inner(name, meta, data.len() as u64, Some(data), |_, _| Ok(()))
    }

    /// Writes entry `name` of `len` bytes whose contents `fill(offset, dst)` provides, window
    /// by window (up to `window` bytes, in order): for data that is not in one host slice
    /// (device memory staged through host slots, a stream). When it returns every window was
    /// filled and written.
    pub(crate) fn put_with(
        &mut self,
        name: &str,
        meta: &[u8],
        len: u64,
        fill: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.put_inner(name, meta, len, None, fill)
    }

    /// [`CheckpointTx::put`] from `direct` (written straight from it), or [`put_with`]'s
    /// `fill` through a window buffer.
    fn put_inner(
        &mut self,
        name: &str,
        meta: &[u8],
        len: u64,
        direct: Option<&[u8]>,
        mut fill: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let runs = self.take_pages(name, meta, len)?;
        let mut window = self.window();
        if let Some(w) = &self.bg {
            window = window.min(w.budget()).max(PAGE as u64);
        }
        let mut extents = Vec::with_capacity(runs.len());
        let mut buf: Vec<u8> = Vec::new();
        let bg = self.bg.as_ref();
        let written = (|| {
            let mut off = 0u64;
            let mut i = 0;
            while i < runs.len() {
                // A window of whole runs.
                let mut j = i;
                let mut bytes = 0u64;
                while j < runs.len() && (j == i || bytes + runs[j].1 * PAGE as u64 <= window) {
                    bytes += (runs[j].1 * PAGE as u64).min(len - off - bytes);
                    j += 1;
                }
                if let Some(w) = bg {
                    // Staged: copy the window into host memory, hand it to the writer.
                    let mut data = w.take_buffer(bytes as usize)?;
                    // Host data is copied and checksummed in one pass (copy_crc); filled data
                    // is checksummed after its fill.
                    let src = direct.map(|d| &d[off as usize..(off + bytes) as usize]);
                    if src.is_none() {
                        if let Err(e) = fill(off, &mut data) {
                            w.untake(data);
                            return Err(e);
                        }
                    }
                    let mut pieces = Vec::with_capacity(j - i);
                    let mut at = 0usize;
                    for &(page, n) in &runs[i..j] {
                        let l = (bytes as usize - at).min(n as usize * PAGE);
                        let crc = match src {
                            Some(src) => copy_crc(&mut data[at..at + l], &src[at..at + l]),
                            None => crc32c(&data[at..at + l]),
                        };
                        extents.push(Extent {
                            page,
                            len: l as u32,
                            crc,
                        });
                        pieces.push((page, at, l));
                        at += l;
                    }
                    w.send(Window { data, pieces })?;
                    off += bytes;
                    i = j;
                    continue;
                }
                let data: &[u8] = match direct {
                    Some(d) => &d[off as usize..(off + bytes) as usize],
                    None => {
                        buf.resize(bytes as usize, 0);
                        fill(off, &mut buf)?;
                        &buf
                    }
                };
                // Each extent's crc32c is computed by the engine, next to its copy into an
                // I/O buffer (on a copy thread, while other extents are on the devices).
                let mut jobs = Vec::with_capacity(j - i);
                let mut at = 0usize;
                for &(page, n) in &runs[i..j] {
                    let l = (bytes as usize - at).min(n as usize * PAGE);
                    jobs.push(Job::Write {
                        page,
                        data: &data[at..at + l],
                    });
                    at += l;
                }
                let crcs = self.store.io().run_crc(&mut jobs)?;
                for (job, crc) in jobs.iter().zip(crcs) {
                    if let Job::Write { page, data } = job {
                        extents.push(Extent {
                            page: *page,
                            len: data.len() as u32,
                            crc,
                        });
                    }
                }
                off += bytes;
                i = j;
            }
            Ok(())
        })();
        if let Err(e) = written {
            // Nothing may still be writing into these pages when they are given back.
            if let Some(w) = &self.bg {
                if let Err(first) = w.drain() {
                    log::debug!("background write: {first}");
                }
            }
            self.give_back(&runs);
            return Err(e);
        }
        self.add_entry(name, meta, len, &runs, extents);
        Ok(())
    }

    /// Checks a new entry's name and meta, and takes pages for `len` bytes (runs within chunks).
    fn take_pages(&self, name: &str, meta: &[u8], len: u64) -> Result<Vec<(u64, u64)>> {
        check_name("entry", name, MAX_ENTRY_NAME)?;
        if meta.len() > MAX_META {
            return Err(StoreError::Invalid(format!(
                "entry {name:?}: {} bytes of meta, at most {MAX_META}",
                meta.len()
            )));
        }
        if self.names.contains(name) {
            return Err(StoreError::Exists(format!("entry {name:?} in this version")));
        }
        let pages = len.div_ceil(PAGE as u64);
        if pages == 0 {
            return Ok(Vec::new());
        }
        let mut m = self.store.meta();
        if let Some(p) = &m.poisoned {
            return Err(StoreError::Poisoned(p.clone()));
        }
        let cp = self.store.chunk_pages();
        m.alloc.alloc_runs(pages, cp).ok_or_else(|| StoreError::Full {
            needed: len,
            free: m.alloc.free_pages() * PAGE as u64,
        })
    }

    /// Gives back the pages of a put that failed (nothing may still write into them).
    fn give_back(&self, runs: &[(u64, u64)]) {
        let mut m = self.store.meta();
        runs.iter().for_each(|&(p, n)| m.alloc.free(p, n));
    }

    /// Records a written entry on `runs`.
    fn add_entry(&mut self, name: &str, meta: &[u8], len: u64, runs: &[(u64, u64)], extents: Vec<Extent>) {
        self.allocated.extend_from_slice(runs);
        self.names.insert(name.to_string());
        self.entries.push(Entry {
            name: name.to_string(),
            meta: meta.to_vec(),
            len,
            extents,
        });
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Bytes a put hands to the engine at once: every namespace's I/O buffers full.
    pub(crate) fn window(&self) -> u64 {
        (self.store.options().io_buffers.max(2) as u64
            * self.store.chunk_pages()
            * PAGE as u64
            * self.store.inner.members.len() as u64)
            .max(PAGE as u64)
    }

    pub(crate) fn has_background(&self) -> bool {
        self.bg.is_some()
    }

    /// Waits for the background writer and stops it; its first error, if any.
    pub(crate) fn end_background(&mut self) -> Result<()> {
        match self.bg.take() {
            Some(w) => w.drain(),
            None => Ok(()),
        }
    }

    /// Takes the last entry out again (its writes failed after its put was queued), giving its
    /// pages back; only once no writer runs.
    pub(crate) fn forget_last_entry(&mut self) {
        debug_assert!(self.bg.is_none());
        let Some(e) = self.entries.pop() else { return };
        self.names.remove(&e.name);
        let mut m = self.store.meta();
        for x in &e.extents {
            m.alloc.free(x.page, x.pages());
            if let Some(i) = self
                .allocated
                .iter()
                .rposition(|&(p, n)| p == x.page && n == x.pages())
            {
                self.allocated.remove(i);
            }
        }
    }

    /// From now on, puts return as soon as their data is copied into host staging memory (at
    /// most `staging_bytes` of it; a put waits for writes when it is full), and a background
    /// thread writes it to the namespaces: the caller's memory (host or GPU) is reusable
    /// earlier, while the devices are still busy. [`CheckpointTx::commit`] waits for the
    /// writes. A write error comes back from a later put or from the commit.
    pub fn background(&mut self, staging_bytes: u64) -> Result<&mut Self> {
        if self.bg.is_some() {
            return Err(StoreError::Invalid(
                "the background writer is already running".into(),
            ));
        }
        if staging_bytes < PAGE as u64 {
            return Err(StoreError::Invalid(format!(
                "{staging_bytes} bytes of staging: at least {PAGE}"
            )));
        }
        self.bg = Some(Writer::start(self.store.clone(), staging_bytes)?);
        Ok(self)
    }

    /// Waits until every put so far is written to the namespaces (not yet committed); the
    /// first background write error, if one happened. Puts without [`CheckpointTx::background`]
    /// are written when they return.
    pub fn wait_written(&self) -> Result<()> {
        self.bg.as_ref().map_or(Ok(()), Writer::drain)
    }

    /// Deletes all but the newest `n` versions (this one counted) in the same commit.
    pub fn keep_last(&mut self, n: usize) -> &mut Self {
        self.keep_last = Some(n.max(1));
        self
    }

    /// Entries put so far.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Commits: the manifest and the catalog are written, every namespace with a write cache
    /// flushed, and the root written with FUA. When it returns the version is durable and
    /// visible; on an error nothing of it is (and the store holds what it held before).
    pub fn commit(mut self) -> Result<CommitInfo> {
        let r = self.commit_inner();
        self.done = r.is_ok();
        r
    }

    /// [`CheckpointTx::commit`] on a background thread. Every entry is staged already (each
    /// `put` returned once the caller's memory was free again: written, or copied into host
    /// staging with [`CheckpointTx::background`]), so [`SaveHandle::wait_staged`] returns at
    /// once; [`SaveHandle::wait_durable`] waits for the remaining writes and the commit.
    pub fn commit_async(self) -> SaveHandle {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("vfpoll-store-commit".into())
            .spawn(move || {
                let r = self.commit();
                let _ = tx.send(());
                r
            });
        match thread {
            Ok(t) => SaveHandle {
                thread: Some(t),
                durable: rx,
                result: None,
            },
            Err(e) => SaveHandle {
                thread: None,
                durable: rx,
                result: Some(Err(StoreError::Internal(format!(
                    "cannot start the commit thread: {e}"
                )))),
            },
        }
    }

    /// Drops the version: its space is given back, nothing was ever visible.
    pub fn abort(self) {}

    fn commit_inner(&mut self) -> Result<CommitInfo> {
        self.wait_written()?;
        let name = self.name.clone();
        let entries = std::mem::take(&mut self.entries);
        let keep_last = self.keep_last;
        let r = self.store.commit_catalog(|meta, cat| {
            let id = meta.root.next_id.max(1);
            meta.root.next_id = id + 1;
            let manifest = Manifest {
                id,
                checkpoint: name.clone(),
                entries,
            };
            let (blob, len, crc) =
                encode_blob(BlobKind::Manifest, id, &manifest.encode()).map_err(StoreError::Invalid)?;
            let pages = blob.len() as u64 / PAGE as u64;
            let page = meta
                .alloc
                .alloc_contiguous(pages)
                .ok_or_else(|| StoreError::Full {
                    needed: blob.len() as u64,
                    free: meta.alloc.free_pages() * PAGE as u64,
                })?;
            let bytes: u64 = manifest.entries.iter().map(|e| e.len).sum();
            let rec = VersionRec {
                id,
                committed: now_ns(),
                bytes,
                entries: manifest.entries.len() as u32,
                manifest: crate::format::BlobLoc { page, len, crc },
            };
            let ci = match cat.checkpoints.iter().position(|c| c.name == name) {
                Some(i) => i,
                None => {
                    cat.checkpoints.push(CheckpointRec {
                        name: name.clone(),
                        versions: Vec::new(),
                    });
                    cat.checkpoints.len() - 1
                }
            };
            cat.checkpoints[ci].versions.push(rec);
            let mut deleted = Vec::new();
            let mut frees = Vec::new();
            if let Some(n) = keep_last {
                for (vid, pages) in
                    remove_versions(meta, &mut cat.checkpoints[ci], &|_, from_end| from_end >= n)
                {
                    deleted.push(vid);
                    frees.extend(pages.into_iter().map(|(a, n)| (a, n, Some(vid))));
                }
            }
            meta.manifests.insert(id, Arc::new(manifest.clone()));
            let info = CommitInfo {
                checkpoint: name.clone(),
                version: id,
                entries: rec.entries,
                bytes,
                generation: meta.root.generation + 1,
                deleted,
            };
            Ok(Change {
                out: info,
                writes: vec![(page, blob)],
                taken: vec![(page, pages)],
                frees,
            })
        });
        match r {
            Ok(info) => {
                self.allocated.clear();
                Ok(info)
            }
            Err(e) => {
                // Nothing committed: forget a manifest registered for it.
                let mut m = self.store.meta();
                let live: HashSet<u64> = m
                    .catalog
                    .checkpoints
                    .iter()
                    .flat_map(|c| c.versions.iter().map(|v| v.id))
                    .collect();
                let stale: Vec<u64> = m
                    .manifests
                    .keys()
                    .copied()
                    .filter(|id| !live.contains(id) && !m.pins.contains_key(id))
                    .collect();
                for id in stale {
                    m.manifests.remove(&id);
                }
                Err(e)
            }
        }
    }
}

impl Drop for CheckpointTx {
    fn drop(&mut self) {
        // Stop the writer first: no write may land in pages given back.
        if let Some(w) = self.bg.take() {
            let _ = w.drain();
            drop(w);
        }
        if !self.done && !self.allocated.is_empty() {
            let mut m = self.store.meta();
            for &(p, n) in &self.allocated {
                m.alloc.free(p, n);
            }
        }
    }
}

/// An asynchronous commit ([`CheckpointTx::commit_async`]).
#[derive(Debug)]
pub struct SaveHandle {
    thread: Option<JoinHandle<Result<CommitInfo>>>,
    durable: mpsc::Receiver<()>,
    result: Option<Result<CommitInfo>>,
}

impl SaveHandle {
    /// Returns once the caller's memory may be reused (every entry staged).
    pub fn wait_staged(&self) -> Result<()> {
        Ok(())
    }

    /// Whether the commit has finished (durable or failed).
    pub fn is_done(&self) -> bool {
        self.result.is_some()
            || self.durable.try_recv().is_ok()
            || self.thread.as_ref().is_some_and(|t| t.is_finished())
    }

    /// Waits until the version is durable and visible, or the commit failed.
    pub fn wait_durable(mut self) -> Result<CommitInfo> {
        if let Some(r) = self.result.take() {
            return r;
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(StoreError::Internal("the commit thread panicked".into())),
            None => Err(StoreError::Internal("no commit thread".into())),
        }
    }
}

/// A committed version open for reading; pins it (see [`Store::open_version`]).
pub struct VersionReader {
    store: Store,
    checkpoint: String,
    info: VersionInfo,
    manifest: Arc<Manifest>,
}

impl std::fmt::Debug for VersionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionReader")
            .field("checkpoint", &self.checkpoint)
            .field("version", &self.info.id)
            .finish()
    }
}

impl VersionReader {
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The version's id.
    pub fn version(&self) -> u64 {
        self.info.id
    }

    /// The version.
    pub fn info(&self) -> &VersionInfo {
        &self.info
    }

    /// The checkpoint's name.
    pub fn checkpoint(&self) -> &str {
        &self.checkpoint
    }

    /// The entries, in the order they were put.
    pub fn entries(&self) -> Vec<EntryInfo> {
        self.manifest
            .entries
            .iter()
            .map(|e| EntryInfo {
                name: e.name.clone(),
                len: e.len,
                meta: e.meta.clone(),
            })
            .collect()
    }

    fn find(&self, name: &str) -> Result<&Entry> {
        self.manifest
            .entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                StoreError::NotFound(format!(
                    "entry {name:?} in checkpoint {:?} version {}",
                    self.checkpoint, self.info.id
                ))
            })
    }

    /// One entry.
    pub fn entry(&self, name: &str) -> Result<EntryInfo> {
        let e = self.find(name)?;
        Ok(EntryInfo {
            name: e.name.clone(),
            len: e.len,
            meta: e.meta.clone(),
        })
    }

    /// Reads all of entry `name` into a new vector, checking crcs.
    pub fn read_to_vec(&self, name: &str) -> Result<Vec<u8>> {
        let e = self.find(name)?;
        let mut v = vec![0u8; e.len as usize];
        self.read_range(name, 0, &mut v, &ReadOptions::default())?;
        Ok(v)
    }

    /// Reads all of entry `name` into `dst` (exactly its length), checking crcs.
    pub fn read(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let e = self.find(name)?;
        if dst.len() as u64 != e.len {
            return Err(StoreError::Invalid(format!(
                "entry {name:?} holds {} bytes; the buffer has {}",
                e.len,
                dst.len()
            )));
        }
        self.read_range(name, 0, dst, &ReadOptions::default())
    }

    /// Reads `dst.len()` bytes of entry `name` from byte `offset`. With `o.verify` every
    /// extent touched is read whole and its crc32c checked; a mismatch is an error naming the
    /// entry and the extent, and `dst` must then not be used.
    pub fn read_range(&self, name: &str, offset: u64, dst: &mut [u8], o: &ReadOptions) -> Result<()> {
        let e = self.find(name)?;
        let end = offset.checked_add(dst.len() as u64);
        if end.is_none_or(|end| end > e.len) {
            return Err(StoreError::Invalid(format!(
                "bytes {offset}..+{} are outside entry {name:?} ({} bytes)",
                dst.len(),
                e.len
            )));
        }
        if dst.is_empty() {
            return Ok(());
        }
        let end = offset + dst.len() as u64;
        // The plan: per extent touched, read straight into `dst` (whole extent inside the
        // range) or into a scratch buffer (an end of the range).
        struct Part {
            ext: Extent,
            ext_start: u64,
            scratch: Option<usize>,
            /// Pages to skip and bytes to read when not verifying a partial extent.
            skip_pages: u64,
            read_len: usize,
        }
        let mut parts = Vec::new();
        let mut scratch: Vec<Vec<u8>> = Vec::new();
        for (x, xs) in e.extents_in(offset, end) {
            let xe = xs + x.len as u64;
            if xs >= offset && xe <= end {
                parts.push(Part {
                    ext: *x,
                    ext_start: xs,
                    scratch: None,
                    skip_pages: 0,
                    read_len: x.len as usize,
                });
            } else if o.verify {
                scratch.push(vec![0u8; x.len as usize]);
                parts.push(Part {
                    ext: *x,
                    ext_start: xs,
                    scratch: Some(scratch.len() - 1),
                    skip_pages: 0,
                    read_len: x.len as usize,
                });
            } else {
                let from = offset.max(xs) - xs;
                let to = end.min(xe) - xs;
                let skip = from / PAGE as u64;
                let len = (to - skip * PAGE as u64) as usize;
                scratch.push(vec![0u8; len]);
                parts.push(Part {
                    ext: *x,
                    ext_start: xs,
                    scratch: Some(scratch.len() - 1),
                    skip_pages: skip,
                    read_len: len,
                });
            }
        }
        let mut crcs: Vec<u32> = Vec::new();
        {
            let mut jobs: Vec<Job<'_>> = Vec::with_capacity(parts.len());
            let mut rest: &mut [u8] = dst;
            let mut rest_at = offset;
            let mut scratch_iter = scratch.iter_mut();
            for p in &parts {
                match p.scratch {
                    None => {
                        let skip = (p.ext_start - rest_at) as usize;
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
                        let (mine, tail) = tail.split_at_mut(p.ext.len as usize);
                        rest = tail;
                        rest_at = p.ext_start + p.ext.len as u64;
                        jobs.push(Job::Read {
                            page: p.ext.page,
                            dst: mine,
                        });
                    }
                    Some(_) => {
                        let s = scratch_iter.next().expect("one scratch per partial part");
                        jobs.push(Job::Read {
                            page: p.ext.page + p.skip_pages,
                            dst: &mut s[..p.read_len],
                        });
                    }
                }
            }
            // With verify, each extent's crc32c is computed by the engine next to its copy out
            // of an I/O buffer (on a copy thread, while other extents are still being read).
            let mut io = self.store.io();
            if o.verify {
                crcs = io.run_crc(&mut jobs)?;
            } else {
                io.run(&mut jobs)?;
            }
        }
        // Check, and copy the partial extents' bytes into place.
        for (p, &got) in parts.iter().zip(crcs.iter().chain(std::iter::repeat(&0))) {
            let (xs, xe) = (p.ext_start, p.ext_start + p.ext.len as u64);
            let object = || {
                format!(
                    "checkpoint {:?} version {} entry {name:?}",
                    self.checkpoint, self.info.id
                )
            };
            if o.verify && got != p.ext.crc {
                return Err(StoreError::Checksum {
                    object: object(),
                    page: p.ext.page,
                    stored: p.ext.crc,
                    computed: got,
                });
            }
            match p.scratch {
                None => {}
                Some(i) => {
                    let s = &scratch[i];
                    let base = xs + p.skip_pages * PAGE as u64;
                    let from = offset.max(xs);
                    let to = end.min(xe);
                    let src = &s[(from - base) as usize..(to - base) as usize];
                    let at = (from - offset) as usize;
                    dst[at..at + src.len()].copy_from_slice(src);
                }
            }
        }
        Ok(())
    }
}

impl Drop for VersionReader {
    fn drop(&mut self) {
        let mut m = self.store.meta();
        let id = self.info.id;
        let left = match m.pins.get_mut(&id) {
            Some(c) => {
                *c -= 1;
                *c
            }
            None => 0,
        };
        if left == 0 {
            m.pins.remove(&id);
            if let Some(pages) = m.zombies.remove(&id) {
                for (p, n) in pages {
                    m.alloc.free(p, n);
                }
                m.manifests.remove(&id);
            }
        }
    }
}
