//! The I/O engine: the members' devices and buffers, the logical → member mapping (FORMAT.md
//! §2), and batches of reads and writes submitted over all members at once.
//!
//! A batch is cut into pieces of at most one chunk (a piece never crosses a chunk, so it lies
//! on one member); each member gets its own queue of pieces, and the engine keeps every member
//! busy up to its buffers and queue depth, ringing each device once per round and polling them
//! all. Data is copied between the caller's memory and the DMA buffers by the CPU.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::device::{Device, DeviceError, IoBuf, IoDone, IoOp};
use crate::error::StoreError;
use crate::format::PAGE;

/// Where the logical space is (FORMAT.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub members: u32,
    pub chunk_pages: u64,
    pub chunks_per_member: u64,
}

impl Geometry {
    /// Member and member byte offset of logical page `p`.
    pub fn locate(&self, p: u64) -> (usize, u64) {
        let c = p / self.chunk_pages;
        let member = (c % self.members as u64) as usize;
        let mchunk = c / self.members as u64;
        let off = crate::format::DATA_START
            + mchunk * self.chunk_pages * PAGE as u64
            + (p % self.chunk_pages) * PAGE as u64;
        (member, off)
    }

    /// Pages of the logical space.
    pub fn pages(&self) -> u64 {
        self.members as u64 * self.chunks_per_member * self.chunk_pages
    }
}

/// One member: its device and its buffers.
pub(crate) struct Member {
    pub dev: Box<dyn Device>,
    bufs: Vec<IoBuf>,
    buf_size: usize,
}

/// A job of a batch.
pub(crate) enum Job<'a> {
    /// Write `data` (zero-padded to whole pages) from logical page `page`.
    Write { page: u64, data: &'a [u8] },
    /// Read `dst.len()` bytes from logical page `page`.
    Read { page: u64, dst: &'a mut [u8] },
}

/// A device request of a batch.
#[derive(Debug, Clone, Copy)]
struct Piece {
    job: usize,
    dev_off: u64,
    /// Offset of the piece's data in its job.
    data_off: usize,
    /// Bytes of data (the request is this rounded up to pages).
    len: usize,
}

/// Members and the timeout of a batch.
pub(crate) struct Io {
    pub members: Vec<Member>,
    pub geo: Geometry,
    pub timeout: Duration,
}

impl Io {
    /// The engine over `devs` (member order), with `bufs` buffers of one chunk per member.
    pub fn new(
        devs: Vec<Box<dyn Device>>,
        geo: Geometry,
        bufs: usize,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let buf_size = (geo.chunk_pages as usize) * PAGE;
        let mut members = Vec::with_capacity(devs.len());
        for dev in devs {
            let b = dev
                .alloc_buffers(bufs.max(2), buf_size)
                .map_err(|e| StoreError::Device {
                    device: dev.describe(),
                    source: e,
                })?;
            members.push(Member {
                dev,
                bufs: b,
                buf_size,
            });
        }
        Ok(Io {
            members,
            geo,
            timeout,
        })
    }

    fn dev_err(&self, m: usize, e: DeviceError) -> StoreError {
        StoreError::Device {
            device: self.members[m].dev.describe(),
            source: e,
        }
    }
}

impl Io {
    /// Runs the jobs as one batch over all members.
    pub fn run(&mut self, jobs: &mut [Job<'_>]) -> Result<(), StoreError> {
        let mut queues: Vec<VecDeque<Piece>> = vec![VecDeque::new(); self.members.len()];
        let chunk_bytes = self.geo.chunk_pages as usize * PAGE;
        for (j, job) in jobs.iter().enumerate() {
            let (page, len) = match job {
                Job::Write { page, data } => (*page, data.len()),
                Job::Read { page, dst } => (*page, dst.len()),
            };
            if page.saturating_add(len.div_ceil(PAGE) as u64) > self.geo.pages() {
                return Err(StoreError::Internal(format!(
                    "I/O of {len} bytes at logical page {page} runs past the {} pages of the store",
                    self.geo.pages()
                )));
            }
            let mut data_off = 0usize;
            let mut p = page;
            while data_off < len {
                let in_chunk = (self.geo.chunk_pages - p % self.geo.chunk_pages) as usize * PAGE;
                let n = (len - data_off).min(in_chunk).min(chunk_bytes);
                let (member, dev_off) = self.geo.locate(p);
                queues[member].push_back(Piece {
                    job: j,
                    dev_off,
                    data_off,
                    len: n,
                });
                data_off += n;
                p += n.div_ceil(PAGE) as u64;
            }
        }
        let total: usize = queues.iter().map(VecDeque::len).sum();
        let mut pieces: Vec<Piece> = Vec::with_capacity(total);
        let mut pending: Vec<VecDeque<usize>> = vec![VecDeque::new(); self.members.len()];
        for (m, q) in queues.into_iter().enumerate() {
            for piece in q {
                pending[m].push_back(pieces.len());
                pieces.push(piece);
            }
        }
        let mut finished = 0usize;
        let mut failure: Option<StoreError> = None;
        let mut done: Vec<IoDone> = Vec::with_capacity(64);
        let mut last = Instant::now();
        while finished < total {
            let mut progress = false;
            for (m, pend) in pending.iter_mut().enumerate() {
                while failure.is_none() {
                    let Some(&pi) = pend.front() else { break };
                    let member = &mut self.members[m];
                    let Some(mut buf) = member.bufs.pop() else { break };
                    let piece = pieces[pi];
                    let io_len = piece.len.next_multiple_of(PAGE);
                    let prep = buf.set_len(io_len).and_then(|()| match &jobs[piece.job] {
                        Job::Write { data, .. } => {
                            buf.write(0, &data[piece.data_off..piece.data_off + piece.len])?;
                            if io_len > piece.len {
                                buf.fill(piece.len, io_len - piece.len, 0)?;
                            }
                            Ok(IoOp::Write {
                                offset: piece.dev_off,
                                buf,
                                fua: false,
                            })
                        }
                        Job::Read { .. } => Ok(IoOp::Read {
                            offset: piece.dev_off,
                            buf,
                        }),
                    });
                    let op = match prep {
                        Ok(op) => op,
                        Err(e) => {
                            failure = Some(StoreError::Internal(format!("staging a buffer: {e}")));
                            break;
                        }
                    };
                    match member.dev.submit(pi as u64, op) {
                        Ok(()) => {
                            pend.pop_front();
                            progress = true;
                        }
                        Err((DeviceError::QueueFull, op)) => {
                            member
                                .bufs
                                .push(op.into_buf().expect("reads and writes have buffers"));
                            break;
                        }
                        Err((e, op)) => {
                            member
                                .bufs
                                .push(op.into_buf().expect("reads and writes have buffers"));
                            failure = Some(StoreError::Device {
                                device: member.dev.describe(),
                                source: e,
                            });
                        }
                    }
                }
                if failure.is_some() {
                    // Pieces never submitted are finished (failed).
                    finished += pend.len();
                    pend.clear();
                }
                if let Err(e) = self.members[m].dev.kick() {
                    failure.get_or_insert(self.dev_err(m, e));
                }
            }
            for m in 0..self.members.len() {
                done.clear();
                self.members[m].dev.poll(&mut done);
                for d in done.drain(..) {
                    progress = true;
                    finished += 1;
                    let Some(piece) = pieces.get(d.tag as usize).copied() else {
                        failure.get_or_insert(StoreError::Internal(format!(
                            "completion with unknown tag {}",
                            d.tag
                        )));
                        continue;
                    };
                    if let Err(e) = d.result {
                        failure.get_or_insert(StoreError::Device {
                            device: self.members[m].dev.describe(),
                            source: e,
                        });
                    }
                    let Some(buf) = d.buf else {
                        failure.get_or_insert(StoreError::Internal(format!(
                            "{} kept a buffer it may still write into",
                            self.members[m].dev.describe()
                        )));
                        continue;
                    };
                    if failure.is_none() {
                        if let Job::Read { dst, .. } = &mut jobs[piece.job] {
                            if let Err(e) = buf.read(0, &mut dst[piece.data_off..piece.data_off + piece.len])
                            {
                                failure = Some(StoreError::Internal(format!("copying out a buffer: {e}")));
                            }
                        }
                    }
                    self.members[m].bufs.push(buf);
                }
            }
            if progress {
                last = Instant::now();
                continue;
            }
            if last.elapsed() > self.timeout {
                return Err(StoreError::Timeout {
                    waited: last.elapsed(),
                    outstanding: total - finished,
                });
            }
            if failure.is_none()
                && self
                    .members
                    .iter()
                    .all(|mb| mb.bufs.is_empty() && mb.dev.outstanding() == 0)
            {
                return Err(StoreError::Internal(
                    "no I/O buffers left (devices kept them)".into(),
                ));
            }
            match self.members.iter_mut().find(|mb| mb.dev.outstanding() > 0) {
                Some(mb) => mb.dev.wait(Duration::from_millis(1)),
                None => std::thread::yield_now(),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One request on member `m` without a buffer (flush, deallocate), or with one (FUA write,
    /// raw read/write), waited for.
    fn op_wait(&mut self, m: usize, op: IoOp) -> Result<Option<IoBuf>, StoreError> {
        let start = Instant::now();
        let mut op = op;
        loop {
            match self.members[m].dev.submit(u64::MAX, op) {
                Ok(()) => break,
                Err((DeviceError::QueueFull, back)) => {
                    op = back;
                    let mut done = Vec::new();
                    self.members[m].dev.poll(&mut done);
                    if !done.is_empty() {
                        return Err(StoreError::Internal("stray completions while idle".into()));
                    }
                    if start.elapsed() > self.timeout {
                        return Err(StoreError::Timeout {
                            waited: start.elapsed(),
                            outstanding: 1,
                        });
                    }
                }
                Err((e, back)) => {
                    if let Some(b) = back.into_buf() {
                        self.members[m].bufs.push(b);
                    }
                    return Err(self.dev_err(m, e));
                }
            }
        }
        self.members[m].dev.kick().map_err(|e| self.dev_err(m, e))?;
        let mut done = Vec::new();
        loop {
            self.members[m].dev.poll(&mut done);
            if let Some(d) = done.pop() {
                return match d.result {
                    Ok(()) => Ok(d.buf),
                    Err(e) => {
                        if let Some(b) = d.buf {
                            self.members[m].bufs.push(b);
                        }
                        Err(self.dev_err(m, e))
                    }
                };
            }
            if start.elapsed() > self.timeout {
                return Err(StoreError::Timeout {
                    waited: start.elapsed(),
                    outstanding: 1,
                });
            }
            self.members[m].dev.wait(Duration::from_millis(1));
            std::hint::spin_loop();
        }
    }

    fn take_buf(&mut self, m: usize, len: usize) -> Result<IoBuf, StoreError> {
        let mut b = self.members[m]
            .bufs
            .pop()
            .ok_or_else(|| StoreError::Internal("no I/O buffer free".into()))?;
        if len > self.members[m].buf_size {
            self.members[m].bufs.push(b);
            return Err(StoreError::Internal(format!("{len} bytes exceed an I/O buffer")));
        }
        b.set_len(len).map_err(|e| self.dev_err(m, e))?;
        Ok(b)
    }

    /// Reads whole pages at byte `off` of member `m` (no logical mapping: superblocks, roots).
    pub fn read_member(&mut self, m: usize, off: u64, dst: &mut [u8]) -> Result<(), StoreError> {
        let buf = self.take_buf(m, dst.len())?;
        let back = self.op_wait(m, IoOp::Read { offset: off, buf })?;
        let buf = back.ok_or_else(|| StoreError::Internal("read without its buffer".into()))?;
        let r = buf.read(0, dst).map_err(|e| self.dev_err(m, e));
        self.members[m].bufs.push(buf);
        r
    }

    /// Writes whole pages at byte `off` of member `m`; with `fua`, durable on return.
    pub fn write_member(&mut self, m: usize, off: u64, src: &[u8], fua: bool) -> Result<(), StoreError> {
        let mut buf = self.take_buf(m, src.len())?;
        if let Err(e) = buf.write(0, src) {
            self.members[m].bufs.push(buf);
            return Err(self.dev_err(m, e));
        }
        let back = self.op_wait(
            m,
            IoOp::Write {
                offset: off,
                buf,
                fua,
            },
        )?;
        if let Some(b) = back {
            self.members[m].bufs.push(b);
        }
        Ok(())
    }

    /// Flushes every member with a volatile write cache (all at once).
    pub fn flush_all(&mut self) -> Result<(), StoreError> {
        let mut first = None;
        for m in 0..self.members.len() {
            if self.members[m].dev.volatile_write_cache() {
                if let Err(e) = self.op_wait(m, IoOp::Flush) {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Deallocates logical pages `page..page + n` (advisory: errors are logged).
    pub fn deallocate(&mut self, page: u64, n: u64) {
        let mut p = page;
        let end = page + n;
        while p < end {
            let run = (self.geo.chunk_pages - p % self.geo.chunk_pages).min(end - p);
            let (m, off) = self.geo.locate(p);
            if let Err(e) = self.op_wait(
                m,
                IoOp::Deallocate {
                    offset: off,
                    len: run * PAGE as u64,
                },
            ) {
                log::debug!("deallocate of {run} pages at logical page {p}: {e}");
            }
            p += run;
        }
    }
}
