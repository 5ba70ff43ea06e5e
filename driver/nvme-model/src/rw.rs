//! Read (NVM Command Set 1.0 §3.2.4), Write (§3.2.6), Compare (§3.2.1) and Zone Append (ZNS 1.1
//! §4.4.1): block data and metadata between the namespace and the host, with protection
//! information.
//!
//! What crosses the bus, for NLB blocks of LBA data size DS and metadata size MS:
//! - no metadata: NLB × DS through the data pointer;
//! - extended LBAs (FLBAS MSET = 1): NLB × (DS + MS) through the data pointer, each block's
//!   metadata after its data; MDTS counts all of it;
//! - separate metadata: NLB × DS through the data pointer and NLB × MS through the metadata
//!   pointer (MPTR); MDTS counts the data only;
//! - protection information with PRACT = 1 and MS = 8: the metadata is the tuple alone, which
//!   the controller inserts (writes) or checks and strips (reads): no metadata crosses the bus.
//!   With MS > 8 the metadata crosses and the controller fills in or checks the tuple part.
//!
//! Checks, in order (QEMU 7.2's `nvme_read`, `nvme_do_write`, `nvme_compare`): PRACT on a
//! Compare of a namespace with protection information, MDTS, LBA range, zone rules (Zone
//! Append: its SLBA a zone start, ZASL, PIREMAP), data pointer, metadata pointer, the Type 1
//! ILBRT, then the protection information of each block. A command that fails changes nothing.

use std::sync::atomic::Ordering::Relaxed;

use crate::ctrl::{Controller, Outcome};
use crate::dptr::{copy_from_host, copy_to_host, equals_host, Cursor, Dir};
use crate::ns::{Geometry, NsState};
use crate::nsconfig::{PiType, Protection};
use crate::pi::{self, PiArgs, PiTuple};
use crate::queue::Command;
use crate::Status;
use vfpoll_nvme_spec::cmd::io_op as opcode;

/// One command's transfer, resolved against the namespace's format.
#[derive(Debug, Clone, Copy)]
struct Xfer {
    geo: Geometry,
    slba: u64,
    nlb: u64,
    /// Protection information and what the command asks of it (`None` for a namespace without).
    pi: Option<(Protection, PiArgs)>,
    /// Whether metadata crosses the bus (it has some, and PRACT does not consume it).
    meta_moves: bool,
}

impl Xfer {
    fn ds(&self) -> usize {
        self.geo.lba_size()
    }

    fn ms(&self) -> usize {
        self.geo.ms
    }

    /// Metadata interleaved with data in the data buffer.
    fn interleaved(&self) -> bool {
        self.geo.extended() && self.meta_moves
    }

    /// Bytes described by the data pointer and by the metadata pointer.
    fn lengths(&self) -> (u64, u64) {
        let data = self.nlb << self.geo.lba_shift;
        let meta = if self.meta_moves {
            self.nlb * self.ms() as u64
        } else {
            0
        };
        match self.geo.extended() {
            true => (data + meta, 0),
            false => (data, meta),
        }
    }
}

impl Controller {
    /// Read, Write, Compare, or Zone Append on namespace `i`.
    pub(crate) fn read_write(&mut self, cmd: &Command, i: usize) -> Outcome {
        let ns = self.ns[i].clone();
        let mut st = ns.lock();
        match self.transfer(cmd, &mut st) {
            Ok(result) => Outcome::Done(Status::SUCCESS, result),
            Err(s) => s.into(),
        }
    }

    /// The command on the locked namespace; returns the completion's dwords 0-1 (Zone Append:
    /// the LBA written).
    fn transfer(&mut self, cmd: &Command, st: &mut NsState) -> Result<u64, Status> {
        let op = cmd.opcode();
        let append = op == opcode::ZONE_APPEND;
        let (slba, nlb) = (cmd.slba(), cmd.blocks() as u64);
        let geo = st.geo;
        let args = PiArgs::of(cmd);
        let prot = geo.protection();
        if op == opcode::COMPARE && prot.is_some() && args.pract {
            return Err(Status::INVALID_PROTECTION_INFO);
        }
        let strip = prot.is_some() && args.pract && geo.ms == PiTuple::LEN;
        let mut x = Xfer {
            geo,
            slba,
            nlb,
            pi: prot.map(|p| (p, args)),
            meta_moves: geo.ms > 0 && !strip,
        };
        let (len, mlen) = x.lengths();
        if self.cfg.max_transfer().is_some_and(|m| len > m) {
            return Err(Status::INVALID_FIELD);
        }
        if !st.contains(slba, nlb) {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        let mut zone = None;
        if let Some(z) = st.zones.as_ref() {
            if op == opcode::READ || op == opcode::COMPARE {
                z.check_read(slba, nlb)?;
            } else {
                if append {
                    let start = z.start(z.index(slba));
                    if slba != start {
                        return Err(Status::INVALID_FIELD);
                    }
                    if self.cfg.max_append().is_some_and(|m| nlb << geo.lba_shift > m) {
                        return Err(Status::INVALID_FIELD);
                    }
                    x.slba = z.write_pointer(z.index(slba));
                    if let Some((p, a)) = x.pi.as_mut() {
                        remap(*p, a, x.slba - start)?;
                    }
                }
                zone = Some(z.check_write(x.slba, nlb)?);
            }
        }
        let dir = if op == opcode::READ {
            Dir::ToHost
        } else {
            Dir::FromHost
        };
        self.data_pointer(cmd, len, dir)?;
        self.metadata_pointer(cmd, mlen, dir)?;
        let data_bytes = nlb << geo.lba_shift;
        match op {
            opcode::READ => {
                self.read_blocks(&x, st)?;
                let stats = &self.shared.stats;
                stats.bytes_read.fetch_add(data_bytes, Relaxed);
                stats.host_reads.fetch_add(1, Relaxed);
            }
            opcode::COMPARE => {
                // A Compare counts as a read, whatever it finds.
                self.shared.stats.host_reads.fetch_add(1, Relaxed);
                self.compare_blocks(&x, st)?;
            }
            _ => {
                self.write_blocks(&x, st)?;
                let stats = &self.shared.stats;
                stats.bytes_written.fetch_add(data_bytes, Relaxed);
                stats.host_writes.fetch_add(1, Relaxed);
            }
        }
        if let (Some(z), Some(zones)) = (zone, st.zones.as_mut()) {
            zones.commit_write(z, nlb);
        }
        Ok(if append { x.slba } else { 0 })
    }

    /// Checks stored protection information as PRCHK asks (Read, Compare).
    fn check_stored(x: &Xfer, st: &NsState) -> Result<(), Status> {
        let Some((p, args)) = x.pi else {
            return Ok(());
        };
        args.check_ilbrt(p, x.slba)?;
        if !args.checks() {
            return Ok(());
        }
        let data = &st.data()[st.data_range(x.slba, x.nlb)];
        let meta = &st.meta()[st.meta_range(x.slba, x.nlb)];
        let blocks = data.chunks(x.ds()).zip(meta.chunks(x.ms()));
        blocks
            .enumerate()
            .try_for_each(|(b, (d, m))| pi::check(p, &args, b, d, m))
    }

    fn read_blocks(&mut self, x: &Xfer, st: &NsState) -> Result<(), Status> {
        Self::check_stored(x, st)?;
        let data = &st.data()[st.data_range(x.slba, x.nlb)];
        if !x.interleaved() {
            copy_to_host(&self.segs, data);
            if x.meta_moves {
                copy_to_host(&self.msegs, &st.meta()[st.meta_range(x.slba, x.nlb)]);
            }
            return Ok(());
        }
        let meta = &st.meta()[st.meta_range(x.slba, x.nlb)];
        let mut host = Cursor::new(&self.segs);
        for (d, m) in data.chunks(x.ds()).zip(meta.chunks(x.ms())) {
            host.store(d);
            host.store(m);
        }
        Ok(())
    }

    fn write_blocks(&mut self, x: &Xfer, st: &mut NsState) -> Result<(), Status> {
        let (ds, ms) = (x.ds(), x.ms());
        if let Some((p, args)) = x.pi {
            args.check_ilbrt(p, x.slba)?;
            if !args.pract && args.checks() {
                // Check the host's tuples before anything is stored.
                let (mut data, mut meta) = (Cursor::new(&self.segs), Cursor::new(&self.msegs));
                for b in 0..x.nlb as usize {
                    let (d, m) = self.block[..ds + ms].split_at_mut(ds);
                    data.load(d);
                    match x.interleaved() {
                        true => data.load(m),
                        false => meta.load(m),
                    }
                    pi::check(p, &args, b, d, m)?;
                }
            }
        }
        let (d, m) = (st.data_range(x.slba, x.nlb), st.meta_range(x.slba, x.nlb));
        let (data, meta) = st.storage_mut();
        let (data, meta) = (&mut data[d], &mut meta[m]);
        if x.interleaved() {
            let mut host = Cursor::new(&self.segs);
            for (d, m) in data.chunks_mut(ds).zip(meta.chunks_mut(ms)) {
                host.load(d);
                host.load(m);
            }
        } else {
            copy_from_host(&self.segs, data);
            if x.meta_moves {
                copy_from_host(&self.msegs, meta);
            }
        }
        if let Some((p, args)) = x.pi.filter(|(_, a)| a.pract) {
            for (b, (d, m)) in data.chunks(ds).zip(meta.chunks_mut(ms)).enumerate() {
                pi::insert(p, &args, b, d, m);
            }
        }
        Ok(())
    }

    /// Compares the host's blocks with the stored ones: data, and metadata except the
    /// protection information tuple (which PRCHK checks instead).
    fn compare_blocks(&mut self, x: &Xfer, st: &NsState) -> Result<(), Status> {
        Self::check_stored(x, st)?;
        let data = &st.data()[st.data_range(x.slba, x.nlb)];
        if x.ms() == 0 {
            return match equals_host(&self.segs, data, &mut self.buf) {
                true => Ok(()),
                false => Err(Status::COMPARE_FAILURE),
            };
        }
        let (ds, ms) = (x.ds(), x.ms());
        let meta = &st.meta()[st.meta_range(x.slba, x.nlb)];
        let tuple = x.pi.map(|(p, _)| pi::tuple_offset(p, ms));
        let (mut hdata, mut hmeta) = (Cursor::new(&self.segs), Cursor::new(&self.msegs));
        for (d, m) in data.chunks(ds).zip(meta.chunks(ms)) {
            let (hd, hm) = self.block[..ds + ms].split_at_mut(ds);
            hdata.load(hd);
            match x.interleaved() {
                true => hdata.load(hm),
                false => hmeta.load(hm),
            }
            let same_meta = match tuple {
                Some(t) => hm[..t] == m[..t] && hm[t + PiTuple::LEN..] == m[t + PiTuple::LEN..],
                None => hm == m,
            };
            if hd != d || !same_meta {
                return Err(Status::COMPARE_FAILURE);
            }
        }
        Ok(())
    }
}

/// Zone Append's protection information (ZNS 1.1 §4.4.1, QEMU 7.2's `nvme_do_write`): Type 1
/// needs PIREMAP; with PIREMAP, Type 1 and 2 reference tags are moved by the offset of the
/// write pointer in the zone; Type 3 refuses PIREMAP.
fn remap(p: Protection, args: &mut PiArgs, offset: u64) -> Result<(), Status> {
    match (p.pi_type, args.remap) {
        (PiType::Type1, false) | (PiType::Type3, true) => Err(Status::INVALID_PROTECTION_INFO),
        (PiType::Type1 | PiType::Type2, true) => {
            args.ilbrt = args.ilbrt.wrapping_add(offset as u32);
            Ok(())
        }
        _ => Ok(()),
    }
}
