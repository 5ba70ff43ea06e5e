//! Zoned namespaces on a queue pair (Zoned Namespace Command Set 1.1 §3.3, §3.4): reports,
//! zone actions and appends. Reads and writes of a zoned namespace go through the ordinary
//! paths (a write must start at its zone's write pointer; the controller says so otherwise).

use super::slot::Op;
use super::xfer::{self, NsInfo};
use super::{QueuePair, Rejected};
use crate::buffer::IoBuffer;
use crate::cmd::{rw_words, Command, Rw};
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
        self.sync_view();
        if let Err(error) = self.zoned_ns(nsid, slba) {
            return Err(Rejected { error, buf });
        }
        let len = buf.len();
        if len < 64 || !len.is_multiple_of(4) || len > self.max_xfer {
            let error = NvmeError::InvalidOption(format!(
                "a zone report buffer of {len} bytes: it must be a multiple of 4 from 64 to {} bytes",
                self.max_xfer
            ));
            return Err(Rejected { error, buf });
        }
        let Some(&slot) = self.free_cids.last() else {
            return Err(Rejected {
                error: self.full(),
                buf,
            });
        };
        let sgl = self.use_sgl;
        let dp = match xfer::data_ptr(&buf, 0, len, sgl, &mut self.lists(slot)) {
            Ok(dp) => dp,
            Err(error) => return Err(Rejected { error, buf }),
        };
        let mut cmd = Command::new(op::ZONE_MGMT_RECV, nsid);
        crate::cmd::set_data_ptr(&mut cmd, dp);
        cmd.dw[10] = slba as u32;
        cmd.dw[11] = (slba >> 32) as u32;
        // NUMD, 0's based: the controller moves at most `len` bytes.
        cmd.dw[12] = (len / 4 - 1) as u32;
        // ZRA 00h (Report Zones), the filter, Partial Report.
        cmd.dw[13] = (filter as u32) << 8 | (partial as u32) << 16;
        self.issue(slot, tag, Op::ZoneReport, Some(buf), None, |cid| {
            cmd.set_cid(cid);
            cmd.to_words()
        });
        Ok(())
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
        self.sync_view();
        let ns = match self.zone_start(nsid, zslba) {
            Ok(ns) => ns,
            Err(error) => return Err(Rejected { error, buf }),
        };
        let len = buf.len();
        let Some(blocks) = ns.blocks_of(len).filter(|_| ns.meta_bytes == 0) else {
            return Err(Rejected {
                error: self.refusal(&ns, len, None),
                buf,
            });
        };
        if len > ns.append_max || blocks > ns.zone_size || blocks > 65536 {
            let error = NvmeError::TooLarge {
                len,
                mdts: ns.append_max.min(ns.zone_size as usize * ns.block_bytes),
            };
            return Err(Rejected { error, buf });
        }
        let Some(&slot) = self.free_cids.last() else {
            return Err(Rejected {
                error: self.full(),
                buf,
            });
        };
        let sgl = self.use_sgl;
        let p = match xfer::describe(
            ns.block_bytes,
            0,
            blocks,
            &buf,
            0,
            None,
            sgl,
            &mut self.lists(slot),
        ) {
            Ok(p) => p,
            Err(error) => return Err(Rejected { error, buf }),
        };
        self.issue(slot, tag, Op::ZoneAppend, Some(buf), None, |cid| {
            rw_words(Rw {
                op: op::ZONE_APPEND,
                nsid,
                cid,
                slba: zslba,
                blocks: blocks as u32,
                dw12_flags: ns.prinfo,
                // Type 1 PI: the reference tag of an append is checked against the zone's
                // first LBA (ZNS 1.1 §3.4.1; the controller remaps it to the written LBA).
                ref_tag: if ns.ref_tag { zslba as u32 } else { 0 },
                dp: p.data,
                mptr: p.mptr,
            })
        });
        Ok(())
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
