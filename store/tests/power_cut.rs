//! Power cuts: hundreds of cuts at random points during checkpoint puts and commits, deletes,
//! and KV puts, on memory devices with volatile write caches that lose unflushed writes and
//! tear writes in flight at random sector boundaries. After every cut the store is opened
//! again from what survived, and must hold exactly the last committed versions (a commit cut
//! short may have landed or not, nothing in between), pass fsck, and return no wrong KV bytes.

mod common;

use std::collections::HashMap;

use common::{bytes, mem_store, reopen};
use vfpoll_store::device::MemHandle;
use vfpoll_store::{Store, StoreError};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The versions of a checkpoint, oldest first: their tensors (each version's bytes are unique).
type Versions = Vec<Vec<(String, Vec<u8>)>>;

#[derive(Clone, Default)]
struct Model {
    ckpts: HashMap<String, Versions>,
}

/// Whether the store holds exactly `m`'s versions (by content), and passes fsck.
fn matches(store: &Store, m: &Model) -> bool {
    let got: HashMap<String, Vec<u64>> = store
        .checkpoints()
        .into_iter()
        .map(|c| (c.name, c.versions.iter().map(|v| v.id).collect()))
        .collect();
    let want: HashMap<&String, &Versions> = m.ckpts.iter().filter(|(_, v)| !v.is_empty()).collect();
    if got.len() != want.len() {
        return false;
    }
    for (name, versions) in want {
        let Some(ids) = got.get(name) else { return false };
        if ids.len() != versions.len() {
            return false;
        }
        for (id, tensors) in ids.iter().zip(versions) {
            let r = store.open_version(name, Some(*id)).unwrap();
            if r.entries().len() != tensors.len() {
                return false;
            }
            for (t, data) in tensors {
                match r.read_to_vec(t) {
                    Ok(d) if &d == data => {}
                    Ok(_) => return false,
                    Err(e) => panic!("{name} v{id} {t}: {e}"),
                }
            }
        }
    }
    true
}

/// Checks the store against `committed`, or `alt` (the model had the interrupted change
/// landed); returns the model that matched.
fn check(store: &Store, committed: &Model, alt: Option<&Model>) -> Model {
    let model = if matches(store, committed) {
        committed
    } else if let Some(a) = alt.filter(|a| matches(store, a)) {
        a
    } else {
        let got: Vec<(String, usize)> = store
            .checkpoints()
            .into_iter()
            .map(|c| (c.name, c.versions.len()))
            .collect();
        panic!("the store holds {got:?}, neither the committed versions nor the change in flight");
    };
    let rep = store.fsck().unwrap();
    assert!(rep.is_clean(), "fsck: {:?}", rep.findings);
    model.clone()
}

fn check_kv(store: &Store, pool: &str, bs: usize, values: &HashMap<u128, Vec<Vec<u8>>>) -> (u64, u64) {
    let pool = store.pool(pool).unwrap();
    let keys: Vec<u128> = values.keys().copied().collect();
    let mut out = vec![vec![0u8; bs]; keys.len()];
    let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hits = pool.get_many(&keys, &mut bufs).unwrap();
    let mut n = 0;
    for ((k, h), b) in keys.iter().zip(&hits).zip(&out) {
        if let Some(len) = h {
            n += 1;
            assert!(
                values[k].iter().any(|v| v[..] == b[..*len]),
                "key {k}: a hit returned bytes never put under it"
            );
        }
    }
    (n, keys.len() as u64)
}

fn cut_all(handles: &[MemHandle], rng: &mut Rng) {
    for h in handles {
        if !h.is_cut() {
            h.cut(rng.next());
        }
    }
}

#[test]
fn hundreds_of_power_cuts_during_puts_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut handles) = mem_store(dir.path(), 2, 8 << 20);
    store.create_pool("kv", 16384, 48).unwrap();
    // Puts of 1 MiB and more to this one write their blocks first (crcs on the copy threads)
    // and their headers in a second burst.
    store.create_pool("big", 128 << 10, 16).unwrap();
    drop(store);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut committed = Model::default();
    let mut kv_values: HashMap<u128, Vec<Vec<u8>>> = HashMap::new();
    let mut big_values: HashMap<u128, Vec<Vec<u8>>> = HashMap::new();
    let mut seq = 0u64;
    let (mut cuts, mut landed, mut torn, mut kv_hits, mut big_hits) = (0, 0, 0, 0, 0);
    let cuts_wanted = if cfg!(debug_assertions) { 300 } else { 1000 };
    while cuts < cuts_wanted {
        let (store, hs) = reopen(dir.path(), &handles);
        handles = hs;
        let store = store.unwrap();
        committed = check(&store, &committed, None);
        kv_hits += check_kv(&store, "kv", 16384, &kv_values).0;
        kv_hits += check_kv(&store, "big", 128 << 10, &big_values).0;
        // Arm a cut somewhere in the next requests of one member; the others go down with it.
        let victim = rng.below(handles.len() as u64) as usize;
        handles[victim].arm_cut(1 + rng.below(60), rng.next());
        let pool = store.pool("kv").unwrap();
        let big = store.pool("big").unwrap();
        let mut in_flight: Option<Model> = None;
        loop {
            let op = rng.below(10);
            let r: Result<(), StoreError> = if op < 5 {
                // A checkpoint version.
                let name = format!("ck{}", rng.below(3));
                let mut tensors = Vec::new();
                let mut tx = store.begin(&name).unwrap();
                let keep = rng.below(2) == 0;
                if keep {
                    tx.keep_last(2);
                }
                if rng.below(2) == 0 {
                    // Puts staged in host memory, written by the background thread.
                    tx.background(64 << 10 << rng.below(3)).unwrap();
                }
                let r = (|| {
                    for t in 0..1 + rng.below(4) {
                        seq += 1;
                        let len = [1, 4096, 5000, 70_000, 200_000][rng.below(5) as usize];
                        let data = bytes(seq, len);
                        tx.put(&format!("t{t}"), b"m", &data)?;
                        tensors.push((format!("t{t}"), data));
                    }
                    // What the model becomes if this commit lands.
                    let mut next = committed.clone();
                    let vs = next.ckpts.entry(name.clone()).or_default();
                    vs.push(tensors.clone());
                    if keep && vs.len() > 2 {
                        vs.drain(..vs.len() - 2);
                    }
                    in_flight = Some(next.clone());
                    tx.commit()?;
                    committed = next;
                    in_flight = None;
                    Ok(())
                })();
                r
            } else if op < 6 {
                // Delete the oldest version of a checkpoint.
                let name = format!("ck{}", rng.below(3));
                let oldest = store
                    .checkpoint(&name)
                    .ok()
                    .and_then(|c| c.versions.first().map(|v| v.id));
                match oldest {
                    Some(id) => {
                        let mut next = committed.clone();
                        let vs = next.ckpts.get_mut(&name).unwrap();
                        vs.remove(0);
                        if vs.is_empty() {
                            next.ckpts.remove(&name);
                        }
                        in_flight = Some(next.clone());
                        let r = store.delete_version(&name, id);
                        if r.is_ok() {
                            committed = next;
                            in_flight = None;
                        }
                        r
                    }
                    None => Ok(()),
                }
            } else if op < 9 && rng.below(4) == 0 {
                // A big KV put: 9 to 16 blocks of about 128 KiB.
                let n = 9 + rng.below(8) as usize;
                let mut keys = Vec::new();
                let mut vals = Vec::new();
                while keys.len() < n {
                    let k = rng.below(24) as u128;
                    if keys.contains(&k) {
                        continue;
                    }
                    seq += 1;
                    let v = bytes(seq, (128 << 10) - rng.below(4096) as usize);
                    big_values.entry(k).or_default().push(v.clone());
                    keys.push(k);
                    vals.push(v);
                }
                let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                big.put_many(&keys, &refs)
            } else if op < 9 {
                // KV puts (not synced: a cache).
                let n = 1 + rng.below(6) as usize;
                let mut keys = Vec::new();
                let mut vals = Vec::new();
                for _ in 0..n {
                    let k = rng.below(80) as u128;
                    if keys.contains(&k) {
                        continue;
                    }
                    seq += 1;
                    let v = bytes(seq, 1 + rng.below(16384) as usize);
                    kv_values.entry(k).or_default().push(v.clone());
                    keys.push(k);
                    vals.push(v);
                }
                let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                pool.put_many(&keys, &refs)
            } else {
                pool.sync()
            };
            if r.is_err() {
                break;
            }
            if handles.iter().any(MemHandle::is_cut) {
                break;
            }
            if rng.below(40) == 0 {
                // A cut while idle: cached writes are lost or torn.
                break;
            }
        }
        cut_all(&handles, &mut rng);
        torn += handles.iter().map(|h| h.last_cut().torn).sum::<u64>();
        drop(pool);
        drop(big);
        drop(store);
        cuts += 1;
        // Reopen and decide whether an interrupted change landed.
        let (store, hs) = reopen(dir.path(), &handles);
        handles = hs;
        let store = store.unwrap();
        let before = committed.clone();
        committed = check(&store, &committed, in_flight.as_ref());
        if in_flight.is_some() && !matches(&store, &before) {
            landed += 1;
        }
        kv_hits += check_kv(&store, "kv", 16384, &kv_values).0;
        big_hits += check_kv(&store, "big", 128 << 10, &big_values).0;
    }
    eprintln!(
        "{cuts} cuts: {landed} interrupted changes landed, {torn} writes torn, {kv_hits} KV hits and {big_hits} big-block \
         hits checked"
    );
    assert!(big_hits > 0, "big KV blocks survived some cuts");
    assert!(torn > 0, "the cuts tore writes");
    assert!(kv_hits > 0, "KV blocks survived some cuts");
}

/// Power cuts while two threads put and get KV blocks beside checkpoint commits, on three I/O
/// channels: the commits' flushes must cover data written on whichever channel, a get beside
/// a put on another channel must never return bytes not put under its key, and after every
/// cut the store holds exactly the committed versions (or the one in flight) and passes fsck.
#[test]
fn power_cuts_with_kv_threads_beside_commits_on_several_channels() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let (store, mut handles) = mem_store(dir.path(), 2, 8 << 20);
    assert_eq!(store.info().io_channels, 3);
    store.create_pool("kv", 16384, 48).unwrap();
    drop(store);
    let mut rng = Rng(0x5eed_4321_dcba_0002);
    let mut committed = Model::default();
    let values: Arc<Mutex<HashMap<u128, Vec<Vec<u8>>>>> = Arc::default();
    let mut seq = 0u64;
    let (mut cuts, mut kv_hits, mut live_hits) = (0, 0, 0u64);
    let cuts_wanted = if cfg!(debug_assertions) { 60 } else { 300 };
    while cuts < cuts_wanted {
        let (store, hs) = reopen(dir.path(), &handles);
        handles = hs;
        let store = store.unwrap();
        committed = check(&store, &committed, None);
        // Opened (its header table read) before the cut is armed.
        let kv = store.pool("kv").unwrap();
        let victim = rng.below(handles.len() as u64) as usize;
        handles[victim].arm_cut(1 + rng.below(150), rng.next());
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (pool, values, stop) = (kv.clone(), values.clone(), stop.clone());
                let mut rng = Rng(rng.next() | 1);
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    let mut n = (cuts as u64) << 32 | t << 24;
                    while !stop.load(Ordering::SeqCst) {
                        let keys: Vec<u128> = (0..1 + rng.below(4)).map(|_| rng.below(64) as u128).collect();
                        let mut keys = keys;
                        keys.dedup();
                        if rng.below(2) == 0 {
                            let vals: Vec<Vec<u8>> = keys
                                .iter()
                                .map(|_| {
                                    n += 1;
                                    bytes(n, 1 + rng.below(16384) as usize)
                                })
                                .collect();
                            {
                                let mut v = values.lock().unwrap();
                                for (k, x) in keys.iter().zip(&vals) {
                                    v.entry(*k).or_default().push(x.clone());
                                }
                            }
                            let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                            if pool.put_many(&keys, &refs).is_err() {
                                break;
                            }
                        } else {
                            let mut out = vec![vec![0u8; 16384]; keys.len()];
                            let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
                            let Ok(got) = pool.get_many(&keys, &mut bufs) else { break };
                            let v = values.lock().unwrap();
                            for ((k, h), b) in keys.iter().zip(&got).zip(&out) {
                                if let Some(len) = h {
                                    hits += 1;
                                    assert!(
                                        v[k].iter().any(|x| x[..] == b[..*len]),
                                        "key {k}: a hit beside other threads' bursts returned bytes never put under it"
                                    );
                                }
                            }
                        }
                    }
                    hits
                })
            })
            .collect();
        let mut in_flight: Option<Model> = None;
        loop {
            let name = format!("ck{}", rng.below(2));
            let mut tx = store.begin(&name).unwrap();
            tx.keep_last(2);
            let mut tensors = Vec::new();
            let r = (|| {
                for t in 0..1 + rng.below(3) {
                    seq += 1;
                    let data = bytes(seq, [4096, 70_000, 200_000][rng.below(3) as usize]);
                    tx.put(&format!("t{t}"), b"", &data)?;
                    tensors.push((format!("t{t}"), data));
                }
                let mut next = committed.clone();
                let vs = next.ckpts.entry(name.clone()).or_default();
                vs.push(tensors.clone());
                if vs.len() > 2 {
                    vs.drain(..vs.len() - 2);
                }
                in_flight = Some(next.clone());
                tx.commit()?;
                committed = next;
                in_flight = None;
                Ok::<(), StoreError>(())
            })();
            if r.is_err() || handles.iter().any(MemHandle::is_cut) || rng.below(30) == 0 {
                break;
            }
        }
        cut_all(&handles, &mut rng);
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            live_hits += w.join().unwrap();
        }
        drop(kv);
        drop(store);
        cuts += 1;
        let (store, hs) = reopen(dir.path(), &handles);
        handles = hs;
        let store = store.unwrap();
        committed = check(&store, &committed, in_flight.as_ref());
        kv_hits += check_kv(&store, "kv", 16384, &values.lock().unwrap()).0;
    }
    eprintln!(
        "{cuts} cuts beside KV threads: {live_hits} hits while running and {kv_hits} after restarts checked"
    );
    assert!(live_hits > 0, "gets hit while the threads ran");
    assert!(kv_hits > 0, "KV blocks survived some cuts");
}
