//! The device layer: one namespace, driven by batches of submitted requests and a poll.
//!
//! [`Device`] is what the store needs from a namespace: its block size and capacity, whether it
//! has a volatile write cache, buffers it can move data into and out of ([`IoBuf`], DMA-able
//! memory), and submit/poll of reads, writes, FUA writes, flushes and deallocates. Backends:
//! - [`UringDevice`]: a Linux file or block device opened with `O_DIRECT`, driven by io_uring;
//! - [`NvmeDevice`]: an NVMe namespace through a vfpoll queue pair (VFIO, or the in-process
//!   NVMe model for tests);
//! - [`MemDevice`]: memory, with a write cache that a power cut ([`MemHandle::cut`]) loses or
//!   tears, for crash tests.
//!
//! [`NamespaceSpec`] parses the strings the CLI, the C API and Python name namespaces with.

mod mem;
mod nvme;
mod spec;
mod uring;

use vfpoll_dma::{DeviceBuf, DmaContext, DmaError, PageSize, RegionBuf};
use vfpoll_nvme::IoBuffer;
use vfpoll_pci::BusAddr;

pub use mem::{CutReport, MemDevice, MemHandle};
pub use nvme::NvmeDevice;
pub(crate) use spec::{open_all, OpenSpecOptions};
pub use spec::{parse_size, NamespaceSpec};
pub use uring::{UringDevice, UringOptions};

/// Errors of a device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device has no room for another request now: poll, then submit again.
    #[error("the device queue is full")]
    QueueFull,
    /// An I/O failed.
    #[error("{device}: {op} of {len} bytes at byte {offset} failed: {detail}")]
    Io {
        /// The device.
        device: String,
        /// "read", "write", "flush", ...
        op: &'static str,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Why.
        detail: String,
    },
    /// A request the device cannot take (misaligned, out of range).
    #[error("{0}")]
    Invalid(String),
    /// The device could not be opened or set up.
    #[error("{0}")]
    Open(String),
    /// DMA memory.
    #[error("DMA memory: {0}")]
    Dma(#[from] DmaError),
    /// The backend opens no second I/O channel on its namespace ([`Device::open_channel`]).
    #[error("{0}: this backend opens no second I/O channel")]
    NoChannel(String),
}

/// A buffer a device can read into and write from: a piece of DMA memory of a fixed capacity,
/// of which the first [`IoBuf::len`] bytes take part in the next request.
///
/// The memory is host memory of the device's DMA context (the store's own buffers), or a piece
/// of a peer device's BAR ([`IoBuf::peer`], the caller's [`DeviceBuf`] lent to one request of
/// a peer-BAR read or write). The CPU reaches the bytes only through copies ([`IoBuf::read`],
/// [`IoBuf::write`]; volatile for a BAR); no reference into the memory is ever made (a device
/// may write it).
#[derive(Debug)]
pub struct IoBuf {
    mem: Mem,
    len: usize,
}

/// Where an [`IoBuf`]'s bytes are.
#[derive(Debug)]
enum Mem {
    Host(RegionBuf),
    Peer(DeviceBuf),
}

impl IoBuf {
    /// A buffer over `buf`, its whole length in use.
    pub fn new(buf: RegionBuf) -> Self {
        let len = buf.len();
        IoBuf {
            mem: Mem::Host(buf),
            len,
        }
    }

    /// A buffer over a piece of a peer device's BAR, its whole length in use: an NVMe
    /// controller whose DMA context registered the BAR moves the data straight into or out of
    /// it. Only [`NvmeDevice`] takes such a buffer; the other backends refuse it (a file
    /// cannot DMA into a BAR).
    pub fn peer(buf: DeviceBuf) -> Self {
        let len = buf.len();
        IoBuf {
            mem: Mem::Peer(buf),
            len,
        }
    }

    /// Whether its bytes are a peer device's BAR ([`IoBuf::peer`]).
    pub fn is_peer(&self) -> bool {
        matches!(self.mem, Mem::Peer(_))
    }

    /// The peer BAR piece back ([`IoBuf::peer`]); the buffer itself if it is host memory.
    pub fn into_peer(self) -> Result<DeviceBuf, IoBuf> {
        match self.mem {
            Mem::Peer(b) => Ok(b),
            mem => Err(IoBuf { mem, len: self.len }),
        }
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes it can hold.
    pub fn capacity(&self) -> usize {
        match &self.mem {
            Mem::Host(b) => b.len(),
            Mem::Peer(b) => b.len(),
        }
    }

    /// Sets the bytes in use (at most the capacity).
    pub fn set_len(&mut self, len: usize) -> Result<(), DeviceError> {
        if len > self.capacity() {
            return Err(DeviceError::Invalid(format!(
                "{len} bytes do not fit a {}-byte buffer",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Copies bytes `off..off + dst.len()` out.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        match &self.mem {
            Mem::Host(b) => Ok(b.read(off, dst)?),
            Mem::Peer(b) => Ok(b.read(off, dst)?),
        }
    }

    /// Copies `src` in at `off`.
    pub fn write(&mut self, off: usize, src: &[u8]) -> Result<(), DeviceError> {
        match &mut self.mem {
            Mem::Host(b) => Ok(b.write(off, src)?),
            Mem::Peer(b) => Ok(b.write(off, src)?),
        }
    }

    /// Sets `len` bytes from `off` to `byte`.
    pub fn fill(&mut self, off: usize, len: usize, byte: u8) -> Result<(), DeviceError> {
        match &mut self.mem {
            Mem::Host(b) => Ok(b.fill(off, len, byte)?),
            Mem::Peer(b) => {
                let block = [byte; 4096];
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(block.len());
                    b.write(off + at, &block[..n])?;
                    at += n;
                }
                Ok(())
            }
        }
    }

    /// The CPU address of the first byte, for a kernel or device that moves the data (never
    /// make a reference from it). For a peer buffer it is the BAR's CPU mapping (MMIO), which
    /// no kernel I/O path may be given: backends other than NVMe refuse peer buffers first.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.mem {
            Mem::Host(b) => b.as_ptr(),
            Mem::Peer(b) => b.as_ptr(),
        }
    }
}

/// Refuses a request whose buffer is a peer BAR, on a backend (`describe`) that cannot DMA
/// into one.
pub(crate) fn refuse_peer(describe: &dyn Fn() -> String, op: &IoOp) -> Result<(), DeviceError> {
    match op {
        IoOp::Read { buf, .. } | IoOp::Write { buf, .. } if buf.is_peer() => Err(DeviceError::Invalid(format!(
            "{}: a peer BAR buffer needs an NVMe namespace through VFIO (vfio:BDF/NSID) in the DMA context that \
             registered the BAR; this backend cannot DMA into a BAR",
            describe()
        ))),
        _ => Ok(()),
    }
}

// SAFETY: the `RegionBuf` or `DeviceBuf` keeps its region (host memory, or a peer BAR whose
// registration guarantees it stays mapped), and so its DMA mapping, alive as long as this
// value, and upholds the contract for its bytes; `len` is at most its length (`set_len`
// checks), and `contiguous_len` is clipped to it.
unsafe impl IoBuffer for IoBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        debug_assert!(off < self.len);
        match &self.mem {
            Mem::Host(b) => b.bus_addr(off),
            Mem::Peer(b) => b.bus_addr(off),
        }
    }
    fn contiguous_len(&self, off: usize) -> usize {
        let c = match &self.mem {
            Mem::Host(b) => b.contiguous_len(off),
            Mem::Peer(b) => b.contiguous_len(off),
        };
        c.min(self.len.saturating_sub(off))
    }
}

/// Carves `count` buffers of `size` bytes (a multiple of 4 KiB) out of one region of `dma`:
/// 2 MiB hugepages where the system has them, else 4 KiB pages.
pub fn alloc_buffers(dma: &DmaContext, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError> {
    if count == 0 || size == 0 || !size.is_multiple_of(4096) {
        return Err(DeviceError::Invalid(format!(
            "{count} buffers of {size} bytes: need at least one, of a non-zero multiple of 4 KiB"
        )));
    }
    let total = count
        .checked_mul(size)
        .ok_or_else(|| DeviceError::Invalid("buffer memory overflows".into()))?;
    let region = match dma.alloc_region(total, PageSize::Huge2M) {
        Ok(r) => r,
        Err(e) => {
            log::debug!("no 2 MiB hugepages for {total} bytes of I/O buffers ({e}); using 4 KiB pages");
            dma.alloc_region(total, PageSize::Base4K)?
        }
    };
    let mut rest = RegionBuf::whole(region);
    Ok((0..count)
        .map(|_| {
            let next = rest.split_off(size);
            IoBuf::new(std::mem::replace(&mut rest, next))
        })
        .collect())
}

/// What a request does.
#[derive(Debug)]
pub enum IoOp {
    /// Read `buf.len()` bytes at byte `offset` into `buf`.
    Read {
        /// Byte offset (a multiple of the block size).
        offset: u64,
        /// Where the bytes go.
        buf: IoBuf,
    },
    /// Write `buf.len()` bytes of `buf` at byte `offset`; with `fua`, durable when it completes
    /// (NVMe Force Unit Access, `RWF_DSYNC`).
    Write {
        /// Byte offset (a multiple of the block size).
        offset: u64,
        /// The bytes.
        buf: IoBuf,
        /// Force Unit Access.
        fua: bool,
    },
    /// Make every write completed before it durable (NVMe Flush, `fdatasync`).
    Flush,
    /// Deallocate (trim) `len` bytes at `offset`: they read back as zeroes or old data, and the
    /// device may reclaim them.
    Deallocate {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

impl IoOp {
    /// The operation's name.
    pub fn name(&self) -> &'static str {
        match self {
            IoOp::Read { .. } => "read",
            IoOp::Write { fua: false, .. } => "write",
            IoOp::Write { fua: true, .. } => "FUA write",
            IoOp::Flush => "flush",
            IoOp::Deallocate { .. } => "deallocate",
        }
    }

    /// Byte offset and length (0, 0 for a flush).
    pub fn range(&self) -> (u64, u64) {
        match self {
            IoOp::Read { offset, buf } | IoOp::Write { offset, buf, .. } => (*offset, buf.len() as u64),
            IoOp::Flush => (0, 0),
            IoOp::Deallocate { offset, len } => (*offset, *len),
        }
    }

    /// Takes the buffer out, if it has one.
    pub fn into_buf(self) -> Option<IoBuf> {
        match self {
            IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => Some(buf),
            _ => None,
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct IoDone {
    /// The tag given at submit.
    pub tag: u64,
    /// How it went.
    pub result: Result<(), DeviceError>,
    /// The buffer given at submit (`None` for requests without one; also `None` when the device
    /// kept a buffer it may still write into, which is then leaked, never reused).
    pub buf: Option<IoBuf>,
}

/// One namespace, through one I/O channel (a ring, a queue pair). Driven by one thread at a
/// time: submit, then poll. [`Device::open_channel`] opens another channel on the same
/// namespace, for another thread.
pub trait Device: Send {
    /// What it is, for messages ("file /data/store.img", "NVMe 0000:00:03.0 namespace 1").
    fn describe(&self) -> String;
    /// Bytes per logical block (offsets and lengths are multiples of it).
    fn block_size(&self) -> u32;
    /// Bytes of the namespace.
    fn capacity(&self) -> u64;
    /// Whether completed writes may sit in a volatile cache until a flush.
    fn volatile_write_cache(&self) -> bool;
    /// `count` buffers of `size` bytes this device can read into and write from.
    fn alloc_buffers(&self, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError>;
    /// Requests it can have in flight.
    fn queue_depth(&self) -> usize;
    /// Starts `op`; `tag` comes back in its [`IoDone`]. A refused request comes back with the
    /// error ([`DeviceError::QueueFull`]: poll and try again).
    #[allow(
        clippy::result_large_err,
        reason = "the request comes back by value so its buffer is never lost; boxing would allocate at every full queue"
    )]
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (DeviceError, IoOp)>;
    /// Makes the requests submitted since the last call visible to the device (one doorbell or
    /// `io_uring_enter` per batch).
    fn kick(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Appends finished requests to `done`; returns how many.
    fn poll(&mut self, done: &mut Vec<IoDone>) -> usize;
    /// Requests submitted and not yet reported by `poll`.
    fn outstanding(&self) -> usize;
    /// Sleeps until a completion may have arrived (at most `timeout`); devices that cannot
    /// sleep return at once.
    fn wait(&mut self, _timeout: std::time::Duration) {}
    /// Another channel on the same namespace: a device of its own (its own io_uring, NVMe
    /// queue pair, or memory device queue) that another thread drives while this one is
    /// busy, with the same block size, capacity and write cache. Both see each other's
    /// completed writes, and a flush through either covers the writes completed through
    /// both (NVMe Flush is per namespace, `fdatasync` per file), as the store's commits need.
    ///
    /// The default says the backend cannot ([`DeviceError::NoChannel`]): the store then runs
    /// every burst on one channel.
    fn open_channel(&self) -> Result<Box<dyn Device>, DeviceError> {
        Err(DeviceError::NoChannel(self.describe()))
    }
    /// The DMA context its controller moves data through, where a peer device's BAR
    /// registered in it ([`DmaContext::register_peer_bar`]) can be read into and written from
    /// directly ([`IoBuf::peer`]): NVMe namespaces only. `None` (the default): the backend
    /// cannot DMA into a BAR (io_uring files, memory).
    fn dma_context(&self) -> Option<DmaContext> {
        None
    }
}
