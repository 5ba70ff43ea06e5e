//! Helpers of the store's integration tests.

#![allow(dead_code)]

use vfpoll_store::device::{Device, MemDevice, MemHandle};
use vfpoll_store::{FormatOptions, Store, StoreOptions};

/// Store options with the lock files in `dir`, and three I/O channels whatever the CPUs (so
/// that the bursts of the tests' threads overlap on the devices).
pub fn opts(dir: &std::path::Path) -> StoreOptions {
    StoreOptions {
        lock_dir: Some(dir.into()),
        io_buffers: 8,
        io_channels: 3,
        ..Default::default()
    }
}

/// Format options with the lock files in `dir` and 64 KiB chunks.
pub fn fopts(dir: &std::path::Path) -> FormatOptions {
    FormatOptions {
        chunk_size: 64 << 10,
        store: opts(dir),
        ..Default::default()
    }
}

/// A store over `n` memory devices of `size` bytes (write cache on).
pub fn mem_store(dir: &std::path::Path, n: usize, size: u64) -> (Store, Vec<MemHandle>) {
    let devs: Vec<MemDevice> = (0..n).map(|_| MemDevice::new(size, 512, true)).collect();
    let handles = devs.iter().map(MemDevice::handle).collect();
    let boxed: Vec<Box<dyn Device>> = devs.into_iter().map(|d| Box::new(d) as Box<dyn Device>).collect();
    (Store::format_devices(boxed, &fopts(dir)).unwrap(), handles)
}

/// Reopens the store over the durable images of `handles` (after a cut, or after dropping the
/// store), in reverse order (members find their places themselves).
pub fn reopen(dir: &std::path::Path, handles: &[MemHandle]) -> (vfpoll_store::Result<Store>, Vec<MemHandle>) {
    let devs: Vec<MemDevice> = handles.iter().rev().map(MemHandle::restart).collect();
    let mut hs: Vec<MemHandle> = devs.iter().map(MemDevice::handle).collect();
    hs.reverse();
    let boxed: Vec<Box<dyn Device>> = devs.into_iter().map(|d| Box::new(d) as Box<dyn Device>).collect();
    (Store::open_devices(boxed, &opts(dir)), hs)
}

/// Deterministic bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
