//! Zoned namespaces on a queue pair (Zoned Namespace Command Set 1.1 §3.3, §3.4): reports,
//! zone actions and appends. Reads and writes of a zoned namespace go through the ordinary
//! paths (a write must start at its zone's write pointer; the controller says so otherwise).

use super::slot::Op;
use super::xfer::{self, NsInfo};
use super::{QueuePair, Rejected};
use crate::buffer::IoBuffer;
use crate::cmd::{Command, Rw};
use crate::error::{NvmeError, Result};
use crate::zns::{op, ZoneAction, ZoneFilter};

impl<B: IoBuffer> QueuePair<B> {
    /// Report Zones (Zone Management Receive): fills `buf` with the zone report from the zone
    /// containing `slba`, as [`crate::zns::parse_report`] reads it: a 64-byte header and one
    /// descriptor per zone, as many as fit. `partial` makes the header count only the zones
    /// reported. `buf` is a whole number of dwords, at most the maximum transfer.
    pub fn report_zones(
        &mut self,
        nsid: u32,
        slba: u64,
        filter: ZoneFilter,
        partial: bool,
        buf: B,
        tag: u64,
    ) -> Result<(), Rejected<B>> {
        match self.report_zones_cmd(nsid, slba, filter, partial, &buf) {
            Ok((slot, mut cmd)) => {
                self.issue(slot, tag, Op::ZoneReport, Some(buf), None, |cid| {
                    cmd.set_cid(cid);
                    cmd.to_words()
                });
                Ok(())
            }
            Err(error) => Err(Rejected { error, buf }),
        }
    }

    /// The checks of `report_zones` and its command, for the free slot it returns.
    fn report_zones_cmd(
        &mut self,
        nsid: u32,
        slba: u64,
        filter: ZoneFilter,
        partial: bool,
        buf: &B,
    ) -> Result<(u16, Command)> {
        self.sync_view();
        self.zoned_ns(nsid, slba)?;
        let len = buf.len();
        if len < 64 || !len.is_multiple_of(4) || len > self.max_xfer {
            return Err(NvmeError::InvalidOption(format!(
                "a zone report buffer of {len} bytes: it must be a multiple of 4 from 64 to {} bytes",
                self.max_xfer
            )));
        }
        let slot = self.free_slot()?;
        let sgl = self.use_sgl;
        let dp = xfer::data_ptr(buf, 0, len, sgl, &mut self.lists(slot))?;
        let mut cmd = Command::new(op::ZONE_MGMT_RECV, nsid);
        crate::cmd::set_data_ptr(&mut cmd, dp);
        cmd.dw[10] = slba as u32;
        cmd.dw[11] = (slba >> 32) as u32;
        // NUMD, 0's based: the controller moves at most `len` bytes.
        cmd.dw[12] = (len / 4 - 1) as u32;
        // ZRA 00h (Report Zones), the filter, Partial Report.
        cmd.dw[13] = (filter as u32) << 8 | (partial as u32) << 16;
        Ok((slot, cmd))
    }

    /// Zone Management Send: `action` on the zone starting at `zslba`, or, with `all`, on every
    /// zone it applies to (Select All; `zslba` is then ignored).
    pub fn zone_action(
        &mut self,
        nsid: u32,
        zslba: u64,
        action: ZoneAction,
        all: bool,
        tag: u64,
    ) -> Result<()> {
        self.sync_view();
        if !all {
            self.zone_start(nsid, zslba)?;
        } else {
            self.zoned_ns(nsid, 0)?;
        }
        let mut cmd = Command::new(op::ZONE_MGMT_SEND, nsid);
        if !all {
            cmd.dw[10] = zslba as u32;
            cmd.dw[11] = (zslba >> 32) as u32;
        }
        cmd.dw[13] = action as u32 | (all as u32) << 8;
        self.submit_nodata(cmd, Op::Zone(action), tag)
    }

    /// Zone Append: writes `buf` at the write pointer of the zone starting at `zslba`; the
    /// completion's result is the LBA the data landed at. One command: `buf` holds at most the
    /// Zone Append Size Limit (ZASL) and never crosses into the next zone.
    pub fn zone_append(&mut self, nsid: u32, zslba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        match self.zone_append_entry(nsid, zslba, &buf) {
            Ok((slot, rw)) => {
                self.issue(slot, tag, Op::ZoneAppend, Some(buf), None, |cid| {
                    Rw { cid, ..rw }.words()
                });
                Ok(())
            }
            Err(error) => Err(Rejected { error, buf }),
        }
    }

    /// The checks of `zone_append` and its entry, for the free slot it returns.
    fn zone_append_entry(&mut self, nsid: u32, zslba: u64, buf: &B) -> Result<(u16, Rw)> {
        self.sync_view();
        let ns = self.zone_start(nsid, zslba)?;
        let len = buf.len();
        let Some(blocks) = ns.blocks_of(len).filter(|_| ns.meta_bytes == 0) else {
            return Err(self.refusal(&ns, len, None));
        };
        if len > ns.append_max || blocks > ns.zone_size || blocks > 65536 {
            return Err(NvmeError::TooLarge {
                len,
                mdts: ns.append_max.min(ns.zone_size as usize * ns.block_bytes),
            });
        }
        let slot = self.free_slot()?;
        let sgl = self.use_sgl;
        let p = xfer::describe(
            ns.block_bytes,
            0,
            blocks,
            buf,
            0,
            None,
            sgl,
            &mut self.lists(slot),
        )?;
        // At the zone's first LBA, which is also the reference tag an append is checked
        // against (type 1 PI).
        let rw = super::submit::rw_entry(&ns, Op::ZoneAppend, zslba, blocks, p.data, p.mptr);
        Ok((slot, rw))
    }

    /// A zoned namespace this queue pair may use, with `slba` inside it.
    fn zoned_ns(&self, nsid: u32, slba: u64) -> Result<NsInfo> {
        self.check_usable()?;
        let ns = self.usable_ns(nsid)?;
        if ns.zone_size == 0 {
            return Err(NvmeError::InvalidOption(format!(
                "namespace {nsid} is not zoned: zone commands need a zoned namespace (`vfpoll identify` shows each namespace's command set)"
            )));
        }
        if slba >= ns.blocks {
            return Err(NvmeError::LbaOutOfRange {
                nsid,
                slba,
                end: slba + 1,
                blocks: ns.blocks,
                lba_size: ns.data_size,
            });
        }
        Ok(ns)
    }

    /// `zoned_ns`, with `zslba` the start of a zone.
    fn zone_start(&self, nsid: u32, zslba: u64) -> Result<NsInfo> {
        let ns = self.zoned_ns(nsid, zslba)?;
        if !zslba.is_multiple_of(ns.zone_size) {
            return Err(NvmeError::InvalidOption(format!(
                "LBA {zslba} is not the start of a zone of namespace {nsid} (zones are {} blocks; that zone starts at {})",
                ns.zone_size,
                zslba / ns.zone_size * ns.zone_size
            )));
        }
        Ok(ns)
    }
}
