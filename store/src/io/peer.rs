//! Peer-BAR bursts: the engine submits the caller's [`DeviceBuf`] pieces (a peer device's BAR,
//! registered in the members' DMA context) instead of its own buffers, so the controller moves
//! the data straight between the namespace and the BAR: no bounce buffer, no CPU copy.
//!
//! Each job is cut into pieces of at most one chunk, as in [`Io::run`](super::Io::run); each
//! piece is split off the job's buffer and moved into its queue pair, which owns it until the
//! completion hands it back; the pieces are joined back into the job's buffer once every one
//! has come back. Only whole pages move this way: the caller (the checkpoint layer) reads and
//! writes the odd bytes of an extent's last page through the store's own buffers, since a
//! page-sized transfer would touch BAR bytes the caller did not lend.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use vfpoll_dma::{DeviceBuf, DmaContext};

use super::Io;
use crate::device::{DeviceError, IoBuf, IoDone, IoOp};
use crate::error::StoreError;
use crate::format::PAGE;

/// A job of a peer burst: whole pages between logical page `page` and `buf`.
#[derive(Debug)]
pub(crate) struct PeerJob {
    /// First logical page.
    pub page: u64,
    /// The BAR bytes (a multiple of a page); `None` after a timeout left a piece of it with a
    /// queue pair (the device may still write it: it is never reused).
    pub buf: Option<DeviceBuf>,
    /// Write from `buf` (else read into it).
    pub write: bool,
}

/// A request of a peer burst.
struct PeerPiece {
    job: usize,
    dev_off: u64,
    write: bool,
}

/// Why a store cannot do peer-BAR I/O, for its error messages.
pub(crate) const PEER_NEEDS: &str = "peer-BAR I/O needs every namespace of the store to be an NVMe namespace \
     through VFIO (vfio:BDF/NSID, or model: in tests) in one DMA context: a file or memory cannot DMA into a BAR; \
     use the host-memory paths (put, read_range) instead";

impl Io {
    /// The DMA context every member's controller moves data through, or why there is none
    /// (a member that is not an NVMe namespace, or members in different contexts).
    pub fn dma_context(&self) -> Result<DmaContext, String> {
        let mut ctx: Option<DmaContext> = None;
        for mb in &self.members {
            let Some(c) = mb.dev.dma_context() else {
                return Err(format!("{} cannot DMA into a BAR", mb.dev.describe()));
            };
            match &ctx {
                None => ctx = Some(c),
                // One context per mapper (vfpoll-dma's rule), so the mapper names the context:
                // an IOVA mapped through it is valid for every controller behind it.
                Some(first) if same_mapper(first, &c) => {}
                Some(_) => {
                    return Err(format!(
                        "{} is in a DMA context of its own (another VFIO container or model)",
                        mb.dev.describe()
                    ))
                }
            }
        }
        ctx.ok_or_else(|| "the store has no namespace".into())
    }

    /// Runs `jobs`: every piece submitted from or into the caller's BAR buffers, over all
    /// members at once, up to each queue's depth. Returns once every piece is back and joined
    /// into its job's buffer, even after a failure (the first error is returned); after a
    /// timeout the pieces still in a queue pair stay there and their jobs' `buf` is `None`.
    pub fn run_peer(&mut self, jobs: &mut [PeerJob]) -> Result<(), StoreError> {
        let nm = self.members.len();
        let cb = self.geo.chunk_pages * PAGE as u64;
        let mut pieces: Vec<PeerPiece> = Vec::new();
        // Per job, its pieces' buffers in order (None while in flight).
        let mut parts: Vec<Vec<Option<DeviceBuf>>> = Vec::with_capacity(jobs.len());
        let mut first: Vec<usize> = Vec::with_capacity(jobs.len());
        let mut pend: Vec<VecDeque<(usize, IoBuf)>> = (0..nm).map(|_| VecDeque::new()).collect();
        if let Some(len) = jobs
            .iter()
            .filter_map(|j| j.buf.as_ref().map(DeviceBuf::len))
            .find(|l| !l.is_multiple_of(PAGE))
        {
            return Err(StoreError::Internal(format!(
                "a peer job of {len} bytes: whole pages only"
            )));
        }
        for (j, job) in jobs.iter_mut().enumerate() {
            first.push(pieces.len());
            let mut mine = Vec::new();
            if let Some(mut rest) = job.buf.take() {
                if rest.is_empty() {
                    job.buf = Some(rest);
                    parts.push(mine);
                    continue;
                }
                let mut page = job.page;
                while !rest.is_empty() {
                    let room = (cb - (page % self.geo.chunk_pages) * PAGE as u64) as usize;
                    let n = room.min(rest.len());
                    let tail = rest.split_off(n);
                    let (member, dev_off) = self.geo.locate(page);
                    pend[member].push_back((pieces.len(), IoBuf::peer(rest)));
                    pieces.push(PeerPiece {
                        job: j,
                        dev_off,
                        write: job.write,
                    });
                    mine.push(None);
                    rest = tail;
                    page += (n / PAGE) as u64;
                }
                // `rest` is the empty piece at the end: dropped (it owns no bytes).
            }
            parts.push(mine);
        }
        let total = pieces.len();
        let mut finished = 0usize;
        let mut failure: Option<StoreError> = None;
        let mut done: Vec<IoDone> = Vec::with_capacity(64);
        let mut last = Instant::now();
        let back = |pi: usize, buf: IoBuf, parts: &mut Vec<Vec<Option<DeviceBuf>>>| -> Result<(), String> {
            let p = &pieces[pi];
            match buf.into_peer() {
                Ok(b) => {
                    parts[p.job][pi - first[p.job]] = Some(b);
                    Ok(())
                }
                Err(_) => Err(format!("peer piece {pi} came back as a host buffer")),
            }
        };
        while finished < total {
            let mut progress = false;
            for (m, queue) in pend.iter_mut().enumerate() {
                let mut sent = false;
                while failure.is_none() {
                    let Some((pi, buf)) = queue.pop_front() else {
                        break;
                    };
                    let p = &pieces[pi];
                    let op = if p.write {
                        IoOp::Write {
                            offset: p.dev_off,
                            buf,
                            fua: false,
                        }
                    } else {
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
                            queue.push_front((pi, op.into_buf().expect("reads and writes have buffers")));
                            break;
                        }
                        Err((e, op)) => {
                            let buf = op.into_buf().expect("reads and writes have buffers");
                            if let Err(msg) = back(pi, buf, &mut parts) {
                                failure.get_or_insert(StoreError::Internal(msg));
                            }
                            finished += 1;
                            failure = Some(self.dev_err(m, e));
                        }
                    }
                }
                if failure.is_some() {
                    // Pieces never submitted are finished (failed), their bytes given back.
                    for (pi, buf) in queue.drain(..) {
                        if let Err(msg) = back(pi, buf, &mut parts) {
                            failure.get_or_insert(StoreError::Internal(msg));
                        }
                        finished += 1;
                    }
                }
                if sent {
                    if let Err(e) = self.members[m].dev.kick() {
                        failure.get_or_insert(self.dev_err(m, e));
                    }
                }
            }
            for m in 0..nm {
                done.clear();
                self.members[m].dev.poll(&mut done);
                for d in done.drain(..) {
                    progress = true;
                    finished += 1;
                    let tag = d.tag as usize;
                    if tag >= total {
                        failure.get_or_insert(StoreError::Internal(format!(
                            "completion with unknown tag {}",
                            d.tag
                        )));
                        continue;
                    }
                    if let Err(e) = d.result {
                        failure.get_or_insert(StoreError::Device {
                            device: self.members[m].dev.describe(),
                            source: e,
                        });
                    }
                    match d.buf {
                        Some(buf) => {
                            if let Err(msg) = back(tag, buf, &mut parts) {
                                failure.get_or_insert(StoreError::Internal(msg));
                            }
                        }
                        None => {
                            failure.get_or_insert(StoreError::Internal(format!(
                                "{} kept a piece of the peer BAR it may still write into",
                                self.members[m].dev.describe()
                            )));
                        }
                    }
                }
            }
            if progress {
                last = Instant::now();
                continue;
            }
            if last.elapsed() > self.timeout {
                failure = Some(StoreError::Timeout {
                    waited: last.elapsed(),
                    outstanding: total - finished,
                });
                break;
            }
            match self.members.iter_mut().find(|mb| mb.dev.outstanding() > 0) {
                Some(mb) if last.elapsed() >= self.poll_spin => mb.dev.wait(Duration::from_millis(1)),
                _ => std::hint::spin_loop(),
            }
        }
        // Join each job's pieces back; a job with a piece still out (or kept) stays `None`.
        for (j, p) in parts.into_iter().enumerate() {
            if !p.is_empty() && p.iter().all(Option::is_some) {
                jobs[j].buf = join_all(p.into_iter().flatten());
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Joins consecutive pieces of one BAR buffer back into one.
pub(crate) fn join_all(pieces: impl IntoIterator<Item = DeviceBuf>) -> Option<DeviceBuf> {
    let mut acc: Option<DeviceBuf> = None;
    for p in pieces {
        acc = Some(match acc {
            None => p,
            Some(a) => match a.join(p) {
                Ok(j) => j,
                // Pieces cut from one buffer in order always join; keep the first part if not.
                Err((a, _)) => {
                    log::error!("peer BAR pieces of one buffer did not join back");
                    a
                }
            },
        });
    }
    acc
}

/// Whether two DMA contexts map through the same mapper (the same IOMMU domain).
fn same_mapper(a: &DmaContext, b: &DmaContext) -> bool {
    std::ptr::addr_eq(
        std::sync::Arc::as_ptr(a.mapper()),
        std::sync::Arc::as_ptr(b.mapper()),
    )
}
