//! `vfpoll identify`: what the controller says about itself and its namespaces.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use serde_json::json;
use vfpoll_dma::{DmaBuf, DmaContext, PageSize};
use vfpoll_nvme::format::{PiFormat, PiType};
use vfpoll_nvme::identify::{oacs, oncs};
use vfpoll_nvme::zns::{self, ZoneFilter};
use vfpoll_nvme::{Controller, Namespace, QpairOptions};

use crate::ctx::Ctx;
use crate::nvme_open::DeviceArgs;
use vfpoll_pci::vfio::IommuMode;

/// Arguments of `vfpoll identify`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `vfpoll identify`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let (ctrl, dma, container) = a.dev.open()?;
    let mode = container.mode();
    let caps = zone_capacities(&ctrl, &dma, a.dev.page_size);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&a.dev, mode, &ctrl, &caps))?
        );
    } else {
        print!("{}", text(&a.dev, mode, &ctrl, &caps));
    }
    Ok(ExitCode::SUCCESS)
}

/// Zone 0's capacity (blocks) of each zoned namespace, or why it could not be read.
type Capacities = HashMap<u32, Result<u64, String>>;

/// Reads zone 0's descriptor of each zoned namespace (Report Zones, partial, through a queue
/// pair of its own): the zone size is the spacing of zones, the capacity the blocks a zone takes
/// in writes, which Identify does not give (ZNS 1.1 §3.4.1).
fn zone_capacities(c: &Controller, dma: &DmaContext, page: PageSize) -> Capacities {
    let zoned: Vec<(u32, usize)> = c
        .namespaces()
        .iter()
        .filter_map(|n| n.zoned.map(|z| (n.nsid, z.identify.zone_ext_size)))
        .collect();
    if zoned.is_empty() {
        return HashMap::new();
    }
    let setup = dma
        .pool(4096, 1, page)
        .map_err(|e| format!("no DMA buffer for a zone report: {e}"))
        .and_then(|pool| {
            let qp = c
                .create_qpair::<DmaBuf>(&QpairOptions::default())
                .map_err(|e| format!("no queue pair for a zone report: {e}"))?;
            Ok((pool, qp))
        });
    let (mut pool, mut qp) = match setup {
        Ok(s) => s,
        Err(e) => {
            return zoned
                .into_iter()
                .map(|(nsid, _)| (nsid, Err(e.clone())))
                .collect()
        }
    };
    let mut report = |nsid: u32, ext: usize| -> Result<u64, String> {
        let b = pool.alloc().ok_or("the report buffer is still in use")?;
        qp.report_zones(nsid, 0, ZoneFilter::All, true, b, 0)
            .map_err(|r| {
                let e = r.error.to_string();
                pool.free(r.buf);
                e
            })?;
        let start = Instant::now();
        let mut done = None;
        while done.is_none() {
            qp.poll(1, |d| done = Some(d));
            if done.is_none() && start.elapsed() > Duration::from_secs(10) {
                // The buffer stays with the queue pair (a late completion may still fill it).
                return Err("Report Zones did not complete within 10 s".into());
            }
        }
        let d = done.expect("set");
        let b = d.buf.expect("the report buffer comes back");
        let mut page = vec![0u8; b.len()];
        let read = pool.read(&b, 0, &mut page).map_err(|e| e.to_string());
        pool.free(b);
        d.result.map_err(|e| e.to_string())?;
        read?;
        let (_, zones) = zns::parse_report(&page, ext);
        zones
            .first()
            .map(|z| z.capacity)
            .ok_or_else(|| "the zone report lists no zone".to_string())
    };
    zoned
        .into_iter()
        .map(|(nsid, ext)| (nsid, report(nsid, ext)))
        .collect()
}

fn flags(v: u16, names: &[(u16, &str)]) -> String {
    let set: Vec<&str> = names
        .iter()
        .filter(|(b, _)| v & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        String::new()
    } else {
        format!(" ({})", set.join(", "))
    }
}

fn size(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn text(dev: &DeviceArgs, mode: IommuMode, c: &Controller, caps: &Capacities) -> String {
    let id = c.identify();
    let cap = c.cap();
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<10}: {v}\n"));
    line("device", format!("{} ({mode})", dev.device));
    line("vid", format!("{:#06x}", id.vid));
    line("ssvid", format!("{:#06x}", id.ssvid));
    line("sn", id.serial.clone());
    line("mn", id.model.clone());
    line("fr", id.firmware.clone());
    line("ver", c.version().to_string());
    line("cntlid", format!("{:#x}", id.cntlid));
    line("cmic", format!("{:#x}", id.cmic));
    line(
        "mdts",
        match c.mdts_bytes() {
            Some(b) => format!("{} ({})", id.mdts, size(b as u64)),
            None => "0 (no limit)".into(),
        },
    );
    line(
        "oacs",
        format!(
            "{:#x}{}",
            id.oacs,
            flags(
                id.oacs,
                &[
                    (oacs::FORMAT, "Format NVM"),
                    (oacs::NS_MGMT, "NS Management"),
                    (oacs::DBBUF, "Doorbell Buffer Config")
                ]
            )
        ),
    );
    line(
        "oncs",
        format!(
            "{:#x}{}",
            id.oncs,
            flags(
                id.oncs,
                &[
                    (oncs::COMPARE, "Compare"),
                    (oncs::DSM, "Dataset Management"),
                    (oncs::WRITE_ZEROES, "Write Zeroes")
                ]
            )
        ),
    );
    line(
        "sgls",
        format!(
            "{:#x}{}",
            id.sgls,
            if id.sgl_supported() {
                " (SGLs supported)"
            } else {
                ""
            }
        ),
    );
    line(
        "vwc",
        if id.has_volatile_write_cache() {
            "present".into()
        } else {
            "absent".into()
        },
    );
    line("sqes/cqes", format!("{:#x} / {:#x}", id.sqes, id.cqes));
    line("nn", id.nn.to_string());
    line("subnqn", id.subnqn.clone());
    line(
        "cap",
        format!(
            "mqes={} cqr={} to={}ms doorbell-stride={}B mps={}..{} cmbs={} pmrs={}",
            cap.max_queue_entries(),
            cap.contiguous_queues_required() as u8,
            cap.timeout_ms(),
            cap.doorbell_stride(),
            cap.mps_min(),
            cap.mps_max(),
            cap.cmb_supported() as u8,
            cap.pmr_supported() as u8
        ),
    );
    line("io queues", format!("{} granted", c.io_queues_granted()));
    line(
        "dbbuf",
        if c.shadow_doorbells() {
            "shadow doorbells in use".into()
        } else {
            "not in use".into()
        },
    );
    s.push_str("namespaces:\n");
    for n in c.namespaces().iter() {
        s.push_str(&format!(
            "  nsid {:<3} {:>12} blocks x {:>4} B = {:>10}  {}\n",
            n.nsid,
            n.blocks,
            n.lba_size,
            size(n.bytes()),
            describe_format(n)
        ));
        if let Some(z) = &n.zoned {
            let cap = caps.get(&n.nsid).cloned().unwrap_or(Err("not read".into()));
            s.push_str(&format!("            {}\n", describe_zones(z, n.lba_size, cap)));
        }
    }
    s
}

/// The namespace's command set and format, as one line: what I/O through vfpoll moves.
fn describe_format(n: &Namespace) -> String {
    let set = match n.command_set {
        zns::CSI_NVM => "",
        zns::CSI_ZONED => "zoned, ",
        other => &format!(
            "command set {other:#04x} ({}): not supported for I/O, ",
            command_set_name(other)
        ),
    };
    let format = match &n.format {
        Ok(f) => f.to_string().replacen(
            &format!("LBA format {}:", f.index),
            &format!("LBA format {} of {}:", f.index, f.count),
            1,
        ),
        Err(e) => format!("format unusable: {e}"),
    };
    format!("({set}{format})")
}

/// The name of I/O command set `csi` (NVMe Base 2.0 Figure 286, 2.1 for 03h/04h).
fn command_set_name(csi: u8) -> &'static str {
    match csi {
        zns::CSI_NVM => "NVM",
        0x01 => "Key Value",
        zns::CSI_ZONED => "Zoned Namespace",
        0x03 => "Subsystem Local Memory",
        0x04 => "Computational Programs",
        _ => "reserved or vendor specific",
    }
}

fn describe_zones(z: &zns::ZonedInfo, lba: usize, cap: Result<u64, String>) -> String {
    let limit = |v: Option<u32>| v.map_or("no limit".to_string(), |v| v.to_string());
    let capacity = match cap {
        Ok(b) => format!(
            "capacity {b} blocks ({}; zone 0's, {})",
            size(b * lba as u64),
            if z.identify.variable_capacity() {
                "may change on a zone reset (ZOC.VZCAP)"
            } else {
                "fixed"
            }
        ),
        Err(e) => format!("capacity unknown ({e})"),
    };
    format!(
        "zones of {} blocks ({}), {capacity}, max open {}, max active {}, zone append limit {}",
        z.identify.zone_size,
        size(z.identify.zone_size * lba as u64),
        limit(z.identify.max_open()),
        limit(z.identify.max_active()),
        z.zasl_bytes.map_or("MDTS".to_string(), |b| size(b as u64))
    )
}

fn format_json(n: &Namespace) -> serde_json::Value {
    match &n.format {
        Ok(f) => json!({
            "index": f.index,
            "count": f.count,
            "data_size": f.data_size,
            "metadata_size": f.metadata_size,
            "metadata": if f.metadata_size == 0 { "none" } else if f.extended { "extended" } else { "separate" },
            "protection": f.protection.map(|p| json!({
                "type": match p.ty { PiType::Type1 => 1, PiType::Type2 => 2, PiType::Type3 => 3 },
                "guard_bits": match p.format { PiFormat::Guard16 => 16, PiFormat::Guard32 => 32, PiFormat::Guard64 => 64 },
                "first_bytes": p.first,
            })),
        }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn to_json(dev: &DeviceArgs, mode: IommuMode, c: &Controller, caps: &Capacities) -> serde_json::Value {
    let id = c.identify();
    let mut v = json!({
        "device": dev.device.to_string(),
        "mode": if mode.has_iommu() { "iommu" } else { "noiommu" },
        "vid": id.vid,
        "ssvid": id.ssvid,
        "serial": id.serial,
        "model": id.model,
        "firmware": id.firmware,
        "version": c.version().to_string(),
        "cntlid": id.cntlid,
        "mdts": id.mdts,
        "mdts_bytes": c.mdts_bytes(),
        "oacs": id.oacs,
        "oncs": id.oncs,
        "sgls": id.sgls,
        "vwc": id.has_volatile_write_cache(),
        "nn": id.nn,
        "subnqn": id.subnqn,
        "max_queue_entries": c.cap().max_queue_entries(),
        "io_queues_granted": c.io_queues_granted(),
        "shadow_doorbells": c.shadow_doorbells(),
        "namespaces": c.namespaces().iter().map(|n| json!({
            "nsid": n.nsid,
            "lba_size": n.lba_size,
            "blocks": n.blocks,
            "bytes": n.bytes(),
            "metadata_size": n.metadata_size,
            "command_set": n.command_set,
            "command_set_name": command_set_name(n.command_set),
            "format": format_json(n),
            "zoned": n.zoned.map(|z| json!({
                "zone_size": z.identify.zone_size,
                "zone_capacity": caps.get(&n.nsid).and_then(|c| c.as_ref().ok()),
                "zone_capacity_error": caps.get(&n.nsid).and_then(|c| c.as_ref().err()),
                "variable_capacity": z.identify.variable_capacity(),
                "max_open": z.identify.max_open(),
                "max_active": z.identify.max_active(),
                "zone_append_limit": z.zasl_bytes,
                "zoc": z.identify.zoc,
                "ozcs": z.identify.ozcs,
            })),
        })).collect::<Vec<_>>(),
    });
    v["backend"] = json!(mode.name());
    v
}
