//! KV pool eviction under each policy (`StoreOptions::kv_eviction`): a pool filled far past its
//! slots keeps exact statistics, every hit returns the bytes put, the policy decides which
//! blocks a scan of new keys pushes out, and a restart rebuilds a consistent index.

mod common;

use common::{bytes, fopts, opts};
use vfpoll_store::device::{Device, MemDevice, MemHandle};
use vfpoll_store::{EvictionPolicy, KvPool, Store, StoreOptions};

const BS: usize = 4096;

fn with_policy(o: StoreOptions, policy: EvictionPolicy) -> StoreOptions {
    StoreOptions {
        kv_eviction: policy,
        ..o
    }
}

fn store(dir: &std::path::Path, policy: EvictionPolicy) -> (Store, MemHandle) {
    let dev = MemDevice::new(16 << 20, 512, true);
    let h = dev.handle();
    let mut f = fopts(dir);
    f.store = with_policy(f.store, policy);
    (
        Store::format_devices(vec![Box::new(dev) as Box<dyn Device>], &f).unwrap(),
        h,
    )
}

fn reopen(dir: &std::path::Path, h: &MemHandle, policy: EvictionPolicy) -> Store {
    let dev: Box<dyn Device> = Box::new(h.restart());
    Store::open_devices(vec![dev], &with_policy(opts(dir), policy)).unwrap()
}

/// Key `k`'s block (its length varies with the key).
fn val(k: u128) -> Vec<u8> {
    bytes(k as u64 ^ 0x5eed, 1 + (k as usize * 389) % BS)
}

fn put(pool: &KvPool, keys: &[u128]) {
    let vals: Vec<Vec<u8>> = keys.iter().map(|&k| val(k)).collect();
    let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
    pool.put_many(keys, &refs).unwrap();
}

/// Gets `keys`; every hit must hold exactly the bytes put. Returns which keys hit.
fn get(pool: &KvPool, keys: &[u128]) -> Vec<bool> {
    let mut out = vec![vec![0u8; BS]; keys.len()];
    let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hits = pool.get_many(keys, &mut bufs).unwrap();
    keys.iter()
        .zip(&hits)
        .zip(&out)
        .map(|((k, h), o)| {
            if let Some(n) = h {
                assert_eq!(&o[..*n], &val(*k)[..], "key {k}: wrong bytes");
            }
            h.is_some()
        })
        .collect()
}

#[test]
fn a_scan_of_new_keys_pushes_out_reused_blocks_under_lru_only() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::S3Fifo] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _h) = store(dir.path(), policy);
        // 16 slots: a full pool evicts 8 at once; S3-FIFO's small queue holds 1.
        let pool = store.create_pool("kv", BS as u32, 16).unwrap();
        let first: Vec<u128> = (0..16).collect();
        put(&pool, &first);
        assert!(get(&pool, &first[..4]).iter().all(|&h| h));
        // One put: 8 blocks evicted, the 4 hit ones kept under both policies.
        put(&pool, &[100]);
        let s = pool.stats();
        assert_eq!(
            (s.evictions, s.deallocated, pool.len()),
            (8, 7, 9),
            "{policy}: {s:?}"
        );
        let held: Vec<u128> = first.iter().copied().filter(|&k| pool.contains(k)).collect();
        assert_eq!(held, vec![0, 1, 2, 3, 12, 13, 14, 15], "{policy}");
        // A scan: 32 new keys put once, never read.
        for chunk in (200..232).collect::<Vec<u128>>().chunks(4) {
            put(&pool, chunk);
        }
        let hot = get(&pool, &first[..4]);
        match policy {
            // Least recently used: the reused blocks went before the scan's newest.
            EvictionPolicy::Lru => assert_eq!(hot, vec![false; 4]),
            // Hit while in the small queue, they moved to the main one; the scan's blocks
            // came and went through the small queue.
            EvictionPolicy::S3Fifo => assert_eq!(hot, vec![true; 4]),
        }
        let s = pool.stats();
        assert_eq!(s.puts, 16 + 1 + 32);
        // Evicted slots not reused at once are free: the pool is not full between batches.
        assert_eq!(
            s.evictions,
            s.puts - pool.len(),
            "{policy}: nothing else left: {s:?}"
        );
        assert!(pool.len() <= 16 && s.deallocated < s.evictions, "{s:?}");
    }
}

/// Puts 600 keys into a 64-slot pool: a hot set read after every put, cold keys read back a
/// few puts later, one-off keys never read. Checks the counters against the test's own count,
/// every hit's bytes, and the index after a restart (and evictions after it).
#[test]
fn a_pool_filled_ten_times_over_keeps_exact_counts_and_survives_a_restart() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::S3Fifo] {
        let dir = tempfile::tempdir().unwrap();
        let (store, h) = store(dir.path(), policy);
        let pool = store.create_pool("kv", BS as u32, 64).unwrap();
        let hot: Vec<u128> = (1_000_000..1_000_008).collect();
        put(&pool, &hot);
        let (mut hits, mut gets) = (0u64, 0u64);
        let mut count = |h: &[bool]| {
            gets += h.len() as u64;
            hits += h.iter().filter(|&&x| x).count() as u64;
        };
        let mut hot_hits = 0;
        for round in 0..75u128 {
            let keys: Vec<u128> = (round * 8..round * 8 + 8).collect();
            put(&pool, &keys);
            let h = get(&pool, &hot);
            hot_hits += h.iter().filter(|&&x| x).count();
            count(&h);
            if round >= 3 {
                // Half of the keys put three rounds ago are read back.
                let back: Vec<u128> = ((round - 3) * 8..(round - 3) * 8 + 4).collect();
                count(&get(&pool, &back));
            }
        }
        let s = pool.stats();
        assert_eq!(s.puts, 8 + 600);
        assert_eq!((s.hits, s.hits + s.misses), (hits, gets), "{policy}: {s:?}");
        assert_eq!(s.bad_blocks, 0);
        let len = pool.len();
        assert!(len <= 64 && len > 48, "{len}");
        assert_eq!(s.evictions, s.puts - len, "{policy}: {s:?}");
        // Each put of 8 into the full pool evicts a batch of 8 and reuses it whole.
        assert_eq!(s.deallocated, 0, "{s:?}");
        // The hot set, read after every put, is never evicted under either policy.
        assert_eq!(hot_hits, 75 * 8, "{policy}");
        match policy {
            // The blocks read back 3 rounds later are still among the 64 most recent.
            EvictionPolicy::Lru => assert_eq!(s.misses, 0),
            // Every block enters the small queue. Until the blocks read back have moved to the
            // main queue, the small one is most of the pool (rounds 3 to 9 hit); from round 10
            // on it is down to its 6 slots and the blocks read back 3 rounds after their put
            // have left it: S3-FIFO's price for filtering one-off blocks, paid by blocks
            // reused once, late (65 rounds of 4 misses).
            EvictionPolicy::S3Fifo => assert_eq!(s.misses, 65 * 4),
        }

        let all: Vec<u128> = (0..600).chain(hot.iter().copied()).collect();
        let held: Vec<u128> = all.iter().copied().filter(|&k| pool.contains(k)).collect();
        assert_eq!(held.len() as u64, len);
        pool.sync().unwrap();
        drop(pool);
        drop(store);

        let store = reopen(dir.path(), &h, policy);
        let pool = store.pool("kv").unwrap();
        assert_eq!(pool.len(), len, "{policy}");
        let after: Vec<u128> = all.iter().copied().filter(|&k| pool.contains(k)).collect();
        assert_eq!(after, held, "{policy}: the index after the restart");
        // The order restarts cold (oldest puts first) and still evicts: new keys fill the
        // free slots, then 8 more evict 8 blocks.
        let fill: Vec<u128> = (5000..5000 + 64 - len as u128).collect();
        put(&pool, &fill);
        assert_eq!((pool.stats().evictions, pool.len()), (0, 64));
        let new: Vec<u128> = (6000..6008).collect();
        put(&pool, &new);
        assert!(get(&pool, &new).iter().all(|&x| x));
        let s = pool.stats();
        assert_eq!(
            (s.evictions, s.deallocated, pool.len()),
            (8, 0, 64),
            "{policy}: {s:?}"
        );
        // The hot set was read last before the restart, but a restart forgets hits: under
        // both policies the oldest puts (the hot set's, before all others) go first, and
        // nothing else.
        assert_eq!(get(&pool, &hot), vec![false; 8], "{policy}");
        let rest: Vec<u128> = held
            .iter()
            .chain(&fill)
            .copied()
            .filter(|k| !hot.contains(k))
            .collect();
        assert_eq!(rest.len(), 64 - 8);
        assert!(get(&pool, &rest).iter().all(|&x| x), "{policy}");
        assert!(store.fsck().unwrap().is_clean());
    }
}
