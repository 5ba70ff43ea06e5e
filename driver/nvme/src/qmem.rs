//! Raw access to queue memory: submission queue slots, completion queue entries, PRP list pages
//! and shadow doorbells, all inside one [`DmaRegion`] owned by the queue.
//!
//! This is the only module of the crate with `unsafe` code. It never forms a reference into the
//! region: SQ entries are stored with volatile writes, completion entries are read with
//! volatile loads (the phase tag first, then the rest after a barrier), list entries are
//! volatile stores. Offsets are checked against the region length.

use std::mem::ManuallyDrop;
use std::sync::atomic::{compiler_fence, fence, Ordering};

use vfpoll_dma::DmaRegion;

use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::BusAddr;

use crate::cmd::{Completion, CQE_SIZE, PHASE, SQE_SIZE};

/// Where a queue's pieces sit in its memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub sq_off: usize,
    pub cq_off: usize,
    pub entries: u16,
}

/// A queue's DMA memory, and where its submission and completion queue slots are.
pub(crate) struct QueueMem {
    region: ManuallyDrop<DmaRegion>,
    base: *mut u8,
    len: usize,
    /// Slot 0 of the submission queue: in `region`, or in the controller memory buffer
    /// (`sq_cmb`). Slots `0..entries` are in bounds (checked when set).
    sq: *mut u64,
    /// Entry 0 of the completion queue, in `region`; entries `0..entries` are in bounds.
    cq: *const u32,
    entries: u16,
    /// The submission queue's tail: the slot the next command goes to. Always below
    /// `entries` (set only here: 0, advanced with wrap-around by `push_sqe`, or checked by
    /// `set_sq_tail`), so `push_sqe` stores without a bounds check.
    sq_tail: u16,
    /// The completion queue's head: the entry the next completion is read from. Always below
    /// `entries` (0, or advanced with wrap-around by `pop_cqe`), so it is read unchecked.
    cq_head: u16,
    /// The phase tag the entry at `cq_head` carries once posted, where it sits in DW3 (bit
    /// 16): `PHASE` or 0; it flips each time the head wraps (NVMe Base 2.0 §4.6).
    cq_phase: u32,
    /// Keeps the CMB mapping alive while the submission queue is there.
    sq_cmb: Option<Mmio>,
    /// Set when the controller may still access the memory: it is then never freed.
    leak: bool,
}

impl Drop for QueueMem {
    fn drop(&mut self) {
        if !self.leak {
            // SAFETY: dropped exactly once, here; `base` is not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        }
    }
}

// SAFETY: the memory is owned by `region` (Send) and the CMB window by `sq_cmb` (Send), and is
// reached only through `&mut self` for stores or `&self` for volatile loads; the raw pointers are
// tied to the memory they came from.
unsafe impl Send for QueueMem {}

impl std::fmt::Debug for QueueMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueueMem({:?}, SQ in CMB: {})",
            self.region,
            self.sq_cmb.is_some()
        )
    }
}

/// The panic of an index past the queue's entries: out of line and by value, so the hot
/// paths' bounds checks are a compare and a branch (an `assert!` with the index in its message
/// keeps the index in a stack slot for it).
#[cold]
#[inline(never)]
#[track_caller]
fn out_of_bounds(what: &str, slot: u16) -> ! {
    panic!("{what} {slot} out of bounds")
}

/// Orders the stores to queue memory before a following doorbell store (MMIO).
///
/// On x86-64 stores are not reordered with other stores and an uncached MMIO store is not
/// reordered with earlier write-back stores, so a compiler barrier is enough; elsewhere a full
/// fence (SPDK: `spdk_wmb`).
#[inline(always)]
pub(crate) fn wmb() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// Orders the load of a completion's phase tag before the loads of its other fields.
#[inline(always)]
fn rmb() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

impl QueueMem {
    /// The queue memory `region`, with the submission and completion queues where `layout`
    /// says. Panics if they do not fit in the region.
    pub(crate) fn new(mut region: DmaRegion, layout: Layout) -> Self {
        let len = region.len();
        let n = layout.entries as usize;
        assert!(
            layout.sq_off.is_multiple_of(SQE_SIZE)
                && layout.cq_off.is_multiple_of(CQE_SIZE)
                && layout.sq_off + n * SQE_SIZE <= len
                && layout.cq_off + n * CQE_SIZE <= len,
            "queues of {n} entries outside the {len:#x}-byte queue memory"
        );
        // Start from zeroes: completion queues need phase tags of 0, list pages are rewritten.
        region.fill(0, len, 0).expect("whole region is in bounds");
        let base = region.as_ptr();
        QueueMem {
            region: ManuallyDrop::new(region),
            base,
            len,
            sq: base.wrapping_add(layout.sq_off).cast(),
            cq: base.wrapping_add(layout.cq_off).cast_const().cast(),
            entries: layout.entries,
            sq_tail: 0,
            cq_head: 0,
            cq_phase: PHASE,
            sq_cmb: None,
            leak: false,
        }
    }

    /// Moves the submission queue's slots into `cmb`, a window of the controller memory buffer
    /// (write-through MMIO) at least `entries` slots long.
    pub(crate) fn put_sq_in_cmb(&mut self, cmb: Mmio) {
        assert!(
            cmb.len() >= self.entries as usize * SQE_SIZE && (cmb.as_ptr() as usize).is_multiple_of(8),
            "CMB window {cmb:?} too small for {} submission queue entries",
            self.entries
        );
        self.sq = cmb.as_ptr().cast();
        self.sq_cmb = Some(cmb);
    }

    /// Never free this memory (nor unmap it): the controller may still read or write it.
    pub(crate) fn leak(&mut self) {
        self.leak = true;
        if let Some(cmb) = self.sq_cmb.take() {
            std::mem::forget(cmb);
        }
    }

    pub(crate) fn region(&self) -> &DmaRegion {
        &self.region
    }

    /// Bus address of `off`.
    pub(crate) fn bus(&self, off: usize) -> BusAddr {
        self.region.bus_addr(off)
    }

    #[inline(always)]
    fn check(&self, off: usize, size: usize) {
        assert!(
            off.is_multiple_of(size.min(8)) && off + size <= self.len,
            "queue memory access {off:#x}+{size} out of bounds"
        );
    }

    /// Stores a 64-byte command, as eight little-endian 64-bit words, in the submission queue
    /// slot at the tail, and advances the tail (NVMe Base 2.0 §4.1). Returns the new tail.
    #[inline]
    pub(crate) fn push_sqe(&mut self, words: &[u64; 8]) -> u16 {
        let tail = self.sq_tail;
        let dst = self.sq.wrapping_add(tail as usize * 8);
        for (i, &w) in words.iter().enumerate() {
            // SAFETY: `tail < entries` (the invariant of `sq_tail`, kept by every method that
            // sets it), and the queue's `entries` slots are inside the region or the CMB window
            // (checked in `new` / `put_sq_in_cmb`), 8-byte aligned; both are kept alive by
            // `self`. Volatile: the device reads this memory.
            unsafe { dst.wrapping_add(i).write_volatile(w.to_le()) };
        }
        let next = if tail + 1 == self.entries { 0 } else { tail + 1 };
        self.sq_tail = next;
        next
    }

    /// The submission queue's tail.
    #[inline]
    pub(crate) fn sq_tail(&self) -> u16 {
        self.sq_tail
    }

    /// Moves the submission queue's tail (back over commands not announced, or to 0 for a
    /// queue re-created after a reset). Panics if `tail` is not a slot of the queue.
    pub(crate) fn set_sq_tail(&mut self, tail: u16) {
        if tail >= self.entries {
            out_of_bounds("submission queue tail", tail);
        }
        self.sq_tail = tail;
    }

    /// The completion queue's head.
    #[inline]
    pub(crate) fn cq_head(&self) -> u16 {
        self.cq_head
    }

    /// Back to a new completion queue's state: head 0, phase tag 1 (a queue re-created in place
    /// after a controller reset; its entries are zeroed apart, by `zero`).
    pub(crate) fn reset_cq(&mut self) {
        self.cq_head = 0;
        self.cq_phase = PHASE;
    }

    /// Whether the controller has posted the entry at the head (no side effect).
    #[inline]
    pub(crate) fn cqe_posted(&self) -> bool {
        self.cqe_at_head().is_some()
    }

    /// The completion at the head if the controller has posted it (its phase tag is the one
    /// expected), and advances the head past it, with wrap-around and a phase flip (NVMe Base
    /// 2.0 §4.6).
    #[inline]
    pub(crate) fn pop_cqe(&mut self) -> Option<Completion> {
        // The head from a local: after the volatile loads the field would be loaded again.
        let head = self.cq_head;
        let c = self.cqe_at_head()?;
        if head + 1 == self.entries {
            self.cq_head = 0;
            self.cq_phase ^= PHASE;
        } else {
            self.cq_head = head + 1;
        }
        Some(c)
    }

    /// Completion queue entry `cq_head` if the controller has posted it: its phase tag (DW3 bit
    /// 16) is `cq_phase`. The tag is loaded first; the other dwords only after it matched.
    #[inline(always)]
    fn cqe_at_head(&self) -> Option<Completion> {
        let p = self.cq.wrapping_add(self.cq_head as usize * 4);
        // SAFETY: `cq_head < entries` (the invariant of `cq_head`, kept by every method that
        // sets it) and the queue's entries are inside the region (checked in `new`), 16-byte
        // aligned; volatile because the device writes them.
        let dw3 = u32::from_le(unsafe { p.wrapping_add(3).read_volatile() });
        if dw3 & PHASE != self.cq_phase {
            return None;
        }
        rmb();
        let mut dw = [0u32, 0, 0, dw3];
        for (i, d) in dw.iter_mut().take(3).enumerate() {
            // SAFETY: as above; the device wrote the entry before its phase tag.
            *d = u32::from_le(unsafe { p.wrapping_add(i).read_volatile() });
        }
        Some(Completion::from_dwords(dw))
    }

    /// Copies the 64-byte command in submission queue slot `slot` out (a command written but
    /// not yet announced, kept across a controller reset).
    pub(crate) fn read_sqe(&self, slot: u16) -> [u64; 8] {
        assert!(slot < self.entries, "submission queue slot {slot} out of bounds");
        let src = self.sq.wrapping_add(slot as usize * 8).cast_const();
        let mut words = [0u64; 8];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: as in `write_sqe`; volatile because the slot is device-visible memory.
            *w = u64::from_le(unsafe { src.wrapping_add(i).read_volatile() });
        }
        words
    }

    /// Zeroes `len` bytes from `off` of the region (the completion queue of a queue re-created
    /// after a controller reset: every phase tag back to 0). Only while the controller does not
    /// use the queue.
    pub(crate) fn zero(&mut self, off: usize, len: usize) {
        self.region
            .fill(off, len, 0)
            .expect("queue memory zeroed inside its region");
    }

    /// Stores a 64-bit little-endian word at `off` (PRP list entries, SGL descriptors).
    #[inline]
    pub(crate) fn write_u64(&mut self, off: usize, v: u64) {
        self.check(off, 8);
        let p = self.base.wrapping_add(off).cast::<u64>();
        // SAFETY: in bounds and aligned (checked); the region is live.
        unsafe { p.write_volatile(v.to_le()) };
    }
}

/// The Doorbell Buffer Config pages of a controller (NVMe Base 2.0 §5.8): one page of shadow
/// doorbells the host writes and one page of EventIdx values the controller writes, shared by
/// every I/O queue; each queue touches only its own two 32-bit words in each page.
pub(crate) struct ShadowPages {
    region: DmaRegion,
    base: *mut u8,
}

// SAFETY: the region is owned here; the raw pointer points into it. Queues on different threads
// access disjoint 32-bit words only, with volatile accesses (see `ShadowSlot`).
unsafe impl Send for ShadowPages {}
// SAFETY: as above; `&ShadowPages` hands out slots, never references into the memory.
unsafe impl Sync for ShadowPages {}

impl std::fmt::Debug for ShadowPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShadowPages({:?})", self.region)
    }
}

impl ShadowPages {
    /// Two zeroed pages: shadow doorbells at offset 0, EventIdx at `page`.
    pub(crate) fn new(mut region: DmaRegion, page: usize) -> Self {
        assert!(region.len() >= 2 * page);
        region.fill(0, 2 * page, 0).expect("in bounds");
        let base = region.as_ptr();
        ShadowPages { region, base }
    }

    /// Bus addresses of the shadow doorbell page and the EventIdx page.
    pub(crate) fn bus(&self, page: usize) -> (BusAddr, BusAddr) {
        (self.region.bus_addr(0), self.region.bus_addr(page))
    }

    /// For a controller that was just disabled (it no longer writes EventIdx): sets every I/O
    /// submission queue's EventIdx (queues 1..=`queues`, doorbell stride `stride`) to its
    /// shadow tail, so that the next update of each asks for an MMIO doorbell write
    /// (`ShadowSlot::update`), the path that checks whether the controller still knows the
    /// queue: a queue pair that has not noticed the reset yet keeps its next commands instead
    /// of taking them for announced.
    pub(crate) fn force_events(&self, stride: usize, page: usize, queues: u16) {
        for qid in 1..=queues as usize {
            let sq = 2 * qid * stride;
            if sq + 4 > page {
                break;
            }
            let p = self.base.wrapping_add(sq).cast::<u32>();
            let e = self.base.wrapping_add(page + sq).cast::<u32>();
            // SAFETY: the shadow word is inside the first page (checked against `page` above;
            // `new` checked the region holds two pages), 4-byte aligned. Its queue's thread may
            // write it meanwhile: an aligned 32-bit volatile load sees one value or the other,
            // either of which forces the event.
            let tail = unsafe { p.read_volatile() };
            // SAFETY: the EventIdx word is inside the second page, likewise aligned; it is the
            // controller's, which is disabled.
            unsafe { e.write_volatile(tail) };
        }
    }

    /// The words of queue `qid` (doorbell stride `stride`), reset to 0 for a new queue: its
    /// shadow doorbells and its EventIdx words, which a previous queue of the same id may
    /// have left behind (a stale EventIdx would suppress the first MMIO doorbells).
    pub(crate) fn slot(self: &std::sync::Arc<Self>, qid: u16, stride: usize, page: usize) -> ShadowSlot {
        let sq = 2 * qid as usize * stride;
        let cq = sq + stride;
        assert!(cq + 4 <= page, "queue {qid} beyond the shadow doorbell page");
        let s = ShadowSlot {
            pages: std::sync::Arc::clone(self),
            base: self.base,
            sq,
            cq,
            ei: page,
            words: [sq, page + sq, cq, page + cq].map(|off| self.base.wrapping_add(off).cast::<u32>()),
        };
        s.store(sq, 0);
        s.store(cq, 0);
        s.store(page + sq, 0);
        s.store(page + cq, 0);
        s
    }
}

/// One queue's shadow doorbells and EventIdx words.
#[derive(Debug)]
pub(crate) struct ShadowSlot {
    /// Keeps the pages alive.
    #[expect(dead_code, reason = "held for its lifetime only")]
    pages: std::sync::Arc<ShadowPages>,
    /// `pages.base`, one load fewer per doorbell update.
    base: *mut u8,
    sq: usize,
    cq: usize,
    ei: usize,
    /// The SQ shadow doorbell, the SQ EventIdx, the CQ shadow doorbell and the CQ EventIdx
    /// words (at `sq`, `ei + sq`, `cq`, `ei + cq`): `update` loads no offset.
    words: [*mut u32; 4],
}

// SAFETY: `base` and `words` point into the pages `pages` keeps alive (Send and Sync); a slot touches only
// its own queue's words, through `&self` methods used by the one thread that owns the queue.
unsafe impl Send for ShadowSlot {}

impl ShadowSlot {
    /// Zeroes this queue's shadow doorbell and EventIdx words (a queue re-created in place after
    /// a controller reset, before the controller learns of it again).
    pub(crate) fn reset(&self) {
        for off in [self.sq, self.cq, self.ei + self.sq, self.ei + self.cq] {
            self.store(off, 0);
        }
    }

    fn store(&self, off: usize, v: u32) {
        let p = self.base.wrapping_add(off).cast::<u32>();
        // SAFETY: `off` is one of this queue's words in the shadow page or (when the queue is
        // set up, before the controller knows it) the EventIdx page; both are inside the two
        // pages (checked in `slot` and `new`), 4-byte aligned; the region lives as long as
        // `pages`. Only this queue writes its shadow words.
        unsafe { p.write_volatile(v.to_le()) }
    }

    #[cfg(test)]
    fn load(&self, off: usize) -> u32 {
        let p = self.base.wrapping_add(off).cast::<u32>();
        // SAFETY: as in `store`; the controller writes EventIdx words, hence volatile.
        u32::from_le(unsafe { p.read_volatile() })
    }

    /// Publishes a new SQ tail (or, `cq`, CQ head) in the shadow doorbell and says whether the
    /// controller asked to be told through the MMIO doorbell: the EventIdx rule (NVMe Base 2.0 §5.8) as
    /// Linux implements it (`nvme_dbbuf_need_event`).
    #[inline]
    pub(crate) fn update(&self, cq: bool, value: u16) -> bool {
        let (db, ei) = if cq {
            (self.words[2], self.words[3])
        } else {
            (self.words[0], self.words[1])
        };
        wmb();
        // SAFETY: `db` is this queue's shadow doorbell word (`words`, made in `slot` from
        // offsets checked there to lie in the first page; `new` checked the region holds two
        // pages), 4-byte aligned; the region lives as long as `pages`. Only this queue writes it.
        let old = u32::from_le(unsafe { db.read_volatile() }) as u16;
        // SAFETY: as above.
        unsafe { db.write_volatile((value as u32).to_le()) };
        // The shadow write must be visible before the EventIdx read (the controller orders the
        // other way round): a full fence.
        fence(Ordering::SeqCst);
        // SAFETY: `ei` is this queue's EventIdx word in the second page, likewise checked and
        // aligned; the controller writes it, hence volatile.
        let event = u32::from_le(unsafe { ei.read_volatile() }) as u16;
        value.wrapping_sub(event).wrapping_sub(1) < value.wrapping_sub(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfpoll_dma::{DmaContext, PageSize};

    const PAGE: usize = 4096;

    /// A queue id used again starts with zeroed shadow doorbell and EventIdx words (NVMe Base
    /// 2.0 §5.8): the old queue's EventIdx would make the new queue's first doorbell moves look
    /// announced already, and no MMIO doorbell would be written for them. (The device model,
    /// like QEMU, writes a new queue's EventIdx itself, so this is tested here.)
    #[test]
    fn a_reused_queue_id_gets_clean_words_and_rings_its_first_doorbells() {
        let dma = DmaContext::for_testing();
        let region = dma.alloc_region(2 * PAGE, PageSize::Base4K).unwrap();
        let pages = std::sync::Arc::new(ShadowPages::new(region, PAGE));
        let old = pages.slot(1, 4, PAGE);
        // The old queue's life: doorbells moved to 40, the controller's EventIdx with them.
        for v in 1..=40u16 {
            old.update(false, v);
            old.update(true, v);
            old.store(old.ei + old.sq, v as u32);
            old.store(old.ei + old.cq, v as u32);
        }
        // A neighbour's words are not touched by the new slot.
        let other = pages.slot(2, 4, PAGE);
        other.store(other.ei + other.sq, 7);
        drop(old);
        let new = pages.slot(1, 4, PAGE);
        for off in [new.sq, new.cq, new.ei + new.sq, new.ei + new.cq] {
            assert_eq!(new.load(off), 0, "word at {off:#x}");
        }
        assert_eq!(other.load(other.ei + other.sq), 7);
        assert!(new.update(false, 1), "the new queue's first SQ tail move rings");
        assert!(new.update(true, 1), "its first CQ head move rings");
        // What a stale EventIdx would have done: suppress the doorbell.
        new.store(new.ei + new.sq, 40);
        assert!(!new.update(false, 2));
    }
}
