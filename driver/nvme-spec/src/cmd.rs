//! Submission and completion queue entries (NVMe Base 2.0 §4.1, §4.2), the opcodes of the
//! admin and NVM command sets, feature identifiers, Identify CNS values and log page
//! identifiers.
//!
//! [`Command`] is the 64-byte submission entry as 16 dwords, with a getter for every field and
//! builders for the commands that carry no host address; the driver adds the ones that do
//! (typed bus addresses) and copies a finished entry into a queue slot, the model decodes the
//! entries it fetches ([`Command::from_le_bytes`]). [`Completion`] is the 16-byte completion
//! entry. Neither is ever referenced in place in DMA memory.

use core::fmt;

use crate::status::Status;

/// Size of a submission queue entry (CC.IOSQES = 6).
pub const SQE_SIZE: usize = 64;
/// Size of a completion queue entry (CC.IOCQES = 4).
pub const CQE_SIZE: usize = 16;

/// The phase tag bit of a completion's DW3 (NVMe Base 2.0 Figure 96).
pub const PHASE: u32 = 1 << 16;

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

/// I/O opcodes: the NVM Command Set's (NVM Command Set 1.0 Figure 18) and the Zoned Namespace
/// Command Set's (ZNS 1.1 Figure 17).
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
    /// Zone Management Send (zoned namespaces).
    pub const ZONE_MGMT_SEND: u8 = 0x79;
    /// Zone Management Receive (zoned namespaces).
    pub const ZONE_MGMT_RECV: u8 = 0x7a;
    /// Zone Append (zoned namespaces).
    pub const ZONE_APPEND: u8 = 0x7d;
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
    /// Asynchronous Event Configuration (bit 8: Namespace Attribute Notices).
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE: u8 = 0x0f;
    /// I/O Command Set Profile (CDW11: the index of a combination in the Identify I/O Command
    /// Set data structure).
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;

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
    /// Active Namespace ID list of one I/O Command Set (with a CSI).
    pub const ACTIVE_NS_LIST_CSI: u32 = 0x07;
    /// Identify I/O Command Set data structure (the combinations a controller supports).
    pub const IO_COMMAND_SETS: u32 = 0x1c;
}

/// Log page identifiers (NVMe Base 2.0 Figure 202).
pub mod log_page {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List (read clears it; CDW10 bit 15, RAE, keeps the notice masked).
    pub const CHANGED_NS_LIST: u8 = 0x04;
}

/// SGL descriptor types (NVMe Base 2.0 §4.3.2, Figure 118): the high nibble of a descriptor's
/// byte 15.
pub mod sgl {
    /// SGL Data Block.
    pub const DATA_BLOCK: u8 = 0x0;
    /// SGL Bit Bucket.
    pub const BIT_BUCKET: u8 = 0x1;
    /// SGL Segment: points to the next segment.
    pub const SEGMENT: u8 = 0x2;
    /// SGL Last Segment: points to the last segment.
    pub const LAST_SEGMENT: u8 = 0x3;
    /// Bytes of one descriptor.
    pub const DESCRIPTOR_BYTES: usize = 16;
}

/// Data pointer kind in CDW0.PSDT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Psdt {
    /// PRPs.
    Prp = 0,
    /// SGLs, metadata pointer a buffer address.
    SglBuffer = 1,
}

/// A 64-byte submission queue entry, as 16 dwords (NVMe Base 2.0 §4.2, Figure 88: common
/// command format).
///
/// | dwords | field |
/// | --- | --- |
/// | 0 | opcode (7:0), fused operation (9:8), PSDT (15:14), command identifier (31:16) |
/// | 1 | namespace identifier |
/// | 2-3 | command dwords 2 and 3 |
/// | 4-5 | metadata pointer (MPTR) |
/// | 6-9 | data pointer: PRP entries 1 (6-7) and 2 (8-9), or SGL descriptor 1 |
/// | 10-15 | command dwords 10 to 15 (the NVM command set's SLBA in 10-11, NLB in 12) |
#[derive(Clone, Copy, PartialEq, Eq, Default)]
#[repr(C, align(64))]
pub struct Command {
    /// The 16 command dwords.
    pub dw: [u32; 16],
}

const _: () = assert!(core::mem::size_of::<Command>() == SQE_SIZE);

impl Command {
    /// A command with this opcode and namespace, everything else zero.
    #[inline]
    pub const fn new(opcode: u8, nsid: u32) -> Self {
        let mut dw = [0u32; 16];
        dw[0] = opcode as u32;
        dw[1] = nsid;
        Command { dw }
    }

    /// An entry as it lies in a submission queue (little endian).
    pub fn from_le_bytes(b: &[u8; SQE_SIZE]) -> Self {
        Command {
            dw: core::array::from_fn(|i| {
                u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }),
        }
    }

    /// The opcode (CDW0 bits 7:0).
    #[inline]
    pub const fn opcode(&self) -> u8 {
        self.dw[0] as u8
    }

    /// Fused Operation (CDW0 bits 9:8).
    #[inline]
    pub const fn fuse(&self) -> u32 {
        (self.dw[0] >> 8) & 0b11
    }

    /// The data pointer kind (CDW0 bits 15:14).
    #[inline]
    pub const fn psdt(&self) -> u32 {
        (self.dw[0] >> 14) & 0b11
    }

    /// The command identifier (CDW0 bits 31:16).
    #[inline]
    pub const fn cid(&self) -> u16 {
        (self.dw[0] >> 16) as u16
    }

    /// The namespace id.
    #[inline]
    pub const fn nsid(&self) -> u32 {
        self.dw[1]
    }

    /// Command dword `n`.
    #[inline]
    pub const fn cdw(&self, n: usize) -> u32 {
        self.dw[n]
    }

    /// Sets the command identifier (CDW0 bits 31:16).
    #[inline]
    pub fn set_cid(&mut self, cid: u16) {
        self.dw[0] = (self.dw[0] & 0xffff) | ((cid as u32) << 16);
    }

    /// Sets the data pointer kind (CDW0 bits 15:14).
    #[inline]
    pub fn set_psdt(&mut self, psdt: Psdt) {
        self.dw[0] = (self.dw[0] & !(0b11 << 14)) | ((psdt as u32) << 14);
    }

    /// The metadata pointer (CDW4-5).
    #[inline]
    pub const fn mptr(&self) -> u64 {
        self.dw[4] as u64 | (self.dw[5] as u64) << 32
    }

    /// PRP entry 1 (CDW6-7).
    #[inline]
    pub const fn prp1(&self) -> u64 {
        self.dw[6] as u64 | (self.dw[7] as u64) << 32
    }

    /// PRP entry 2 (CDW8-9).
    #[inline]
    pub const fn prp2(&self) -> u64 {
        self.dw[8] as u64 | (self.dw[9] as u64) << 32
    }

    /// The data pointer as SGL descriptor 1 (CDW6-9), little endian.
    pub fn sgl1(&self) -> [u8; sgl::DESCRIPTOR_BYTES] {
        let mut d = [0; sgl::DESCRIPTOR_BYTES];
        for (i, w) in self.dw[6..10].iter().enumerate() {
            d[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        d
    }

    /// Sets the starting LBA (CDW10-11) and the 0's based block count (CDW12 bits 15:0) of a
    /// read, write, compare or write zeroes.
    #[inline]
    pub fn set_lba_range(&mut self, slba: u64, blocks: u32) {
        debug_assert!((1..=65536).contains(&blocks));
        self.dw[10] = slba as u32;
        self.dw[11] = (slba >> 32) as u32;
        self.dw[12] = (self.dw[12] & !0xffff) | (blocks - 1);
    }

    /// Starting LBA of an I/O command (CDW10-11).
    #[inline]
    pub const fn slba(&self) -> u64 {
        self.dw[10] as u64 | (self.dw[11] as u64) << 32
    }

    /// Block count (1-based) of an I/O command (CDW12 bits 15:0, 0's based).
    #[inline]
    pub const fn blocks(&self) -> u32 {
        (self.dw[12] & 0xffff) + 1
    }

    /// Sets Force Unit Access (CDW12 bit 30).
    #[inline]
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

    /// An NVM read or write of `blocks` blocks at `slba` (data pointer set separately): the
    /// entry [`Rw::words`] encodes, with no pointer, flags or reference tag.
    pub fn rw(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> Self {
        Command::from_words(
            Rw {
                opcode,
                nsid,
                slba,
                blocks,
                ..Rw::NONE
            }
            .words(),
        )
    }

    /// Dataset Management with `ranges` ranges (0's based count in CDW10) and the Deallocate
    /// attribute (CDW11 bit 2).
    pub fn deallocate(nsid: u32, ranges: u32) -> Self {
        let mut c = Command::new(io_op::DATASET_MANAGEMENT, nsid);
        c.dw[10] = ranges - 1;
        c.dw[11] = 1 << 2;
        c
    }

    /// The entry as the eight little-endian 64-bit words a submission queue slot holds.
    #[inline]
    pub fn to_words(&self) -> [u64; 8] {
        core::array::from_fn(|i| self.dw[2 * i] as u64 | (self.dw[2 * i + 1] as u64) << 32)
    }

    /// The entry of eight 64-bit words (the inverse of [`Command::to_words`]).
    #[inline]
    pub fn from_words(w: [u64; 8]) -> Self {
        Command {
            dw: core::array::from_fn(|i| (w[i / 2] >> (32 * (i % 2))) as u32),
        }
    }
}

/// Every field of a command that names a range of blocks and moves data (NVM Command Set 1.0
/// §3.2.4 Read, §3.2.6 Write, §3.2.1 Compare, §3.2.8 Write Zeroes; Zoned Namespace Command
/// Set 1.1 §3.4.1 Zone Append): the one encoder of such an entry ([`Rw::words`]), which the
/// driver's hot path and [`Command::rw`] both use.
///
/// | bytes | field |
/// | --- | --- |
/// | 0 | opcode |
/// | 1 bits 7:6 | PSDT (CDW0 bits 15:14) |
/// | 3:2 | command identifier |
/// | 7:4 | namespace identifier |
/// | 15:8 | CDW2-3, zero |
/// | 23:16 | metadata pointer |
/// | 39:24 | data pointer |
/// | 47:40 | starting LBA (CDW10-11) |
/// | 49:48 | number of logical blocks, 0's based (CDW12 bits 15:0) |
/// | 51:50 | CDW12 bits 31:16: LR, FUA (30), PRINFO (29:26), ... |
/// | 55:52 | CDW13, zero |
/// | 59:56 | CDW14: the initial logical block reference tag |
/// | 63:60 | CDW15, zero |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    /// The opcode ([`io_op`], or the Zoned Namespace Command Set's Zone Append).
    pub opcode: u8,
    /// What the data pointer holds.
    pub psdt: Psdt,
    /// The command identifier.
    pub cid: u16,
    /// The namespace identifier.
    pub nsid: u32,
    /// The metadata pointer (0: none).
    pub mptr: u64,
    /// The data pointer: PRP entries 1 and 2, or SGL descriptor 1's two halves (little
    /// endian).
    pub dptr: [u64; 2],
    /// The starting LBA.
    pub slba: u64,
    /// The number of blocks, 1..=65536.
    pub blocks: u32,
    /// CDW12 bits 31:16 (bits 15:0 must be zero): FUA (bit 30) and PRINFO (bits 29:26).
    pub dw12_flags: u32,
    /// CDW14: the initial logical block reference tag (protection information types 1 and 2).
    pub ref_tag: u32,
}

impl Rw {
    /// Every field zero, PRPs, one block: a base for struct update syntax.
    pub const NONE: Rw = Rw {
        opcode: 0,
        psdt: Psdt::Prp,
        cid: 0,
        nsid: 0,
        mptr: 0,
        dptr: [0; 2],
        slba: 0,
        blocks: 1,
        dw12_flags: 0,
        ref_tag: 0,
    };

    /// The entry as the eight little-endian 64-bit words a submission queue slot holds (see
    /// [`Command::to_words`]), written straight from the fields: the I/O hot path builds no
    /// [`Command`] first.
    #[inline(always)]
    pub const fn words(self) -> [u64; 8] {
        debug_assert!(self.blocks >= 1 && self.blocks <= 65536);
        debug_assert!(self.dw12_flags & 0xffff == 0);
        [
            self.opcode as u64
                | (self.psdt as u64) << 14
                | (self.cid as u64) << 16
                | (self.nsid as u64) << 32,
            0,
            self.mptr,
            self.dptr[0],
            self.dptr[1],
            self.slba,
            (self.blocks - 1) as u64 | self.dw12_flags as u64,
            self.ref_tag as u64,
        ]
    }
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
    #[inline]
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
    #[inline]
    pub const fn to_dwords(self) -> [u32; 4] {
        [
            self.dw0,
            self.dw1,
            self.sq_head as u32 | (self.sq_id as u32) << 16,
            self.cid as u32 | (self.status as u32) << 16,
        ]
    }

    /// The phase tag.
    #[inline]
    pub const fn phase(&self) -> bool {
        self.status & 1 == 1
    }

    /// The status without the phase tag.
    #[inline]
    pub const fn status(&self) -> Status {
        Status::from_field(self.status)
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

    /// Writes `v` at byte offset `at` of an entry, as a host would (little endian).
    fn put(b: &mut [u8], at: usize, v: &[u8]) {
        b[at..at + v.len()].copy_from_slice(v);
    }

    /// Every field of the common command format at its byte offset (NVMe Base 2.0 Figure 88;
    /// NVM Command Set 1.0 Figure 20 for SLBA and NLB), read back through the getters.
    #[test]
    fn submission_entry_fields_sit_at_the_spec_offsets() {
        let mut b = [0u8; SQE_SIZE];
        put(&mut b, 0, &[0x02]); // OPC, byte 0
        b[1] = 0b0100_0001; // FUSE bits 9:8 = 01b, PSDT bits 15:14 = 01b
        put(&mut b, 2, &0xbeefu16.to_le_bytes()); // CID, bytes 3:2
        put(&mut b, 4, &7u32.to_le_bytes()); // NSID, bytes 7:4
        put(&mut b, 16, &0x9_0000_0040u64.to_le_bytes()); // MPTR, bytes 23:16
        put(&mut b, 24, &0xdead_0000_1000u64.to_le_bytes()); // PRP1, bytes 31:24
        put(&mut b, 32, &0x2000u64.to_le_bytes()); // PRP2, bytes 39:32
        put(&mut b, 40, &0x1_2345_6789u64.to_le_bytes()); // SLBA, bytes 47:40
        put(&mut b, 48, &7u16.to_le_bytes()); // NLB, bytes 49:48
        b[51] = 0x40; // FUA, CDW12 bit 30
        put(&mut b, 60, &0xaabb_ccddu32.to_le_bytes()); // CDW15, bytes 63:60
        let c = Command::from_le_bytes(&b);
        assert_eq!(
            (c.opcode(), c.fuse(), c.psdt(), c.cid(), c.nsid()),
            (2, 1, 1, 0xbeef, 7)
        );
        assert_eq!(
            (c.mptr(), c.prp1(), c.prp2()),
            (0x9_0000_0040, 0xdead_0000_1000, 0x2000)
        );
        assert_eq!((c.slba(), c.blocks(), c.cdw(15)), (0x1_2345_6789, 8, 0xaabb_ccdd));
        assert_eq!(c.sgl1()[..8], 0xdead_0000_1000u64.to_le_bytes());

        // The builders put the same fields in the same places.
        let mut d = Command::rw(io_op::READ, 7, 0x1_2345_6789, 8);
        d.set_cid(0xbeef);
        d.set_psdt(Psdt::SglBuffer);
        d.set_fua(true);
        d.dw[0] |= 1 << 8;
        d.dw[4..10].copy_from_slice(&c.dw[4..10]);
        d.dw[15] = 0xaabb_ccdd;
        assert_eq!(d, c);
        let words = c.to_words();
        assert_eq!(words[0], u64::from_le_bytes(b[0..8].try_into().unwrap()));
        assert_eq!(words[7], u64::from_le_bytes(b[56..64].try_into().unwrap()));
    }

    #[test]
    fn admin_builders_fill_their_dwords() {
        let l = Command::get_log_page(log_page::SMART, 0xffff_ffff, 128, 0x1_0000_0200);
        assert_eq!((l.opcode(), l.dw[10], l.dw[11]), (0x02, (127 << 16) | 2, 0));
        assert_eq!((l.dw[12], l.dw[13]), (0x200, 1));
        assert_eq!(Command::abort(3, 0x42).dw[10], 0x0042_0003);
        assert_eq!(Command::format_nvm(1, 0x15).dw[10], 0x1005);
        assert_eq!(
            Command::identify_csi(cns::NAMESPACE_CSI, 1, 2).dw[10..12],
            [5, 0x0200_0000]
        );
        assert_eq!(
            Command::set_features(feature::NUMBER_OF_QUEUES, 0x0003_0003).dw[10..12],
            [7, 0x0003_0003]
        );
        assert_eq!(Command::deallocate(1, 4).dw[10..12], [3, 4]);
        assert!(feature::without_data(feature::KEEP_ALIVE) && !feature::without_data(0x0e));
    }

    /// [`Rw::words`], the one encoder of a read, write, compare, write zeroes or zone append,
    /// against the byte offsets of NVMe Base 2.0 Figure 88 and NVM Command Set 1.0 Figures
    /// 20-22: the bytes a queue slot would hold, decoded here by hand, for any field values
    /// (256 cases, see [`crate::proptest_support`]).
    mod props {
        use super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        fn rw() -> impl Strategy<Value = Rw> {
            (
                any::<u8>(),
                any::<bool>(),
                any::<u16>(),
                any::<u32>(),
                any::<u64>(),
                any::<[u64; 2]>(),
                any::<u64>(),
                1u32..=65536,
                any::<u16>(),
                any::<u32>(),
            )
                .prop_map(
                    |(opcode, sgl, cid, nsid, mptr, dptr, slba, blocks, flags, ref_tag)| Rw {
                        opcode,
                        psdt: if sgl { Psdt::SglBuffer } else { Psdt::Prp },
                        cid,
                        nsid,
                        mptr,
                        dptr,
                        slba,
                        blocks,
                        dw12_flags: (flags as u32) << 16,
                        ref_tag,
                    },
                )
        }

        proptest! {
            #![proptest_config(config(256))]

            #[test]
            fn rw_entry_fields_sit_at_the_spec_offsets(r in rw()) {
                let mut b = [0u8; SQE_SIZE];
                for (i, w) in r.words().iter().enumerate() {
                    b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
                }
                // Bytes `at..at + n` as a little-endian number.
                let le = |at: usize, n: usize| b[at..at + n].iter().rev().fold(0u64, |v, &x| v << 8 | x as u64);
                prop_assert_eq!(b[0], r.opcode);
                // CDW0 bits 15:14 PSDT; bits 9:8 FUSE (a normal command) and 13:10 reserved.
                prop_assert_eq!(b[1], (r.psdt as u8) << 6);
                prop_assert_eq!(le(2, 2), r.cid as u64);
                prop_assert_eq!(le(4, 4), r.nsid as u64);
                prop_assert_eq!(le(8, 8), 0);
                prop_assert_eq!(le(16, 8), r.mptr);
                prop_assert_eq!((le(24, 8), le(32, 8)), (r.dptr[0], r.dptr[1]));
                prop_assert_eq!(le(40, 8), r.slba);
                prop_assert_eq!(le(48, 2), r.blocks as u64 - 1);
                prop_assert_eq!(le(50, 2), (r.dw12_flags >> 16) as u64);
                prop_assert_eq!(le(52, 4), 0);
                prop_assert_eq!(le(56, 4), r.ref_tag as u64);
                prop_assert_eq!(le(60, 4), 0);
                // The getters read the same entry back.
                let c = Command::from_le_bytes(&b);
                prop_assert_eq!((c.opcode(), c.psdt(), c.cid(), c.nsid()), (r.opcode, r.psdt as u32, r.cid, r.nsid));
                prop_assert_eq!((c.mptr(), c.prp1(), c.prp2()), (r.mptr, r.dptr[0], r.dptr[1]));
                prop_assert_eq!((c.slba(), c.blocks(), c.cdw(14)), (r.slba, r.blocks, r.ref_tag));
                prop_assert_eq!(Command::from_words(r.words()), c);
                prop_assert_eq!(c.to_words(), r.words());
            }
        }
    }

    /// DW2: SQ head (15:0), SQ identifier (31:16); DW3: CID (15:0), phase (16), status (31:17)
    /// (NVMe Base 2.0 Figure 96).
    #[test]
    fn completion_entry_fields_sit_at_the_spec_offsets() {
        let c = Completion::from_dwords([7, 0, 0x0002_0011, 0x0001_0042]);
        assert_eq!((c.dw0, c.sq_head, c.sq_id, c.cid), (7, 0x11, 2, 0x42));
        assert!(c.phase());
        assert!(c.status().is_success());
        assert_eq!(Completion::from_dwords(c.to_dwords()), c);
        let e = Completion::from_dwords([0, 0, 0, PHASE | (0x8000 | 0x80 << 1) << 16]);
        assert_eq!(e.status(), Status::LBA_OUT_OF_RANGE);
    }
}
