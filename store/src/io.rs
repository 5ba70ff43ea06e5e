//! The I/O engine: the members' devices and buffers, the logical → member mapping (FORMAT.md
//! §2), and batches of reads and writes submitted over all members at once.
//!
//! A batch is cut into pieces of at most one chunk (a piece never crosses a chunk, so it lies
//! on one member); each member gets its own queue of pieces, and the engine keeps every member
//! busy up to its buffers and queue depth, ringing each device once per round and polling them
//! all. Data is copied between the caller's memory and the DMA buffers by the CPU, and a crc32c
//! wanted for a piece is computed in the same pass (32 KiB at a time, while the bytes the copy
//! touched are still in cache), never in a second pass over the caller's memory.
//!
//! In a large batch that computes crc32c (at least 1 MiB in 4 pieces) the copies run on
//! scoped copy threads (`Io::copy_threads`) beside the calling thread: it submits a read as soon
//! as a buffer is free and hands the full buffer to a copy thread when it completes; a write's
//! buffer is filled by a copy thread and submitted when it comes back. So the copies and
//! checksums of some chunks overlap the device I/O of others, and a batch is not held to one
//! core's copy rate. When the calling thread has nothing to submit or reap it takes copies off
//! the same queue. Small batches (a KV get at QD1) copy on the calling thread: starting threads
//! would cost more than the copy.
//!
//! A store has several engines, its I/O channels ([`channels`]): each burst runs on one,
//! taken for the burst, so the bursts of several threads overlap on the devices. A peer-BAR
//! burst ([`peer`]) submits the caller's BAR pieces instead of the engine's buffers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::device::{Device, DeviceError, IoBuf, IoDone, IoOp};
use crate::error::StoreError;
use crate::format::{crc32c_append, PAGE};

mod channels;
mod peer;
pub(crate) use channels::{extra_buffers, Channel, Channels, MAX_CHANNELS};
pub(crate) use peer::{join_all, PeerJob, PEER_NEEDS};

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
    member: usize,
    dev_off: u64,
    /// Bytes of data (the request is this rounded up to pages).
    len: usize,
    write: bool,
    /// Whether its crc32c is computed next to its copy (the only piece of its job, with a crc
    /// wanted), continued from `crcs[piece]`.
    crc: bool,
}

/// Members and the timeout of a batch.
pub(crate) struct Io {
    pub members: Vec<Member>,
    pub geo: Geometry,
    pub timeout: Duration,
    /// Threads that copy and checksum beside the calling thread in a large batch (0: the
    /// calling thread does it all).
    pub copy_threads: usize,
    /// How long a small batch or a single request polls before it sleeps
    /// ([`StoreOptions::poll_spin`](crate::StoreOptions::poll_spin)).
    pub poll_spin: Duration,
    /// Its number among the store's channels (0: the first, with the most buffers).
    pub channel: usize,
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
            copy_threads: 0,
            poll_spin: Duration::ZERO,
            channel: 0,
        })
    }

    /// Channel `channel` beside this one: an engine with its own device per member, opened
    /// on the same namespaces ([`Device::open_channel`]), with `bufs` buffers per member, and
    /// this one's settings.
    pub fn open_channel(&self, bufs: usize, channel: usize) -> Result<Io, StoreError> {
        let mut devs = Vec::with_capacity(self.members.len());
        for (m, mb) in self.members.iter().enumerate() {
            devs.push(mb.dev.open_channel().map_err(|e| self.dev_err(m, e))?);
        }
        let mut io = Io::new(devs, self.geo, bufs, self.timeout)?;
        io.copy_threads = self.copy_threads;
        io.poll_spin = self.poll_spin;
        io.channel = channel;
        Ok(io)
    }

    fn dev_err(&self, m: usize, e: DeviceError) -> StoreError {
        StoreError::Device {
            device: self.members[m].dev.describe(),
            source: e,
        }
    }
}

/// Bytes copied, then checksummed, at a time: the crc32c reads what the copy just touched
/// while it is still in the CPU's cache.
const STEP: usize = 32 << 10;

/// A run of fewer bytes than this (or of fewer pieces than [`HELP_MIN_PIECES`]) does its
/// copies on the calling thread: starting copy threads would cost more than they save.
const HELP_MIN_BYTES: usize = 1 << 20;
const HELP_MIN_PIECES: usize = 4;

/// Whether a run of `pieces` pieces and `bytes` bytes that computes crc32c has its copies
/// done by `copy_threads` copy threads (else the calling thread copies).
pub(crate) fn copies_help(copy_threads: usize, pieces: usize, bytes: usize) -> bool {
    copy_threads > 0 && pieces >= HELP_MIN_PIECES && bytes >= HELP_MIN_BYTES
}

/// A piece's bytes in its job.
enum Bytes<'a> {
    Src(&'a [u8]),
    Dst(&'a mut [u8]),
}

impl<'a> Bytes<'a> {
    fn len(&self) -> usize {
        match self {
            Bytes::Src(s) => s.len(),
            Bytes::Dst(d) => d.len(),
        }
    }

    fn split(self, n: usize) -> (Bytes<'a>, Bytes<'a>) {
        match self {
            Bytes::Src(s) => {
                let (a, b) = s.split_at(n);
                (Bytes::Src(a), Bytes::Src(b))
            }
            Bytes::Dst(d) => {
                let (a, b) = d.split_at_mut(n);
                (Bytes::Dst(a), Bytes::Dst(b))
            }
        }
    }
}

/// Copy work on one piece's buffer: fill it before a write, or empty it after a read, with
/// the crc32c of the bytes on the way.
struct Work<'a> {
    piece: usize,
    buf: IoBuf,
    bytes: Bytes<'a>,
    /// The crc32c to continue over the bytes, if one is wanted.
    crc: Option<u32>,
}

/// Finished copy work.
struct Worked {
    piece: usize,
    buf: IoBuf,
    crc: u32,
    result: Result<(), DeviceError>,
}

impl Work<'_> {
    fn run(self) -> Worked {
        let Work {
            piece,
            mut buf,
            bytes,
            crc,
        } = self;
        let mut c = crc.unwrap_or(0);
        let result = (|| match bytes {
            Bytes::Src(src) => {
                let io_len = src.len().next_multiple_of(PAGE);
                buf.set_len(io_len)?;
                for (i, part) in src.chunks(STEP).enumerate() {
                    buf.write(i * STEP, part)?;
                    if crc.is_some() {
                        c = crc32c_append(c, part);
                    }
                }
                if io_len > src.len() {
                    buf.fill(src.len(), io_len - src.len(), 0)?;
                }
                Ok(())
            }
            Bytes::Dst(dst) => {
                for (i, part) in dst.chunks_mut(STEP).enumerate() {
                    buf.read(i * STEP, part)?;
                    if crc.is_some() {
                        c = crc32c_append(c, part);
                    }
                }
                Ok(())
            }
        })();
        Worked {
            piece,
            buf,
            crc: c,
            result,
        }
    }
}

/// The copy threads of one run, and the queue the calling thread may take work from too.
struct Helpers<'a> {
    tasks: Sender<Work<'a>>,
    steal: Receiver<Work<'a>>,
    done: Receiver<Worked>,
}

impl Io {
    /// Runs the jobs as one batch over all members.
    pub fn run(&mut self, jobs: &mut [Job<'_>]) -> Result<(), StoreError> {
        self.run_inner(jobs, None).map(drop)
    }

    /// [`Io::run`], returning the crc32c of each job's bytes (written, or read).
    pub fn run_crc(&mut self, jobs: &mut [Job<'_>]) -> Result<Vec<u32>, StoreError> {
        self.run_inner(jobs, Some(&vec![0; jobs.len()]))
    }

    /// [`Io::run_crc`] with each job's crc32c continued from `seeds[job]` (a crc over bytes
    /// that precede the job's, as a KV block's key and generation precede its data).
    ///
    /// A job of one piece (an extent: at most one chunk, inside one chunk) has its crc
    /// computed next to its copy, on a copy thread in a large batch; a job of several pieces
    /// has it computed over its bytes once they are all moved (combining the pieces' crcs
    /// would cost more than that).
    pub fn run_crc_seeded(&mut self, jobs: &mut [Job<'_>], seeds: &[u32]) -> Result<Vec<u32>, StoreError> {
        if seeds.len() != jobs.len() {
            return Err(StoreError::Internal(format!(
                "{} crc seeds for {} jobs",
                seeds.len(),
                jobs.len()
            )));
        }
        self.run_inner(jobs, Some(seeds))
    }

    /// Cuts the jobs into pieces of at most one chunk (a piece lies on one member); returns
    /// them with their bytes and, per job, the index of its first piece (and one past the
    /// last job's).
    #[allow(clippy::type_complexity, reason = "three parallel lists, private")]
    fn plan<'b>(
        &self,
        jobs: &'b mut [Job<'_>],
    ) -> Result<(Vec<Piece>, Vec<Option<Bytes<'b>>>, Vec<usize>), StoreError> {
        let chunk_bytes = self.geo.chunk_pages as usize * PAGE;
        let mut pieces = Vec::new();
        let mut bytes = Vec::new();
        let mut first = Vec::with_capacity(jobs.len() + 1);
        for job in jobs.iter_mut() {
            first.push(pieces.len());
            let (page, mut rest, write) = match job {
                Job::Write { page, data } => (*page, Bytes::Src(data), true),
                Job::Read { page, dst } => (*page, Bytes::Dst(dst), false),
            };
            let len = rest.len();
            if page.saturating_add(len.div_ceil(PAGE) as u64) > self.geo.pages() {
                return Err(StoreError::Internal(format!(
                    "I/O of {len} bytes at logical page {page} runs past the {} pages of the store",
                    self.geo.pages()
                )));
            }
            let mut p = page;
            while rest.len() > 0 {
                let in_chunk = (self.geo.chunk_pages - p % self.geo.chunk_pages) as usize * PAGE;
                let n = rest.len().min(in_chunk).min(chunk_bytes);
                let (member, dev_off) = self.geo.locate(p);
                let (head, tail) = rest.split(n);
                pieces.push(Piece {
                    member,
                    dev_off,
                    len: n,
                    write,
                    crc: false,
                });
                bytes.push(Some(head));
                rest = tail;
                p += n.div_ceil(PAGE) as u64;
            }
        }
        first.push(pieces.len());
        Ok((pieces, bytes, first))
    }

    fn run_inner(&mut self, jobs: &mut [Job<'_>], seeds: Option<&[u32]>) -> Result<Vec<u32>, StoreError> {
        let (mut pieces, bytes, first) = self.plan(jobs)?;
        let mut crcs = vec![0u32; pieces.len()];
        if let Some(seeds) = seeds {
            for (j, w) in first.windows(2).enumerate() {
                if w[1] == w[0] + 1 {
                    pieces[w[0]].crc = true;
                    crcs[w[0]] = seeds[j];
                }
            }
        }
        let total_bytes: usize = pieces.iter().map(|p| p.len).sum();
        // Copy threads only where a crc32c is computed: plain copies are cheap next to the
        // extra thread's cost on a small machine (measured in the test bed: a crc-off load on
        // 2 vCPUs ran at 0.26 GB/s with a copy thread, 0.73 without).
        let helpers = if seeds.is_some() && copies_help(self.copy_threads, pieces.len(), total_bytes) {
            self.copy_threads.min(pieces.len() - 1)
        } else {
            0
        };
        if helpers == 0 {
            self.drive(&pieces, bytes, &mut crcs, None)?;
        } else {
            std::thread::scope(|s| {
                let (tasks, steal) = crossbeam_channel::unbounded::<Work<'_>>();
                let (done_tx, done) = crossbeam_channel::unbounded::<Worked>();
                for i in 0..helpers {
                    let (rx, tx) = (steal.clone(), done_tx.clone());
                    let spawned = std::thread::Builder::new()
                        .name(format!("vfpoll-store-copy{i}"))
                        .spawn_scoped(s, move || {
                            while let Ok(w) = rx.recv() {
                                if tx.send(w.run()).is_err() {
                                    break;
                                }
                            }
                        });
                    if let Err(e) = spawned {
                        // The calling thread does the copies the missing helpers would have.
                        log::debug!("cannot start a copy thread: {e}");
                        break;
                    }
                }
                drop(done_tx);
                let pool = Helpers { tasks, steal, done };
                self.drive(&pieces, bytes, &mut crcs, Some(&pool))
            })?;
        }
        let Some(seeds) = seeds else { return Ok(Vec::new()) };
        Ok(jobs
            .iter()
            .zip(first.windows(2))
            .zip(seeds)
            .map(|((job, w), &seed)| match (w[1] - w[0], job) {
                (0, _) => seed,
                (1, _) => crcs[w[0]],
                (_, Job::Write { data, .. }) => crc32c_append(seed, data),
                (_, Job::Read { dst, .. }) => crc32c_append(seed, dst),
            })
            .collect())
    }

    /// Moves the pieces: buffers are filled (by the helpers where there are some, else here),
    /// submitted, polled, and emptied, with every member kept busy up to its buffers and queue
    /// depth. Returns once every buffer is back, even after a failure.
    fn drive<'a>(
        &mut self,
        pieces: &[Piece],
        mut bytes: Vec<Option<Bytes<'a>>>,
        crcs: &mut [u32],
        pool: Option<&Helpers<'a>>,
    ) -> Result<(), StoreError> {
        let nm = self.members.len();
        let total = pieces.len();
        // A small batch polls for its completions (its latency is the device's); a large
        // one sleeps while every device is busy (its devices stay busy meanwhile).
        let spin = if pieces.iter().map(|p| p.len).sum::<usize>() < HELP_MIN_BYTES {
            self.poll_spin
        } else {
            Duration::ZERO
        };
        let mut pend: Vec<VecDeque<usize>> = vec![VecDeque::new(); nm];
        for (i, p) in pieces.iter().enumerate() {
            pend[p.member].push_back(i);
        }
        // Buffers ready to submit (filled for writes, empty for reads), per member.
        let mut ready: Vec<VecDeque<(usize, IoBuf)>> = (0..nm).map(|_| VecDeque::new()).collect();
        let mut local: VecDeque<Worked> = VecDeque::new();
        let mut at_helpers = 0usize;
        let mut finished = 0usize;
        let mut failure: Option<StoreError> = None;
        let mut done: Vec<IoDone> = Vec::with_capacity(64);
        let mut last = Instant::now();
        let dispatch = |w: Work<'a>, local: &mut VecDeque<Worked>, at_helpers: &mut usize| match pool {
            Some(p) => match p.tasks.send(w) {
                Ok(()) => *at_helpers += 1,
                Err(e) => local.push_back(e.into_inner().run()),
            },
            None => local.push_back(w.run()),
        };
        while finished < total {
            let mut progress = false;
            // Buffers for waiting pieces. Without helpers one write per member is filled per
            // round, so that the device starts on it while the next one is filled.
            if failure.is_none() {
                for m in 0..nm {
                    while let Some(&pi) = pend[m].front() {
                        let Some(buf) = self.members[m].bufs.pop() else {
                            break;
                        };
                        pend[m].pop_front();
                        progress = true;
                        match bytes[pi].take() {
                            Some(Bytes::Src(src)) => {
                                dispatch(
                                    Work {
                                        piece: pi,
                                        buf,
                                        bytes: Bytes::Src(src),
                                        crc: pieces[pi].crc.then_some(crcs[pi]),
                                    },
                                    &mut local,
                                    &mut at_helpers,
                                );
                                if pool.is_none() {
                                    break;
                                }
                            }
                            other => {
                                bytes[pi] = other;
                                ready[m].push_back((pi, buf));
                            }
                        }
                    }
                }
            }
            // Finished copies.
            loop {
                let w = match local.pop_front() {
                    Some(w) => w,
                    None => match pool.map(|p| p.done.try_recv()) {
                        Some(Ok(w)) => {
                            at_helpers -= 1;
                            w
                        }
                        _ => break,
                    },
                };
                progress = true;
                let p = pieces[w.piece];
                crcs[w.piece] = w.crc;
                if let Err(e) = w.result {
                    failure.get_or_insert(StoreError::Internal(format!("copying a buffer: {e}")));
                }
                if p.write && failure.is_none() {
                    ready[p.member].push_back((w.piece, w.buf));
                } else {
                    self.members[p.member].bufs.push(w.buf);
                    finished += 1;
                }
            }
            // Submissions, one doorbell per member.
            for m in 0..nm {
                let mut sent = false;
                while failure.is_none() {
                    let Some((pi, mut buf)) = ready[m].pop_front() else {
                        break;
                    };
                    let p = pieces[pi];
                    let op = if p.write {
                        IoOp::Write {
                            offset: p.dev_off,
                            buf,
                            fua: false,
                        }
                    } else {
                        if let Err(e) = buf.set_len(p.len.next_multiple_of(PAGE)) {
                            self.members[m].bufs.push(buf);
                            finished += 1;
                            failure = Some(self.dev_err(m, e));
                            break;
                        }
                        IoOp::Read {
                            offset: p.dev_off,
                            buf,
                        }
                    };
                    match self.members[m].dev.submit(pi as u64, op) {
                        Ok(()) => {
                            sent = true;
                            progress = true;
                        }
                        Err((DeviceError::QueueFull, op)) => {
                            ready[m].push_front((pi, op.into_buf().expect("reads and writes have buffers")));
                            break;
                        }
                        Err((e, op)) => {
                            self.members[m]
                                .bufs
                                .push(op.into_buf().expect("reads and writes have buffers"));
                            finished += 1;
                            failure = Some(self.dev_err(m, e));
                        }
                    }
                }
                if failure.is_some() {
                    // Pieces never submitted are finished (failed).
                    finished += pend[m].len();
                    pend[m].clear();
                    for (_, b) in ready[m].drain(..) {
                        self.members[m].bufs.push(b);
                        finished += 1;
                    }
                }
                if sent {
                    if let Err(e) = self.members[m].dev.kick() {
                        failure.get_or_insert(self.dev_err(m, e));
                    }
                }
            }
            // Completions: write buffers go back, read buffers to be emptied.
            for m in 0..nm {
                done.clear();
                self.members[m].dev.poll(&mut done);
                for d in done.drain(..) {
                    progress = true;
                    let Some(&p) = pieces.get(d.tag as usize) else {
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
                        finished += 1;
                        failure.get_or_insert(StoreError::Internal(format!(
                            "{} kept a buffer it may still write into",
                            self.members[m].dev.describe()
                        )));
                        continue;
                    };
                    let dst = if p.write || failure.is_some() {
                        None
                    } else {
                        bytes[d.tag as usize].take()
                    };
                    match dst {
                        Some(Bytes::Dst(dst)) => dispatch(
                            Work {
                                piece: d.tag as usize,
                                buf,
                                bytes: Bytes::Dst(dst),
                                crc: p.crc.then_some(crcs[d.tag as usize]),
                            },
                            &mut local,
                            &mut at_helpers,
                        ),
                        _ => {
                            self.members[m].bufs.push(buf);
                            finished += 1;
                        }
                    }
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
            // Nothing moved: take a copy off the helpers' queue, else wait for the helpers or
            // the devices.
            if let Some(p) = pool {
                if let Ok(w) = p.steal.try_recv() {
                    at_helpers -= 1;
                    local.push_back(w.run());
                    continue;
                }
            }
            let busy = self.members.iter_mut().find(|mb| mb.dev.outstanding() > 0);
            match (busy, pool) {
                (None, Some(p)) if at_helpers > 0 => {
                    if let Ok(w) = p.done.recv_timeout(Duration::from_millis(1)) {
                        at_helpers -= 1;
                        local.push_back(w);
                    }
                }
                (Some(_), _) if at_helpers == 0 && last.elapsed() < spin => std::hint::spin_loop(),
                (Some(mb), _) if at_helpers == 0 => mb.dev.wait(Duration::from_millis(1)),
                // Copy threads are busy and so are the devices: let the copy threads (and,
                // on a loaded machine, whatever else runs) have the CPU rather than spin.
                (Some(_), _) | (None, _) => std::thread::yield_now(),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Io {
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
            if start.elapsed() >= self.poll_spin {
                self.members[m].dev.wait(Duration::from_millis(1));
            }
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

#[cfg(test)]
mod tests;
