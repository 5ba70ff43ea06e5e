//! Checkpoint entries saved from and loaded into a peer device's BAR (a GPU BAR exposed through
//! VFIO, an ivshmem BAR, a peer's CMB): the NVMe controllers move the data straight between
//! the namespaces and the BAR, as SPDK's and GPUDirect Storage's users expect (issue 23).
//!
//! The caller registers the BAR in the store's DMA context ([`Store::dma_context`]) and lends
//! a [`DeviceBuf`] of it to [`CheckpointTx::put_from_peer`] or
//! [`VersionReader::read_into_peer`]. The store splits the buffer into pieces of at most one
//! chunk, moves each into its queue pair (which owns it until its completion hands it back),
//! and joins them back before it returns. Whole pages go device to device; the odd bytes of an
//! extent's last page (an entry's length need not be a multiple of 4 KiB) and the ends of a
//! range read go through the store's own buffers and a CPU copy, since a page-sized transfer
//! would touch BAR bytes that were not lent. The crc32c of each extent is computed by reading
//! the BAR back through its CPU mapping (volatile copies, never a reference).

use vfpoll_dma::{DeviceBuf, DmaContext};

use super::{CheckpointTx, ReadOptions, VersionReader};
use crate::error::{Result, StoreError};
use crate::format::{crc32c_append, Extent, PAGE};
use crate::io::{join_all, Job, PeerJob, PEER_NEEDS};
use crate::store::Store;

/// Bytes read back through the BAR's CPU mapping at a time for a crc32c.
const STEP: usize = 64 << 10;

impl Store {
    /// The DMA context in which every namespace of the store moves data, for registering a
    /// peer device's BAR ([`DmaContext::register_peer_bar`], `unsafe`: the caller answers for
    /// the BAR mapping) whose [`DeviceBuf`]s [`CheckpointTx::put_from_peer`] and
    /// [`VersionReader::read_into_peer`] take.
    ///
    /// `Some` when every member is an NVMe namespace through vfpoll's driver (`vfio:`; `model:`
    /// in tests) and all are in one context (`vfio:` namespaces of one store share one VFIO
    /// container; each `model:` namespace has a context of its own, so only a one-member
    /// model store has one). `None` otherwise: an io_uring file or block device, or memory,
    /// cannot DMA into a BAR, and a BAR registered in one context means nothing to a
    /// controller in another. Registration itself may still be refused: under the iommufd
    /// backend the kernel will not map a BAR (the error says to use `--iommu-backend type1`);
    /// the caller then uses the host-memory paths.
    pub fn dma_context(&self) -> Option<DmaContext> {
        self.peer_context().ok()
    }

    /// [`Store::dma_context`], or the error that peer-BAR I/O reports without one.
    fn peer_context(&self) -> Result<DmaContext> {
        self.io()
            .dma_context()
            .map_err(|why| StoreError::Invalid(format!("{PEER_NEEDS} ({why})")))
    }
}

/// The crc32c of `len` bytes of `buf` from `at`, read through the BAR's CPU mapping.
fn bar_crc(buf: &DeviceBuf, at: usize, len: usize, step: &mut [u8]) -> Result<u32> {
    let mut crc = 0;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(step.len());
        buf.read(at + done, &mut step[..n])
            .map_err(|e| StoreError::Internal(format!("reading the peer BAR: {e}")))?;
        crc = crc32c_append(crc, &step[..n]);
        done += n;
    }
    Ok(crc)
}

/// `buf` cut into consecutive pieces of `lens` bytes (which sum to its length); `buf` is left
/// an empty piece at its start, for [`rejoin`].
fn cut(buf: &mut DeviceBuf, lens: &[usize]) -> Vec<Option<DeviceBuf>> {
    let mut rest = buf.split_off(0);
    let mut out = Vec::with_capacity(lens.len());
    for &n in lens {
        let tail = rest.split_off(n);
        out.push(Some(std::mem::replace(&mut rest, tail)));
    }
    out
}

/// Joins `pieces` back into `buf`; if one is missing (a timeout left it with a queue pair,
/// which may still write it), `buf` stays empty and an error says so.
fn rejoin(buf: &mut DeviceBuf, pieces: Vec<Option<DeviceBuf>>) -> Result<()> {
    if pieces.iter().any(Option::is_none) {
        return Err(StoreError::Internal(
            "a piece of the peer BAR buffer stayed with a queue pair after a timeout; the buffer is \
             left empty (its bytes are never reused by the store)"
                .into(),
        ));
    }
    if let Some(whole) = join_all(pieces.into_iter().flatten()) {
        *buf = whole;
    }
    Ok(())
}

/// Runs the peer jobs of `pieces` (index, first logical page) on one channel, moving the
/// pieces in and back.
fn run_direct(
    store: &Store,
    pieces: &mut [Option<DeviceBuf>],
    direct: &[(usize, u64)],
    write: bool,
) -> Result<()> {
    if direct.is_empty() {
        return Ok(());
    }
    let mut jobs: Vec<PeerJob> = direct
        .iter()
        .map(|&(i, page)| PeerJob {
            page,
            buf: pieces[i].take(),
            write,
        })
        .collect();
    let r = store.io().run_peer(&mut jobs);
    for (job, &(i, _)) in jobs.into_iter().zip(direct) {
        pieces[i] = job.buf;
    }
    r
}

impl CheckpointTx {
    /// Writes entry `name` with the caller's `meta` bytes from `buf`, a piece of a peer
    /// device's BAR registered in [`Store::dma_context`]: the controllers read the data from
    /// the BAR straight into the namespaces (no bounce buffer, no CPU copy of the whole pages;
    /// the odd bytes of the last page go through a store buffer, and so does everything when
    /// `buf` does not start at a multiple of 4 bytes, as NVMe needs). The crc32c of each extent is
    /// computed first by reading the BAR through its CPU mapping (a BAR read by the CPU is
    /// slow: uncached reads, tens to hundreds of MB/s on a GPU BAR). Commit semantics are
    /// those of [`CheckpointTx::put`]: nothing is visible before the commit, all or nothing.
    ///
    /// `buf` is borrowed mutably because its pieces move into the queue pairs while in flight;
    /// its bytes are not changed, and the caller must not change them until this returns (the
    /// stored crc32c is of the bytes read before the transfer). When it returns `buf` holds
    /// its whole range again, except after a timeout, when a piece may still be with a queue
    /// pair: `buf` is then left empty. A store with a member that is not an NVMe namespace in
    /// the store's one DMA context refuses ([`StoreError::Invalid`]) before touching anything.
    pub fn put_from_peer(&mut self, name: &str, meta: &[u8], buf: &mut DeviceBuf) -> Result<()> {
        self.store.peer_context()?;
        let len = buf.len() as u64;
        let runs = self.take_pages(name, meta, len)?;
        // Extents (with their crc32c from the BAR), and the pieces: whole pages direct, the odd
        // bytes of the last page through a store buffer.
        let mut extents = Vec::with_capacity(runs.len());
        let mut lens = Vec::new();
        let mut direct = Vec::new();
        let mut odd = Vec::new();
        let mut step = vec![0u8; STEP];
        let planned = (|| {
            let mut at = 0usize;
            for &(page, n) in &runs {
                let l = (len as usize - at).min(n as usize * PAGE);
                let crc = bar_crc(buf, at, l, &mut step)?;
                extents.push(Extent {
                    page,
                    len: l as u32,
                    crc,
                });
                // NVMe data buffers are dword aligned (NVMe Base 2.0 §4.1.1, PRP entries); an
                // extent whose BAR bytes are not goes through a store buffer.
                let whole = if buf.bus_addr(at).is_aligned(4) {
                    l / PAGE * PAGE
                } else {
                    0
                };
                if whole > 0 {
                    direct.push((lens.len(), page));
                    lens.push(whole);
                }
                if l > whole {
                    odd.push((lens.len(), page + (whole / PAGE) as u64));
                    lens.push(l - whole);
                }
                at += l;
            }
            Ok(())
        })();
        let written = planned.and_then(|()| {
            let mut pieces = cut(buf, &lens);
            let r = (|| {
                if !odd.is_empty() {
                    let mut tails: Vec<Vec<u8>> = Vec::with_capacity(odd.len());
                    for &(i, _) in &odd {
                        let p = pieces[i].as_ref().expect("not lent yet");
                        let mut t = vec![0u8; p.len()];
                        p.read(0, &mut t)
                            .map_err(|e| StoreError::Internal(format!("reading the peer BAR: {e}")))?;
                        tails.push(t);
                    }
                    let mut jobs: Vec<Job<'_>> = odd
                        .iter()
                        .zip(&tails)
                        .map(|(&(_, page), t)| Job::Write { page, data: t })
                        .collect();
                    self.store.io().run(&mut jobs)?;
                }
                run_direct(&self.store, &mut pieces, &direct, true)
            })();
            let back = rejoin(buf, pieces);
            r.and(back)
        });
        if let Err(e) = written {
            self.give_back(&runs);
            return Err(e);
        }
        self.add_entry(name, meta, len, &runs, extents);
        Ok(())
    }
}

/// How a piece of a peer read gets its bytes.
enum How {
    /// Whole pages from logical page `page`, device to BAR.
    Direct { page: u64 },
    /// Through the store's buffers ([`VersionReader::read_range`]) from entry byte `at`, then a
    /// CPU copy into the BAR; `verify`: that read checks the extent itself.
    Host { at: u64, verify: bool },
}

impl VersionReader {
    /// Reads `buf.len()` bytes of entry `name` from byte `offset` into `buf`, a piece of a
    /// peer device's BAR registered in [`Store::dma_context`]: each extent's whole pages are
    /// read by the controller straight into the BAR (no bounce buffer, no CPU copy); the odd
    /// bytes of an entry's last page, extents only partly inside the range, and extents that
    /// would land in the BAR at an address that is not a multiple of 4 (NVMe moves data to
    /// dword-aligned addresses only: keep `offset` and `buf`'s address congruent modulo 4,
    /// e.g. both page-aligned) go through the store's buffers and a CPU copy.
    ///
    /// With `o.verify` (the default) the crc32c of every extent is checked: a whole extent
    /// read into the BAR is read back through the BAR's CPU mapping (correct, but a CPU read
    /// of a BAR is slow: uncached, tens to hundreds of MB/s on a GPU BAR, so it can cost more
    /// than the transfer); `verify: false` skips it. A mismatch is an error naming the entry
    /// and extent, and the BAR's bytes must then not be used.
    ///
    /// `buf` is lent to the queue pairs piece by piece and whole again when this returns,
    /// except after a timeout, when a piece may still be with a queue pair: `buf` is then left
    /// empty. A store with a member that is not an NVMe namespace in the store's one DMA
    /// context refuses ([`StoreError::Invalid`]); a caller whose BAR could not be registered
    /// (the iommufd backend refuses BARs) reads into host memory with
    /// [`VersionReader::read_range`] instead.
    pub fn read_into_peer(
        &self,
        name: &str,
        offset: u64,
        buf: &mut DeviceBuf,
        o: &ReadOptions,
    ) -> Result<()> {
        self.store.peer_context()?;
        let e = self.find(name)?;
        let len = buf.len() as u64;
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > e.len) {
            return Err(StoreError::Invalid(format!(
                "bytes {offset}..+{len} are outside entry {name:?} ({} bytes)",
                e.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let mut lens = Vec::new();
        let mut hows = Vec::new();
        // Whole extents read into the BAR and checked from it: (extent, its byte in `buf`).
        let mut checks: Vec<(Extent, usize)> = Vec::new();
        for (x, xs) in e.extents_in(offset, end) {
            let xe = xs + x.len as u64;
            let whole = x.len as usize / PAGE * PAGE;
            // NVMe data buffers are dword aligned (NVMe Base 2.0 §4.1.1, PRP entries): an
            // extent that would land unaligned in the BAR goes through a store buffer.
            let inside = xs >= offset && xe <= end;
            if inside && whole > 0 && buf.bus_addr((xs - offset) as usize).is_aligned(4) {
                lens.push(whole);
                hows.push(How::Direct { page: x.page });
                if whole < x.len as usize {
                    lens.push(x.len as usize - whole);
                    hows.push(How::Host {
                        at: xs + whole as u64,
                        verify: false,
                    });
                }
                if o.verify {
                    checks.push((*x, (xs - offset) as usize));
                }
            } else {
                let (from, to) = (offset.max(xs), end.min(xe));
                lens.push((to - from) as usize);
                hows.push(How::Host {
                    at: from,
                    verify: o.verify,
                });
            }
        }
        let mut pieces = cut(buf, &lens);
        let r = (|| {
            let mut tmp = Vec::new();
            let mut direct = Vec::new();
            for (i, h) in hows.iter().enumerate() {
                match *h {
                    How::Direct { page } => direct.push((i, page)),
                    How::Host { at, verify } => {
                        let p = pieces[i].as_mut().expect("not lent yet");
                        tmp.resize(p.len(), 0);
                        self.read_range(name, at, &mut tmp, &ReadOptions { verify })?;
                        p.write(0, &tmp)
                            .map_err(|e| StoreError::Internal(format!("writing the peer BAR: {e}")))?;
                    }
                }
            }
            run_direct(&self.store, &mut pieces, &direct, false)
        })();
        let back = rejoin(buf, pieces);
        r.and(back)?;
        let mut step = vec![0u8; STEP.min(len as usize)];
        for (x, at) in checks {
            let got = bar_crc(buf, at, x.len as usize, &mut step)?;
            if got != x.crc {
                return Err(StoreError::Checksum {
                    object: format!(
                        "checkpoint {:?} version {} entry {name:?} (read into a peer BAR)",
                        self.checkpoint, self.info.id
                    ),
                    page: x.page,
                    stored: x.crc,
                    computed: got,
                });
            }
        }
        Ok(())
    }
}
