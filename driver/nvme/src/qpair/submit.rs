//! The submission paths: reads, writes and compares (with or without a separate metadata
//! buffer, split at the maximum transfer), commands without data, raw passthrough.
//!
//! Every path checks before it writes a submission queue entry: the namespace and its format,
//! the length in whole blocks, the LBA range, a free slot; the pointers come from
//! [`super::xfer::describe`]. Nothing is announced to the controller until the doorbell rings
//! in `poll` or `flush_submissions`.

use std::sync::atomic::Ordering;

use vfpoll_pci::BusAddr;

use super::slot::{Op, Request, UNUSED};
use super::xfer::{self, NsInfo};
use super::{QueuePair, Rejected};
use crate::buffer::IoBuffer;
use crate::cmd::{io_op, Command, DataPtr, Psdt, Rw};
use crate::ctrlr::PAGE_SIZE;
use crate::error::{NvmeError, Result};
use crate::queue::Rung;

/// A refused submission: why, and the buffers back.
type Refused<B> = (NvmeError, B, Option<B>);

/// The entry of a read, write, compare or zone append (`op`) of `blocks` blocks at `slba` of
/// `ns`, with command id 0 (`issue` gives it one): the format's PRINFO and, where the format
/// checks reference tags, the LBA's low 32 bits as the initial one (for a zone append, the
/// zone's first LBA: ZNS 1.1 §3.4.1, the controller remaps it to the written LBA). The hot
/// template's path fills the same fields from `HotNs`.
#[inline(always)]
pub(super) fn rw_entry(ns: &NsInfo, op: Op, slba: u64, blocks: u64, dp: DataPtr, mptr: BusAddr) -> Rw {
    let (opcode, fua) = op.io_opcode();
    let (psdt, dptr) = dp.rw_fields();
    Rw {
        opcode,
        psdt,
        cid: 0,
        nsid: ns.nsid,
        mptr: mptr.get(),
        dptr,
        slba,
        blocks: blocks as u32,
        dw12_flags: (fua as u32) << 30 | ns.prinfo,
        ref_tag: if ns.ref_tag { slba as u32 } else { 0 },
    }
}

/// The submission fast path's namespace: the few fields of one namespace's view that decide
/// whether a read or write fits one command with PRP1 alone, precomputed so that each check
/// is one compare, and the command's constant bits. Made from the view (`make_hot`, when a
/// submission to a namespace it can describe takes the checked path), reset to [`HotNs::NONE`]
/// whenever the view is rebuilt or the queue pair fails, so a request that fits it has passed
/// exactly the checks the checked path makes.
#[derive(Debug, Clone, Copy)]
pub(super) struct HotNs {
    /// The NSID, widened: [`HotNs::NONE`]'s `u64::MAX` matches no `u32` a caller can give.
    nsid: u64,
    /// The namespace's size in blocks.
    blocks: u64,
    /// Bytes per block - 1 (a power of two).
    mask: usize,
    /// log2(bytes per block).
    shift: u32,
    /// The longest buffer one command moves (at most a page: PRP1 alone).
    max_len: usize,
    /// The length of the last request that fitted (every application has one or two),
    /// checked against `max_len` and `mask` when it was stored: a request of that length
    /// passes the length checks with one compare (`hot_len` checks any other).
    len: usize,
    /// Its blocks.
    len_blocks: u64,
    /// `(PAGE_SIZE - len) / 4`: the highest dword in a page its buffer may start at.
    room: usize,
    /// CDW12 bits of the format: PRINFO (NVM Command Set 1.0 §3.2.4).
    dw12_flags: u32,
    /// CDW14 = the LBA's low 32 bits (the initial reference tag) when all-ones, 0 when 0.
    ref_mask: u64,
}

impl HotNs {
    /// No hot namespace: every submission takes the checked path.
    pub(super) const NONE: HotNs = HotNs {
        nsid: u64::MAX,
        blocks: 0,
        mask: 0,
        shift: 0,
        max_len: 0,
        // Never matched: no NSID matches `nsid` first.
        len: 0,
        len_blocks: 0,
        room: 0,
        dw12_flags: 0,
        ref_mask: 0,
    };
}

impl<B: IoBuffer> QueuePair<B> {
    /// Reads `buf.len()` bytes from `slba` of `nsid` into `buf`: a whole number of blocks of the
    /// bytes per block the namespace's format moves through the data buffer (the LBA size, plus
    /// the metadata for an extended-LBA format).
    #[inline]
    pub fn read(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Read, nsid, slba, buf, tag)
    }

    /// Writes `buf` to `slba` of `nsid`.
    #[inline]
    pub fn write(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Write, nsid, slba, buf, tag)
    }

    /// Writes with Force Unit Access: completes only once the data is on non-volatile media.
    #[inline]
    pub fn write_fua(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::WriteFua, nsid, slba, buf, tag)
    }

    /// Compares `buf` with the blocks at `slba`: completes with "Compare Failure" on a mismatch.
    #[inline]
    pub fn compare(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Compare, nsid, slba, buf, tag)
    }

    /// Reads data into `buf` and the blocks' metadata into `meta`, for a namespace formatted
    /// with metadata in a separate buffer: `meta` holds exactly blocks × metadata bytes, in
    /// one bus-contiguous, dword-aligned range. Both come back with the completion.
    pub fn read_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: B,
        meta: B,
        tag: u64,
    ) -> Result<(), Rejected<(B, B)>> {
        self.submit_md(Op::Read, nsid, slba, buf, meta, tag)
    }

    /// Writes `buf` and its blocks' metadata `meta` (see [`QueuePair::read_with_metadata`]).
    pub fn write_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: B,
        meta: B,
        tag: u64,
    ) -> Result<(), Rejected<(B, B)>> {
        self.submit_md(Op::Write, nsid, slba, buf, meta, tag)
    }

    fn submit_md(
        &mut self,
        op: Op,
        nsid: u32,
        slba: u64,
        buf: B,
        meta: B,
        tag: u64,
    ) -> Result<(), Rejected<(B, B)>> {
        self.submit(op, nsid, slba, buf, Some(meta), tag)
            .map_err(|(error, b, m)| Rejected {
                error,
                buf: (b, m.expect("given")),
            })
    }

    /// A read, write or compare: the hot namespace's template when everything about the request
    /// fits it ([`HotNs`]), the checked path otherwise.
    #[inline]
    fn submit_data(&mut self, op: Op, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        if let Some((slot, blocks, prp1)) = self.hot_fits(nsid, slba, &buf) {
            let h = self.hot;
            let (opcode, fua) = op.io_opcode();
            self.issue_popped(slot, tag, op, Some(buf), None, false, |cid| {
                // A one-page PRP transfer, from the template.
                Rw {
                    opcode,
                    psdt: Psdt::Prp,
                    cid,
                    nsid: h.nsid as u32,
                    mptr: 0,
                    dptr: [prp1, 0],
                    slba,
                    blocks: blocks as u32,
                    dw12_flags: (fua as u32) << 30 | h.dw12_flags,
                    ref_tag: (slba & h.ref_mask) as u32,
                }
                .words()
            });
            return Ok(());
        }
        self.submit_data_checked(op, nsid, slba, buf, tag)
    }

    /// Whether a request of `buf` at `slba` of `nsid` fits the hot namespace's template: the
    /// namespace, a whole number of blocks that one command moves, in range, a dword-aligned
    /// buffer inside one page (PRP1 alone describes it), a free slot, which it takes. The same
    /// checks as `submit`'s, each one compare against a precomputed field.
    #[inline(always)]
    fn hot_fits(&mut self, nsid: u32, slba: u64, buf: &B) -> Option<(u16, u64, u64)> {
        let h = &self.hot;
        // The namespace table may have changed since the template was made (see `sync_view`).
        if nsid as u64 != h.nsid || self.ctrl.ns_gen.load(Ordering::Acquire) != self.ns_gen {
            return None;
        }
        let len = buf.len();
        // 1..=max_len bytes, whole blocks: checked when `len` was stored, or now.
        let (blocks, room) = if len == h.len {
            (h.len_blocks, h.room)
        } else {
            self.hot_len(len)?
        };
        match slba.checked_add(blocks) {
            Some(end) if end <= self.hot.blocks => {}
            _ => return None,
        }
        // Dword-aligned and inside one page, in one compare: a misaligned start's low two bits
        // rotate to the top, above any room.
        let start = buf.bus_addr(0).get();
        if (start as usize & (PAGE_SIZE - 1)).rotate_right(2) > room {
            return None;
        }
        let slot = self.free_cids.pop()?;
        Some((slot, blocks, start))
    }

    /// The hot template's length checks for a length other than the last one's: 1..=max_len
    /// bytes, whole blocks. One that passes is stored as the last (with its blocks and room).
    #[inline(never)]
    fn hot_len(&mut self, len: usize) -> Option<(u64, usize)> {
        let h = &mut self.hot;
        if len.wrapping_sub(1) >= h.max_len || len & h.mask != 0 {
            return None;
        }
        h.len = len;
        h.len_blocks = (len >> h.shift) as u64;
        // `max_len` is at most a page.
        h.room = (PAGE_SIZE - len) / 4;
        Some((h.len_blocks, h.room))
    }

    /// Every submission of a data buffer that is not the hot template's: the general checks
    /// (and their errors), other namespaces, formats with metadata, split requests.
    #[inline(never)]
    fn submit_data_checked(
        &mut self,
        op: Op,
        nsid: u32,
        slba: u64,
        buf: B,
        tag: u64,
    ) -> Result<(), Rejected<B>> {
        match self.submit(op, nsid, slba, buf, None, tag) {
            Ok(()) => Ok(()),
            Err((error, buf, _)) => Err(Rejected { error, buf }),
        }
    }

    /// Makes namespace `i` of the view the hot one, when the template can describe its
    /// commands: a usable format that moves data only, a power-of-two block, PRPs (not SGLs),
    /// no copy of each command for resubmission, and a queue pair that has not failed.
    pub(super) fn make_hot(&mut self, i: usize) {
        let ns = &self.namespaces[i];
        // Not with `resubmit_on_reset`: its copy of each command stays on the checked path.
        let eligible = ns.plain
            && ns.shift != xfer::NOT_POW2
            && !self.use_sgl
            && self.saved.is_empty()
            && self.failed.is_none()
            && ns.block_bytes <= ns.one_command.min(PAGE_SIZE);
        self.hot = if eligible {
            HotNs {
                nsid: ns.nsid as u64,
                blocks: ns.blocks,
                mask: ns.block_bytes - 1,
                shift: ns.shift,
                max_len: ns.one_command.min(PAGE_SIZE),
                // One block to start with (a length that passes the checks: `eligible`).
                len: ns.block_bytes,
                len_blocks: 1,
                room: (PAGE_SIZE - ns.block_bytes) / 4,
                dw12_flags: ns.prinfo,
                ref_mask: if ns.ref_tag { u32::MAX as u64 } else { 0 },
            }
        } else {
            HotNs::NONE
        };
    }

    /// The common submission: checks, then one command (the request fits one whatever the
    /// buffer's offset) with its pointers and request entry. Larger requests go to
    /// `submit_split`.
    #[inline]
    fn submit(
        &mut self,
        op: Op,
        nsid: u32,
        slba: u64,
        buf: B,
        meta: Option<B>,
        tag: u64,
    ) -> Result<(), Refused<B>> {
        self.sync_view();
        if self.failed.is_some() {
            return Err((self.check_usable().expect_err("failed"), buf, meta));
        }
        let Some(i) = self.namespaces.iter().position(|n| n.nsid == nsid) else {
            return Err((self.ns(nsid).expect_err("no such namespace"), buf, meta));
        };
        let ns = &self.namespaces[i];
        if !ns.plain || meta.is_some() {
            return self.submit_general(op, i, slba, buf, meta, tag);
        }
        // The fast path: a format that moves data only. The namespace by reference, its few
        // hot fields copied out.
        let len = buf.len();
        let Some(blocks) = ns.blocks_of(len) else {
            let ns = *ns;
            return Err((self.refusal(&ns, len, None), buf, meta));
        };
        match slba.checked_add(blocks) {
            Some(end) if end <= ns.blocks => {}
            _ => {
                let ns = *ns;
                return Err((self.range_error(&ns, slba, blocks), buf, meta));
            }
        }
        if len > ns.one_command {
            let ns = *ns;
            return self.submit_split(op, ns, slba, buf, meta, tag);
        }
        let Some(&slot) = self.free_cids.last() else {
            return Err((self.full(), buf, meta));
        };
        let sgl = self.use_sgl;
        // `blocks_of` made `len` exactly `blocks x block_bytes`: the data pointer describes
        // exactly what moves.
        let dp = match xfer::data_ptr_with(&buf, 0, len, sgl, || self.lists(slot)) {
            Ok(dp) => dp,
            Err(e) => return Err((e, buf, meta)),
        };
        let rw = rw_entry(&self.namespaces[i], op, slba, blocks, dp, BusAddr(0));
        if self.hot.nsid != nsid as u64 {
            self.make_hot(i);
        }
        self.issue(slot, tag, op, Some(buf), None, |cid| Rw { cid, ..rw }.words());
        Ok(())
    }

    /// A submission with metadata (in the blocks, or a separate buffer), or one to refuse.
    #[inline(never)]
    fn submit_general(
        &mut self,
        op: Op,
        i: usize,
        slba: u64,
        buf: B,
        meta: Option<B>,
        tag: u64,
    ) -> Result<(), Refused<B>> {
        let ns = self.namespaces[i];
        let len = buf.len();
        let usable = ns.refused.is_none() && (ns.meta_bytes == 0) == meta.is_none();
        let blocks = match ns.blocks_of(len) {
            Some(b) if usable => b,
            _ => return Err((self.refusal(&ns, len, meta.as_ref().map(|m| m.len())), buf, meta)),
        };
        if let Some(m) = &meta {
            if m.len() as u64 != blocks * ns.meta_bytes as u64 {
                return Err((self.meta_size_error(&ns, blocks, m.len()), buf, meta));
            }
        }
        if let Err(e) = self.check_range(&ns, slba, blocks) {
            return Err((e, buf, meta));
        }
        if len > ns.one_command || !ns.md_fits(blocks) {
            return self.submit_split(op, ns, slba, buf, meta, tag);
        }
        let Some(&slot) = self.free_cids.last() else {
            return Err((self.full(), buf, meta));
        };
        let sgl = self.use_sgl;
        let m = meta.as_ref().map(|m| (m, 0));
        let p = match xfer::describe(
            ns.block_bytes,
            ns.meta_bytes,
            blocks,
            &buf,
            0,
            m,
            sgl,
            &mut self.lists(slot),
        ) {
            Ok(p) => p,
            Err(e) => return Err((e, buf, meta)),
        };
        let rw = rw_entry(&ns, op, slba, blocks, p.data, p.mptr);
        self.issue(slot, tag, op, Some(buf), meta, |cid| Rw { cid, ..rw }.words());
        Ok(())
    }

    /// Issues a single-command request in free slot `slot` (the last of `free_cids`, checked by
    /// the caller): takes the slot with a new command id, writes the entry `words(cid)` gives,
    /// and keeps the request and its buffers there until the completion.
    #[inline(always)]
    pub(super) fn issue(
        &mut self,
        slot: u16,
        tag: u64,
        op: Op,
        buf: Option<B>,
        meta: Option<B>,
        words: impl FnOnce(u16) -> [u64; 8],
    ) {
        debug_assert_eq!(self.free_cids.last(), Some(&slot));
        self.free_cids.pop();
        let save = !self.saved.is_empty();
        self.issue_popped(slot, tag, op, buf, meta, save, words);
    }

    /// `issue` for a slot already taken off `free_cids`; `save`: keep a copy of the command
    /// (`QpairOptions::resubmit_on_reset`; the hot template is never made with the option on,
    /// so its path passes a constant `false`).
    #[inline(always)]
    #[expect(clippy::too_many_arguments, reason = "inlined into its two callers")]
    fn issue_popped(
        &mut self,
        slot: u16,
        tag: u64,
        op: Op,
        buf: Option<B>,
        meta: Option<B>,
        save: bool,
        words: impl FnOnce(u16) -> [u64; 8],
    ) {
        let s = &mut self.slots[slot as usize];
        let cid = s.claim(slot, slot);
        s.req = Request::new(tag, 1, op);
        s.buf = buf;
        // A free slot holds no metadata buffer (every completion takes it): stored only when
        // there is one, so the hot template's path (a constant `None`) stores nothing.
        debug_assert!(s.meta.is_none(), "free slot {slot} holds a metadata buffer");
        if meta.is_some() {
            s.meta = meta;
        }
        self.ring.push(&mut self.mem, &words(cid));
        if save {
            self.save_last(slot);
        }
        self.stats.requests += 1;
        self.live += 1;
    }

    /// Keeps a copy of the command just written, the one of slot `slot`, for a resubmission
    /// after a reset (`QpairOptions::resubmit_on_reset`): read back from the submission queue,
    /// so the hot path writes the command once, as without the option.
    #[inline(never)]
    pub(super) fn save_last(&mut self, slot: u16) {
        self.saved[slot as usize] = self.mem.read_sqe(self.ring.slot_back(&self.mem, 1));
    }

    #[cold]
    #[inline(never)]
    fn range_error(&self, ns: &NsInfo, slba: u64, blocks: u64) -> NvmeError {
        self.check_range(ns, slba, blocks).expect_err("out of range")
    }

    #[cold]
    #[inline(never)]
    fn meta_size_error(&self, ns: &NsInfo, blocks: u64, have: usize) -> NvmeError {
        self.meta_error(
            ns,
            format!(
                "the command has {blocks} blocks, so {} bytes of metadata, but the metadata buffer holds {have}",
                blocks * ns.meta_bytes as u64
            ),
        )
    }

    /// Why a submission with a data buffer of `len` bytes (and a metadata buffer of `meta`
    /// bytes) to `ns` is refused.
    #[cold]
    #[inline(never)]
    pub(super) fn refusal(&self, ns: &NsInfo, len: usize, meta: Option<usize>) -> NvmeError {
        let format = self.format_of(ns.nsid);
        if let Some(why) = ns.refused {
            return NvmeError::Refused {
                nsid: ns.nsid,
                format,
                why: why.to_string(),
            };
        }
        if ns.blocks_of(len).is_none() {
            return NvmeError::BadLength {
                nsid: ns.nsid,
                len,
                block_bytes: ns.block_bytes,
                format,
            };
        }
        match meta {
            None => self.meta_error(ns, "the command has no metadata buffer".into()),
            Some(_) => NvmeError::InvalidOption(format!(
                "namespace {} ({format}) moves no metadata in a separate buffer: submit without one",
                ns.nsid
            )),
        }
    }

    #[cold]
    fn meta_error(&self, ns: &NsInfo, what: String) -> NvmeError {
        NvmeError::Metadata {
            nsid: ns.nsid,
            format: self.format_of(ns.nsid),
            per_block: ns.meta_bytes,
            what,
        }
    }

    #[cold]
    fn format_of(&self, nsid: u32) -> String {
        self.namespaces
            .iter()
            .position(|n| n.nsid == nsid)
            .map_or_else(|| "unknown format".into(), |i| self.formats[i].to_string())
    }

    /// The slot the next command takes (the last of `free_cids`, which `issue` pops), or
    /// [`NvmeError::QueueFull`].
    pub(super) fn free_slot(&self) -> Result<u16> {
        match self.free_cids.last() {
            Some(&slot) => Ok(slot),
            None => Err(self.full()),
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn full(&self) -> NvmeError {
        NvmeError::QueueFull {
            qid: self.ring.qid,
            outstanding: self.outstanding(),
        }
    }

    /// A request larger than one command: split into whole-block parts when splitting is on.
    #[inline(never)]
    fn submit_split(
        &mut self,
        op: Op,
        ns: NsInfo,
        slba: u64,
        buf: B,
        meta: Option<B>,
        tag: u64,
    ) -> Result<(), Refused<B>> {
        let len = buf.len();
        let aligned = buf.bus_addr(0).is_aligned(PAGE_SIZE as u64);
        let step_blocks = ns.step_blocks(aligned);
        let step = step_blocks as usize * ns.block_bytes;
        let total = (len / ns.block_bytes) as u64;
        let parts = {
            let (mut left, mut n) = (total, 0usize);
            while left > 0 {
                left -= ns.part_blocks(left, step_blocks);
                n += 1;
            }
            n
        };
        if parts > self.slots.len() {
            let error = NvmeError::TooLarge {
                len,
                mdts: step * self.slots.len(),
            };
            return Err((error, buf, meta));
        }
        if parts > 1 && !self.split {
            let error = NvmeError::TooLarge {
                len,
                mdts: self.max_xfer,
            };
            return Err((error, buf, meta));
        }
        if parts > self.free_cids.len() {
            return Err((self.full(), buf, meta));
        }
        // The request lives at its first command's slot.
        let rid = *self.free_cids.last().expect("checked above");
        let sgl = self.use_sgl;
        let mut done = 0usize;
        for part in 0..parts {
            let first = (done / ns.block_bytes) as u64;
            let nlb = ns.part_blocks(total - first, step_blocks);
            let plen = nlb as usize * ns.block_bytes;
            let slot = self.free_cids.pop().expect("checked above");
            let m = meta.as_ref().map(|m| (m, first as usize * ns.meta_bytes));
            let p = match xfer::describe(
                ns.block_bytes,
                ns.meta_bytes,
                nlb,
                &buf,
                done,
                m,
                sgl,
                &mut self.lists(slot),
            ) {
                Ok(p) => p,
                Err(e) => {
                    // Take back the parts already written: none was announced to the controller
                    // (the doorbell rings only in `poll`/`flush_submissions`), so rewinding the
                    // tail removes them.
                    self.ring.unpush(&mut self.mem, part as u16);
                    self.free_cids.push(slot);
                    for (c, t) in self.slots.iter_mut().enumerate() {
                        if t.owner == rid {
                            t.owner = UNUSED;
                            self.free_cids.push(c as u16);
                        }
                    }
                    return Err((e, buf, meta));
                }
            };
            let cid = self.claim(slot, rid);
            let rw = rw_entry(&ns, op, slba + first, nlb, p.data, p.mptr);
            self.ring.push(&mut self.mem, &Rw { cid, ..rw }.words());
            if !self.saved.is_empty() {
                self.save_last(slot);
            }
            done += plen;
        }
        self.stats.requests += 1;
        self.extra_commands += parts as u64 - 1;
        self.live += 1;
        let s = &mut self.slots[rid as usize];
        s.req = Request::new(tag, parts as u16, op);
        s.buf = Some(buf);
        s.meta = meta;
        Ok(())
    }

    pub(super) fn submit_nodata(&mut self, cmd: Command, op: Op, tag: u64) -> Result<()> {
        self.check_usable()?;
        let slot = self.free_slot()?;
        self.issue(slot, tag, op, None, None, |cid| {
            let mut cmd = cmd;
            cmd.set_cid(cid);
            cmd.to_words()
        });
        Ok(())
    }

    /// Submits `cmd` as it is (opcode, namespace, CDW2-5, CDW10-15), with its data pointer set
    /// from `buf` if given (describing all of `buf`): I/O passthrough for commands this API does
    /// not cover, or to see what the controller says about a command the safe methods would
    /// refuse. No check is made of what the command makes the controller move.
    ///
    /// # Safety
    /// The command must not make the controller access memory outside `buf`: for a read or
    /// write, the block count times the bytes per block of the namespace's format must not
    /// exceed `buf.len()`, and a metadata pointer the caller put in CDW4-5 must be memory the
    /// controller may write for as long as the command runs; nor anything else the caller
    /// does not own.
    pub unsafe fn submit_raw(
        &mut self,
        cmd: Command,
        buf: Option<B>,
        tag: u64,
    ) -> Result<(), Rejected<Option<B>>> {
        let checked = self.check_usable().and_then(|()| {
            let slot = self.free_slot()?;
            let mut cmd = cmd;
            if let Some(b) = &buf {
                let sgl = self.use_sgl;
                let dp = xfer::data_ptr(b, 0, b.len(), sgl, &mut self.lists(slot))?;
                crate::cmd::set_data_ptr(&mut cmd, dp);
            }
            Ok((slot, cmd))
        });
        match checked {
            Ok((slot, mut cmd)) => {
                self.issue(slot, tag, Op::Raw, buf, None, |cid| {
                    cmd.set_cid(cid);
                    cmd.to_words()
                });
                Ok(())
            }
            Err(error) => Err(Rejected { error, buf }),
        }
    }

    /// Flush: commits the namespace's volatile write cache to media.
    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<()> {
        self.sync_view();
        self.ns(nsid)?;
        self.submit_nodata(Command::new(io_op::FLUSH, nsid), Op::Flush, tag)
    }

    /// Write Zeroes: `blocks` (1..=65536) blocks from `slba` read back as zeroes (their
    /// metadata too; with PRACT the controller writes valid protection information).
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, blocks: u32, tag: u64) -> Result<()> {
        self.sync_view();
        let ns = self.usable_ns(nsid)?;
        if !(1..=65536).contains(&blocks) {
            return Err(NvmeError::InvalidOption(format!(
                "write zeroes of {blocks} blocks: must be 1..=65536"
            )));
        }
        self.check_range(&ns, slba, blocks as u64)?;
        let mut cmd = Command::rw(io_op::WRITE_ZEROES, nsid, slba, blocks);
        // PRACT makes the controller write PI for the zeroed blocks (NVM Command Set 1.0
        // §3.2.8.1); a host-PI queue pair writes none and reads must not check it.
        cmd.dw[12] |= ns.prinfo & crate::format::prinfo::PRACT;
        if ns.ref_tag {
            cmd.dw[14] = slba as u32;
        }
        self.submit_nodata(cmd, Op::WriteZeroes, tag)
    }

    /// Dataset Management / Deallocate (trim) of up to 256 ranges `(slba, blocks)`.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)], tag: u64) -> Result<()> {
        self.sync_view();
        let ns = self.usable_ns(nsid)?;
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(NvmeError::InvalidOption(format!(
                "{} deallocate ranges: must be 1..=256",
                ranges.len()
            )));
        }
        for &(slba, n) in ranges {
            self.check_range(&ns, slba, n as u64)?;
        }
        self.check_usable()?;
        let slot = self.free_slot()?;
        // The range list (16 bytes per range, NVM Command Set 1.0 Figure 39) goes into the list
        // page of the slot this command will get: 256 ranges are exactly one page.
        let off = self.lists_off + slot as usize * self.list_pages * PAGE_SIZE;
        for (i, &(slba, n)) in ranges.iter().enumerate() {
            self.mem.write_u64(off + i * 16, (n as u64) << 32);
            self.mem.write_u64(off + i * 16 + 8, slba);
        }
        let mut cmd = Command::deallocate(nsid, ranges.len() as u32);
        crate::cmd::set_data_ptr(&mut cmd, crate::cmd::DataPtr::prp(self.mem.bus(off), BusAddr(0)));
        self.submit_nodata(cmd, Op::DatasetManagement, tag)
    }

    /// A namespace this queue pair may send commands to.
    pub(super) fn usable_ns(&self, nsid: u32) -> Result<NsInfo> {
        let ns = self.ns(nsid)?;
        match ns.refused {
            None => Ok(ns),
            Some(_) => Err(self.refusal(&ns, ns.block_bytes, None)),
        }
    }

    /// Rings the submission doorbell for everything submitted since the last ring (not while
    /// a controller reset has the queues: they are announced once re-created, at a poll).
    #[inline]
    pub fn flush_submissions(&mut self) {
        if self.ring.unrung != 0 {
            self.ring_submissions();
        }
    }

    /// Rings the submission doorbell ([`crate::queue::Ring::ring_sq`]), unless the controller
    /// was reset since the queues were created (checked before an MMIO write only; see
    /// `recover.rs`).
    #[inline(always)]
    pub(super) fn ring_submissions(&mut self) -> Rung {
        // By reference: nothing is loaded for the check unless an MMIO write is due.
        let (ctrl, epoch) = (&self.ctrl, &self.epoch);
        self.ring.ring_sq(self.mem.sq_tail(), move || {
            ctrl.reset.epoch.load(Ordering::Acquire) == *epoch
        })
    }
}
