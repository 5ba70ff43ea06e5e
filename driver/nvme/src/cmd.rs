//! Submission and completion queue entries (NVMe Base 2.0 §4.2, §4.6) and command builders.
//!
//! The entries, opcodes and tables are `vfpoll-nvme-spec`'s ([`vfpoll_nvme_spec::cmd`],
//! re-exported here); this module adds what takes a bus address ([`CommandExt`],
//! [`SglDescriptor`]). Every read, write, compare, write zeroes and zone append is encoded by
//! [`Rw::words`], the spec crate's one encoder of such an entry, tested there against the
//! specification's byte offsets.
//!
//! Commands are built in an ordinary local [`Command`] and copied whole into a submission
//! queue slot; completions are copied out of the completion queue into a [`Completion`] after
//! the phase check. Neither type is ever referenced in place in DMA memory.

use vfpoll_pci::BusAddr;

use vfpoll_nvme_spec::cmd::sgl;
pub use vfpoll_nvme_spec::cmd::{admin_op, cns, feature, io_op, log_page, Command, Completion, Psdt, Rw};
pub(crate) use vfpoll_nvme_spec::cmd::{CQE_SIZE, PHASE, SQE_SIZE};

/// The builders of [`Command`] that take bus addresses (typed [`BusAddr`], never a bare
/// integer). A command built this way reaches a controller only through the driver, or through
/// the `unsafe` passthrough calls ([`crate::Controller::admin_raw`],
/// [`crate::QueuePair::submit_raw`]), whose callers vouch for the addresses.
pub trait CommandExt: Sized {
    /// Sets PRP entry 1 (CDW6-7).
    fn set_prp1(&mut self, addr: BusAddr);
    /// Sets PRP entry 2 (CDW8-9); see [`CommandExt::set_prp1`].
    fn set_prp2(&mut self, addr: BusAddr);
    /// Sets the SGL descriptor in the data pointer (CDW6-9) and PSDT to SGL.
    fn set_sgl(&mut self, desc: SglDescriptor);
    /// Create I/O Completion Queue, physically contiguous, interrupts disabled (NVMe Base 2.0
    /// §5.4).
    fn create_io_cq(qid: u16, entries: u32, base: BusAddr) -> Self;
    /// Create I/O Completion Queue with interrupts enabled (IEN = 1) on vector `iv`
    /// (NVMe Base 2.0 §5.4, CDW11 bits 31:16 IV, bit 1 IEN, bit 0 PC).
    fn create_io_cq_irq(qid: u16, entries: u32, base: BusAddr, iv: u16) -> Self;
    /// Create I/O Submission Queue bound to completion queue `cqid`, physically contiguous
    /// (NVMe Base 2.0 §5.5).
    fn create_io_sq(qid: u16, entries: u32, base: BusAddr, cqid: u16) -> Self;
    /// Doorbell Buffer Config: shadow doorbells at `shadow`, EventIdx at `eventidx`.
    fn doorbell_buffer_config(shadow: BusAddr, eventidx: BusAddr) -> Self;
}

impl CommandExt for Command {
    fn set_prp1(&mut self, addr: BusAddr) {
        self.dw[6] = addr.get() as u32;
        self.dw[7] = (addr.get() >> 32) as u32;
    }

    fn set_prp2(&mut self, addr: BusAddr) {
        self.dw[8] = addr.get() as u32;
        self.dw[9] = (addr.get() >> 32) as u32;
    }

    fn set_sgl(&mut self, desc: SglDescriptor) {
        let b = desc.0;
        for i in 0..4 {
            self.dw[6 + i] = u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        }
        self.set_psdt(Psdt::SglBuffer);
    }

    fn create_io_cq(qid: u16, entries: u32, base: BusAddr) -> Self {
        let mut c = Command::new(admin_op::CREATE_IO_CQ, 0);
        c.set_prp1(base);
        c.dw[10] = ((entries - 1) << 16) | qid as u32;
        c.dw[11] = 1; // PC = 1, IEN = 0
        c
    }

    fn create_io_cq_irq(qid: u16, entries: u32, base: BusAddr, iv: u16) -> Self {
        let mut c = Self::create_io_cq(qid, entries, base);
        c.dw[11] = ((iv as u32) << 16) | 0b11;
        c
    }

    fn create_io_sq(qid: u16, entries: u32, base: BusAddr, cqid: u16) -> Self {
        let mut c = Command::new(admin_op::CREATE_IO_SQ, 0);
        c.set_prp1(base);
        c.dw[10] = ((entries - 1) << 16) | qid as u32;
        c.dw[11] = ((cqid as u32) << 16) | 1; // PC = 1, QPRIO = urgent/ignored
        c
    }

    fn doorbell_buffer_config(shadow: BusAddr, eventidx: BusAddr) -> Self {
        let mut c = Command::new(admin_op::DOORBELL_BUFFER_CONFIG, 0);
        c.set_prp1(shadow);
        c.set_prp2(eventidx);
        c
    }
}

/// Sets the data pointer (CDW6-9) and PSDT of `c` from one the driver built.
pub(crate) fn set_data_ptr(c: &mut Command, dp: DataPtr) {
    c.set_psdt(dp.psdt);
    c.set_prp1(BusAddr(dp.lo));
    c.set_prp2(BusAddr(dp.hi));
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
    /// The fields of an [`Rw`] this pointer sets: PSDT and the two halves of the data
    /// pointer.
    #[inline(always)]
    pub(crate) const fn rw_fields(self) -> (Psdt, [u64; 2]) {
        (self.psdt, [self.lo, self.hi])
    }

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

/// An SGL descriptor (NVMe Base 2.0 §4.3.2), 16 bytes, little endian.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SglDescriptor(pub [u8; 16]);

impl SglDescriptor {
    /// SGL Data Block descriptor (type 0h).
    pub fn data_block(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, sgl::DATA_BLOCK)
    }

    /// SGL Segment descriptor (type 2h): points to the next segment of `len` bytes.
    pub fn segment(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, sgl::SEGMENT)
    }

    /// SGL Last Segment descriptor (type 3h).
    pub fn last_segment(addr: BusAddr, len: u32) -> Self {
        Self::with_type(addr, len, sgl::LAST_SEGMENT)
    }

    fn with_type(addr: BusAddr, len: u32, ty: u8) -> Self {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.get().to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[15] = ty << 4;
        SglDescriptor(b)
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
    fn the_encoder_matches_the_command_builder() {
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
            let (psdt, dptr) = dp.rw_fields();
            let w = Rw {
                opcode: io_op::WRITE,
                psdt,
                cid: 0xf123,
                nsid: 7,
                mptr,
                dptr,
                slba: 0xfe_dcba_9876,
                blocks: 65536,
                dw12_flags: (fua as u32) << 30 | prinfo << 26,
                ref_tag,
            }
            .words();
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
}
