//! I/O commands: dispatch by the namespace's command set, and the commands that move no block
//! data (NVM Command Set 1.0 §3; Zoned Namespace Command Set 1.1 §4). Read, Write, Compare and
//! Zone Append are in the `rw` module.

use crate::ctrl::{Controller, Outcome, CSS_ADMIN_ONLY, CSS_ALL_IOCS};
use crate::dptr::{self, copy_from_host, Cursor, Dir};
use crate::pi::{self, PiArgs};
use crate::queue::Command;
use crate::zns::{action, DESCRIPTOR, REPORT_HEADER};
use crate::Status;
use vfpoll_nvme_spec::cmd::io_op as opcode;

/// Dataset Management, CDW11 bit 2: Attribute – Deallocate.
const DSM_DEALLOCATE: u32 = 1 << 2;
/// Zone Management Send, CDW13: Select All (bit 8), Zone Random Write Area Allocation (bit 9).
const ZSF_SELECT_ALL: u32 = 1 << 8;
const ZSF_ZRWA_ALLOCATE: u32 = 1 << 9;
/// Zone Management Receive, CDW13: Zone Receive Action Report Zones (bits 7:0), Partial Report
/// (bit 16); the filter (ZRASF, bits 15:8) goes up to 7, offline zones.
const ZRA_REPORT_ZONES: u32 = 0x00;
const ZRM_PARTIAL: u32 = 1 << 16;
const ZRASF_MAX: u8 = 7;

/// The command set a namespace's I/O commands follow, given CC.CSS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommandSet {
    Nvm,
    Zoned,
}

impl Controller {
    /// Executes an I/O command.
    pub(crate) fn io(&mut self, cmd: &Command) -> Outcome {
        if cmd.fuse() != 0 {
            return Status::INVALID_FIELD.into();
        }
        // Flush comes first: it may name every namespace (QEMU 7.2's `nvme_io_cmd` too).
        if cmd.opcode() == opcode::FLUSH {
            return self.flush(cmd).into();
        }
        let Some(i) = self.ns_index(cmd.nsid()) else {
            return Status::INVALID_NAMESPACE.into();
        };
        let Some(set) = self.command_set(i) else {
            return Status::INVALID_OPCODE.into();
        };
        match (cmd.opcode(), set) {
            (opcode::WRITE | opcode::READ | opcode::COMPARE, _) => self.read_write(cmd, i),
            (opcode::ZONE_APPEND, CommandSet::Zoned) => self.read_write(cmd, i),
            (opcode::WRITE_ZEROES, _) => self.write_zeroes(cmd, i).into(),
            (opcode::DATASET_MANAGEMENT, _) => self.dataset_management(cmd, i).into(),
            (opcode::ZONE_MGMT_SEND, CommandSet::Zoned) => self.zone_send(cmd, i).into(),
            (opcode::ZONE_MGMT_RECV, CommandSet::Zoned) => self.zone_receive(cmd, i).into(),
            _ => Status::INVALID_OPCODE.into(),
        }
    }

    /// The command set of namespace `i` under CC.CSS (QEMU 7.2's `nvme_select_iocs_ns`): none
    /// with "admin only"; a zoned namespace follows the Zoned Namespace Command Set when all
    /// I/O command sets are enabled, and the NVM Command Set (reads and writes still keep to
    /// its zones, zone commands are Invalid Opcode) when only NVM is.
    fn command_set(&self, i: usize) -> Option<CommandSet> {
        match (self.css, self.ns[i].cfg.zoned.is_some()) {
            (CSS_ADMIN_ONLY, _) => None,
            (CSS_ALL_IOCS, true) => Some(CommandSet::Zoned),
            _ => Some(CommandSet::Nvm),
        }
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

    /// Fills `self.segs` from the command's data pointer for `len` bytes: PRPs (PSDT 00b), or
    /// SGL1 when SGLs are configured (PSDT 01b, and 10b where MPTR holds an SGL too).
    pub(crate) fn data_pointer(&mut self, cmd: &Command, len: u64, dir: Dir) -> Result<(), Status> {
        match cmd.psdt() {
            0 => dptr::prp(&self.mem, cmd.prp1(), cmd.prp2(), len, self.page, &mut self.segs),
            1 | 2 if self.cfg.sgl => dptr::sgl(&self.mem, &cmd.sgl1(), len, dir, &mut self.segs),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Fills `self.msegs` from the command's metadata pointer for `len` bytes (NVMe Base 2.0
    /// §4.1, Figure 92): with PSDT 00b, MPTR is the dword-aligned address of one contiguous
    /// buffer; with 01b, of one contiguous buffer at any byte; with 10b, of an SGL descriptor.
    /// An MPTR of 0 is the address 0, as the specification has it (QEMU skips the metadata of
    /// a namespace without protection information when MPTR is 0).
    pub(crate) fn metadata_pointer(&mut self, cmd: &Command, len: u64, dir: Dir) -> Result<(), Status> {
        self.msegs.clear();
        if len == 0 {
            return Ok(());
        }
        let mptr = cmd.mptr();
        let mapped = match cmd.psdt() {
            0 if mptr & 0x3 != 0 => return Err(Status::INVALID_FIELD),
            0 => self.mem.map(mptr, len as usize, &mut self.msegs),
            1 if self.cfg.sgl => self.mem.map(mptr, len as usize, &mut self.msegs),
            2 if self.cfg.sgl => return dptr::metadata_sgl(&self.mem, mptr, len, dir, &mut self.msegs),
            _ => return Err(Status::INVALID_FIELD),
        };
        mapped.map_err(|e| {
            log::debug!("metadata pointer: {e}");
            Status::DATA_TRANSFER_ERROR
        })
    }

    /// Write Zeroes (§3.2.8): SLBA and NLB as for Write, no data transfer and no MDTS limit
    /// (WZSL = 0). Data and metadata read back as zeroes. With protection information, PRCHK
    /// is Invalid Protection Information and PRACT inserts tuples (guard of the zeroes, LBAT,
    /// reference tags from ILBRT); without PRACT the tuples are all ones, as deallocated blocks'
    /// (QEMU 7.2's `nvme_dif_rw`). On a zoned namespace it is a write at the write pointer.
    fn write_zeroes(&mut self, cmd: &Command, i: usize) -> Status {
        let ns = self.ns[i].clone();
        let mut st = ns.lock();
        let (slba, nlb) = (cmd.slba(), cmd.blocks() as u64);
        if !st.contains(slba, nlb) {
            return Status::LBA_OUT_OF_RANGE;
        }
        let zone = match st.zones.as_ref().map(|z| z.check_write(slba, nlb)) {
            Some(Err(s)) => return s,
            Some(Ok(z)) => Some(z),
            None => None,
        };
        let args = PiArgs::of(cmd);
        let geo = st.geo;
        match geo.protection() {
            Some(_) if args.checks() => return Status::INVALID_PROTECTION_INFO,
            Some(p) if args.pract => {
                let (d, m) = (st.data_range(slba, nlb), st.meta_range(slba, nlb));
                let (data, meta) = st.storage_mut();
                let (data, meta) = (&mut data[d], &mut meta[m]);
                data.fill(0);
                meta.fill(0);
                let blocks = data.chunks(geo.lba_size()).zip(meta.chunks_mut(geo.ms));
                for (b, (d, m)) in blocks.enumerate() {
                    pi::insert(p, &args, b, d, m);
                }
            }
            _ => st.deallocate(slba, nlb),
        }
        if let (Some(z), Some(zones)) = (zone, st.zones.as_mut()) {
            zones.commit_write(z, nlb);
        }
        Status::SUCCESS
    }

    /// Dataset Management (§3.2.3): CDW10 NR (0's based ranges), CDW11 attributes; the data is
    /// NR + 1 16-byte ranges (context attributes, length in blocks, starting LBA). With AD
    /// (deallocate) the ranges are deallocated (data and metadata zeroes, PI tuples all ones),
    /// after all were checked; without, nothing happens. Zones are left as they are.
    fn dataset_management(&mut self, cmd: &Command, i: usize) -> Status {
        let n = (cmd.cdw(10) & 0xff) as usize + 1;
        if let Err(s) = self.data_pointer(cmd, 16 * n as u64, Dir::FromHost) {
            return s;
        }
        copy_from_host(&self.segs, &mut self.buf[..16 * n]);
        if cmd.cdw(11) & DSM_DEALLOCATE == 0 {
            return Status::SUCCESS;
        }
        let range = |r: &[u8]| {
            let nlb = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")) as u64;
            let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            (slba, nlb)
        };
        let ns = self.ns[i].clone();
        let mut st = ns.lock();
        let ranges = &self.buf[..16 * n];
        if ranges
            .chunks(16)
            .map(range)
            .any(|(slba, nlb)| !st.contains(slba, nlb))
        {
            return Status::LBA_OUT_OF_RANGE;
        }
        for (slba, nlb) in ranges.chunks(16).map(range) {
            st.deallocate(slba, nlb);
        }
        Status::SUCCESS
    }

    /// Zone Management Send (ZNS 1.1 §4.4): CDW10-11 SLBA (a zone's start, ignored with Select
    /// All), CDW13 the action (bits 7:0) and Select All (bit 8). Close, Finish, Open, Reset and
    /// Offline; zone descriptor extensions and zone random write areas are not offered (Invalid
    /// Field, Invalid Zone Operation Request).
    fn zone_send(&mut self, cmd: &Command, i: usize) -> Status {
        let ns = self.ns[i].clone();
        let mut st = ns.lock();
        let (slba, dw13) = (cmd.slba(), cmd.cdw(13));
        let act = dw13 as u8;
        let Some(mut zones) = st.zones.take() else {
            return Status::INVALID_OPCODE;
        };
        let target = match dw13 & ZSF_SELECT_ALL {
            0 if slba >= st.blocks => Err(Status::LBA_OUT_OF_RANGE),
            0 if slba != zones.start(zones.index(slba)) => Err(Status::INVALID_FIELD),
            0 => Ok(Some(zones.index(slba))),
            _ => Ok(None),
        };
        let done = match (target, act) {
            (Err(s), _) => Err(s),
            (_, action::OPEN) if dw13 & ZSF_ZRWA_ALLOCATE != 0 => Err(Status::INVALID_ZONE_OPERATION),
            (_, action::SET_ZDE) => Err(Status::INVALID_FIELD),
            (Ok(target), act) => zones.send(act, target, |lba, n| st.deallocate(lba, n)),
        };
        st.zones = Some(zones);
        done.err().unwrap_or(Status::SUCCESS)
    }

    /// Zone Management Receive, Report Zones (ZNS 1.1 §4.3): CDW10-11 SLBA (the zone holding it
    /// is the first reported), CDW12 NUMD (0's based dwords), CDW13 the action, filter and
    /// Partial Report. The data is the header and as many descriptors as fit, zero filled.
    fn zone_receive(&mut self, cmd: &Command, i: usize) -> Status {
        let ns = self.ns[i].clone();
        let st = ns.lock();
        let (slba, dw13) = (cmd.slba(), cmd.cdw(13));
        let len = (cmd.cdw(12) as u64 + 1) * 4;
        let filter = (dw13 >> 8) as u8;
        let Some(zones) = st.zones.as_ref() else {
            return Status::INVALID_OPCODE;
        };
        if slba >= st.blocks {
            return Status::LBA_OUT_OF_RANGE;
        }
        // Extended reports need descriptor extensions, which no zone has (ZDES 0).
        if dw13 & 0xff != ZRA_REPORT_ZONES || filter > ZRASF_MAX || len < REPORT_HEADER as u64 {
            return Status::INVALID_FIELD;
        }
        if self.cfg.max_transfer().is_some_and(|m| len > m) {
            return Status::INVALID_FIELD;
        }
        if let Err(s) = self.data_pointer(cmd, len, Dir::ToHost) {
            return s;
        }
        let built = len.min((REPORT_HEADER + DESCRIPTOR * zones.count()) as u64) as usize;
        let mut report = vec![0u8; built];
        zones.report(slba, filter, dw13 & ZRM_PARTIAL != 0, &mut report);
        let mut out = Cursor::new(&self.segs);
        out.store(&report);
        let zeroes = [0u8; 4096];
        let mut left = len as usize - built;
        while left > 0 {
            let n = left.min(zeroes.len());
            out.store(&zeroes[..n]);
            left -= n;
        }
        Status::SUCCESS
    }
}
