//! The in-memory index of a KV pool open in this process (FORMAT.md §6): its slots, keys, LRU
//! order and header table, and the locks its handles share. The I/O that fills and uses it is
//! in `kv`; this module does none, so the store's metadata can hold pools without importing
//! `kv` (modules import only downward: `kv_index` ← `store` ← `kv` ← `fsck`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use crate::format::{PoolRec, PAGE, SLOT_HEADER};

/// Counters of a pool since it was opened in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Blocks put.
    pub puts: u64,
    /// Gets that returned the block.
    pub hits: u64,
    /// Gets that found nothing (or a block that failed its crc).
    pub misses: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks that failed their crc on a get (torn or stale after a crash), counted in misses.
    pub bad_blocks: u64,
    /// Blocks deallocated (trimmed) after eviction or removal.
    pub deallocated: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) key: u128,
    pub(crate) generation: u64,
    pub(crate) len: u32,
    pub(crate) crc: u32,
    pub(crate) tick: u64,
}

pub(crate) struct PoolState {
    pub(crate) headers: Vec<u8>,
    pub(crate) slots: Vec<Option<Slot>>,
    pub(crate) index: HashMap<u128, u64>,
    pub(crate) free: Vec<u64>,
    /// tick → slot, oldest first.
    pub(crate) lru: BTreeMap<u64, u64>,
    pub(crate) tick: u64,
    pub(crate) next_gen: u64,
    pub(crate) stats: KvStats,
}

impl PoolState {
    pub(crate) fn touch(&mut self, slot: u64) {
        self.tick += 1;
        let t = self.tick;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            self.lru.remove(&s.tick);
            s.tick = t;
            self.lru.insert(t, slot);
        }
    }

    /// Takes `slot` out of the index and the LRU (header zeroed in memory) without freeing
    /// it; returns whether it held a block.
    pub(crate) fn take(&mut self, slot: u64) -> bool {
        let at = slot as usize * SLOT_HEADER;
        self.headers[at..at + SLOT_HEADER].fill(0);
        let Some(s) = self.slots[slot as usize].take() else {
            return false;
        };
        self.lru.remove(&s.tick);
        if self.index.get(&s.key) == Some(&slot) {
            self.index.remove(&s.key);
        }
        true
    }

    /// Empties `slot` in memory (header zeroed) and frees it.
    pub(crate) fn clear(&mut self, slot: u64) {
        if self.take(slot) {
            self.free.push(slot);
        }
    }

    /// The header pages (of the pool's table) of `slots`, each once, with their bytes now.
    pub(crate) fn snapshot(&self, slots: impl Iterator<Item = u64>) -> Vec<(u64, Vec<u8>)> {
        let mut pages: Vec<u64> = slots.map(|s| s * SLOT_HEADER as u64 / PAGE as u64).collect();
        pages.sort_unstable();
        pages.dedup();
        pages
            .iter()
            .map(|&p| {
                (
                    p,
                    self.headers[p as usize * PAGE..(p as usize + 1) * PAGE].to_vec(),
                )
            })
            .collect()
    }
}

/// The state of a pool open in this process, shared by its handles.
pub(crate) struct PoolShared {
    pub(crate) rec: PoolRec,
    /// The index; never held across I/O.
    state: Mutex<PoolState>,
    /// Held by a put or remove from its header snapshot to its publish, so that header pages
    /// reach the device in the order their copies were taken (`kv` module docs, Locking).
    write_order: Mutex<()>,
}

impl PoolShared {
    /// A pool's shared state over `state` (its index as read at open).
    pub(crate) fn new(rec: PoolRec, state: PoolState) -> Self {
        PoolShared {
            rec,
            state: Mutex::new(state),
            write_order: Mutex::new(()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write_order(&self) -> MutexGuard<'_, ()> {
        self.write_order.lock().unwrap_or_else(|e| e.into_inner())
    }
}
