//! `vfpoll hello`: the smallest end-to-end check of a controller: write a block, read it back,
//! compare, and put the original content back.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use vfpoll_nvme::{QpairOptions, QueuePair, RegionBuf};

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
    /// First block to use (default: the namespace's last 4 KiB). Its content is read first and
    /// written back afterwards, so no data is lost unless the program is killed in between.
    #[arg(long)]
    lba: Option<u64>,
}

fn run_one(qp: &mut QueuePair<RegionBuf>, what: &str) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut result = None;
    while result.is_none() {
        qp.poll(1, |d| result = Some(d.result));
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{what}: no completion within 30 s");
        }
    }
    result.expect("set").with_context(|| what.to_string())?;
    Ok(start.elapsed())
}

/// Runs `vfpoll hello`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let (ctrl, dma, _container) = a.dev.open()?;
    let ns = ctrl.namespace(a.nsid)?.clone();
    let len = ns.lba_size.max(4096);
    let blocks = (len / ns.lba_size) as u64;
    let lba = a.lba.unwrap_or(ns.blocks - blocks);
    let mut qp = ctrl.create_qpair::<RegionBuf>(&QpairOptions::default())?;
    let saved = Arc::new(dma.alloc_region(len, a.dev.page_size)?);
    let mut msg = dma.alloc_region(len, a.dev.page_size)?;
    let text = format!(
        "hello from vfpoll: {} namespace {} LBA {lba}, written at unix time {}\n",
        a.dev.device,
        a.nsid,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let pattern: Vec<u8> = text.bytes().cycle().take(len).collect();
    msg.write(0, &pattern)?;
    let msg = Arc::new(msg);
    let back = Arc::new(dma.alloc_region(len, a.dev.page_size)?);
    let buf = |r: &Arc<vfpoll_dma::DmaRegion>| RegionBuf::new(r.clone(), 0, len).expect("in range");

    qp.read(a.nsid, lba, buf(&saved), 0).map_err(|r| r.error)?;
    let t_save = run_one(&mut qp, "reading the original blocks")?;
    qp.write(a.nsid, lba, buf(&msg), 1).map_err(|r| r.error)?;
    let t_write = run_one(&mut qp, "writing")?;
    qp.read(a.nsid, lba, buf(&back), 2).map_err(|r| r.error)?;
    let t_read = run_one(&mut qp, "reading back")?;
    let mut got = vec![0u8; len];
    back.read(0, &mut got)?;
    let same = got == pattern;
    qp.write(a.nsid, lba, buf(&saved), 3).map_err(|r| r.error)?;
    run_one(&mut qp, "restoring the original blocks")?;

    println!(
        "{} ({} {}): namespace {} LBA {lba}..{}: wrote {len} B in {t_write:?}, read back in {t_read:?} (first read {t_save:?}): {}",
        a.dev.device,
        ctrl.identify().model,
        ctrl.identify().serial,
        a.nsid,
        lba + blocks,
        if same { "data matches" } else { "DATA DIFFERS" }
    );
    if same {
        println!("  {}", text.trim_end());
        Ok(ExitCode::SUCCESS)
    } else {
        let first = (0..len).find(|&i| got[i] != pattern[i]).unwrap_or(0);
        eprintln!(
            "vfpoll: error: byte {first} reads {:#04x}, wrote {:#04x}",
            got[first], pattern[first]
        );
        Ok(ExitCode::FAILURE)
    }
}
