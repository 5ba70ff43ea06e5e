//! KV pools: batched put/get, replacement, LRU eviction with deallocate, removal, statistics,
//! a restart that rebuilds the index from the headers, and refusals.

mod common;

use common::{bytes, mem_store, reopen};
use vfpoll_store::StoreError;

fn get(pool: &vfpoll_store::KvPool, keys: &[u128], bs: usize) -> (Vec<Option<usize>>, Vec<Vec<u8>>) {
    let mut out = vec![vec![0u8; bs]; keys.len()];
    let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hits = pool.get_many(keys, &mut bufs).unwrap();
    (hits, out)
}

/// The blocks of `keys` that `pool` holds, with their bytes.
fn held(pool: &vfpoll_store::KvPool, keys: &[u128], bs: usize) -> Vec<(u128, Vec<u8>)> {
    let (hits, out) = get(pool, keys, bs);
    keys.iter()
        .zip(hits)
        .zip(out)
        .filter_map(|((k, h), mut o)| {
            h.map(|n| {
                o.truncate(n);
                (*k, o)
            })
        })
        .collect()
}

#[test]
fn put_get_replace_evict_remove_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (store, handles) = mem_store(dir.path(), 2, 16 << 20);
    let bs = 64 << 10;
    let pool = store.create_pool("kv", bs as u32, 64).unwrap();
    assert!(matches!(
        store.create_pool("kv", 4096, 1),
        Err(StoreError::Exists(_))
    ));
    let v = |k: u128, round: u64| bytes(k as u64 * 1000 + round, 1 + (k as usize * 997) % bs);
    // 64 keys fill the pool exactly.
    let keys: Vec<u128> = (0..64).map(|k| k * 0x1_0000_0000_0000_0001).collect();
    for chunk in keys.chunks(16) {
        let vals: Vec<Vec<u8>> = chunk.iter().map(|&k| v(k, 0)).collect();
        let refs: Vec<&[u8]> = vals.iter().map(|x| x.as_slice()).collect();
        pool.put_many(chunk, &refs).unwrap();
    }
    assert_eq!(pool.len(), 64);
    assert_eq!(pool.stats().evictions, 0);
    let (hits, out) = get(&pool, &keys, bs);
    for ((k, h), o) in keys.iter().zip(&hits).zip(&out) {
        let want = v(*k, 0);
        assert_eq!(*h, Some(want.len()));
        assert_eq!(&o[..want.len()], &want[..]);
    }
    // Replace a key: the new value wins, the pool does not grow.
    pool.put_many(&[keys[3]], &[&v(keys[3], 1)]).unwrap();
    assert_eq!(pool.len(), 64);
    let (h, o) = get(&pool, &[keys[3]], bs);
    assert_eq!(&o[0][..h[0].unwrap()], &v(keys[3], 1)[..]);
    // Touch keys 0..8 so they are recently used; new keys evict the least recent ones.
    get(&pool, &keys[..8], bs);
    let fresh: Vec<u128> = (1000..1004).collect();
    let vals: Vec<Vec<u8>> = fresh.iter().map(|&k| v(k, 0)).collect();
    let refs: Vec<&[u8]> = vals.iter().map(|x| x.as_slice()).collect();
    pool.put_many(&fresh, &refs).unwrap();
    let st = pool.stats();
    assert!(st.evictions >= 4, "{st:?}");
    assert!(
        st.deallocated > 0,
        "evicted blocks not reused at once are deallocated: {st:?}"
    );
    let (hits, _) = get(&pool, &keys[..8], bs);
    assert!(hits.iter().all(Option::is_some), "recently used keys stay");
    let (hits, _) = get(&pool, &fresh, bs);
    assert!(hits.iter().all(Option::is_some));
    // Remove.
    assert_eq!(pool.remove_many(&[keys[0], 424242]).unwrap(), 1);
    assert!(!pool.contains(keys[0]));
    let before = pool.stats();
    let (hits, _) = get(&pool, &[keys[0]], bs);
    assert_eq!(hits, vec![None]);
    assert_eq!(pool.stats().misses, before.misses + 1);
    let held: Vec<u128> = keys
        .iter()
        .chain(&fresh)
        .copied()
        .filter(|&k| pool.contains(k))
        .collect();
    pool.sync().unwrap();
    drop(pool);
    drop(store);

    // After a restart the index comes back from the headers alone.
    let (store, _) = reopen(dir.path(), &handles);
    let store = store.unwrap();
    let pool = store.pool("kv").unwrap();
    assert_eq!(pool.len() as usize, held.len());
    let (hits, out) = get(&pool, &held, bs);
    for ((k, h), o) in held.iter().zip(&hits).zip(&out) {
        let want = if *k == keys[3] { v(*k, 1) } else { v(*k, 0) };
        assert_eq!(*h, Some(want.len()), "key {k}");
        assert_eq!(&o[..want.len()], &want[..]);
    }
    assert_eq!(store.pools()[0].used, Some(held.len() as u64));
    let rep = store.fsck().unwrap();
    assert!(rep.is_clean());
    assert_eq!(rep.kv_slots, held.len() as u64);
}

#[test]
fn refusals_and_pool_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 1, 8 << 20);
    assert!(store
        .create_pool("p", 1000, 4)
        .unwrap_err()
        .to_string()
        .contains("multiple of 4096"));
    assert!(store.create_pool("p", 4096, 0).is_err());
    let e = store.create_pool("huge", 1 << 20, 100).unwrap_err();
    assert!(matches!(e, StoreError::Full { .. }), "{e}");
    let free = store.info().free;
    let pool = store.create_pool("p", 8192, 8).unwrap();
    assert!(pool
        .put_many(&[1], &[&[0u8; 8193]])
        .unwrap_err()
        .to_string()
        .contains("block holds"));
    assert!(pool
        .put_many(&[1, 1], &[&[1u8][..], &[2u8][..]])
        .unwrap_err()
        .to_string()
        .contains("twice"));
    assert!(pool.put_many(&[1], &[&[][..]]).is_err());
    pool.put_many(&[1], &[&[9u8; 8000]]).unwrap();
    let mut small = [0u8; 100];
    let e = pool.get_many(&[1], &mut [&mut small[..]]).unwrap_err();
    assert!(e.to_string().contains("8000 bytes"), "{e}");
    let e = store.delete_pool("p").unwrap_err();
    assert!(e.to_string().contains("is open"), "{e}");
    drop(pool);
    store.delete_pool("p").unwrap();
    assert!(store.pools().is_empty());
    assert_eq!(store.info().free, free);
    assert!(matches!(store.pool("p"), Err(StoreError::NotFound(_))));
}

#[test]
fn concurrent_gets_and_puts_never_return_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 2, 16 << 20);
    let pool = store.create_pool("kv", 4096, 16).unwrap();
    // Each value is its key and round, so a hit is checkable without shared state.
    let val = |k: u128, r: u64| {
        let mut b = vec![0u8; 4096];
        b[..16].copy_from_slice(&k.to_le_bytes());
        b[16..24].copy_from_slice(&r.to_le_bytes());
        b[24..].copy_from_slice(&bytes(k as u64 ^ r, 4072));
        b
    };
    let first: Vec<u128> = (0..8).collect();
    let vals: Vec<Vec<u8>> = first.iter().map(|&k| val(k, 1000)).collect();
    let refs: Vec<&[u8]> = vals.iter().map(|x| x.as_slice()).collect();
    pool.put_many(&first, &refs).unwrap();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            for r in 0..200u64 {
                let keys: Vec<u128> = (0..8).map(|i| ((r * 8 + i) % 40) as u128).collect();
                let vals: Vec<Vec<u8>> = keys.iter().map(|&k| val(k, r)).collect();
                let refs: Vec<&[u8]> = vals.iter().map(|x| x.as_slice()).collect();
                pool.put_many(&keys, &refs).unwrap();
            }
        })
    };
    let mut hits = 0;
    let mut rounds = 0;
    while !writer.is_finished() || rounds < 10 {
        rounds += 1;
        let keys: Vec<u128> = (0..40).collect();
        let (h, out) = get(&pool, &keys, 4096);
        for ((k, h), o) in keys.iter().zip(&h).zip(&out) {
            if h.is_some() {
                hits += 1;
                let r = u64::from_le_bytes(o[16..24].try_into().unwrap());
                assert_eq!(o, &val(*k, r), "key {k}");
            }
        }
    }
    writer.join().unwrap();
    assert!(hits > 0);
}

/// Several threads putting (some keys shared between them, with evictions), removing and
/// getting on one pool, with small batches (one burst) and batches of 1 MiB and more (blocks
/// first, crcs on the copy threads, then headers): every hit is a block put under its key,
/// and after a sync and a restart the index rebuilt from the headers holds exactly what the
/// pool held, byte for byte (the header pages reached the device in order).
#[test]
fn several_writers_and_readers_then_a_restart_agree() {
    for (bs, per_put, slots) in [(8192usize, 6usize, 48u64), (128 << 10, 9, 64)] {
        let dir = tempfile::tempdir().unwrap();
        let (store, handles) = mem_store(dir.path(), 2, 24 << 20);
        let pool = store.create_pool("kv", bs as u32, slots).unwrap();
        // A value names its key, writer and round, so that a hit is checkable on its own.
        let val = move |k: u128, w: u64, r: u64| {
            let len = if per_put > 6 {
                bs - (k as usize * 37 + r as usize) % 4096
            } else {
                100 + (k as usize * 37 + r as usize) % (bs - 100)
            };
            let mut b = bytes(k as u64 * 7919 + w * 131 + r, len);
            b[..16].copy_from_slice(&k.to_le_bytes());
            b[16..24].copy_from_slice(&(w << 32 | r).to_le_bytes());
            b
        };
        let check = move |k: u128, got: &[u8]| {
            let wr = u64::from_le_bytes(got[16..24].try_into().unwrap());
            assert_eq!(
                got,
                &val(k, wr >> 32, wr & 0xffff_ffff)[..],
                "key {k}: wrong bytes"
            );
        };
        std::thread::scope(|s| {
            for w in 0..3u64 {
                let pool = &pool;
                s.spawn(move || {
                    let mut x = w + 1;
                    for r in 0..40u64 {
                        let mut keys: Vec<u128> = Vec::new();
                        while keys.len() < per_put {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let k = ((x >> 33) % 96) as u128;
                            if !keys.contains(&k) {
                                keys.push(k);
                            }
                        }
                        let vals: Vec<Vec<u8>> = keys.iter().map(|&k| val(k, w, r)).collect();
                        let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                        pool.put_many(&keys, &refs).unwrap();
                        if r % 8 == 7 {
                            pool.remove_many(&keys[..2]).unwrap();
                        }
                    }
                });
            }
            for _ in 0..2 {
                let pool = &pool;
                s.spawn(move || {
                    for i in 0..30u128 {
                        let keys: Vec<u128> = (0..8).map(|j| (i * 8 + j) % 96).collect();
                        let (hits, out) = get(pool, &keys, bs);
                        for ((k, h), o) in keys.iter().zip(&hits).zip(&out) {
                            if let Some(n) = h {
                                check(*k, &o[..*n]);
                            }
                        }
                    }
                });
            }
        });
        let st = pool.stats();
        assert_eq!(st.bad_blocks, 0, "{st:?}");
        assert!(st.evictions > 0, "{st:?}");
        let all: Vec<u128> = (0..96).collect();
        let before = held(&pool, &all, bs);
        assert_eq!(before.len() as u64, pool.len());
        for (k, v) in &before {
            check(*k, v);
        }
        pool.sync().unwrap();
        drop(pool);
        drop(store);
        let (store, _) = reopen(dir.path(), &handles);
        let store = store.unwrap();
        let pool = store.pool("kv").unwrap();
        let again = held(&pool, &all, bs);
        assert_eq!(
            again.len(),
            before.len(),
            "block size {bs}: the restart found another set of keys"
        );
        assert!(again == before, "block size {bs}: the restart found other bytes");
        assert!(store.fsck().unwrap().is_clean());
    }
}
