//! DMA buffer pools for C: a [`DmaPool`] and one handle per buffer, made with the pool, so
//! taking and giving back a buffer never allocates. A handle's state says who owns the buffer:
//! the caller, a queue pair (in flight: it cannot be read, written, freed or submitted again
//! until its completion gives it back), or nobody any more (lost after an unrecoverable
//! failure: the device might still write to it, so it never returns to the pool).
//!
//! Everything here is single-threaded by contract (a pool, its buffers and the queue pairs that
//! use them belong to one thread at a time), hence `Rc` and `RefCell`: a `RefCell` turns a
//! contract broken from C into a caught panic rather than two live `&mut`.

#![allow(non_camel_case_types)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use libc::{EBUSY, EINVAL, ENOBUFS};
use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvme::IoBuffer;
use vfpoll_pci::BusAddr;

use crate::env::{vfpoll_ctrl, Env};
use crate::error::{Error, Res};

/// Who holds a buffer.
#[derive(Debug, Default)]
enum Slot {
    /// In the pool's free list; its handle is not valid.
    #[default]
    Free,
    /// The caller's.
    Held(DmaBuf),
    /// A queue pair's, until its completion.
    InFlight,
    /// Never coming back (see the module docs); the handle is valid until freed.
    Lost,
}

/// What a pool's handles and the requests in flight share.
pub(crate) struct PoolShared {
    dma: RefCell<DmaPool>,
    slots: Box<[RefCell<Slot>]>,
    /// Handles allocated and not freed.
    out: Cell<usize>,
    /// Of those, the ones in flight.
    in_flight: Cell<usize>,
    pub env: Arc<Env>,
}

/// A pool of DMA buffers: see `vfpoll_pool_create`.
pub struct vfpoll_pool {
    shared: Rc<PoolShared>,
    /// One handle per buffer, by index; C's `vfpoll_buf *` point into this slice.
    bufs: Box<[vfpoll_buf]>,
}

/// A DMA buffer of a pool: see `vfpoll_buf_alloc`.
pub struct vfpoll_buf {
    shared: Rc<PoolShared>,
    index: u32,
}

/// A buffer lent to a queue pair: the pool's buffer, of which a command uses the first `len`
/// bytes.
#[derive(Debug)]
pub(crate) struct Sub {
    buf: DmaBuf,
    len: usize,
}

// SAFETY: `Sub` only narrows a `DmaBuf`, whose `IoBuffer` guarantees hold for all of its
// `DmaBuf::len()` bytes: `len` is checked to be at most that when a `Sub` is made (`take`) and
// never changes, so every `off < len` is an address of the buffer, and the `len - off` bytes
// from it are contiguous because the whole buffer is.
unsafe impl IoBuffer for Sub {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        debug_assert!(off < self.len);
        IoBuffer::bus_addr(&self.buf, off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len - off
    }
}

/// A buffer in flight, as a request remembers it.
pub(crate) struct BufRef {
    shared: Rc<PoolShared>,
    index: u32,
}

impl BufRef {
    /// The completion gives the buffer back (`None`: lost). Returns whether it was lost.
    pub fn give_back(self, sub: Option<Sub>) -> bool {
        let slot = &self.shared.slots[self.index as usize];
        let lost = sub.is_none();
        *slot.borrow_mut() = match sub {
            Some(s) => Slot::Held(s.buf),
            None => Slot::Lost,
        };
        self.shared.in_flight.set(self.shared.in_flight.get() - 1);
        lost
    }
}

impl vfpoll_pool {
    /// `count` buffers of `buf_size` bytes, for the controllers of `ctrl`'s environment.
    pub(crate) fn new(ctrl: &vfpoll_ctrl, buf_size: usize, count: usize) -> Res<Self> {
        let dma = ctrl.ctrl.dma().pool(buf_size, count, ctrl.env.page_size)?;
        let shared = Rc::new(PoolShared {
            slots: (0..count).map(|_| RefCell::new(Slot::Free)).collect(),
            dma: RefCell::new(dma),
            out: Cell::new(0),
            in_flight: Cell::new(0),
            env: Arc::clone(&ctrl.env),
        });
        let bufs = (0..count as u32)
            .map(|index| vfpoll_buf {
                shared: Rc::clone(&shared),
                index,
            })
            .collect();
        Ok(vfpoll_pool { shared, bufs })
    }

    /// Takes a free buffer.
    pub(crate) fn alloc(&self) -> Res<&vfpoll_buf> {
        let s = &self.shared;
        let Some(buf) = s.dma.borrow_mut().alloc() else {
            return Err(Error::new(
                ENOBUFS,
                format!(
                    "all {} buffers of the pool are allocated{}: free one (vfpoll_buf_free) or make a larger pool",
                    self.bufs.len(),
                    match s.in_flight.get() {
                        0 => String::new(),
                        n => format!(" ({n} in flight: poll for their completions)"),
                    }
                ),
            ));
        };
        let index = buf.index();
        *s.slots[index].borrow_mut() = Slot::Held(buf);
        s.out.set(s.out.get() + 1);
        Ok(&self.bufs[index])
    }

    /// Bytes per buffer.
    pub(crate) fn buf_size(&self) -> usize {
        self.shared.dma.borrow().buf_size()
    }

    /// Buffers free now.
    pub(crate) fn available(&self) -> usize {
        self.shared.dma.borrow().available()
    }

    /// Whether the pool may be destroyed: no handle is out.
    pub(crate) fn check_idle(&self) -> Res<()> {
        match (self.shared.out.get(), self.shared.in_flight.get()) {
            (0, _) => Ok(()),
            (n, 0) => Err(Error::new(
                EBUSY,
                format!("{n} buffers of the pool are still allocated: free them (vfpoll_buf_free) first"),
            )),
            (n, f) => Err(Error::new(
                EBUSY,
                format!(
                    "{n} buffers of the pool are still allocated, {f} of them in flight: poll their queue pairs until the completions are back, free the buffers, then destroy the pool"
                ),
            )),
        }
    }
}

impl vfpoll_buf {
    fn slot(&self) -> &RefCell<Slot> {
        &self.shared.slots[self.index as usize]
    }

    /// The caller's buffer, or why it is not the caller's to use.
    fn held<T>(&self, f: impl FnOnce(&DmaBuf) -> Res<T>) -> Res<T> {
        match &*self.slot().borrow() {
            Slot::Held(b) => f(b),
            other => Err(self.not_held(other)),
        }
    }

    fn not_held(&self, s: &Slot) -> Error {
        let i = self.index;
        match s {
            Slot::InFlight => Error::new(
                EBUSY,
                format!("buffer {i} is in flight: it belongs to a queue pair until its completion has been polled"),
            ),
            Slot::Free => Error::inval(format!(
                "buffer {i} is not allocated (freed already?): allocate buffers with vfpoll_buf_alloc"
            )),
            Slot::Lost => Error::new(
                libc::EIO,
                format!("buffer {i} was lost after an unrecoverable failure (its completion said buffer_lost); free its handle"),
            ),
            Slot::Held(_) => unreachable!("held buffers are not refused"),
        }
    }

    /// Whether this buffer's pool belongs to `env`.
    pub(crate) fn in_env(&self, env: &Arc<Env>) -> Res<()> {
        if Arc::ptr_eq(&self.shared.env, env) {
            Ok(())
        } else {
            Err(Error::inval(format!(
                "buffer {} belongs to a pool of another environment: the controller cannot reach it",
                self.index
            )))
        }
    }

    /// Gives the buffer back to its pool. A lost buffer's handle is retired instead.
    pub(crate) fn free(&self) -> Res<()> {
        let s = &self.shared;
        let mut slot = self.slot().borrow_mut();
        match std::mem::take(&mut *slot) {
            Slot::Held(b) => s.dma.borrow_mut().free(b),
            // Stays out of the pool's free list for good: the device may still write to it.
            Slot::Lost => {}
            other => {
                let e = self.not_held(&other);
                *slot = other;
                return Err(e);
            }
        }
        s.out.set(s.out.get() - 1);
        Ok(())
    }

    /// Bytes in the buffer.
    pub(crate) fn size(&self) -> Res<usize> {
        self.held(|b| Ok(b.len()))
    }

    /// Copies `src` into the buffer at `off`.
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> Res<()> {
        self.held(|b| Ok(self.shared.dma.borrow_mut().write(b, off, src)?))
    }

    /// Copies from the buffer at `off` into `dst`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Res<()> {
        self.held(|b| Ok(self.shared.dma.borrow().read(b, off, dst)?))
    }

    /// The buffer's start in the CPU's address space.
    pub(crate) fn data_ptr(&self) -> Res<*mut u8> {
        self.held(|b| Ok(b.as_ptr()))
    }

    /// Lends the buffer's first `len` bytes to a command.
    pub(crate) fn take(&self, len: usize) -> Res<Sub> {
        let mut slot = self.slot().borrow_mut();
        let size = match &*slot {
            Slot::Held(b) => b.len(),
            other => return Err(self.not_held(other)),
        };
        if len == 0 || len > size {
            return Err(Error::new(
                EINVAL,
                format!(
                    "transfer length {len} does not fit buffer {} of {size} bytes (1..={size})",
                    self.index
                ),
            ));
        }
        let Slot::Held(buf) = std::mem::replace(&mut *slot, Slot::InFlight) else {
            unreachable!("checked above")
        };
        self.shared.in_flight.set(self.shared.in_flight.get() + 1);
        Ok(Sub { buf, len })
    }

    /// A submission was refused: the buffer is the caller's again.
    pub(crate) fn untake(&self, sub: Sub) {
        *self.slot().borrow_mut() = Slot::Held(sub.buf);
        self.shared.in_flight.set(self.shared.in_flight.get() - 1);
    }

    /// What a request keeps to give the buffer back at completion.
    pub(crate) fn by_ref(&self) -> BufRef {
        BufRef {
            shared: Rc::clone(&self.shared),
            index: self.index,
        }
    }
}
