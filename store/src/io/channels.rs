//! The store's I/O channels (SPDK's model): each channel is a whole [`Io`] engine, with a device
//! of its own per member (an io_uring, an NVMe queue pair, a memory device queue: see
//! [`Device::open_channel`](crate::device::Device::open_channel)) and DMA buffers of its own.
//! A burst takes an idle channel, drives it from the calling thread, and gives it back when
//! its guard drops; no channel is held across calls of the store's API. Threads beyond the
//! number of channels wait for one. So bursts of several threads (a KV server's workers, a
//! checkpoint save beside KV gets) are on the devices at the same time, each channel still
//! driven by one thread at a time as a queue pair requires.
//!
//! Taking a channel is a mutex and a pop from a short stack, without allocation; the first
//! channel (the one with the most buffers) is kept on top of the idle ones, so a thread alone
//! always runs on it.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::Io;
use crate::device::DeviceError;
use crate::error::StoreError;

/// The most channels a store opens ([`StoreOptions::io_channels`](crate::StoreOptions::io_channels)).
pub(crate) const MAX_CHANNELS: usize = 64;

/// I/O buffers per namespace of each channel after the first, for `io_buffers` of the first:
/// half as many (at least 2). Bursts of many chunks (checkpoint saves) run on the first
/// channel whenever it is idle.
pub(crate) fn extra_buffers(io_buffers: usize) -> usize {
    (io_buffers / 2).max(2)
}

/// The idle channels, and how many threads wait for one.
struct Idle {
    engines: Vec<Io>,
    waiting: usize,
}

/// The channels of a store; see the module docs.
pub(crate) struct Channels {
    idle: Mutex<Idle>,
    freed: Condvar,
    count: usize,
}

impl Channels {
    /// `first` (channel 0) and up to `want - 1` more channels beside it on the same devices,
    /// with `bufs` buffers per member each. A backend that opens no second channel, or one
    /// that fails to, leaves fewer channels (logged), never an error: the store runs with
    /// what it has.
    pub fn open(first: Io, want: usize, bufs: usize) -> Channels {
        let mut engines: Vec<Io> = Vec::with_capacity(want.max(1));
        for c in 1..want {
            match first.open_channel(bufs, c) {
                Ok(io) => engines.push(io),
                Err(StoreError::Device {
                    device,
                    source: DeviceError::NoChannel(_),
                }) => {
                    log::info!("{device} opens no second I/O channel: the store runs one burst at a time");
                    break;
                }
                Err(e) => {
                    log::warn!("cannot open I/O channel {c} ({e}); the store runs with {c}");
                    break;
                }
            }
        }
        engines.push(first);
        let count = engines.len();
        Channels {
            idle: Mutex::new(Idle { engines, waiting: 0 }),
            freed: Condvar::new(),
            count,
        }
    }

    /// Channels open.
    pub fn count(&self) -> usize {
        self.count
    }

    fn lock(&self) -> MutexGuard<'_, Idle> {
        // Nothing panics while it is held; a poisoned lock still holds a consistent stack.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle channel, waiting for one while all are busy.
    pub fn take(&self) -> Channel<'_> {
        let mut idle = self.lock();
        loop {
            if let Some(io) = idle.engines.pop() {
                return Channel {
                    pool: self,
                    io: Some(io),
                };
            }
            idle.waiting += 1;
            idle = self.freed.wait(idle).unwrap_or_else(|e| e.into_inner());
            idle.waiting -= 1;
        }
    }

    fn give_back(&self, io: Io) {
        let mut idle = self.lock();
        // Channel 0 stays on top (the stack has room for every channel: no allocation).
        match idle.engines.last() {
            Some(top) if top.channel == 0 => {
                let at = idle.engines.len() - 1;
                idle.engines.insert(at, io);
            }
            _ => idle.engines.push(io),
        }
        let wake = idle.waiting > 0;
        drop(idle);
        if wake {
            self.freed.notify_one();
        }
    }
}

/// A channel taken for a burst: the engine, given back when dropped.
pub(crate) struct Channel<'a> {
    pool: &'a Channels,
    io: Option<Io>,
}

impl Deref for Channel<'_> {
    type Target = Io;
    fn deref(&self) -> &Io {
        self.io
            .as_ref()
            .expect("a channel holds its engine until dropped")
    }
}

impl DerefMut for Channel<'_> {
    fn deref_mut(&mut self) -> &mut Io {
        self.io
            .as_mut()
            .expect("a channel holds its engine until dropped")
    }
}

impl Drop for Channel<'_> {
    fn drop(&mut self) {
        if let Some(io) = self.io.take() {
            self.pool.give_back(io);
        }
    }
}
