//! Submission and completion queue entries (NVMe Base 2.0 §4.2, §4.6) and command builders.
//!
//! Commands are built in an ordinary local [`Command`] and copied whole into a submission
//! queue slot; completions are copied out of the completion queue into a [`Completion`] after
//! the phase check. Neither type is ever referenced in place in DMA memory.

use core::fmt;

use vfpoll_pci::BusAddr;

/// Size of a submission queue entry.
pub(crate) const SQE_SIZE: usize = 64;
/// Size of a completion queue entry.
pub(crate) const CQE_SIZE: usize = 16;

/// The phase tag bit of a completion's DW3.
pub(crate) const PHASE: u32 = 1 << 16;

/// Admin command opcodes (NVMe Base 2.0 Figure 138).
pub mod admin_op {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Doorbell Buffer Config.
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    /// Format NVM.
    pub const FORMAT_NVM: u8 = 0x80;
}

/// NVM command set I/O opcodes (NVM Command Set 1.0 Figure 18).
pub mod io_op {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Feature identifiers (NVMe Base 2.0 Figure 271).
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Interrupt Vector Configuration.
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE: u8 = 0x0f;

    /// Whether feature `fid` moves no data buffer and carries no address in its dwords: the
    /// ones Get/Set Features may send safely. Every other feature (LBA Range Type,
    /// Autonomous Power State Transition, Host Memory Buffer, Timestamp, Host Behavior
    /// Support, Host Identifier, the metadata features, vendor-specific ones) moves data
    /// through a pointer or names host memory.
    pub const fn without_data(fid: u8) -> bool {
        matches!(
            fid,
            ARBITRATION
                | POWER_MANAGEMENT
                | TEMPERATURE_THRESHOLD
                | ERROR_RECOVERY
                | VOLATILE_WRITE_CACHE
                | NUMBER_OF_QUEUES
                | INTERRUPT_COALESCING
                | INTERRUPT_VECTOR_CONFIG
                | WRITE_ATOMICITY
                | ASYNC_EVENT_CONFIG
                | KEEP_ALIVE
        )
    }
}

/// Identify CNS values (NVMe Base 2.0 Figure 273).
pub mod cns {
    /// Identify Namespace data structure for the given NSID.
    pub const NAMESPACE: u32 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u32 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u32 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u32 = 0x03;
    /// I/O Command Set specific Identify Namespace data structure (with a CSI).
    pub const NAMESPACE_CSI: u32 = 0x05;
    /// I/O Command Set specific Identify Controller data structure (with a CSI).
    pub const CONTROLLER_CSI: u32 = 0x06;
}

/// Log page identifiers (NVMe Base 2.0 Figure 202).
pub mod log_page {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Changed Namespace List.
    pub const CHANGED_NS_LIST: u8 = 0x04;
}

/// Data pointer kind in CDW0.PSDT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Psdt {
    /// PRPs.
    Prp = 0,
    /// SGLs, metadata pointer a buffer address.
    SglBuffer = 1,
}

/// A 64-byte submission queue entry, as 16 dwords (NVMe Base 2.0 Figure 88).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
#[repr(C, align(64))]
pub struct Command {
    /// The 16 command dwords.
    pub dw: [u32; 16],
}

const _: () = assert!(core::mem::size_of::<Command>() == 64);

impl Command {
    /// A command with this opcode and namespace, everything else zero.
    pub const fn new(opcode: u8, nsid: u32) -> Self {
        let mut dw = [0u32; 16];
        dw[0] = opcode as u32;
        dw[1] = nsid;
        Command { dw }
    }

    /// The opcode.
    pub const fn opcode(&self) -> u8 {
        self.dw[0] as u8
    }

    /// The namespace id.
    pub const fn nsid(&self) -> u32 {
        self.dw[1]
    }

    /// The command identifier.
    pub const fn cid(&self) -> u16 {
        (self.dw[0] >> 16) as u16
    }

    /// Sets the command identifier (CDW0 bits 31:16).
    pub fn set_cid(&mut self, cid: u16) {
        self.dw[0] = (self.dw[0] & 0xffff) | ((cid as u32) << 16);
    }

    /// Sets the data pointer kind (CDW0 bits 15:14).
    pub fn set_psdt(&mut self, psdt: Psdt) {
        self.dw[0] = (self.dw[0] & !(0b11 << 14)) | ((psdt as u32) << 14);
    }

    /// The data pointer kind.
    pub const fn psdt(&self) -> u32 {
        (self.dw[0] >> 14) & 0b11
    }

    /// Sets PRP entry 1 (CDW6-7). A command built this way reaches a controller only through
    /// the `unsafe` passthrough calls ([`crate::Controller::admin_raw`],
    /// [`crate::QueuePair::submit_raw`]), whose callers vouch for the addresses.
    pub fn set_prp1(&mut self, addr: BusAddr) {
        self.dw[6] = addr.get() as u32;
        self.dw[7] = (addr.get() >> 32) as u32;
    }

    /// Sets PRP entry 2 (CDW8-9); see [`Command::set_prp1`].
    pub fn set_prp2(&mut self, addr: BusAddr) {
        self.dw[8] = addr.get() as u32;
        self.dw[9] = (addr.get() >> 32) as u32;
    }

    /// PRP entry 1.
    pub const fn prp1(&self) -> u64 {
        self.dw[6] as u64 | (self.dw[7] as u64) << 32
    }

    /// PRP entry 2.
    pub const fn prp2(&self) -> u64 {
        self.dw[8] as u64 | (self.dw[9] as u64) << 32
    }

    /// Sets the data pointer (CDW6-9) and PSDT from one the driver built.
    pub(crate) fn set_data_ptr(&mut self, dp: DataPtr) {
        self.set_psdt(dp.psdt);
        self.set_prp1(BusAddr(dp.lo));
        self.set_prp2(BusAddr(dp.hi));
    }

    /// Sets the SGL descriptor in the data pointer (CDW6-9) and PSDT to SGL.
    pub fn set_sgl(&mut self, desc: SglDescriptor) {
        let b = desc.0;
        for i in 0..4 {
            self.dw[6 + i] = u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        }
        self.set_psdt(Psdt::SglBuffer);
    }

    /// Sets the starting LBA (CDW10-11) and the 0's based block count (CDW12 bits 15:0) of a
    /// read, write, compare or write zeroes.
    pub fn set_lba_range(&mut self, slba: u64, blocks: u32) {
        debug_assert!((1..=65536).contains(&blocks));
        self.dw[10] = slba as u32;
        self.dw[11] = (slba >> 32) as u32;
        self.dw[12] = (self.dw[12] & !0xffff) | (blocks - 1);
    }

    /// Starting LBA of an I/O command.
    pub const fn slba(&self) -> u64 {
        self.dw[10] as u64 | (self.dw[11] as u64) << 32
    }

    /// Block count (1-based) of an I/O command.
    pub const fn blocks(&self) -> u32 {
        (self.dw[12] & 0xffff) + 1
    }

    /// Sets Force Unit Access (CDW12 bit 30).
    pub fn set_fua(&mut self, fua: bool) {
        self.dw[12] = (self.dw[12] & !(1 << 30)) | ((fua as u32) << 30);
    }

    /// Identify (CNS in CDW10, controller id 0).
    pub fn identify(cns: u32, nsid: u32) -> Self {
        let mut c = Command::new(admin_op::IDENTIFY, nsid);
        c.dw[10] = cns;
        c
    }

    /// Identify with a Command Set Identifier (CDW11 bits 31:24), for CNS 05h/06h.
    pub fn identify_csi(cns: u32, nsid: u32, csi: u8) -> Self {
        let mut c = Command::identify(cns, nsid);
        c.dw[11] = (csi as u32) << 24;
        c
    }

    /// Create I/O Completion Queue, physically contiguous, interrupts disabled (NVMe Base 2.0
    /// §5.4).
    pub fn create_io_cq(qid: u16, entries: u32, base: BusAddr) -> Self {
        let mut c = Command::new(admin_op::CREATE_IO_CQ, 0);
        c.set_prp1(base);
        c.dw[10] = ((entries - 1) << 16) | qid as u32;
        c.dw[11] = 1; // PC = 1, IEN = 0
        c
    }

    /// Create I/O Completion Queue with interrupts enabled (IEN = 1) on vector `iv`
    /// (NVMe Base 2.0 §5.4, CDW11 bits 31:16 IV, bit 1 IEN, bit 0 PC).
    pub fn create_io_cq_irq(qid: u16, entries: u32, base: BusAddr, iv: u16) -> Self {
        let mut c = Self::create_io_cq(qid, entries, base);
        c.dw[11] = ((iv as u32) << 16) | 0b11;
        c
    }

    /// Create I/O Submission Queue bound to completion queue `cqid`, physically contiguous
    /// (NVMe Base 2.0 §5.5).
    pub fn create_io_sq(qid: u16, entries: u32, base: BusAddr, cqid: u16) -> Self {
        let mut c = Command::new(admin_op::CREATE_IO_SQ, 0);
        c.set_prp1(base);
        c.dw[10] = ((entries - 1) << 16) | qid as u32;
        c.dw[11] = ((cqid as u32) << 16) | 1; // PC = 1, QPRIO = urgent/ignored
        c
    }

    /// Delete I/O Submission Queue.
    pub fn delete_io_sq(qid: u16) -> Self {
        let mut c = Command::new(admin_op::DELETE_IO_SQ, 0);
        c.dw[10] = qid as u32;
        c
    }

    /// Delete I/O Completion Queue.
    pub fn delete_io_cq(qid: u16) -> Self {
        let mut c = Command::new(admin_op::DELETE_IO_CQ, 0);
        c.dw[10] = qid as u32;
        c
    }

    /// Set Features.
    pub fn set_features(fid: u8, dw11: u32) -> Self {
        let mut c = Command::new(admin_op::SET_FEATURES, 0);
        c.dw[10] = fid as u32;
        c.dw[11] = dw11;
        c
    }

    /// Get Features (current value).
    pub fn get_features(fid: u8) -> Self {
        let mut c = Command::new(admin_op::GET_FEATURES, 0);
        c.dw[10] = fid as u32;
        c
    }

    /// Get Log Page of `dwords` dwords (NVMe Base 2.0 §5.16), namespace `nsid`.
    pub fn get_log_page(lid: u8, nsid: u32, dwords: u32, offset: u64) -> Self {
        let mut c = Command::new(admin_op::GET_LOG_PAGE, nsid);
        let numd = dwords - 1;
        c.dw[10] = ((numd & 0xffff) << 16) | lid as u32;
        c.dw[11] = numd >> 16;
        c.dw[12] = offset as u32;
        c.dw[13] = (offset >> 32) as u32;
        c
    }

    /// Abort command `cid` on submission queue `sqid`.
    pub fn abort(sqid: u16, cid: u16) -> Self {
        let mut c = Command::new(admin_op::ABORT, 0);
        c.dw[10] = ((cid as u32) << 16) | sqid as u32;
        c
    }

    /// Format NVM with LBA format `lbaf`, no secure erase.
    pub fn format_nvm(nsid: u32, lbaf: u8) -> Self {
        let mut c = Command::new(admin_op::FORMAT_NVM, nsid);
        c.dw[10] = (lbaf & 0xf) as u32 | (((lbaf >> 4) & 0x3) as u32) << 12;
        c
    }

    /// Doorbell Buffer Config: shadow doorbells at `shadow`, EventIdx at `eventidx`.
    pub fn doorbell_buffer_config(shadow: BusAddr, eventidx: BusAddr) -> Self {
        let mut c = Command::new(admin_op::DOORBELL_BUFFER_CONFIG, 0);
        c.set_prp1(shadow);
        c.set_prp2(eventidx);
        c
    }

    /// An NVM read or write of `blocks` blocks at `slba` (data pointer set separately).
    pub fn rw(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> Self {
        let mut c = Command::new(opcode, nsid);
        c.set_lba_range(slba, blocks);
        c
    }

    /// Dataset Management with `ranges` ranges (0's based count in CDW10) and the Deallocate
    /// attribute (CDW11 bit 2).
    pub fn deallocate(nsid: u32, ranges: u32) -> Self {
        let mut c = Command::new(io_op::DATASET_MANAGEMENT, nsid);
        c.dw[10] = ranges - 1;
        c.dw[11] = 1 << 2;
        c
    }
}

impl Command {
    /// The entry as the eight little-endian 64-bit words a submission queue slot holds.
    #[inline]
    pub fn to_words(&self) -> [u64; 8] {
        core::array::from_fn(|i| self.dw[2 * i] as u64 | (self.dw[2 * i + 1] as u64) << 32)
    }
}

/// The data pointer of a command (CDW6-9 and CDW0.PSDT): two PRP entries, or one SGL
/// descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataPtr {
    /// CDW6-7: PRP entry 1, or the descriptor's first 8 bytes.
    pub lo: u64,
    /// CDW8-9: PRP entry 2, or the descriptor's last 8 bytes.
    pub hi: u64,
    /// CDW0.PSDT.
    pub psdt: Psdt,
}

impl DataPtr {
    /// PRP entries.
    pub(crate) const fn prp(prp1: BusAddr, prp2: BusAddr) -> Self {
        DataPtr {
            lo: prp1.get(),
            hi: prp2.get(),
            psdt: Psdt::Prp,
        }
    }

    /// One SGL descriptor.
    pub(crate) fn sgl(desc: SglDescriptor) -> Self {
        let b = desc.0;
        DataPtr {
            lo: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            hi: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
            psdt: Psdt::SglBuffer,
        }
    }
}

/// The fields of a Read, Write or Compare that vary per command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rw {
    pub op: u8,
    pub nsid: u32,
    pub cid: u16,
    pub slba: u64,
    /// 1..=65536.
    pub blocks: u32,
    /// CDW12 bits 31:16: FUA (bit 30) and PRINFO (bits 29:26).
    pub dw12_flags: u32,
    /// CDW14: the initial logical block reference tag (PI types 1 and 2).
    pub ref_tag: u32,
    pub dp: DataPtr,
    /// CDW4-5: the metadata pointer (0: none).
    pub mptr: BusAddr,
}

/// A Read, Write or Compare as the words of a submission queue entry: what [`Command::rw`]
/// with `set_cid`, `set_fua`, the data and metadata pointers and CDW12/14 gives, without
/// building the 16 dwords first (the I/O hot path).
#[inline]
pub(crate) fn rw_words(c: Rw) -> [u64; 8] {
    debug_assert!((1..=65536).contains(&c.blocks));
    debug_assert!(c.dw12_flags & 0xffff == 0);
    [
        c.op as u64 | (c.dp.psdt as u64) << 14 | (c.cid as u64) << 16 | (c.nsid as u64) << 32,
        0,
        c.mptr.get(),
        c.dp.lo,
        c.dp.hi,
        c.slba,
        (c.blocks - 1) as u64 | c.dw12_flags as u64,
        c.ref_tag as u64,
    ]
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Command(op={:#04x} cid={} nsid={} dw={:08x?})",
            self.opcode(),
            self.cid(),
            self.nsid(),
            &self.dw
        )
    }
}

/// An SGL descriptor (NVMe Base 2.0 §4.3.2), 16 bytes, little endian.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SglDescriptor(pub [u8; 16]);

impl SglDescriptor {
    /// SGL Data Block descriptor (type 0h).
    pub fn data_block(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, 0x0)
    }

    /// SGL Segment descriptor (type 2h): points to the next segment of `len` bytes.
    pub fn segment(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, 0x2)
    }

    /// SGL Last Segment descriptor (type 3h).
    pub fn last_segment(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, 0x3)
    }

    fn with_type(addr: BusAddr, len: u32, ty: u8) -> Self {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.get().to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[15] = ty << 4;
        SglDescriptor(b)
    }
}

/// A completion queue entry, copied out of the completion queue (NVMe Base 2.0 Figure 89).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// Command specific result (DW0).
    pub dw0: u32,
    /// DW1.
    pub dw1: u32,
    /// SQ head pointer.
    pub sq_head: u16,
    /// SQ identifier.
    pub sq_id: u16,
    /// Command identifier.
    pub cid: u16,
    /// Status field with the phase tag in bit 0 (DW3 bits 31:16).
    pub status: u16,
}

impl Completion {
    /// Decodes the four dwords.
    pub const fn from_dwords(dw: [u32; 4]) -> Self {
        Completion {
            dw0: dw[0],
            dw1: dw[1],
            sq_head: dw[2] as u16,
            sq_id: (dw[2] >> 16) as u16,
            cid: dw[3] as u16,
            status: (dw[3] >> 16) as u16,
        }
    }

    /// The four dwords.
    pub const fn to_dwords(self) -> [u32; 4] {
        [
            self.dw0,
            self.dw1,
            self.sq_head as u32 | (self.sq_id as u32) << 16,
            self.cid as u32 | (self.status as u32) << 16,
        ]
    }

    /// The phase tag.
    pub const fn phase(&self) -> bool {
        self.status & 1 == 1
    }

    /// The status without the phase tag, as [`crate::status::Status`].
    pub const fn status(&self) -> crate::status::Status {
        crate::status::Status::from_field(self.status)
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Completion(cid={} sq={} head={} dw0={:#x} {:?} p={})",
            self.cid,
            self.sq_id,
            self.sq_head,
            self.dw0,
            self.status(),
            self.phase() as u8
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_fields_land_in_the_right_dwords() {
        let mut c = Command::rw(io_op::READ, 1, 0x1_2345_6789, 8);
        c.set_cid(0xbeef);
        c.set_prp1(BusAddr(0xdead_0000_1000));
        c.set_prp2(BusAddr(0x2000));
        c.set_fua(true);
        assert_eq!(c.dw[0], 0xbeef_0002);
        assert_eq!(c.dw[1], 1);
        assert_eq!((c.dw[6], c.dw[7], c.dw[8]), (0x1000, 0xdead, 0x2000));
        assert_eq!((c.dw[10], c.dw[11]), (0x2345_6789, 1));
        assert_eq!(c.dw[12], (1 << 30) | 7);
        assert_eq!((c.slba(), c.blocks(), c.cid()), (0x1_2345_6789, 8, 0xbeef));
        let q = Command::create_io_sq(3, 256, BusAddr(0x10_0000), 3);
        assert_eq!((q.dw[10], q.dw[11]), (0x00ff_0003, 0x0003_0001));
        let l = Command::get_log_page(log_page::SMART, 0xffff_ffff, 128, 0);
        assert_eq!(l.dw[10], (127 << 16) | 2);
        let mut s = Command::new(io_op::READ, 1);
        s.set_sgl(SglDescriptor::data_block(BusAddr(0x1234_5000), 4096));
        assert_eq!((s.psdt(), s.dw[6], s.dw[8], s.dw[9]), (1, 0x1234_5000, 4096, 0));
        assert_eq!(SglDescriptor::last_segment(BusAddr(0), 32).0[15], 0x30);
    }

    #[test]
    fn rw_words_match_the_command_builder() {
        let sgl = SglDescriptor::data_block(BusAddr(0x1234_5678_9000), 8192);
        for (fua, dp, mptr, prinfo, ref_tag) in [
            (
                false,
                DataPtr::prp(BusAddr(0xdead_0000_1000), BusAddr(0)),
                0,
                0,
                0,
            ),
            (
                true,
                DataPtr::prp(BusAddr(0x1000), BusAddr(0x7_0000_2000)),
                0x9_0000_0040,
                0,
                0,
            ),
            (false, DataPtr::sgl(sgl), 0x8000, 0b1011, 0xfe_dcba_9876u64 as u32),
        ] {
            let mut c = Command::rw(io_op::WRITE, 7, 0xfe_dcba_9876, 65536);
            c.set_cid(0xf123);
            c.set_fua(fua);
            match dp.psdt {
                Psdt::Prp => {
                    c.set_prp1(BusAddr(dp.lo));
                    c.set_prp2(BusAddr(dp.hi));
                }
                Psdt::SglBuffer => c.set_sgl(sgl),
            }
            c.dw[4] = mptr as u32;
            c.dw[5] = (mptr >> 32) as u32;
            c.dw[12] |= prinfo << 26;
            c.dw[14] = ref_tag;
            let w = rw_words(Rw {
                op: io_op::WRITE,
                nsid: 7,
                cid: 0xf123,
                slba: 0xfe_dcba_9876,
                blocks: 65536,
                dw12_flags: (fua as u32) << 30 | prinfo << 26,
                ref_tag,
                dp,
                mptr: BusAddr(mptr),
            });
            assert_eq!(w, c.to_words(), "{c:?}");
        }
        let mut c = Command::new(io_op::READ, 1);
        c.dw[15] = 0xaabb_ccdd;
        c.dw[0] = 0x1122_3344;
        assert_eq!(
            (c.to_words()[0], c.to_words()[7]),
            (0x1_1122_3344, 0xaabb_ccdd << 32)
        );
    }

    #[test]
    fn completion_round_trips() {
        let c = Completion::from_dwords([7, 0, 0x0002_0011, 0x0001_0042]);
        assert_eq!((c.dw0, c.sq_head, c.sq_id, c.cid), (7, 0x11, 2, 0x42));
        assert!(c.phase());
        assert!(c.status().is_success());
        assert_eq!(Completion::from_dwords(c.to_dwords()), c);
    }
}
