//! The one place where an I/O command's data and metadata pointers are built.
//!
//! The controller moves `NLB × bytes per block` through the data pointer and `NLB × metadata
//! bytes per block` through the metadata pointer (NVM Command Set 1.0 §5.2), where the bytes
//! per block come from the namespace's format and the queue pair's PI mode ([`Access`]).
//! [`describe`] computes both lengths from the block count itself, checks that the buffers hold
//! them, and builds pointers for exactly those bytes: the device never moves a byte the buffers
//! do not describe. Everything here is pure logic over [`IoBuffer`] addresses, unit-tested
//! against every format, offset and length.

use vfpoll_pci::BusAddr;

use crate::buffer::IoBuffer;
use crate::cmd::{DataPtr, SglDescriptor};
use crate::ctrlr::PAGE_SIZE;
use crate::error::{NvmeError, Result};
use crate::format::{Access, NsFormat, Refusal};
use crate::prp::{self, PrpError, PrpListMem};

/// What a queue pair knows of one namespace: its size and how its commands move bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct NsInfo {
    pub nsid: u32,
    pub blocks: u64,
    /// Bytes per block in the data buffer.
    pub block_bytes: usize,
    /// `log2(block_bytes)` when it is a power of two, else [`NOT_POW2`].
    pub shift: u32,
    /// Bytes per block in the separate metadata buffer (0: none).
    pub meta_bytes: usize,
    /// PRINFO bits of CDW12.
    pub prinfo: u32,
    /// CDW14 carries the part's first LBA (the initial reference tag).
    pub ref_tag: bool,
    /// The longest data buffer that always fits one command, wherever it starts.
    pub one_command: usize,
    /// The bytes one part of a split request moves when its buffer starts on a page (`.0`)
    /// or anywhere (`.1`).
    pub steps: (usize, usize),
    /// Why I/O to this namespace is refused, if it is.
    pub refused: Option<Refusal>,
    /// Usable, and no metadata moves (no metadata, or PI alone stripped by PRACT): the data
    /// buffer is the data, and the submission fast path applies.
    pub plain: bool,
    /// Data bytes per block (for messages).
    pub data_size: usize,
    /// Metadata bytes per block a command moves (in the data buffer or the separate one),
    /// when the controller needs metadata transfers cut to whole 512-byte multiples (see
    /// [`MetadataQuirk`]); 0 otherwise.
    pub md_quirk: usize,
    /// Zone size in blocks of a zoned namespace (0: not zoned).
    pub zone_size: u64,
    /// The largest Zone Append data buffer.
    pub append_max: usize,
}

/// `NsInfo::shift` of a block size that is not a power of two (data + metadata).
pub(super) const NOT_POW2: u32 = u32::MAX;

impl NsInfo {
    /// The view of a namespace formatted `format` for a queue pair whose commands move at most
    /// `max_xfer` bytes through the data pointer.
    pub(super) fn new(
        nsid: u32,
        blocks: u64,
        format: NsFormat,
        access: Result<Access, Refusal>,
        max_xfer: usize,
    ) -> Self {
        let (a, refused) = match access {
            Ok(a) => (a, None),
            // A refused namespace keeps the plain sizes for messages; nothing is submitted.
            Err(r) => (
                Access {
                    block_bytes: format.data_size,
                    meta_bytes: 0,
                    prinfo: 0,
                    ref_tag: false,
                },
                Some(r),
            ),
        };
        let bb = a.block_bytes;
        let steps = (part_step(max_xfer, bb, true), part_step(max_xfer, bb, false));
        NsInfo {
            nsid,
            blocks,
            block_bytes: bb,
            shift: if bb.is_power_of_two() {
                bb.trailing_zeros()
            } else {
                NOT_POW2
            },
            meta_bytes: a.meta_bytes,
            prinfo: a.prinfo,
            ref_tag: a.ref_tag,
            one_command: steps.1,
            steps,
            plain: refused.is_none() && a.meta_bytes == 0 && bb == format.data_size,
            refused,
            data_size: format.data_size,
            md_quirk: 0,
            zone_size: 0,
            append_max: 0,
        }
    }

    /// Whether a command of `nlb` blocks moves metadata the controller handles right (always,
    /// without the quirk).
    #[inline]
    pub(super) fn md_fits(&self, nlb: u64) -> bool {
        self.md_quirk == 0 || MetadataQuirk::fits(nlb as usize * self.md_quirk)
    }

    /// Blocks per part of a split request whose buffer starts on a page (`aligned`) or not
    /// (the longest part that keeps to [`part_step`]'s page rule). A part cut short for
    /// [`MetadataQuirk`] can leave the next part starting mid-page, so with the quirk every part
    /// takes the step for any start.
    pub(super) fn step_blocks(&self, aligned: bool) -> u64 {
        let step = if aligned && self.md_quirk == 0 {
            self.steps.0
        } else {
            self.steps.1
        };
        (step / self.block_bytes) as u64
    }

    /// How many of `left` blocks the next part of a split request takes, at most `step`.
    pub(super) fn part_blocks(&self, left: u64, step: u64) -> u64 {
        let k = left.min(step);
        if self.md_fits(k) {
            k
        } else {
            MetadataQuirk::blocks(k as usize, self.md_quirk) as u64
        }
    }

    /// How many blocks a data buffer of `len` bytes holds; `None` unless a non-zero whole
    /// number.
    #[inline]
    pub(super) fn blocks_of(&self, len: usize) -> Option<u64> {
        if self.shift != NOT_POW2 {
            (len != 0 && len & (self.block_bytes - 1) == 0).then_some((len >> self.shift) as u64)
        } else {
            (len != 0 && len.is_multiple_of(self.block_bytes)).then(|| (len / self.block_bytes) as u64)
        }
    }
}

/// QEMU's NVMe controller (up to 9.0, and 7.2 as Debian 12 ships it) loses metadata: its DMA
/// helper, given a transfer that is not a multiple of 512 bytes, writes or reads only the
/// remainder of the division and drops the rest (`dma_blk_cb` discards the aligned part instead
/// of the tail; fixed upstream in 2024). Data transfers are whole blocks and safe; metadata is
/// not: a command with 1000 blocks of 8-byte metadata moves only the first 320 bytes of it. On
/// such a controller every command's metadata is kept below 512 bytes or to a whole multiple
/// of 512 bytes of at most 4 KiB (few enough pieces for one DMA round), by splitting requests.
pub(super) struct MetadataQuirk;

impl MetadataQuirk {
    /// Whether QEMU moves `bytes` of metadata of one command right.
    pub(super) const fn fits(bytes: usize) -> bool {
        bytes < 512 || bytes.is_multiple_of(512) && bytes <= 4096
    }

    /// The most blocks (at least 1, at most `k`) of a command whose metadata (`md` bytes per
    /// block) [`MetadataQuirk::fits`].
    pub(super) const fn blocks(k: usize, md: usize) -> usize {
        let mut n = k;
        while n > 1 && !Self::fits(n * md) {
            n -= 1;
        }
        n
    }
}

/// Bytes per command when a request is split, a whole number of blocks: the maximum transfer,
/// but a part never spans more memory pages than that allows bytes, so unless the part starts
/// on a page and is a whole number of pages (`aligned`) it is one page (or block) shorter.
/// (Controllers size their internal scatter lists by MDTS; QEMU's fails a 4 MiB transfer that
/// touches 1025 pages.) At least one block, so a split always makes progress; a block larger
/// than the maximum transfer is refused before this is used.
pub(super) const fn part_step(max_xfer: usize, block: usize, aligned: bool) -> usize {
    let room = if aligned && block.is_power_of_two() || max_xfer <= PAGE_SIZE {
        max_xfer
    } else {
        let shorter = if PAGE_SIZE > block { PAGE_SIZE } else { block };
        max_xfer.saturating_sub(shorter)
    };
    let step = room / block * block;
    if step == 0 {
        block
    } else {
        step
    }
}

/// Pointers for one command: the data pointer, and MPTR (0 without a metadata buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pointers {
    pub data: DataPtr,
    pub mptr: BusAddr,
}

/// The data and metadata pointers of a command of `nlb` blocks under `access`: the data
/// pointer describes exactly `nlb × block_bytes` bytes of `buf` from `off`, MPTR exactly
/// `nlb × meta_bytes` bytes of `meta` from `meta_off`. PRP lists go into `lists`; `sgl` asks
/// for an SGL data block where the range is bus-contiguous.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn describe<B: IoBuffer>(
    access_block: usize,
    access_meta: usize,
    nlb: u64,
    buf: &B,
    off: usize,
    meta: Option<(&B, usize)>,
    sgl: bool,
    lists: &mut impl PrpListMem,
) -> Result<Pointers> {
    let len = nlb as usize * access_block;
    if len == 0 || off.checked_add(len).is_none_or(|end| end > buf.len()) {
        return Err(short(len, buf.len().saturating_sub(off), "data"));
    }
    let data = data_ptr(buf, off, len, sgl, lists)?;
    let mptr = match (access_meta, meta) {
        (0, None) => BusAddr(0),
        (0, Some(_)) => return Err(unexpected_meta()),
        (_, None) => return Err(short(nlb as usize * access_meta, 0, "metadata")),
        (m, Some((mb, moff))) => meta_ptr(mb, moff, nlb as usize * m)?,
    };
    Ok(Pointers { data, mptr })
}

#[cold]
fn short(need: usize, have: usize, what: &str) -> NvmeError {
    NvmeError::InvalidOption(format!(
        "the command moves {need} bytes of {what} but its buffer holds {have} from the given offset"
    ))
}

#[cold]
fn unexpected_meta() -> NvmeError {
    NvmeError::InvalidOption(
        "a metadata buffer was given for a namespace that moves no separate metadata".into(),
    )
}

/// MPTR for `len` bytes of `meta` from `off`: one bus-contiguous, dword-aligned range (MPTR
/// with PSDT 00b or 01b is the address of a contiguous buffer, NVMe Base 2.0 §4.2).
#[inline]
fn meta_ptr<B: IoBuffer>(meta: &B, off: usize, len: usize) -> Result<BusAddr> {
    if off.checked_add(len).is_none_or(|end| end > meta.len()) {
        return Err(short(len, meta.len().saturating_sub(off), "metadata"));
    }
    let at = meta.bus_addr(off);
    if !at.is_aligned(4) {
        return Err(NvmeError::Buffer(PrpError::Misaligned(at.get())));
    }
    if meta.contiguous_len(off) < len {
        return Err(NvmeError::InvalidOption(format!(
            "the metadata buffer is not bus-contiguous over the {len} bytes a command needs; use a buffer inside one page or a contiguous DMA region"
        )));
    }
    Ok(at)
}

/// The data pointer for `len` bytes of `buf` from `off`, dword aligned: an SGL data block
/// where enabled and contiguous, PRP1 alone for one memory page, PRP1 + PRP2 for two, a PRP
/// list in `lists` otherwise.
#[inline]
pub(super) fn data_ptr<B: IoBuffer>(
    buf: &B,
    off: usize,
    len: usize,
    sgl: bool,
    lists: &mut impl PrpListMem,
) -> Result<DataPtr> {
    data_ptr_with(buf, off, len, sgl, || lists)
}

/// [`data_ptr`] with the list pages made only when a list is needed (the I/O hot path: most
/// transfers need PRP1 or PRP1 + PRP2 alone).
#[inline]
pub(super) fn data_ptr_with<B: IoBuffer, L: PrpListMem>(
    buf: &B,
    off: usize,
    len: usize,
    sgl: bool,
    lists: impl FnOnce() -> L,
) -> Result<DataPtr> {
    let start = buf.bus_addr(off);
    if !start.is_aligned(4) {
        return Err(NvmeError::Buffer(PrpError::Misaligned(start.get())));
    }
    if sgl && buf.contiguous_len(off) >= len {
        return Ok(DataPtr::sgl(SglDescriptor::data_block(start, len as u32)));
    }
    let first = start.get() as usize & (PAGE_SIZE - 1);
    if first + len <= PAGE_SIZE {
        return Ok(DataPtr::prp(start, BusAddr(0)));
    }
    if first + len <= 2 * PAGE_SIZE {
        let second = buf.bus_addr(off + PAGE_SIZE - first);
        if second.is_aligned(PAGE_SIZE as u64) {
            return Ok(DataPtr::prp(start, second));
        }
    }
    prp_list(buf, off, len, start, &mut lists())
}

/// PRPs through `prp::build`, with a list in `lists`.
#[inline(never)]
fn prp_list<B: IoBuffer>(
    buf: &B,
    off: usize,
    len: usize,
    start: BusAddr,
    lists: &mut impl PrpListMem,
) -> Result<DataPtr> {
    let first = start.get() as usize & (PAGE_SIZE - 1);
    // Page i (i >= 1) of the transfer starts at byte i * PAGE - first of the part.
    let (p1, p2) = prp::build(
        start,
        len,
        PAGE_SIZE,
        |i| buf.bus_addr(off + i * PAGE_SIZE - first),
        lists,
    )?;
    Ok(DataPtr::prp(p1, p2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::Psdt;
    use crate::format::{PiCheck, PiFormat, PiMode, PiType, Protection};

    /// A buffer of `len` bytes starting `first` bytes into a page, whose pages lie at scattered
    /// bus addresses (page `i` at `0x10_0000 * (i + 1) + 0x3000`, or all contiguous).
    struct Scattered {
        first: usize,
        len: usize,
        contiguous: bool,
    }

    impl Scattered {
        fn page_base(&self, i: usize) -> u64 {
            if self.contiguous {
                0x40_0000 + (i * PAGE_SIZE) as u64
            } else {
                0x10_0000 * (i as u64 + 1) + 0x3000
            }
        }
    }

    // SAFETY: test-only; the addresses are never given to a device, only to the pointer
    // builders, whose output the tests walk.
    unsafe impl IoBuffer for Scattered {
        fn len(&self) -> usize {
            self.len
        }
        fn bus_addr(&self, off: usize) -> BusAddr {
            let at = self.first + off;
            BusAddr(self.page_base(at / PAGE_SIZE) + (at % PAGE_SIZE) as u64)
        }
        fn contiguous_len(&self, off: usize) -> usize {
            if self.contiguous {
                self.len - off
            } else {
                (PAGE_SIZE - (self.first + off) % PAGE_SIZE).min(self.len - off)
            }
        }
    }

    struct Lists {
        pages: Vec<Vec<u64>>,
    }

    impl PrpListMem for Lists {
        fn pages(&self) -> usize {
            self.pages.len()
        }
        fn page_bus(&self, page: usize) -> BusAddr {
            BusAddr(0xf000_0000 + (page * PAGE_SIZE) as u64)
        }
        fn write(&mut self, page: usize, idx: usize, entry: BusAddr) {
            self.pages[page][idx] = entry.get();
        }
    }

    /// Appends `len` bytes at `addr` to a list of bus ranges, merging with the last one when
    /// they touch.
    fn push_range(out: &mut Vec<(u64, usize)>, addr: u64, len: usize) {
        match out.last_mut() {
            Some((a, l)) if *a + *l as u64 == addr => *l += len,
            _ => out.push((addr, len)),
        }
    }

    /// What the controller does with a data pointer for a transfer of `len` bytes: the bus
    /// ranges it moves, in order (NVMe Base 2.0 §4.1.1, §4.1.2).
    fn device_walk(dp: DataPtr, len: usize, lists: &Lists) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        match dp.psdt {
            Psdt::SglBuffer => {
                let sgl_len = (dp.hi & 0xffff_ffff) as usize;
                assert_eq!(sgl_len, len, "the SGL describes exactly the transfer");
                push_range(&mut out, dp.lo, len);
            }
            Psdt::Prp => {
                let first = (dp.lo as usize) & (PAGE_SIZE - 1);
                let n1 = (PAGE_SIZE - first).min(len);
                push_range(&mut out, dp.lo, n1);
                let pages = (len - n1).div_ceil(PAGE_SIZE);
                let entries: Vec<u64> = if pages == 0 {
                    vec![]
                } else if pages == 1 {
                    vec![dp.hi]
                } else {
                    // Follow the list, chained through the last entry of each full page.
                    let mut e = Vec::new();
                    let mut page = ((dp.hi - 0xf000_0000) as usize) / PAGE_SIZE;
                    let mut idx = (dp.hi as usize & (PAGE_SIZE - 1)) / 8;
                    while e.len() < pages {
                        if idx == PAGE_SIZE / 8 - 1 && pages - e.len() > 1 {
                            page = ((lists.pages[page][idx] - 0xf000_0000) as usize) / PAGE_SIZE;
                            idx = 0;
                            continue;
                        }
                        e.push(lists.pages[page][idx]);
                        idx += 1;
                    }
                    e
                };
                let mut left = len - n1;
                for p in entries {
                    assert_eq!(
                        p & (PAGE_SIZE as u64 - 1),
                        0,
                        "PRP entries after the first start pages"
                    );
                    let n = left.min(PAGE_SIZE);
                    push_range(&mut out, p, n);
                    left -= n;
                }
            }
        }
        out
    }

    /// The bus ranges of `len` bytes of `buf`, in order.
    fn buffer_ranges(buf: &Scattered, len: usize) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < len {
            let n = buf.contiguous_len(off).min(len - off);
            push_range(&mut out, buf.bus_addr(off).get(), n);
            off += n;
        }
        out
    }

    fn formats() -> Vec<NsFormat> {
        let mut v = Vec::new();
        for ds in [512usize, 4096] {
            for ms in [0usize, 8, 16, 64] {
                for extended in [false, true] {
                    for pi in [None, Some(PiType::Type1), Some(PiType::Type3)] {
                        if ms == 0 && (extended || pi.is_some()) {
                            continue;
                        }
                        v.push(crate::format::test_format(ds, ms, extended, pi));
                    }
                }
            }
        }
        v
    }

    /// For every format and PI mode, block count, buffer offset and layout: the pointers
    /// describe exactly what the controller moves, byte for byte, inside the buffers; or the
    /// command is refused.
    #[test]
    fn pointers_describe_exactly_what_the_device_moves() {
        let modes = [
            PiMode::Controller,
            PiMode::Host(PiCheck {
                guard: true,
                app_tag: false,
                ref_tag: true,
            }),
        ];
        let mut checked = 0;
        for f in formats() {
            for mode in modes {
                let a = Access::new(&f, mode).expect("16-bit guard formats are supported");
                for nlb in [1u64, 2, 7, 8, 9, 64, 255] {
                    let (dlen, mlen) = a.transfer(nlb);
                    for first in [0usize, 4, 512, 3584, 4092] {
                        for contiguous in [false, true] {
                            for sgl in [false, true] {
                                let buf = Scattered {
                                    first,
                                    len: dlen as usize,
                                    contiguous,
                                };
                                let meta = Scattered {
                                    first: first % 64,
                                    len: mlen as usize,
                                    contiguous: true,
                                };
                                let mut lists = Lists {
                                    pages: vec![vec![0; PAGE_SIZE / 8]; 4],
                                };
                                let m = (mlen != 0).then_some((&meta, 0));
                                let p =
                                    describe(a.block_bytes, a.meta_bytes, nlb, &buf, 0, m, sgl, &mut lists)
                                        .unwrap_or_else(|e| {
                                            panic!("{f} {mode:?} nlb {nlb} first {first}: {e}")
                                        });
                                let walked = device_walk(p.data, dlen as usize, &lists);
                                let expect = buffer_ranges(&buf, dlen as usize);
                                assert_eq!(walked, expect, "{f} {mode:?} nlb {nlb} first {first}");
                                if mlen == 0 {
                                    assert_eq!(p.mptr, BusAddr(0));
                                } else {
                                    assert_eq!(p.mptr, meta.bus_addr(0));
                                }
                                // One block more than the buffers hold is refused.
                                let r = describe(
                                    a.block_bytes,
                                    a.meta_bytes,
                                    nlb + 1,
                                    &buf,
                                    0,
                                    m,
                                    sgl,
                                    &mut lists,
                                );
                                assert!(r.is_err(), "{f} {mode:?}: an overrun must be refused");
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    #[test]
    fn metadata_is_required_exactly_when_it_moves() {
        let buf = Scattered {
            first: 0,
            len: 4096,
            contiguous: true,
        };
        let meta = Scattered {
            first: 0,
            len: 64,
            contiguous: true,
        };
        let mut lists = Lists {
            pages: vec![vec![0; PAGE_SIZE / 8]; 1],
        };
        // Needed, missing.
        assert!(describe(512, 8, 8, &buf, 0, None, false, &mut lists).is_err());
        // Not needed, given.
        assert!(describe(512, 0, 8, &buf, 0, Some((&meta, 0)), false, &mut lists).is_err());
        // Too short (8 blocks of 16 bytes = 128 > 64).
        assert!(describe(512, 16, 8, &buf, 0, Some((&meta, 0)), false, &mut lists).is_err());
        // Misaligned.
        let odd = Scattered {
            first: 2,
            len: 64,
            contiguous: true,
        };
        assert!(describe(512, 8, 8, &buf, 0, Some((&odd, 0)), false, &mut lists).is_err());
        // Not contiguous across a page.
        let split = Scattered {
            first: 4064,
            len: 128,
            contiguous: false,
        };
        assert!(describe(512, 16, 8, &buf, 0, Some((&split, 0)), false, &mut lists).is_err());
        assert_eq!(
            describe(512, 8, 8, &buf, 0, Some((&meta, 0)), false, &mut lists)
                .unwrap()
                .mptr,
            meta.bus_addr(0)
        );
    }

    #[test]
    fn the_metadata_quirk_cuts_parts_qemu_moves_right() {
        // 8-byte metadata: 63 blocks (504 bytes) or 64..=512 in steps of 64.
        assert!(MetadataQuirk::fits(504) && MetadataQuirk::fits(512) && MetadataQuirk::fits(4096));
        assert!(!MetadataQuirk::fits(520) && !MetadataQuirk::fits(8000) && !MetadataQuirk::fits(4608));
        assert_eq!(MetadataQuirk::blocks(1000, 8), 512);
        assert_eq!(MetadataQuirk::blocks(100, 8), 64);
        assert_eq!(MetadataQuirk::blocks(63, 8), 63);
        assert_eq!(MetadataQuirk::blocks(1000, 24), 128);
        assert_eq!(MetadataQuirk::blocks(3, 600), 1);
        // A request of any size splits into parts that all fit and cover it exactly.
        let f = NsFormat {
            index: 1,
            count: 2,
            data_size: 512,
            metadata_size: 8,
            extended: true,
            protection: None,
        };
        let a = Access::new(&f, crate::format::PiMode::Controller).unwrap();
        let mut ns = NsInfo::new(1, 1 << 20, f, Ok(a), 512 << 10);
        ns.md_quirk = 8;
        for n in [1u64, 63, 64, 65, 100, 511, 513, 1000, 2048, 4001] {
            let (mut left, mut parts) = (n, 0);
            while left > 0 {
                let k = ns.part_blocks(left, (ns.steps.1 / ns.block_bytes) as u64);
                assert!(k > 0 && ns.md_fits(k), "{n}: part of {k}");
                left -= k;
                parts += 1;
            }
            assert!(parts <= n.div_ceil(63) + 1, "{n}: {parts} parts");
        }
    }

    #[test]
    fn split_steps_are_whole_blocks_and_respect_the_page_rule() {
        // Aligned buffers of power-of-two blocks take the whole maximum transfer per command.
        assert_eq!(part_step(512 << 10, 512, true), 512 << 10);
        // Unaligned ones one page less (the part then touches at most MDTS / page pages).
        assert_eq!(part_step(512 << 10, 512, false), (512 << 10) - 4096);
        assert_eq!(part_step(512 << 10, 4096, false), (512 << 10) - 4096);
        // A transfer limit of one page leaves nothing to take off.
        assert_eq!(part_step(4096, 512, false), 4096);
        // Blocks of the maximum transfer: one block per command, never 0.
        assert_eq!(part_step(8192, 8192, false), 8192);
        // Extended LBAs: whole 520-byte blocks, one page short of the limit even when aligned
        // (the next part starts mid-page).
        for aligned in [true, false] {
            let s = part_step(512 << 10, 520, aligned);
            assert_eq!(s % 520, 0);
            assert!(s <= (512 << 10) - 4096 && s + 520 > (512 << 10) - 4096, "{s}");
        }
        // Any step of any block size: a whole number of blocks, never over the limit, and a
        // part of that length touches at most max / page pages from any start (unless one
        // block is all there is room for).
        for max in [4096usize, 8192, 128 << 10, 512 << 10] {
            for block in [512usize, 520, 576, 4096, 4104, 4160] {
                if block > max {
                    continue;
                }
                for aligned in [true, false] {
                    let s = part_step(max, block, aligned);
                    assert!(s > 0 && s.is_multiple_of(block) && s <= max, "{max} {block} {s}");
                    if !aligned && max > PAGE_SIZE && s > block {
                        assert!(
                            prp::pages_spanned(4092, s, PAGE_SIZE) <= max / PAGE_SIZE,
                            "{max} {block} {s}"
                        );
                    }
                }
            }
        }
    }

    /// Property tests over random formats, PI modes, block counts, buffer offsets (dword
    /// aligned or not), page layouts, SGL on or off and maximum transfers: the pointers describe
    /// exactly what the controller moves or the command is refused, and split requests are cut
    /// into parts that each fit one command. 256 cases per property (see
    /// [`vfpoll_nvme_spec::proptest_support`]).
    mod props {
        use super::*;
        use proptest::prelude::*;
        use vfpoll_nvme_spec::proptest_support::config;

        /// Data 512..=4096 bytes (powers of two), metadata 0..=128 (at least the 8 bytes of PI
        /// with PI), extended or separate, PI none or type 1/2/3 (16-bit guard, first or last
        /// bytes); the PI mode Controller or Host with any checks.
        fn format_and_mode() -> impl Strategy<Value = (NsFormat, PiMode)> {
            let ms = prop_oneof![Just(0usize), Just(8), Just(16), Just(64), 0usize..=128];
            let mode = prop_oneof![
                Just(PiMode::Controller),
                any::<(bool, bool, bool)>().prop_map(|(guard, app_tag, ref_tag)| PiMode::Host(PiCheck {
                    guard,
                    app_tag,
                    ref_tag
                })),
            ];
            (9u32..=12, ms, any::<bool>(), 0usize..4, any::<bool>(), mode).prop_map(
                |(lbads, ms, extended, pi, first, mode)| {
                    let ty = [
                        None,
                        Some(PiType::Type1),
                        Some(PiType::Type2),
                        Some(PiType::Type3),
                    ][pi];
                    let ms = if ty.is_some() { ms.max(8) } else { ms };
                    let f = NsFormat {
                        index: 0,
                        count: 1,
                        data_size: 1 << lbads,
                        metadata_size: ms,
                        extended: extended && ms != 0,
                        protection: ty.map(|ty| Protection {
                            ty,
                            first,
                            format: PiFormat::Guard16,
                            storage_tag_bits: 0,
                        }),
                    };
                    (f, mode)
                },
            )
        }

        /// Where a buffer starts in its first page: on the page, dword aligned, or anywhere.
        fn start() -> impl Strategy<Value = usize> {
            prop_oneof![
                Just(0usize),
                (0usize..1024).prop_map(|d| 4 * d),
                0usize..PAGE_SIZE
            ]
        }

        /// The bus ranges of bytes `off..off + len` of `buf`, in order.
        fn ranges(buf: &Scattered, off: usize, len: usize) -> Vec<(u64, usize)> {
            let mut out = Vec::new();
            let mut at = off;
            while at < off + len {
                let n = buf.contiguous_len(at).min(off + len - at);
                push_range(&mut out, buf.bus_addr(at).get(), n);
                at += n;
            }
            out
        }

        /// PRP list pages enough for `len` bytes from `start` (at least one).
        fn lists_for(start: BusAddr, len: usize) -> Lists {
            let entries = prp::pages_spanned(start.get(), len, PAGE_SIZE).saturating_sub(1);
            Lists {
                pages: vec![vec![0; PAGE_SIZE / 8]; prp::list_pages_for(entries.max(1), PAGE_SIZE)],
            }
        }

        /// Found by `split_parts_cover_the_request_and_each_fits_one_command`: on QEMU, 25
        /// blocks of 512 bytes with 33 bytes of separate metadata at an 8 KiB maximum transfer,
        /// from a page-aligned buffer, were cut at the aligned step into 15 blocks (the quirk's
        /// cut) and 10, the second 5120 bytes from byte 7680: three pages for a transfer limit
        /// of two.
        #[test]
        fn parts_after_a_metadata_quirk_cut_keep_the_page_rule() {
            let f = NsFormat {
                index: 0,
                count: 1,
                data_size: 512,
                metadata_size: 33,
                extended: false,
                protection: None,
            };
            let a = Access::new(&f, PiMode::Controller).unwrap();
            let mut ns = NsInfo::new(1, 1 << 20, f, Ok(a), 8192);
            ns.md_quirk = 33;
            let step = ns.step_blocks(true);
            let (mut done, mut left) = (0, 25u64);
            while left > 0 {
                let k = ns.part_blocks(left, step);
                let pages = prp::pages_spanned(done * 512, k as usize * 512, PAGE_SIZE);
                assert!(pages <= 2, "{k} blocks at block {done}: {pages} pages");
                done += k;
                left -= k;
            }
        }

        proptest! {
            #![proptest_config(config(256))]

            /// One command of `nlb` blocks from byte `off` of a buffer with spare bytes after
            /// (less than a block), with or without a separate metadata buffer: refused exactly
            /// when a pointer would be misaligned, the metadata is missing, unexpected or not
            /// bus-contiguous; otherwise the controller's walk of the data pointer is exactly
            /// the buffer's bytes, and MPTR is the metadata's first byte. One block more is
            /// always refused.
            #[test]
            fn pointers_describe_exactly_what_the_device_moves_for_any_request(
                (f, mode) in format_and_mode(),
                nlb in prop_oneof![1u64..=16, 1u64..=300],
                (first, off, slack, contiguous) in
                    (start(), 0usize..=8192, any::<prop::sample::Index>(), any::<bool>()),
                (meta_first, moff, meta_contiguous, give_meta) in
                    (start(), 0usize..=512, any::<bool>(), any::<bool>()),
                sgl in any::<bool>(),
            ) {
                let a = Access::new(&f, mode).expect("16-bit guard formats are supported");
                let (dlen, mlen) = a.transfer(nlb);
                let (dlen, mlen) = (dlen as usize, mlen as usize);
                let buf = Scattered { first, len: off + dlen + slack.index(a.block_bytes), contiguous };
                let meta = Scattered { first: meta_first, len: moff + mlen, contiguous: meta_contiguous };
                let m = give_meta.then_some((&meta, moff));
                let mut lists = lists_for(buf.bus_addr(off), dlen);
                let r = describe(a.block_bytes, a.meta_bytes, nlb, &buf, off, m, sgl, &mut lists);
                let data_ok = buf.bus_addr(off).is_aligned(4);
                let meta_ok = match (mlen, give_meta) {
                    (0, given) => !given,
                    (_, false) => false,
                    (_, true) => meta.bus_addr(moff).is_aligned(4) && meta.contiguous_len(moff) >= mlen,
                };
                prop_assert_eq!(r.is_ok(), data_ok && meta_ok, "{} {:?}: {:?}", f, mode, r);
                if let Ok(p) = r {
                    prop_assert_eq!(device_walk(p.data, dlen, &lists), ranges(&buf, off, dlen));
                    prop_assert_eq!(p.data.psdt == Psdt::SglBuffer, sgl && buf.contiguous_len(off) >= dlen);
                    let mptr = if mlen == 0 { BusAddr(0) } else { meta.bus_addr(moff) };
                    prop_assert_eq!(p.mptr, mptr);
                }
                let over = describe(a.block_bytes, a.meta_bytes, nlb + 1, &buf, off, m, sgl, &mut lists);
                prop_assert!(over.is_err(), "an overrun must be refused");
            }

            /// A request of `total` blocks on a queue pair of maximum transfer `max_xfer`, on
            /// QEMU (the metadata quirk) or not, cut as `submit` cuts it: one command when it
            /// fits one whatever the offset, else parts of `NsInfo::part_blocks` at
            /// `NsInfo::step_blocks`. The parts cover the request exactly; each is a whole
            /// number of blocks (1..=65536, NLB is 16 bits) within the maximum transfer, keeps
            /// QEMU's metadata whole (`md_fits`), and spans no more pages than the maximum
            /// transfer allows bytes (unless it is a single block); each is described, with the
            /// queue pair's list pages, exactly, or refused only for a misaligned start.
            #[test]
            fn split_parts_cover_the_request_and_each_fits_one_command(
                (f, mode) in format_and_mode(),
                max_shift in 12u32..=21,
                qemu in any::<bool>(),
                total in prop_oneof![1u64..=64, 1u64..=2048],
                (first, contiguous, sgl) in (start(), any::<bool>(), any::<bool>()),
                meta_first in start(),
            ) {
                let a = Access::new(&f, mode).expect("16-bit guard formats are supported");
                let max_xfer = 1usize << max_shift;
                // Such a namespace is refused (BlockTooLarge) before any command is built.
                prop_assume!(a.block_bytes <= max_xfer);
                let mut ns = NsInfo::new(1, u64::MAX, f, Ok(a), max_xfer);
                if qemu {
                    // As `QueuePair::refresh_view` sets it for QEMU.
                    ns.md_quirk = if ns.meta_bytes != 0 {
                        ns.meta_bytes
                    } else {
                        ns.block_bytes - ns.data_size
                    };
                }
                let (bb, mb) = (ns.block_bytes, ns.meta_bytes);
                let len = total as usize * bb;
                prop_assert_eq!(ns.blocks_of(len), Some(total));
                let buf = Scattered { first, len, contiguous };
                let meta = Scattered { first: meta_first, len: total as usize * mb, contiguous: true };
                // The queue pair's list pages per command (as `QueuePair::create` sizes them).
                let mut list_pages = 1;
                while prp::max_transfer(list_pages, PAGE_SIZE) < max_xfer {
                    list_pages += 1;
                }
                let mut lists = Lists { pages: vec![vec![0; PAGE_SIZE / 8]; list_pages] };
                let one = len <= ns.one_command && ns.md_fits(total);
                let step = ns.step_blocks(buf.bus_addr(0).is_aligned(PAGE_SIZE as u64));
                let (mut done, mut parts) = (0u64, 0usize);
                while done < total {
                    let k = if one { total } else { ns.part_blocks(total - done, step) };
                    prop_assert!((1..=65536).contains(&k) && k <= total - done, "{} blocks at {}", k, done);
                    prop_assert!(one || k <= step, "{} blocks over the step of {}", k, step);
                    let (at, plen) = (done as usize * bb, k as usize * bb);
                    prop_assert!(plen <= max_xfer, "{} bytes over the maximum transfer {}", plen, max_xfer);
                    prop_assert!(ns.md_fits(k), "{} blocks of {} metadata bytes", k, ns.md_quirk);
                    let pages = prp::pages_spanned(buf.bus_addr(at).get(), plen, PAGE_SIZE);
                    prop_assert!(
                        max_xfer == PAGE_SIZE || k == 1 || pages <= max_xfer / PAGE_SIZE,
                        "a part of {} bytes at {} spans {} pages", plen, at, pages
                    );
                    let m = (mb != 0).then_some((&meta, done as usize * mb));
                    let r = describe(bb, mb, k, &buf, at, m, sgl, &mut lists);
                    let ok = buf.bus_addr(at).is_aligned(4)
                        && m.is_none_or(|(mm, o)| mm.bus_addr(o).is_aligned(4));
                    prop_assert_eq!(r.is_ok(), ok, "part at {} of {} {:?}: {:?}", at, f, mode, r);
                    if let Ok(p) = r {
                        prop_assert_eq!(device_walk(p.data, plen, &lists), ranges(&buf, at, plen));
                        let mptr = m.map_or(BusAddr(0), |(mm, o)| mm.bus_addr(o));
                        prop_assert_eq!(p.mptr, mptr);
                    }
                    done += k;
                    parts += 1;
                }
                prop_assert_eq!(done, total);
                prop_assert!(parts as u64 <= total);
            }
        }
    }
}
