//! `vfpoll hello`: the smallest end-to-end check of a controller: write a block, read it back,
//! compare, and put the original content back. Every namespace format is handled: metadata at
//! the end of each block travels in the same buffer, metadata in a separate buffer in its own,
//! protection information is generated and checked by the controller (PRACT). On a zoned
//! namespace the blocks are appended to a zone with room (zones cannot be rewritten, so nothing
//! is restored; the blocks were unwritten before).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvme::format::{Access, PiMode};
use vfpoll_nvme::zns::{self, ZoneFilter};
use vfpoll_nvme::{Done, Namespace, QpairOptions, QueuePair};

use crate::ctx::Ctx;
use crate::nvme_open::DeviceArgs;

/// Arguments of `vfpoll hello`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Namespace.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// First block to use (default: the namespace's last 4 KiB; on a zoned namespace, the
    /// write pointer of the first zone with room). Its content is read first and written back
    /// afterwards, so no data is lost unless the program is killed in between.
    #[arg(long)]
    lba: Option<u64>,
}

fn run_one(qp: &mut QueuePair<DmaBuf>, what: &str) -> anyhow::Result<Done<DmaBuf>> {
    let start = Instant::now();
    let mut done = None;
    while done.is_none() {
        qp.poll(1, |d| done = Some(d));
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{what}: no completion within 30 s");
        }
    }
    Ok(done.expect("set"))
}

/// The buffers of one transfer: data, and metadata for a separate-metadata format.
struct Io {
    data: DmaBuf,
    meta: Option<DmaBuf>,
}

struct Bufs {
    pool: DmaPool,
    data_len: usize,
    meta_len: usize,
}

impl Bufs {
    fn take(&mut self) -> Io {
        let mut take = |len: usize| {
            let mut b = self.pool.alloc().expect("sized for every buffer");
            b.truncate(len);
            b
        };
        let data = take(self.data_len);
        let meta = (self.meta_len != 0).then(|| take(self.meta_len));
        Io { data, meta }
    }

    /// Buffers to read into, poisoned first: a transfer that does not happen cannot pass for
    /// one through the stale bytes of an earlier write.
    fn take_for_read(&mut self) -> anyhow::Result<Io> {
        let io = self.take();
        self.pool.write(&io.data, 0, &vec![0xee; self.data_len])?;
        if let Some(m) = &io.meta {
            self.pool.write(m, 0, &vec![0xee; self.meta_len])?;
        }
        Ok(io)
    }

    fn give(&mut self, d: Done<DmaBuf>) {
        self.pool.free(d.buf.expect("data buffer back"));
        if let Some(m) = d.meta {
            self.pool.free(m);
        }
    }

    /// Copies the data and metadata out of a completed transfer and frees its buffers.
    fn contents(&mut self, d: Done<DmaBuf>) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
        let mut data = vec![0u8; self.data_len];
        let mut meta = vec![0u8; self.meta_len];
        self.pool
            .read(d.buf.as_ref().expect("data buffer back"), 0, &mut data)?;
        if let Some(m) = &d.meta {
            self.pool.read(m, 0, &mut meta)?;
        }
        self.give(d);
        Ok((data, meta))
    }
}

fn submit(
    qp: &mut QueuePair<DmaBuf>,
    write: bool,
    nsid: u32,
    lba: u64,
    io: Io,
    tag: u64,
) -> anyhow::Result<()> {
    let r = match (write, io.meta) {
        (false, None) => qp.read(nsid, lba, io.data, tag).map_err(|r| r.error),
        (true, None) => qp.write(nsid, lba, io.data, tag).map_err(|r| r.error),
        (false, Some(m)) => qp
            .read_with_metadata(nsid, lba, io.data, m, tag)
            .map_err(|r| r.error),
        (true, Some(m)) => qp
            .write_with_metadata(nsid, lba, io.data, m, tag)
            .map_err(|r| r.error),
    };
    Ok(r?)
}

/// Runs `vfpoll hello`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let (ctrl, dma, _container) = a.dev.open()?;
    let ns = ctrl.namespace(a.nsid)?;
    let format = ns
        .format
        .map_err(|e| anyhow::anyhow!("namespace {}: its format is unusable: {e}", a.nsid))?;
    let access = Access::new(&format, PiMode::Controller)
        .map_err(|why| anyhow::anyhow!("namespace {} ({format}) cannot be used for I/O: {why}", a.nsid))?;
    let blocks = (4096 / ns.lba_size).max(1) as u64;
    let (data_len, meta_len) = access.transfer(blocks);
    let (data_len, meta_len) = (data_len as usize, meta_len as usize);
    let pool = dma
        .pool(data_len.next_power_of_two().max(512), 8, a.dev.page_size)
        .with_context(|| format!("DMA buffers of {data_len} bytes"))?;
    let mut bufs = Bufs {
        pool,
        data_len,
        meta_len,
    };
    let mut qp = ctrl.create_qpair::<DmaBuf>(&QpairOptions::default())?;
    let text = format!(
        "hello from vfpoll: {} namespace {}, written at unix time {}\n",
        a.dev.device,
        a.nsid,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let pattern: Vec<u8> = text.bytes().cycle().take(data_len).collect();
    let meta_pattern: Vec<u8> = (0..meta_len).map(|i| (i * 7 + 1) as u8).collect();
    // The metadata bytes the controller owns (protection information under PRACT) are not
    // compared: they come back as the controller generated them.
    let ms = format.metadata_size;
    let pi_at = format
        .protection
        .map(|p| if p.first { 0 } else { ms - p.format.size() });
    let pi_len = format.protection.map_or(0, |p| p.format.size());
    let own = |i: usize| pi_at.is_none_or(|at| !(at..at + pi_len).contains(&(i % ms.max(1))));
    // In an extended block the metadata follows the data: the same rule for its bytes.
    let ds = format.data_size;
    let own_data = |i: usize| {
        let o = i % access.block_bytes;
        o < ds || own(o - ds)
    };
    let fill = |bufs: &mut Bufs| -> anyhow::Result<Io> {
        let io = bufs.take();
        bufs.pool.write(&io.data, 0, &pattern)?;
        if let Some(m) = &io.meta {
            bufs.pool.write(m, 0, &meta_pattern)?;
        }
        Ok(io)
    };

    let (lba, restore, t_write, t_read, got) = if let Some(z) = ns.zoned {
        let zslba = zone_with_room(&mut qp, &mut bufs, &ns, z, blocks)?;
        let t = Instant::now();
        let io = fill(&mut bufs)?;
        qp.zone_append(a.nsid, zslba, io.data, 1).map_err(|r| r.error)?;
        let d = run_one(&mut qp, "appending")?;
        let t_write = t.elapsed();
        let lba = *d.result.as_ref().map_err(|e| anyhow::anyhow!("appending: {e}"))?;
        bufs.give(d);
        let t = Instant::now();
        submit(&mut qp, false, a.nsid, lba, bufs.take_for_read()?, 2)?;
        let d = run_one(&mut qp, "reading back")?;
        d.result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("reading back: {e}"))?;
        let t_read = t.elapsed();
        (lba, None, t_write, t_read, bufs.contents(d)?)
    } else {
        let lba = a.lba.unwrap_or(ns.blocks.saturating_sub(blocks));
        // The original blocks are read without PI checks: blocks never written with protection
        // information hold none that is valid, and must still be saved and put back (with
        // valid PI then). The message is read back with the checks.
        let mut saver = match format.protection {
            Some(_) => Some(ctrl.create_qpair::<DmaBuf>(&QpairOptions {
                protection: PiMode::ControllerUnchecked,
                ..Default::default()
            })?),
            None => None,
        };
        let sq = saver.as_mut().unwrap_or(&mut qp);
        submit(sq, false, a.nsid, lba, bufs.take_for_read()?, 0)?;
        let d = run_one(sq, "reading the original blocks")?;
        drop(saver);
        d.result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("reading the original blocks: {e}"))?;
        let saved = bufs.contents(d)?;
        let t = Instant::now();
        submit(&mut qp, true, a.nsid, lba, fill(&mut bufs)?, 1)?;
        let d = run_one(&mut qp, "writing")?;
        let t_write = t.elapsed();
        d.result.as_ref().map_err(|e| anyhow::anyhow!("writing: {e}"))?;
        bufs.give(d);
        let t = Instant::now();
        submit(&mut qp, false, a.nsid, lba, bufs.take_for_read()?, 2)?;
        let d = run_one(&mut qp, "reading back")?;
        let t_read = t.elapsed();
        d.result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("reading back: {e}"))?;
        (lba, Some(saved), t_write, t_read, bufs.contents(d)?)
    };
    let bad_data = (0..data_len).find(|&i| own_data(i) && got.0[i] != pattern[i]);
    let bad_meta = (0..meta_len).find(|&i| own(i) && got.1[i] != meta_pattern[i]);
    if let Some((data, meta)) = restore {
        let io = bufs.take();
        bufs.pool.write(&io.data, 0, &data)?;
        if let Some(m) = &io.meta {
            bufs.pool.write(m, 0, &meta)?;
        }
        submit(&mut qp, true, a.nsid, lba, io, 3)?;
        let d = run_one(&mut qp, "restoring the original blocks")?;
        d.result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("restoring the original blocks: {e}"))?;
        bufs.give(d);
    }
    let same = bad_data.is_none() && bad_meta.is_none();
    let what = match (meta_len, format.metadata_size) {
        (0, 0) => format!("{data_len} B"),
        (0, _) if data_len as u64 == blocks * ns.lba_size as u64 => {
            format!("{data_len} B (PI by the controller)")
        }
        (0, _) => format!("{data_len} B of data and metadata"),
        (m, _) => format!("{data_len} B + {m} B of metadata"),
    };
    println!(
        "{} ({} {}): namespace {} ({format}) LBA {lba}..{}: wrote {what} in {t_write:?}, read back in {t_read:?}: {}",
        a.dev.device,
        ctrl.identify().model,
        ctrl.identify().serial,
        a.nsid,
        lba + blocks,
        if same { "data matches" } else { "DATA DIFFERS" }
    );
    if ns.zoned.is_some() {
        println!("  (zoned: appended to unwritten blocks, which keep it; zones are not rewritten)");
    }
    if same {
        println!("  {}", text.trim_end());
        Ok(ExitCode::SUCCESS)
    } else {
        if let Some(i) = bad_data {
            eprintln!(
                "vfpoll: error: data byte {i} reads {:#04x}, wrote {:#04x}",
                got.0[i], pattern[i]
            );
        }
        if let Some(i) = bad_meta {
            eprintln!(
                "vfpoll: error: metadata byte {i} reads {:#04x}, wrote {:#04x}",
                got.1[i], meta_pattern[i]
            );
        }
        Ok(ExitCode::FAILURE)
    }
}

/// The start of the first zone whose write pointer has room for `blocks`.
fn zone_with_room(
    qp: &mut QueuePair<DmaBuf>,
    bufs: &mut Bufs,
    ns: &Namespace,
    z: zns::ZonedInfo,
    blocks: u64,
) -> anyhow::Result<u64> {
    let mut slba = 0;
    while slba < ns.blocks {
        let mut b = bufs.pool.alloc().expect("a free buffer");
        let len = b.len().min(64 * 65);
        b.truncate(len);
        qp.report_zones(ns.nsid, slba, ZoneFilter::All, true, b, 0)
            .map_err(|r| r.error)?;
        let d = run_one(qp, "reporting zones")?;
        d.result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("reporting zones: {e}"))?;
        let b = d.buf.expect("buffer back");
        let mut page = vec![0u8; len];
        bufs.pool.read(&b, 0, &mut page)?;
        bufs.pool.free(b);
        let (_, zones) = zns::parse_report(&page, z.identify.zone_ext_size);
        if let Some(found) = zones.iter().find(|zone| zone.remaining() >= blocks) {
            return Ok(found.start);
        }
        match zones.last() {
            Some(last) => slba = last.start + z.identify.zone_size,
            None => break,
        }
    }
    bail!(
        "namespace {}: no zone has room for {blocks} blocks at its write pointer; reset a zone first (QueuePair::zone_action with ZoneAction::Reset)",
        ns.nsid
    )
}
