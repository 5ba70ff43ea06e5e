//! [`UringDevice`]: a Linux file or block device opened with `O_DIRECT` and driven by io_uring
//! (the `io-uring` crate): reads and writes go straight between the store's buffers and the
//! device, a flush is `fdatasync` (`IORING_OP_FSYNC` with `DATASYNC`), a FUA write is a write
//! with `RWF_DSYNC`, and a deallocate punches a hole (`fallocate(PUNCH_HOLE | KEEP_SIZE)`, which
//! block devices turn into a discard).
//!
//! This module holds the crate's io_uring calls: pushing an entry is `unsafe` because the kernel
//! reads or writes the buffer until the entry completes. Every buffer stays in the device's
//! in-flight table until its completion is reaped, and dropping the device waits for the
//! completions (or leaks the buffers), so the kernel never reaches freed memory.
//!
//! Another I/O channel ([`Device::open_channel`]) is a ring of its own on a duplicate of the
//! file descriptor (one open file, so the same `O_DIRECT` mode); `fdatasync` through any of
//! them makes the file's completed writes durable, whichever ring wrote them.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use io_uring::{opcode, types, IoUring};
use vfpoll_dma::DmaContext;

use super::{alloc_buffers, Device, DeviceError, IoBuf, IoDone, IoOp};

/// How a [`UringDevice`] is opened.
#[derive(Debug, Clone)]
pub struct UringOptions {
    /// For a regular file: create it if missing and grow it to this many bytes.
    pub create_size: Option<u64>,
    /// When the file system refuses `O_DIRECT` (tmpfs, some FUSE and overlay mounts), open
    /// without it (through the page cache) instead of failing. Durability is kept (flushes
    /// and FUA writes still reach the disk); speed and CPU use are not those of direct I/O.
    pub allow_buffered: bool,
    /// Entries of the ring (requests in flight).
    pub queue_depth: u32,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            create_size: None,
            allow_buffered: false,
            queue_depth: 128,
        }
    }
}

/// A file or block device through io_uring; see the module docs.
pub struct UringDevice {
    path: PathBuf,
    file: File,
    ring: IoUring,
    block_device: bool,
    direct: bool,
    capacity: u64,
    block_size: u32,
    /// Per ring slot: the tag and the request in flight (its buffer stays here until reaped).
    inflight: Vec<Option<(u64, IoOp)>>,
    free: Vec<usize>,
    unsubmitted: usize,
    dma: DmaContext,
    warned_dealloc: bool,
}

impl std::fmt::Debug for UringDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDevice")
            .field("path", &self.path)
            .field("direct", &self.direct)
            .field("capacity", &self.capacity)
            .finish()
    }
}

fn open_err(path: &Path, what: &str, e: std::io::Error) -> DeviceError {
    DeviceError::Open(format!("{}: {what}: {e}", path.display()))
}

impl UringDevice {
    /// Opens `path` (a regular file or a block device); see [`UringOptions`].
    pub fn open(path: &Path, opts: &UringOptions) -> Result<Self, DeviceError> {
        let meta = std::fs::metadata(path);
        let block_device = meta.as_ref().is_ok_and(|m| m.file_type().is_block_device());
        if !block_device {
            if let Some(size) = opts.create_size {
                let f = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(path)
                    .map_err(|e| open_err(path, "cannot create", e))?;
                let len = f.metadata().map_err(|e| open_err(path, "stat", e))?.len();
                if len < size {
                    f.set_len(size).map_err(|e| open_err(path, "cannot size", e))?;
                }
            } else if let Err(e) = &meta {
                return Err(DeviceError::Open(format!(
                    "{}: {e} (`vfpoll store format` and `store bench` create a file given its size: \
                     file:{}?size=4G)",
                    path.display(),
                    path.display()
                )));
            }
        }
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        // O_EXCL on a block device: exclusive open, refused while mounted or opened so by
        // another process.
        let excl = if block_device { libc::O_EXCL } else { 0 };
        let (file, direct) = match o.clone().custom_flags(libc::O_DIRECT | excl).open(path) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !opts.allow_buffered {
                    return Err(DeviceError::Open(format!(
                        "{}: this file system refuses O_DIRECT (tmpfs, overlayfs or FUSE?): put the store on a \
                         file system that supports direct I/O (ext4, xfs) or a block device, or allow buffered I/O \
                         (StoreOptions::allow_buffered_io)",
                        path.display()
                    )));
                }
                log::warn!("{}: O_DIRECT refused; using buffered I/O", path.display());
                (
                    o.custom_flags(excl)
                        .open(path)
                        .map_err(|e| open_err(path, "cannot open", e))?,
                    false,
                )
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(DeviceError::Open(format!(
                    "{}: the block device is busy (mounted, or opened exclusively by another process)",
                    path.display()
                )))
            }
            Err(e) => return Err(open_err(path, "cannot open", e)),
        };
        let (capacity, block_size) = if block_device {
            let cap = (&file)
                .seek(SeekFrom::End(0))
                .map_err(|e| open_err(path, "cannot size", e))?;
            let rdev = file.metadata().map_err(|e| open_err(path, "stat", e))?.rdev();
            (cap, logical_block_size(rdev).unwrap_or(512))
        } else {
            (
                file.metadata().map_err(|e| open_err(path, "stat", e))?.len(),
                4096,
            )
        };
        let ring = IoUring::new(opts.queue_depth.max(8))
            .map_err(|e| open_err(path, "cannot set up an io_uring (kernel 5.6 or later needed)", e))?;
        let depth = opts.queue_depth.max(8) as usize;
        Ok(UringDevice {
            path: path.to_path_buf(),
            file,
            ring,
            block_device,
            direct,
            capacity,
            block_size,
            inflight: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            unsubmitted: 0,
            dma: DmaContext::for_testing(),
            warned_dealloc: false,
        })
    }

    /// Whether the device was opened with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Another channel: a new ring of the same depth on a duplicate of the descriptor.
    fn channel(&self) -> Result<Self, DeviceError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| open_err(&self.path, "cannot duplicate the descriptor", e))?;
        let depth = self.inflight.len();
        let ring = IoUring::new(depth as u32)
            .map_err(|e| open_err(&self.path, "cannot set up another io_uring", e))?;
        Ok(UringDevice {
            path: self.path.clone(),
            file,
            ring,
            block_device: self.block_device,
            direct: self.direct,
            capacity: self.capacity,
            block_size: self.block_size,
            inflight: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            unsubmitted: 0,
            dma: self.dma.clone(),
            warned_dealloc: self.warned_dealloc,
        })
    }

    fn entry(&self, slot: usize, op: &IoOp) -> io_uring::squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let e = match op {
            IoOp::Read { offset, buf } => opcode::Read::new(fd, buf.as_ptr(), buf.len() as u32)
                .offset(*offset)
                .build(),
            IoOp::Write { offset, buf, fua } => opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32)
                .offset(*offset)
                .rw_flags(if *fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            IoOp::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            IoOp::Deallocate { offset, len } => opcode::Fallocate::new(fd, *len)
                .offset(*offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
        };
        e.user_data(slot as u64)
    }
}

fn logical_block_size(rdev: u64) -> Option<u32> {
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let base = format!("/sys/dev/block/{maj}:{min}");
    for p in [
        format!("{base}/queue/logical_block_size"),
        format!("{base}/../queue/logical_block_size"),
    ] {
        if let Ok(s) = std::fs::read_to_string(p) {
            return s.trim().parse().ok();
        }
    }
    None
}

impl Device for UringDevice {
    fn describe(&self) -> String {
        let kind = if self.block_device { "block device" } else { "file" };
        let mode = if self.direct { "" } else { ", buffered" };
        format!("{kind} {}{mode}", self.path.display())
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn volatile_write_cache(&self) -> bool {
        // The disk under a file may cache writes, and the page cache does without O_DIRECT;
        // fdatasync is cheap where there is nothing to flush.
        true
    }
    fn alloc_buffers(&self, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError> {
        alloc_buffers(&self.dma, count, size)
    }
    fn queue_depth(&self) -> usize {
        self.inflight.len()
    }
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (DeviceError, IoOp)> {
        if let Err(e) = super::refuse_peer(&|| self.describe(), &op) {
            return Err((e, op));
        }
        let (off, len) = op.range();
        let bs = self.block_size as u64;
        let bad_range = off.checked_add(len).is_none_or(|e| e > self.capacity);
        if (matches!(op, IoOp::Read { .. } | IoOp::Write { .. }) && (len > u32::MAX as u64 || len == 0))
            || !off.is_multiple_of(bs)
            || !len.is_multiple_of(bs)
            || bad_range
        {
            let e = DeviceError::Invalid(format!(
                "{}: {} of {len} bytes at {off}: not whole {bs}-byte blocks inside its {} bytes",
                self.describe(),
                op.name(),
                self.capacity
            ));
            return Err((e, op));
        }
        let Some(slot) = self.free.pop() else {
            return Err((DeviceError::QueueFull, op));
        };
        let entry = self.entry(slot, &op);
        // SAFETY: the entry points at `op`'s buffer (or none), which moves into `inflight[slot]`
        // right below and stays there, untouched, until its completion is reaped in `poll`;
        // `Drop` waits for outstanding completions or leaks the buffers. The fd is `self.file`,
        // open for as long as the ring.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The submission queue is full of entries not yet handed to the kernel.
            if let Err(e) = self.ring.submit() {
                log::debug!("{}: io_uring_enter: {e}", self.describe());
            }
            self.unsubmitted = 0;
            self.free.push(slot);
            return Err((DeviceError::QueueFull, op));
        }
        self.inflight[slot] = Some((tag, op));
        self.unsubmitted += 1;
        Ok(())
    }
    fn kick(&mut self) -> Result<(), DeviceError> {
        if self.unsubmitted > 0 {
            self.ring.submit().map_err(|e| DeviceError::Io {
                device: self.describe(),
                op: "io_uring_enter",
                offset: 0,
                len: 0,
                detail: e.to_string(),
            })?;
            self.unsubmitted = 0;
        }
        Ok(())
    }
    fn poll(&mut self, done: &mut Vec<IoDone>) -> usize {
        if self.unsubmitted > 0 {
            if let Err(e) = self.kick() {
                log::warn!("{e}");
            }
        }
        let mut n = 0;
        // A polling loop calls this often: nothing is allocated unless something completed.
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        if cqes.is_empty() {
            return 0;
        }
        let describe = self.describe();
        for (slot, res) in cqes {
            let slot = slot as usize;
            let Some((tag, op)) = self.inflight.get_mut(slot).and_then(Option::take) else {
                log::error!("{describe}: completion for ring slot {slot}, which has nothing in flight");
                continue;
            };
            self.free.push(slot);
            n += 1;
            let (offset, len) = op.range();
            let name = op.name();
            let fail = |detail: String| {
                Err(DeviceError::Io {
                    device: describe.clone(),
                    op: name,
                    offset,
                    len,
                    detail,
                })
            };
            let result = if res < 0 {
                let errno = -res;
                if matches!(op, IoOp::Deallocate { .. })
                    && (errno == libc::EOPNOTSUPP || errno == libc::ENOTSUP)
                {
                    if !self.warned_dealloc {
                        log::info!("{describe}: deallocate is not supported; space stays allocated");
                        self.warned_dealloc = true;
                    }
                    Ok(())
                } else {
                    fail(std::io::Error::from_raw_os_error(errno).to_string())
                }
            } else if matches!(op, IoOp::Read { .. } | IoOp::Write { .. }) && res as u64 != len {
                fail(format!("short transfer: {res} bytes"))
            } else {
                Ok(())
            };
            done.push(IoDone {
                tag,
                result,
                buf: op.into_buf(),
            });
        }
        n
    }
    fn outstanding(&self) -> usize {
        self.inflight.len() - self.free.len()
    }
    fn open_channel(&self) -> Result<Box<dyn Device>, DeviceError> {
        Ok(Box::new(self.channel()?))
    }
    fn wait(&mut self, timeout: Duration) {
        if self.outstanding() > 0 {
            // With IORING_FEAT_EXT_ARG (Linux 5.11) the wait ends after `timeout` (ETIME) even
            // if nothing completed, so a caller with other work (copies, other members) is not
            // held; older kernels wait for a completion.
            let r = if self.ring.params().is_feature_ext_arg() {
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            } else {
                self.ring.submit_and_wait(1)
            };
            match r {
                Err(e) if e.raw_os_error() != Some(libc::ETIME) => {
                    log::debug!("{}: io_uring wait: {e}", self.describe());
                }
                _ => {}
            }
            self.unsubmitted = 0;
        }
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        let mut done = Vec::new();
        for _ in 0..1000 {
            if self.outstanding() == 0 {
                return;
            }
            self.wait(Duration::from_millis(10));
            self.poll(&mut done);
        }
        log::error!(
            "{}: {} requests never completed; leaking their buffers",
            self.describe(),
            self.outstanding()
        );
        for op in self.inflight.iter_mut().filter_map(Option::take) {
            std::mem::forget(op);
        }
    }
}
