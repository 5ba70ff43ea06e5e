//! The in-memory index of a KV pool open in this process (FORMAT.md §6): its slots, keys,
//! eviction order ([`Evictor`]) and header table, and the locks its handles share. The I/O that
//! fills and uses it is in `kv`; this module does none, so the store's metadata can hold pools
//! without importing `kv` (modules import only downward: `kv_index` ← `store` ← `kv` ← `fsck`).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
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

/// How a full KV pool picks the blocks it evicts ([`crate::StoreOptions::kv_eviction`]). The
/// choice lives in memory only: it is not written to the device, and a pool opened again may
/// use the other one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently used first: a put or a hit makes a block the most recent.
    #[default]
    Lru,
    /// S3-FIFO (Yang et al., SOSP'23): new blocks enter a small FIFO queue (a tenth of the
    /// slots); a block hit while there moves to the main FIFO queue when it reaches the small
    /// queue's tail, one never hit is evicted and its key remembered in a ghost queue (as many
    /// keys as the main queue holds blocks). A block put again while its key is a ghost goes
    /// straight to the main queue. The main queue evicts from its tail, and gives a block with
    /// hits (a 2-bit count, at most 3) another round at its head with one hit less.
    S3Fifo,
}

impl EvictionPolicy {
    /// The names [`FromStr`] takes, as [`fmt::Display`] writes them.
    pub const NAMES: [&'static str; 2] = ["lru", "s3fifo"];
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::S3Fifo => "s3fifo",
        })
    }
}

impl FromStr for EvictionPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "lru" => Ok(EvictionPolicy::Lru),
            "s3fifo" => Ok(EvictionPolicy::S3Fifo),
            _ => Err(format!(
                "eviction policy {s:?}: use one of {}",
                EvictionPolicy::NAMES.join(", ")
            )),
        }
    }
}

/// No slot: the end of a queue.
const NIL: u64 = u64::MAX;
/// S3-FIFO's cap on a block's hit count (2 bits).
const MAX_FREQ: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    None,
    Small,
    Main,
}

/// A slot's place in its queue: a doubly linked list through the slot numbers, so that taking
/// any slot out is O(1) and nothing is allocated per block.
#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u64,
    next: u64,
    queue: Queue,
    freq: u8,
}

/// One FIFO queue: `head` the newest, `tail` the next to leave.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u64,
    tail: u64,
    len: u64,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// Keys recently evicted from S3-FIFO's small queue (keys only, no data), oldest first; a key
/// put again while here skips the small queue.
#[derive(Debug, Default)]
struct Ghost {
    /// Key and the number of its entry; an entry whose key maps to another number (the key was
    /// taken out, or added again later) is skipped when it leaves.
    fifo: VecDeque<(u128, u64)>,
    keys: HashMap<u128, u64>,
    next: u64,
    cap: usize,
}

impl Ghost {
    fn add(&mut self, key: u128) {
        if self.cap == 0 {
            return;
        }
        self.next += 1;
        self.keys.insert(key, self.next);
        self.fifo.push_back((key, self.next));
        while self.fifo.len() > self.cap {
            if let Some((k, n)) = self.fifo.pop_front() {
                if self.keys.get(&k) == Some(&n) {
                    self.keys.remove(&k);
                }
            }
        }
    }

    fn take(&mut self, key: u128) -> bool {
        self.keys.remove(&key).is_some()
    }
}

/// The eviction order of a KV pool's slots under an [`EvictionPolicy`], without I/O: what a
/// full pool asks for its victims. Public so that the policies can be replayed against traces
/// exactly as a pool runs them (`examples/kv_policy.rs`); a [`crate::KvPool`] drives its own.
///
/// Every operation is O(1), except [`Evictor::evict`] under S3-FIFO, which may move blocks
/// with hits from a queue's tail to the main queue's head before it finds a victim: each such
/// move uses up a hit or an insertion, so it is O(1) amortised.
///
/// ```
/// use vfpoll_store::{EvictionPolicy, Evictor};
/// let mut e = Evictor::new(EvictionPolicy::S3Fifo, 20);
/// for slot in 0..4 {
///     e.insert(slot, 100 + slot as u128);
/// }
/// e.hit(0); // hit while in the small queue: kept, moved to the main queue
/// assert_eq!(e.evict(), Some(1)); // the oldest block never hit
/// assert_eq!(e.evict(), Some(2));
/// ```
#[derive(Debug)]
pub struct Evictor {
    policy: EvictionPolicy,
    links: Vec<Link>,
    /// S3-FIFO's small queue (unused under LRU).
    small: List,
    /// LRU's list (head the most recent) or S3-FIFO's main queue.
    main: List,
    /// Each queued slot's key, for the ghost (S3-FIFO only; empty under LRU).
    keys: Vec<u128>,
    ghost: Ghost,
    /// S3-FIFO evicts from the small queue while it holds at least this many blocks.
    small_cap: u64,
}

impl Evictor {
    /// An empty order over `slots` slots (none queued).
    pub fn new(policy: EvictionPolicy, slots: u64) -> Self {
        let n = usize::try_from(slots).expect("a pool's slots fit in memory");
        let link = Link {
            prev: NIL,
            next: NIL,
            queue: Queue::None,
            freq: 0,
        };
        let s3 = policy == EvictionPolicy::S3Fifo;
        let small_cap = (slots / 10).max(1);
        Evictor {
            policy,
            links: vec![link; n],
            small: List::EMPTY,
            main: List::EMPTY,
            keys: if s3 { vec![0; n] } else { Vec::new() },
            ghost: Ghost {
                cap: if s3 {
                    (slots - small_cap.min(slots)) as usize
                } else {
                    0
                },
                ..Ghost::default()
            },
            small_cap,
        }
    }

    /// The policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// How many slots a full pool evicts at once: 1/64 of them, at least 8 (all of a smaller
    /// pool), so that the puts after an eviction find free slots.
    pub fn batch(&self) -> u64 {
        let slots = self.links.len() as u64;
        (slots / 64).max(8).min(slots)
    }

    /// Queued slots (blocks that may be evicted).
    pub fn len(&self) -> u64 {
        self.small.len + self.main.len
    }

    /// Whether no slot is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `slot` is queued.
    pub fn is_queued(&self, slot: u64) -> bool {
        self.links[slot as usize].queue != Queue::None
    }

    /// Keys remembered by S3-FIFO's ghost queue.
    pub fn ghosts(&self) -> usize {
        self.ghost.keys.len()
    }

    fn list(&mut self, q: Queue) -> &mut List {
        match q {
            Queue::Small => &mut self.small,
            Queue::Main | Queue::None => &mut self.main,
        }
    }

    fn push_head(&mut self, slot: u64, q: Queue) {
        let head = self.list(q).head;
        let l = &mut self.links[slot as usize];
        l.prev = NIL;
        l.next = head;
        l.queue = q;
        if head == NIL {
            self.list(q).tail = slot;
        } else {
            self.links[head as usize].prev = slot;
        }
        let list = self.list(q);
        list.head = slot;
        list.len += 1;
    }

    fn unlink(&mut self, slot: u64) {
        let Link {
            prev, next, queue, ..
        } = self.links[slot as usize];
        if queue == Queue::None {
            return;
        }
        if prev == NIL {
            self.list(queue).head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.list(queue).tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.list(queue).len -= 1;
        let l = &mut self.links[slot as usize];
        l.prev = NIL;
        l.next = NIL;
        l.queue = Queue::None;
    }

    /// A block just put into `slot` under `key` (a slot already queued is queued again, as new).
    pub fn insert(&mut self, slot: u64, key: u128) {
        self.unlink(slot);
        self.links[slot as usize].freq = 0;
        match self.policy {
            EvictionPolicy::Lru => self.push_head(slot, Queue::Main),
            EvictionPolicy::S3Fifo => {
                self.keys[slot as usize] = key;
                let q = if self.ghost.take(key) {
                    Queue::Main
                } else {
                    Queue::Small
                };
                self.push_head(slot, q);
            }
        }
    }

    /// A block found in `slot` when its pool is opened (the policy starts cold after a restart):
    /// the newest of the main queue with no hits (under LRU, the most recent). Call it in the
    /// order the blocks were put.
    pub fn restore(&mut self, slot: u64, key: u128) {
        self.unlink(slot);
        self.links[slot as usize].freq = 0;
        if self.policy == EvictionPolicy::S3Fifo {
            self.keys[slot as usize] = key;
        }
        self.push_head(slot, Queue::Main);
    }

    /// A get hit the block in `slot` (nothing if it is not queued).
    pub fn hit(&mut self, slot: u64) {
        if !self.is_queued(slot) {
            return;
        }
        match self.policy {
            EvictionPolicy::Lru => {
                self.unlink(slot);
                self.push_head(slot, Queue::Main);
            }
            EvictionPolicy::S3Fifo => {
                let l = &mut self.links[slot as usize];
                l.freq = (l.freq + 1).min(MAX_FREQ);
            }
        }
    }

    /// Takes `slot` out of the order (its block was replaced, removed or found bad); its key
    /// is not remembered. Nothing if it is not queued.
    pub fn remove(&mut self, slot: u64) {
        self.unlink(slot);
    }

    fn pop_tail(&mut self, q: Queue) -> Option<u64> {
        let t = self.list(q).tail;
        (t != NIL).then(|| {
            self.unlink(t);
            t
        })
    }

    /// The next victim, taken out of the order; `None` when no slot is queued.
    pub fn evict(&mut self) -> Option<u64> {
        if self.policy == EvictionPolicy::Lru {
            return self.pop_tail(Queue::Main);
        }
        loop {
            if self.small.len > 0 && (self.small.len >= self.small_cap || self.main.len == 0) {
                let t = self.pop_tail(Queue::Small)?;
                if self.links[t as usize].freq > 0 {
                    self.links[t as usize].freq = 0;
                    self.push_head(t, Queue::Main);
                    continue;
                }
                self.ghost.add(self.keys[t as usize]);
                return Some(t);
            }
            let t = self.pop_tail(Queue::Main)?;
            let f = self.links[t as usize].freq;
            if f > 0 {
                self.links[t as usize].freq = f - 1;
                self.push_head(t, Queue::Main);
                continue;
            }
            return Some(t);
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) key: u128,
    pub(crate) generation: u64,
    pub(crate) len: u32,
    pub(crate) crc: u32,
}

pub(crate) struct PoolState {
    pub(crate) headers: Vec<u8>,
    pub(crate) slots: Vec<Option<Slot>>,
    pub(crate) index: HashMap<u128, u64>,
    pub(crate) free: Vec<u64>,
    /// The occupied slots in eviction order. Free and reserved slots are not in it.
    pub(crate) evictor: Evictor,
    pub(crate) next_gen: u64,
    pub(crate) stats: KvStats,
}

impl PoolState {
    /// Takes `slot` out of the index and the eviction order (header zeroed in memory) without
    /// freeing it; returns whether it held a block.
    pub(crate) fn take(&mut self, slot: u64) -> bool {
        let at = slot as usize * SLOT_HEADER;
        self.headers[at..at + SLOT_HEADER].fill(0);
        let Some(s) = self.slots[slot as usize].take() else {
            return false;
        };
        self.evictor.remove(slot);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(e: &mut Evictor) -> Vec<u64> {
        std::iter::from_fn(|| e.evict()).collect()
    }

    #[test]
    fn lru_evicts_least_recently_used_first() {
        let mut e = Evictor::new(EvictionPolicy::Lru, 8);
        for s in 0..5 {
            e.insert(s, s as u128);
        }
        e.hit(1);
        e.hit(0);
        e.remove(3);
        e.hit(7); // not queued: nothing
        assert!(!e.is_queued(3) && !e.is_queued(7));
        assert_eq!(e.len(), 4);
        assert_eq!(drain(&mut e), vec![2, 4, 1, 0]);
        assert!(e.is_empty());
        assert_eq!(e.ghosts(), 0);
        assert_eq!(e.batch(), 8);
    }

    #[test]
    fn s3fifo_evicts_one_hit_wonders_before_reused_blocks() {
        // 20 slots: the small queue holds 2.
        let mut e = Evictor::new(EvictionPolicy::S3Fifo, 20);
        for s in 0..6 {
            e.insert(s, 100 + s as u128);
        }
        e.hit(1);
        e.hit(3);
        // 0, 2 and 4 were never hit: gone first (and remembered); 1 and 3 moved to the main
        // queue on their way out of the small one; 5 stays while the small queue is under 2.
        assert_eq!(drain(&mut e), vec![0, 2, 4, 1, 3, 5]);
        assert_eq!(e.ghosts(), 4); // 0, 2, 4, and 5 (left the small queue with no hit)
    }

    #[test]
    fn s3fifo_main_queue_gives_hit_blocks_another_round() {
        let mut e = Evictor::new(EvictionPolicy::S3Fifo, 20);
        e.insert(0, 10);
        e.insert(1, 11);
        e.hit(0);
        e.hit(1);
        e.insert(2, 12);
        e.insert(3, 13);
        // 0 and 1 move to the main queue (their hits spent), 2 is evicted.
        assert_eq!(e.evict(), Some(2));
        e.hit(0);
        e.hit(0);
        e.hit(3);
        // The small queue (3) is under its 2: the main queue's tail is 0, hit twice since: one
        // more round; 1 has none left.
        assert_eq!(e.evict(), Some(1));
        assert_eq!(e.evict(), Some(0));
        assert_eq!(e.evict(), Some(3));
        assert_eq!(e.evict(), None);
    }

    #[test]
    fn s3fifo_hit_counts_stop_at_three() {
        let mut e = Evictor::new(EvictionPolicy::S3Fifo, 20);
        e.restore(0, 1); // restored blocks start in the main queue
        e.restore(1, 2);
        for _ in 0..10 {
            e.hit(0);
        }
        // 0 goes round three times (3 hits), and 1 leaves first.
        assert_eq!(drain(&mut e), vec![1, 0]);
    }

    #[test]
    fn s3fifo_ghost_keys_skip_the_small_queue() {
        let mut e = Evictor::new(EvictionPolicy::S3Fifo, 20);
        e.insert(0, 500);
        e.insert(1, 501);
        assert_eq!(e.evict(), Some(0));
        assert_eq!(e.ghosts(), 1);
        // Key 500 comes back (into slot 0): straight to the main queue, so a scan of new
        // keys leaves it alone.
        e.insert(0, 500);
        assert_eq!(e.ghosts(), 0);
        for s in 2..10 {
            e.insert(s, 600 + s as u128);
        }
        let first: Vec<u64> = (0..8).filter_map(|_| e.evict()).collect();
        assert_eq!(first, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(e.is_queued(0) && e.is_queued(9));
        // A removed key is not remembered: it goes back to the small queue.
        e.remove(9);
        e.insert(9, 609);
        assert_eq!(drain(&mut e), vec![0, 9]);
    }

    #[test]
    fn s3fifo_ghost_is_bounded_by_the_main_queue() {
        // 10 slots: small queue 1, ghost 9 keys.
        let mut e = Evictor::new(EvictionPolicy::S3Fifo, 10);
        for k in 0..50u128 {
            e.insert(0, k);
            assert_eq!(e.evict(), Some(0));
        }
        assert_eq!(e.ghosts(), 9);
        // Only the last 9 keys (41..=49) are remembered: key 41 goes to the main queue, key 40
        // to the small one, and is evicted first.
        e.insert(0, 40);
        e.insert(1, 41);
        e.insert(2, 99);
        assert_eq!(drain(&mut e), vec![0, 2, 1]);
    }

    #[test]
    fn policy_names() {
        for p in [EvictionPolicy::Lru, EvictionPolicy::S3Fifo] {
            assert_eq!(p.to_string().parse::<EvictionPolicy>(), Ok(p));
        }
        assert_eq!("S3-FIFO".parse::<EvictionPolicy>(), Ok(EvictionPolicy::S3Fifo));
        let e = "clock".parse::<EvictionPolicy>().unwrap_err();
        assert!(e.contains("lru, s3fifo"), "{e}");
        assert_eq!(EvictionPolicy::default(), EvictionPolicy::Lru);
    }
}
