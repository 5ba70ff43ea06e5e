//! KV block pools (FORMAT.md §6): fixed-size blocks under 128-bit keys, for KV-cache offload.
//!
//! A pool keeps its whole slot header table in memory (64 bytes per slot, read in one burst
//! when the pool is first opened in a process: the index is rebuilt from headers alone, never
//! from the data). `put_many` writes the blocks and their header pages in one submission burst
//! (a batch of 1 MiB or more: the blocks, then the headers; see Locking);
//! `get_many` reads the hits in one burst and checks each block's crc32c, which binds the data
//! to its key and generation: a torn, stale or overwritten block fails it and is a miss, never
//! a hit. A put that finds the pool full evicts blocks in the order of the store's
//! [`EvictionPolicy`] ([`StoreOptions::kv_eviction`](crate::StoreOptions::kv_eviction): LRU
//! by default, or S3-FIFO), a batch of 1/64 of the pool (at least 8 blocks) at a time so the
//! next puts find free slots, and deallocates the ones it does not reuse at once. The order
//! lives in memory only: at open it starts cold, the blocks queued by generation (oldest put
//! first), with no hits and (S3-FIFO) an empty ghost queue. Which policy serves which workload
//! is measured by `examples/kv_policy.rs` (docs/store.md, Eviction).
//!
//! ## Locking
//!
//! The index (slots, keys, LRU, the in-memory header table) is behind a mutex held only for
//! bookkeeping, never across I/O, so gets look up and account while puts of other threads
//! are on the device. A put runs in three steps:
//! 1. **reserve** (index lock): take its slots out of the free list or by eviction, and the
//!    slots of the keys it replaces out of the index; number the blocks (generations);
//! 2. **write** (no index lock): the blocks, then the header pages. A big batch is written
//!    first and its crc32c computed by the engine's copy threads as they copy each block
//!    (`StoreOptions::copy_threads`, as checkpoint saves do), the header pages follow in a
//!    second burst; a small one computes its crcs on the calling thread and writes blocks and
//!    headers in one burst. Header pages hold 64 slots, so two puts' copies of one page must
//!    reach the device in the order they were taken: the puts (and removes) of a pool hold its
//!    write-order lock from their header snapshot to their publish, and take the snapshot
//!    under it. Gets never take it;
//! 3. **publish** (index lock): the keys point at their new slots; slots evicted or replaced
//!    and not reused are deallocated, and only then freed, so no other put can write a slot
//!    that is about to be trimmed.
//!
//! Reserved slots are neither free, indexed nor in the eviction order, so no one else reads,
//! evicts or reuses them. A get that looked a key up before a put evicted or replaced its slot
//! may read that slot while the put writes it, or while it is deallocated: the store has
//! several I/O channels (`StoreOptions::io_channels`), so the get's burst and the put's are on
//! the device at the same time, and the get reads the old block, the new one, zeroes, or a
//! mix of them sector by sector. The engine computes the crc32c over exactly the bytes it
//! copies into the caller's buffer, continued from the key and generation the get looked up,
//! and the get compares it with the crc it looked up before it reports a hit: anything but
//! the old block whole fails (the new block's crc is bound to another key or generation), so
//! it is a miss, never wrong bytes (up to crc32c's 2^-32 chance of a collision), and not a
//! bad block (the slot no longer holds that key and generation). The order of header page
//! writes comes from the write-order lock, not from the engine. Two puts of one key from two
//! threads: the later reservation (higher generation) wins whatever order they finish in, as
//! it would at the next open.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::{Result, StoreError};
use crate::format::{
    crc32c_append, slot_crc_seed, slot_data_crc, PoolRec, SlotHeader, MAX_BLOCK, MAX_NAME, PAGE, SLOT_HEADER,
};
use crate::io::{copies_help, Job};
pub use crate::kv_index::{EvictionPolicy, Evictor, KvStats};
use crate::kv_index::{PoolShared, PoolState, Slot};
use crate::store::{now_ns, Change, Finding, Store};

/// A pool's definition and fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Name.
    pub name: String,
    /// Pool id.
    pub id: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Slots.
    pub slots: u64,
    /// Occupied slots (known only for pools open in this process).
    pub used: Option<u64>,
}

/// A put's slots between its reservation and its publish.
struct Reserved {
    /// The slot and generation of each block.
    slots: Vec<u64>,
    gens: Vec<u64>,
    /// Slots taken out of the index by this put (replaced or evicted) and not reused: their
    /// zeroed headers are written with the put's, then they are deallocated and freed.
    spare: Vec<u64>,
    /// Every slot whose header this put zeroed (`spare` and the ones it reused).
    taken: Vec<u64>,
}

/// A handle on a KV pool (`Send + Sync`, cheap to clone); see the module docs.
///
/// ```
/// # use vfpoll_store::{FormatOptions, Store};
/// # fn main() -> Result<(), vfpoll_store::StoreError> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let mut opts = FormatOptions::default();
/// # opts.store.lock_dir = Some(dir.path().into());
/// let store = Store::format(&["mem:64M"], &opts)?;
/// let pool = store.create_pool("kv", 64 << 10, 128)?;
/// let (a, b) = (vec![1u8; 65536], vec![2u8; 1000]);
/// pool.put_many(&[7, 8], &[&a, &b])?;
/// let mut out = vec![vec![0u8; 65536]; 3];
/// let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
/// let hits = pool.get_many(&[8, 9, 7], &mut bufs)?;
/// assert_eq!(hits, vec![Some(1000), None, Some(65536)]);
/// assert_eq!(&out[2], &a);
/// assert_eq!(pool.stats().misses, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KvPool {
    store: Store,
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool")
            .field("name", &self.shared.rec.name)
            .finish()
    }
}

fn header_page_bytes(rec: &PoolRec) -> usize {
    rec.header_pages() as usize * PAGE
}

/// Reads a pool's header table and builds its index (FORMAT.md §6).
fn load(store: &Store, rec: &PoolRec) -> Result<PoolState> {
    let mut headers = vec![0u8; header_page_bytes(rec)];
    store.io().run(&mut [Job::Read {
        page: rec.header_page,
        dst: &mut headers,
    }])?;
    let mut slots: Vec<Option<Slot>> = vec![None; rec.slots as usize];
    let mut index: HashMap<u128, u64> = HashMap::new();
    let mut max_gen = 0;
    for i in 0..rec.slots {
        let at = i as usize * SLOT_HEADER;
        let Some(h) = SlotHeader::decode(&headers[at..at + SLOT_HEADER], rec.id, rec.block_size) else {
            continue;
        };
        max_gen = max_gen.max(h.generation);
        let s = Slot {
            key: h.key,
            generation: h.generation,
            len: h.len,
            crc: h.crc,
        };
        match index.get(&h.key).copied() {
            Some(j) if slots[j as usize].is_some_and(|o| o.generation >= h.generation) => continue,
            Some(j) => slots[j as usize] = None,
            None => {}
        }
        index.insert(h.key, i);
        slots[i as usize] = Some(s);
    }
    // The eviction order starts cold at open: the blocks by generation (older puts first).
    let mut by_gen: Vec<(u64, u64, u128)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (s.generation, i as u64, s.key)))
        .collect();
    by_gen.sort_unstable();
    let mut evictor = Evictor::new(store.inner.opts.kv_eviction, rec.slots);
    for &(_, i, key) in &by_gen {
        evictor.restore(i, key);
    }
    let free: Vec<u64> = (0..rec.slots)
        .rev()
        .filter(|&i| slots[i as usize].is_none())
        .collect();
    // Zero the stale headers in memory so rewriting a page never revives them.
    for (i, s) in slots.iter().enumerate() {
        if s.is_none() {
            headers[i * SLOT_HEADER..(i + 1) * SLOT_HEADER].fill(0);
        }
    }
    Ok(PoolState {
        headers,
        slots,
        index,
        free,
        evictor,
        next_gen: max_gen + 1,
        stats: KvStats::default(),
    })
}

impl Store {
    /// Creates KV pool `name` of `slots` blocks of `block_size` bytes (a multiple of 4096),
    /// committed like a checkpoint, and opens it.
    pub fn create_pool(&self, name: &str, block_size: u32, slots: u64) -> Result<KvPool> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(StoreError::Invalid(format!(
                "pool {name:?}: names are 1 to {MAX_NAME} bytes"
            )));
        }
        if block_size == 0 || !(block_size as usize).is_multiple_of(PAGE) || block_size > MAX_BLOCK {
            return Err(StoreError::Invalid(format!(
                "block size {block_size}: must be a multiple of 4096 up to 64 MiB"
            )));
        }
        if slots == 0 || slots > 1 << 32 {
            return Err(StoreError::Invalid(format!("{slots} slots: must be 1 to 2^32")));
        }
        self.commit_catalog(|meta, cat| {
            if cat.pools.iter().any(|p| p.name == name) {
                return Err(StoreError::Exists(format!("KV pool {name:?}")));
            }
            let id = meta.root.next_id.max(1);
            let mut rec = PoolRec {
                name: name.to_string(),
                id,
                block_size,
                slots,
                header_page: 0,
                data_page: 0,
                created: now_ns(),
            };
            let full = |meta: &crate::store::Meta, need: u64| StoreError::Full {
                needed: need * PAGE as u64,
                free: meta.alloc.free_pages() * PAGE as u64,
            };
            let hp = rec.header_pages();
            rec.header_page = meta
                .alloc
                .alloc_contiguous(hp)
                .ok_or_else(|| full(meta, hp + rec.data_pages()))?;
            let Some(dp) = meta.alloc.alloc_contiguous(rec.data_pages()) else {
                meta.alloc.free(rec.header_page, hp);
                return Err(full(meta, hp + rec.data_pages()));
            };
            rec.data_page = dp;
            meta.root.next_id = id + 1;
            cat.pools.push(rec.clone());
            // The data region is given back to the device now, while no one else knows it (a
            // deallocate after the commit could trim the first puts of another thread on
            // another I/O channel); the header table is zeroed before the catalog naming the
            // pool is durable.
            self.io().deallocate(rec.data_page, rec.data_pages());
            let zeros = vec![0u8; header_page_bytes(&rec)];
            Ok(Change {
                writes: vec![(rec.header_page, zeros)],
                taken: vec![(rec.header_page, hp), (rec.data_page, rec.data_pages())],
                frees: Vec::new(),
                out: rec,
            })
        })
        .and_then(|rec| self.pool(&rec.name))
    }

    /// Opens KV pool `name` (the first open in a process reads its header table).
    pub fn pool(&self, name: &str) -> Result<KvPool> {
        let rec = {
            let m = self.meta();
            m.catalog
                .pools
                .iter()
                .find(|p| p.name == name)
                .cloned()
                .ok_or_else(|| StoreError::NotFound(format!("KV pool {name:?}")))?
        };
        if let Some(s) = self.meta().pools.get(&rec.id) {
            return Ok(KvPool {
                store: self.clone(),
                shared: s.clone(),
            });
        }
        let state = load(self, &rec)?;
        let mut m = self.meta();
        let shared = m
            .pools
            .entry(rec.id)
            .or_insert_with(|| Arc::new(PoolShared::new(rec, state)))
            .clone();
        Ok(KvPool {
            store: self.clone(),
            shared,
        })
    }

    /// The KV pools.
    pub fn pools(&self) -> Vec<PoolInfo> {
        let m = self.meta();
        m.catalog
            .pools
            .iter()
            .map(|p| PoolInfo {
                name: p.name.clone(),
                id: p.id,
                block_size: p.block_size,
                slots: p.slots,
                used: m.pools.get(&p.id).map(|s| s.lock().index.len() as u64),
            })
            .collect()
    }

    /// Deletes KV pool `name` and deallocates its space; refused while a handle on it lives.
    pub fn delete_pool(&self, name: &str) -> Result<()> {
        let rec = self.commit_catalog(|meta, cat| {
            let i = cat
                .pools
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| StoreError::NotFound(format!("KV pool {name:?}")))?;
            let rec = cat.pools.remove(i);
            if meta.pools.get(&rec.id).is_some_and(|s| Arc::strong_count(s) > 1) {
                return Err(StoreError::Invalid(format!(
                    "KV pool {name:?} is open: drop its handles first"
                )));
            }
            meta.pools.remove(&rec.id);
            // The pages stay allocated until they are deallocated below: freed first, they
            // could be reused and written by another thread, on another I/O channel, before
            // the deallocate trims them.
            Ok(Change {
                out: rec,
                writes: Vec::new(),
                taken: Vec::new(),
                frees: Vec::new(),
            })
        })?;
        let mut io = self.io();
        io.deallocate(rec.header_page, rec.header_pages());
        io.deallocate(rec.data_page, rec.data_pages());
        drop(io);
        let mut meta = self.meta();
        meta.alloc.free(rec.header_page, rec.header_pages());
        meta.alloc.free(rec.data_page, rec.data_pages());
        Ok(())
    }
}

impl KvPool {
    /// The pool.
    pub fn info(&self) -> PoolInfo {
        let r = &self.shared.rec;
        PoolInfo {
            name: r.name.clone(),
            id: r.id,
            block_size: r.block_size,
            slots: r.slots,
            used: Some(self.len()),
        }
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.shared.rec.block_size
    }

    /// Occupied slots.
    pub fn len(&self) -> u64 {
        self.shared.lock().index.len() as u64
    }

    /// Whether no block is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is held (its block may still fail its crc when read).
    pub fn contains(&self, key: u128) -> bool {
        self.shared.lock().index.contains_key(&key)
    }

    /// Counters since the pool was opened in this process.
    pub fn stats(&self) -> KvStats {
        self.shared.lock().stats
    }

    /// Stores `bufs[i]` (1 to block size bytes) under `keys[i]`, replacing an older block of
    /// the same key, evicting blocks when the pool is full (module docs); all blocks and
    /// their headers in one submission burst (a batch of at least 4 blocks and 1 MiB, with
    /// copy threads: the blocks, their crc32c computed by the copy threads, then the headers).
    /// Other threads' gets go on meanwhile; puts of one pool reach the device one at a time
    /// (module docs, Locking). Not durable until [`KvPool::sync`] (a cache: a
    /// put lost to a power cut is a miss afterwards, never wrong bytes).
    pub fn put_many(&self, keys: &[u128], bufs: &[&[u8]]) -> Result<()> {
        let rec = &self.shared.rec;
        if keys.len() != bufs.len() {
            return Err(StoreError::Invalid(format!(
                "{} keys and {} buffers",
                keys.len(),
                bufs.len()
            )));
        }
        if keys.len() as u64 > rec.slots {
            return Err(StoreError::Invalid(format!(
                "{} blocks in one put; the pool has {} slots",
                keys.len(),
                rec.slots
            )));
        }
        let mut seen = HashSet::with_capacity(keys.len());
        for (k, b) in keys.iter().zip(bufs) {
            if b.is_empty() || b.len() > rec.block_size as usize {
                return Err(StoreError::Invalid(format!(
                    "key {k:#x}: {} bytes; a block holds 1 to {}",
                    b.len(),
                    rec.block_size
                )));
            }
            if !seen.insert(*k) {
                return Err(StoreError::Invalid(format!(
                    "key {k:#x} appears twice in one put"
                )));
            }
        }
        let r = self.reserve(keys)?;
        let _order = self.shared.write_order();
        let written = self.write_reserved(&r, keys, bufs);
        self.settle(r, keys, bufs, written)
    }

    /// Step 1 of a put (module docs, Locking): slots and generations for `keys`, under the
    /// index lock.
    fn reserve(&self, keys: &[u128]) -> Result<Reserved> {
        let rec = &self.shared.rec;
        let mut st = self.shared.lock();
        let mut spare: Vec<u64> = Vec::new();
        for k in keys {
            if let Some(&old) = st.index.get(k) {
                st.take(old);
                spare.push(old);
            }
        }
        let mut taken = spare.clone();
        let batch_evict = st.evictor.batch();
        let mut slots: Vec<u64> = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            if spare.is_empty() && st.free.is_empty() {
                let want = batch_evict.max((keys.len() - i) as u64);
                for _ in 0..want {
                    let Some(v) = st.evictor.evict() else { break };
                    st.take(v);
                    st.stats.evictions += 1;
                    spare.push(v);
                    taken.push(v);
                }
            }
            // Replaced and evicted slots first: reused at once, they need no deallocate.
            match spare.pop().or_else(|| st.free.pop()) {
                Some(slot) => slots.push(slot),
                None => {
                    st.free.extend(slots.iter().chain(&spare));
                    return Err(StoreError::Invalid(format!(
                        "KV pool {:?}: all its {} slots are held by puts in flight; put fewer blocks at a time",
                        rec.name, rec.slots
                    )));
                }
            }
        }
        let gens: Vec<u64> = (0..keys.len() as u64).map(|i| st.next_gen + i).collect();
        st.next_gen += keys.len() as u64;
        Ok(Reserved {
            slots,
            gens,
            spare,
            taken,
        })
    }

    /// Step 2 of a put, under the pool's write-order lock: the blocks and the header pages.
    /// Returns each block's crc32c, or `None` for a block not written because a newer put of
    /// its key (a later reservation) published first.
    fn write_reserved(&self, r: &Reserved, keys: &[u128], bufs: &[&[u8]]) -> Result<Vec<Option<u32>>> {
        let rec = &self.shared.rec;
        let bp = rec.block_pages();
        let seeds: Vec<u32> = keys
            .iter()
            .zip(&r.gens)
            .map(|(k, g)| slot_crc_seed(*k, *g))
            .collect();
        let data_jobs = |live: &[Option<u32>]| -> Vec<Job<'_>> {
            bufs.iter()
                .zip(&r.slots)
                .zip(live)
                .filter(|(_, l)| l.is_some())
                .map(|((b, &slot), _)| Job::Write {
                    page: rec.data_page + slot * bp,
                    data: b,
                })
                .collect()
        };
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        // A big batch: blocks first, each crc32c computed by a copy thread as it copies the
        // block into its I/O buffer; the headers, which carry the crcs, follow.
        let early = copies_help(self.store.inner.opts.copy_threads, keys.len(), total);
        let crcs: Vec<u32> = if early {
            let mut jobs = data_jobs(&vec![Some(0); keys.len()]);
            self.store.io().run_crc_seeded(&mut jobs, &seeds)?
        } else {
            bufs.iter()
                .zip(&seeds)
                .map(|(b, &s)| crc32c_append(s, b))
                .collect()
        };
        let mut live: Vec<Option<u32>> = crcs.iter().map(|&c| Some(c)).collect();
        let page_data = {
            let mut st = self.shared.lock();
            let mut more = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                let (slot, generation) = (r.slots[i], r.gens[i]);
                // A put of this key that published since our reservation: the newer wins.
                if let Some(&o) = st.index.get(k) {
                    if st.slots[o as usize].is_some_and(|s| s.generation > generation) {
                        live[i] = None;
                        continue;
                    }
                    st.take(o);
                    more.push(o);
                }
                let h = SlotHeader {
                    pool: rec.id,
                    key: *k,
                    generation,
                    len: bufs[i].len() as u32,
                    crc: crcs[i],
                };
                let at = slot as usize * SLOT_HEADER;
                st.headers[at..at + SLOT_HEADER].copy_from_slice(&h.encode());
            }
            let pages = st.snapshot(r.slots.iter().chain(&r.taken).chain(&more).copied());
            // The other put's block is free at once (not deallocated: a rare race); a put that
            // reuses it snapshots its header page after ours.
            st.free.extend(&more);
            pages
        };
        let mut jobs = if early { Vec::new() } else { data_jobs(&live) };
        for (p, d) in &page_data {
            jobs.push(Job::Write {
                page: rec.header_page + p,
                data: d,
            });
        }
        self.store.io().run(&mut jobs)?;
        Ok(live)
    }

    /// Step 3 of a put: publish the written blocks, free the rest; deallocate the spare slots,
    /// then free them.
    fn settle(
        &self,
        r: Reserved,
        keys: &[u128],
        bufs: &[&[u8]],
        written: Result<Vec<Option<u32>>>,
    ) -> Result<()> {
        let rec = &self.shared.rec;
        let bp = rec.block_pages();
        let live = match written {
            Ok(live) => live,
            Err(e) => {
                // Those slots' contents on disk are unknown: forget them (misses, never hits).
                let mut st = self.shared.lock();
                for &slot in &r.slots {
                    st.take(slot);
                    st.free.push(slot);
                }
                st.free.extend(&r.spare);
                return Err(e);
            }
        };
        {
            let mut st = self.shared.lock();
            for (i, k) in keys.iter().enumerate() {
                let slot = r.slots[i];
                let Some(crc) = live[i] else {
                    st.free.push(slot);
                    continue;
                };
                st.slots[slot as usize] = Some(Slot {
                    key: *k,
                    generation: r.gens[i],
                    len: bufs[i].len() as u32,
                    crc,
                });
                st.index.insert(*k, slot);
                st.evictor.insert(slot, *k);
                st.stats.puts += 1;
            }
        }
        if !r.spare.is_empty() {
            let mut io = self.store.io();
            for &v in &r.spare {
                io.deallocate(rec.data_page + v * bp, bp);
            }
            drop(io);
            let mut st = self.shared.lock();
            st.free.extend(&r.spare);
            st.stats.deallocated += r.spare.len() as u64;
        }
        Ok(())
    }

    /// Reads the blocks of `keys` into `bufs` (each at least as long as the block) in one
    /// submission burst; per key, `Some(length)` for a hit, `None` for a miss. Every hit's
    /// crc32c is checked: a block that fails it is a miss.
    pub fn get_many(&self, keys: &[u128], bufs: &mut [&mut [u8]]) -> Result<Vec<Option<usize>>> {
        if keys.len() != bufs.len() {
            return Err(StoreError::Invalid(format!(
                "{} keys and {} buffers",
                keys.len(),
                bufs.len()
            )));
        }
        let rec = &self.shared.rec;
        let mut want: Vec<Option<(u64, Slot)>> = Vec::with_capacity(keys.len());
        {
            let mut st = self.shared.lock();
            for (i, k) in keys.iter().enumerate() {
                match st.index.get(k).copied() {
                    Some(slot) => {
                        let s = st.slots[slot as usize].expect("indexed slots are occupied");
                        if bufs[i].len() < s.len as usize {
                            return Err(StoreError::Invalid(format!(
                                "key {k:#x}: its block holds {} bytes, the buffer {}",
                                s.len,
                                bufs[i].len()
                            )));
                        }
                        st.evictor.hit(slot);
                        want.push(Some((slot, s)));
                    }
                    None => want.push(None),
                }
            }
        }
        // Read without the pool lock: a put that reuses a slot meanwhile makes its crc fail.
        // The engine computes each block's crc32c next to its copy out of the I/O buffer (for
        // a batch, on its copy threads, while other blocks are still being read).
        let mut crcs = {
            let mut jobs: Vec<Job<'_>> = Vec::with_capacity(keys.len());
            let mut seeds: Vec<u32> = Vec::with_capacity(keys.len());
            for ((w, b), k) in want.iter().zip(bufs.iter_mut()).zip(keys) {
                if let Some((slot, s)) = w {
                    jobs.push(Job::Read {
                        page: rec.data_page + slot * rec.block_pages(),
                        dst: &mut b[..s.len as usize],
                    });
                    seeds.push(slot_crc_seed(*k, s.generation));
                }
            }
            if jobs.is_empty() {
                Vec::new()
            } else {
                self.store.io().run_crc_seeded(&mut jobs, &seeds)?
            }
        }
        .into_iter();
        let mut out = Vec::with_capacity(keys.len());
        let mut st = self.shared.lock();
        for (k, w) in keys.iter().zip(&want) {
            match w {
                None => {
                    st.stats.misses += 1;
                    out.push(None);
                }
                Some((slot, s)) => {
                    let crc = crcs
                        .next()
                        .ok_or_else(|| StoreError::Internal("a crc per block read".into()))?;
                    if crc == s.crc {
                        st.stats.hits += 1;
                        out.push(Some(s.len as usize));
                    } else {
                        st.stats.misses += 1;
                        // Unless a put evicted or replaced the block while it was read (then
                        // it is a plain miss), the block is bad.
                        let same = st.slots[*slot as usize]
                            .is_some_and(|c| c.key == *k && c.generation == s.generation);
                        if same {
                            st.stats.bad_blocks += 1;
                            log::warn!(
                                "KV pool {:?}: block of key {k:#x} failed its crc; dropped",
                                rec.name
                            );
                            st.clear(*slot);
                        }
                        out.push(None);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Removes `keys` (absent ones are ignored); returns how many were held. Their headers
    /// are cleared and their blocks deallocated in one burst.
    pub fn remove_many(&self, keys: &[u128]) -> Result<usize> {
        let rec = &self.shared.rec;
        let _order = self.shared.write_order();
        let (slots, page_data) = {
            let mut st = self.shared.lock();
            let slots: Vec<u64> = keys.iter().filter_map(|k| st.index.get(k).copied()).collect();
            for &s in &slots {
                st.take(s);
            }
            let pages = st.snapshot(slots.iter().copied());
            (slots, pages)
        };
        let mut jobs: Vec<Job<'_>> = page_data
            .iter()
            .map(|(p, d)| Job::Write {
                page: rec.header_page + p,
                data: d,
            })
            .collect();
        let written = self.store.io().run(&mut jobs);
        if written.is_ok() {
            let mut io = self.store.io();
            for &s in &slots {
                io.deallocate(rec.data_page + s * rec.block_pages(), rec.block_pages());
            }
        }
        let mut st = self.shared.lock();
        st.free.extend(&slots);
        written?;
        st.stats.deallocated += slots.len() as u64;
        Ok(slots.len())
    }

    /// Makes every put that has returned durable (flushes the namespaces' write caches).
    pub fn sync(&self) -> Result<()> {
        self.store.io().flush_all()
    }
}

/// fsck of one pool: reads the header table and the data of every occupied slot. Returns the
/// slots checked and findings. Blocks that fail their crc are not findings (a put cut short by
/// a crash leaves them, and they read as misses): they are counted in the report instead.
pub(crate) fn fsck_pool(store: &Store, rec: &PoolRec) -> Result<(u64, Vec<Finding>)> {
    let st = load(store, rec)?;
    let mut findings = Vec::new();
    let mut checked = 0;
    let occupied: Vec<(u64, Slot)> = st
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i as u64, s)))
        .collect();
    for batch in occupied.chunks(64) {
        let mut bufs: Vec<Vec<u8>> = batch.iter().map(|(_, s)| vec![0u8; s.len as usize]).collect();
        let mut jobs: Vec<Job<'_>> = batch
            .iter()
            .zip(bufs.iter_mut())
            .map(|((i, _), b)| Job::Read {
                page: rec.data_page + i * rec.block_pages(),
                dst: b,
            })
            .collect();
        store.io().run(&mut jobs)?;
        drop(jobs);
        for ((i, s), b) in batch.iter().zip(&bufs) {
            checked += 1;
            if slot_data_crc(s.key, s.generation, b) != s.crc {
                log::info!(
                    "KV pool {:?} slot {i}: block fails its crc (reads as a miss)",
                    rec.name
                );
            }
        }
    }
    let dupes = st.index.len() as u64 != occupied.len() as u64;
    if dupes {
        findings.push(Finding {
            object: format!("KV pool {:?}", rec.name),
            detail: "the index and the occupied slots disagree".into(),
        });
    }
    Ok((checked, findings))
}
