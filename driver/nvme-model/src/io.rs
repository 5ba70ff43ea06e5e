//! NVM Command Set I/O commands (NVM Command Set 1.0 §3).

use std::sync::atomic::Ordering::Relaxed;

use crate::ctrl::{Controller, Outcome};
use crate::dptr::{self, copy_from_host, copy_to_host, equals_host, Dir};
use crate::queue::Command;
use crate::Status;

/// NVM Command Set opcodes (NVM Command Set 1.0 §3, Figure 17).
pub mod opcode {
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

/// Dataset Management, CDW11 bit 2: Attribute – Deallocate.
const DSM_DEALLOCATE: u32 = 1 << 2;

impl Controller {
    /// Executes an I/O command.
    pub(crate) fn io(&mut self, cmd: &Command) -> Outcome {
        if cmd.fuse() != 0 {
            return Status::INVALID_FIELD.into();
        }
        match cmd.opcode() {
            opcode::FLUSH => self.flush(cmd),
            opcode::WRITE | opcode::READ | opcode::COMPARE => self.read_write(cmd),
            opcode::WRITE_ZEROES => self.write_zeroes(cmd),
            opcode::DATASET_MANAGEMENT => self.dataset_management(cmd),
            _ => Status::INVALID_OPCODE,
        }
        .into()
    }

    /// Flush (§3.3.1): data is in memory already; NSID FFFFFFFFh flushes all (VWC bits 2:1).
    fn flush(&mut self, cmd: &Command) -> Status {
        let all = cmd.nsid() == u32::MAX && self.cfg.volatile_write_cache;
        if all || self.ns_index(cmd.nsid()).is_some() {
            Status::SUCCESS
        } else {
            Status::INVALID_NAMESPACE
        }
    }

    /// Fills `self.segs` from the command's data pointer for `len` bytes (PRPs, or an SGL when
    /// configured; PSDT 10b, a metadata SGL, is not supported).
    fn data_pointer(&mut self, cmd: &Command, len: u64, dir: Dir) -> Result<(), Status> {
        match cmd.psdt() {
            0 => dptr::prp(&self.mem, cmd.prp1(), cmd.prp2(), len, self.page, &mut self.segs),
            1 if self.cfg.sgl => dptr::sgl(&self.mem, &cmd.sgl1(), len, dir, &mut self.segs),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Read (§3.2.4), Write (§3.2.6) and Compare (§3.2.1): CDW10-11 SLBA, CDW12 NLB (0's based)
    /// and FUA (accepted: data is never cached). Checks, in order: namespace, MDTS, LBA range,
    /// data pointer.
    fn read_write(&mut self, cmd: &Command) -> Status {
        let Some(i) = self.ns_index(cmd.nsid()) else {
            return Status::INVALID_NAMESPACE;
        };
        let (slba, nlb) = (cmd.cdw10_11(), (cmd.cdw(12) & 0xffff) as u64 + 1);
        let len = nlb << self.ns[i].lba_shift;
        if self.cfg.max_transfer().is_some_and(|m| len > m) {
            return Status::INVALID_FIELD;
        }
        let Some(range) = self.ns[i].range(slba, nlb) else {
            return Status::LBA_OUT_OF_RANGE;
        };
        let op = cmd.opcode();
        let dir = if op == opcode::READ {
            Dir::ToHost
        } else {
            Dir::FromHost
        };
        if let Err(s) = self.data_pointer(cmd, len, dir) {
            return s;
        }
        let stats = &self.shared.stats;
        let mut data = self.ns[i].data();
        match op {
            opcode::READ => {
                copy_to_host(&self.segs, &data[range]);
                stats.bytes_read.fetch_add(len, Relaxed);
                stats.host_reads.fetch_add(1, Relaxed);
            }
            opcode::WRITE => {
                copy_from_host(&self.segs, &mut data[range]);
                stats.bytes_written.fetch_add(len, Relaxed);
                stats.host_writes.fetch_add(1, Relaxed);
            }
            _ => {
                stats.host_reads.fetch_add(1, Relaxed);
                if !equals_host(&self.segs, &data[range], &mut self.buf) {
                    return Status::COMPARE_FAILURE;
                }
            }
        }
        Status::SUCCESS
    }

    /// Write Zeroes (§3.2.8): SLBA and NLB as for Write, no data transfer and no MDTS limit
    /// (WZSL = 0). Deallocate (DEAC) makes no difference: deallocated blocks read as zeroes.
    fn write_zeroes(&mut self, cmd: &Command) -> Status {
        let Some(i) = self.ns_index(cmd.nsid()) else {
            return Status::INVALID_NAMESPACE;
        };
        let (slba, nlb) = (cmd.cdw10_11(), (cmd.cdw(12) & 0xffff) as u64 + 1);
        let Some(range) = self.ns[i].range(slba, nlb) else {
            return Status::LBA_OUT_OF_RANGE;
        };
        self.ns[i].data()[range].fill(0);
        Status::SUCCESS
    }

    /// Dataset Management (§3.2.3): CDW10 NR (0's based ranges), CDW11 attributes; the data is
    /// NR + 1 16-byte ranges (context attributes, length in blocks, starting LBA). With AD
    /// (deallocate) the ranges are zeroed, after all were checked; without, nothing happens.
    fn dataset_management(&mut self, cmd: &Command) -> Status {
        let Some(i) = self.ns_index(cmd.nsid()) else {
            return Status::INVALID_NAMESPACE;
        };
        let n = (cmd.cdw(10) & 0xff) as usize + 1;
        if let Err(s) = self.data_pointer(cmd, 16 * n as u64, Dir::FromHost) {
            return s;
        }
        copy_from_host(&self.segs, &mut self.buf[..16 * n]);
        if cmd.cdw(11) & DSM_DEALLOCATE == 0 {
            return Status::SUCCESS;
        }
        let ns = &self.ns[i];
        let range = |r: &[u8]| {
            let nlb = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")) as u64;
            let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            ns.range(slba, nlb)
        };
        if self.buf[..16 * n].chunks(16).any(|r| range(r).is_none()) {
            return Status::LBA_OUT_OF_RANGE;
        }
        let mut data = ns.data();
        for r in self.buf[..16 * n].chunks(16) {
            data[range(r).expect("checked")].fill(0);
        }
        Status::SUCCESS
    }
}
