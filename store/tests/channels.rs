//! I/O channels (`StoreOptions::io_channels`): with several, a KV get and a checkpoint read
//! complete while another thread's burst is held on the devices; with one, they wait for it.
//! A backend that opens no second channel runs with one; a count out of range is refused.
//!
//! The devices are memory devices behind a gate that holds every write submitted while it is
//! closed (in flight, not completed) until it opens: a burst with a write stays on its channel.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{bytes, fopts};
use vfpoll_store::device::{Device, DeviceError, IoBuf, IoDone, IoOp, MemDevice};
use vfpoll_store::{Store, StoreError};

/// Shared by the gated devices of a store, all their channels.
#[derive(Default)]
struct Gate {
    closed: AtomicBool,
    /// Writes held now.
    held: AtomicUsize,
}

impl Gate {
    /// Waits until a write is held (a burst is on the devices and cannot finish).
    fn wait_held(&self) {
        let start = Instant::now();
        while self.held.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(20), "no write was held");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A device whose writes wait at the gate while it is closed.
struct Gated {
    inner: Box<dyn Device>,
    gate: Arc<Gate>,
    held: VecDeque<(u64, IoOp)>,
    /// Whether another channel may be opened (false: the trait's default answer).
    channels: bool,
}

impl Gated {
    fn boxed(inner: Box<dyn Device>, gate: &Arc<Gate>, channels: bool) -> Box<dyn Device> {
        Box::new(Gated {
            inner,
            gate: gate.clone(),
            held: VecDeque::new(),
            channels,
        })
    }
}

impl Device for Gated {
    fn describe(&self) -> String {
        format!("gated {}", self.inner.describe())
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn volatile_write_cache(&self) -> bool {
        self.inner.volatile_write_cache()
    }
    fn alloc_buffers(&self, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError> {
        self.inner.alloc_buffers(count, size)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (DeviceError, IoOp)> {
        if matches!(op, IoOp::Write { .. }) && self.gate.closed.load(Ordering::SeqCst) {
            self.held.push_back((tag, op));
            self.gate.held.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        self.inner.submit(tag, op)
    }
    fn kick(&mut self) -> Result<(), DeviceError> {
        self.inner.kick()
    }
    fn poll(&mut self, done: &mut Vec<IoDone>) -> usize {
        let mut n = 0;
        if !self.gate.closed.load(Ordering::SeqCst) && !self.held.is_empty() {
            while let Some((tag, op)) = self.held.pop_front() {
                match self.inner.submit(tag, op) {
                    Ok(()) => {}
                    Err((DeviceError::QueueFull, op)) => {
                        self.held.push_front((tag, op));
                        break;
                    }
                    Err((e, op)) => {
                        n += 1;
                        done.push(IoDone {
                            tag,
                            result: Err(e),
                            buf: op.into_buf(),
                        });
                    }
                }
                self.gate.held.fetch_sub(1, Ordering::SeqCst);
            }
            if let Err(e) = self.inner.kick() {
                panic!("kick: {e}");
            }
        }
        n + self.inner.poll(done)
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.held.len()
    }
    fn wait(&mut self, timeout: Duration) {
        if self.held.is_empty() {
            self.inner.wait(timeout);
        } else {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
    }
    fn open_channel(&self) -> Result<Box<dyn Device>, DeviceError> {
        if !self.channels {
            return Err(DeviceError::NoChannel(self.describe()));
        }
        Ok(Gated::boxed(self.inner.open_channel()?, &self.gate, true))
    }
}

/// A store over two gated memory devices with `channels` I/O channels.
fn gated_store(dir: &std::path::Path, channels: usize) -> (Store, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let devs: Vec<Box<dyn Device>> = (0..2)
        .map(|_| Gated::boxed(Box::new(MemDevice::new(16 << 20, 512, true)), &gate, true))
        .collect();
    let mut o = fopts(dir);
    o.store.io_channels = channels;
    let store = Store::format_devices(devs, &o).unwrap();
    assert_eq!(store.info().io_channels, channels);
    (store, gate)
}

/// A KV get of a block put earlier, on another thread, while a put's burst is held on the
/// devices: with two channels it completes (a hit, the right bytes) while the put is still
/// held; with one it cannot complete until the put's burst does.
#[test]
fn a_get_completes_while_a_puts_burst_is_held_on_another_channel() {
    for channels in [2, 1] {
        let dir = tempfile::tempdir().unwrap();
        let (store, gate) = gated_store(dir.path(), channels);
        let pool = store.create_pool("kv", 16384, 64).unwrap();
        let a = bytes(1, 16384);
        pool.put_many(&[1], &[&a]).unwrap();
        gate.closed.store(true, Ordering::SeqCst);
        let put = {
            let pool = pool.clone();
            std::thread::spawn(move || pool.put_many(&[2], &[&bytes(2, 16384)]))
        };
        gate.wait_held();
        let (tx, rx) = mpsc::channel();
        let getter = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut out = vec![0u8; 16384];
                let hits = pool.get_many(&[1], &mut [&mut out[..]]);
                tx.send((hits, out)).unwrap();
            })
        };
        let got = if channels > 1 {
            let got = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the get completes on its own channel while the put's burst is held");
            assert!(!put.is_finished(), "the put is still held");
            assert!(gate.held.load(Ordering::SeqCst) > 0);
            gate.closed.store(false, Ordering::SeqCst);
            got
        } else {
            // The put's burst holds the only channel and cannot finish while the gate is
            // closed: the get cannot have completed, however long this waits.
            assert!(
                rx.recv_timeout(Duration::from_millis(300)).is_err(),
                "with one channel a get waits for the burst before it"
            );
            gate.closed.store(false, Ordering::SeqCst);
            rx.recv_timeout(Duration::from_secs(20))
                .expect("the get completes once the put's burst has")
        };
        let (hits, out) = got;
        assert_eq!(hits.unwrap(), vec![Some(16384)], "{channels} channel(s)");
        assert_eq!(out, a);
        put.join().unwrap().unwrap();
        getter.join().unwrap();
        let mut out = vec![0u8; 16384];
        assert_eq!(
            pool.get_many(&[2], &mut [&mut out[..]]).unwrap(),
            vec![Some(16384)]
        );
        assert_eq!(out, bytes(2, 16384));
        assert!(store.fsck().unwrap().is_clean());
    }
}

/// A checkpoint reader on another thread while a save's writes are held on the devices: it
/// reads the committed version, whole, while the save is still held; the save then commits
/// and readers see the new version.
#[test]
fn a_checkpoint_read_completes_during_a_held_save_and_sees_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path(), 3);
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"", &bytes(1, 300_000)).unwrap();
    let v1 = tx.commit().unwrap().version;
    gate.closed.store(true, Ordering::SeqCst);
    let saver = {
        let store = store.clone();
        std::thread::spawn(move || {
            let mut tx = store.begin("m")?;
            tx.put("w", b"", &bytes(2, 300_000))?;
            tx.commit().map(|c| c.version)
        })
    };
    gate.wait_held();
    let (tx, rx) = mpsc::channel();
    let reader = {
        let store = store.clone();
        std::thread::spawn(move || {
            let r = store.open_version("m", None).unwrap();
            tx.send((r.version(), r.read_to_vec("w").unwrap())).unwrap();
        })
    };
    let (v, data) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the read completes on its own channel while the save is held");
    assert!(!saver.is_finished(), "the save is still held");
    assert_eq!(v, v1);
    assert_eq!(data, bytes(1, 300_000));
    gate.closed.store(false, Ordering::SeqCst);
    let v2 = saver.join().unwrap().unwrap();
    reader.join().unwrap();
    let r = store.open_version("m", None).unwrap();
    assert_eq!(
        (r.version(), r.read_to_vec("w").unwrap()),
        (v2, bytes(2, 300_000))
    );
    assert!(store.fsck().unwrap().is_clean());
}

/// A backend that opens no second channel (the trait's default) runs with one, and works;
/// a channel count out of range is refused before any I/O, saying what to use.
#[test]
fn a_backend_without_channels_runs_with_one_and_bad_counts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let devs: Vec<Box<dyn Device>> = vec![
        Gated::boxed(Box::new(MemDevice::new(16 << 20, 512, true)), &gate, true),
        Gated::boxed(Box::new(MemDevice::new(16 << 20, 512, true)), &gate, false),
    ];
    let mut o = fopts(dir.path());
    o.store.io_channels = 4;
    let store = Store::format_devices(devs, &o).unwrap();
    assert_eq!(store.info().io_channels, 1);
    let pool = store.create_pool("kv", 4096, 8).unwrap();
    pool.put_many(&[5], &[&bytes(5, 4096)]).unwrap();
    let mut out = vec![0u8; 4096];
    assert_eq!(
        pool.get_many(&[5], &mut [&mut out[..]]).unwrap(),
        vec![Some(4096)]
    );
    assert_eq!(out, bytes(5, 4096));
    drop(pool);
    drop(store);
    for bad in [0, 65] {
        let devs: Vec<Box<dyn Device>> = vec![Box::new(MemDevice::new(16 << 20, 512, true))];
        let mut o = fopts(dir.path());
        o.store.io_channels = bad;
        match Store::format_devices(devs, &o) {
            Err(StoreError::Invalid(m)) => {
                assert!(m.contains("I/O channels") && m.contains("1 to 64"), "{m}")
            }
            other => panic!("{bad} channels: {other:?}"),
        }
    }
}
