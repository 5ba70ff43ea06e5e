//! `vfpoll identify`: what the controller says about itself and its namespaces.

use std::process::ExitCode;

use clap::Args as ClapArgs;
use serde_json::json;
use vfpoll_nvme::format::{PiFormat, PiType};
use vfpoll_nvme::identify::{oacs, oncs};
use vfpoll_nvme::{zns, Controller, Namespace};

use crate::ctx::Ctx;
use crate::nvme_open::DeviceArgs;

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
    let (ctrl, _dma, _container) = a.dev.open()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&a.dev, &ctrl))?);
    } else {
        print!("{}", text(&a.dev, &ctrl));
    }
    Ok(ExitCode::SUCCESS)
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

fn text(dev: &DeviceArgs, c: &Controller) -> String {
    let id = c.identify();
    let cap = c.cap();
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<10}: {v}\n"));
    line("device", format!("{} ({})", dev.device, dev.mode()));
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
            s.push_str(&format!("            {}\n", describe_zones(z, n.lba_size)));
        }
    }
    s
}

/// The namespace's command set and format, as one line: what I/O through vfpoll moves.
fn describe_format(n: &Namespace) -> String {
    let set = match n.command_set {
        zns::CSI_NVM => "",
        zns::CSI_ZONED => "zoned, ",
        _ => "unsupported command set, ",
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

fn describe_zones(z: &zns::ZonedInfo, lba: usize) -> String {
    let limit = |v: Option<u32>| v.map_or("no limit".to_string(), |v| v.to_string());
    format!(
        "zones of {} blocks ({}), max open {}, max active {}, zone append limit {}",
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

fn to_json(dev: &DeviceArgs, c: &Controller) -> serde_json::Value {
    let id = c.identify();
    json!({
        "device": dev.device.to_string(),
        "mode": if dev.noiommu { "noiommu" } else { "iommu" },
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
            "format": format_json(n),
            "zoned": n.zoned.map(|z| json!({
                "zone_size": z.identify.zone_size,
                "max_open": z.identify.max_open(),
                "max_active": z.identify.max_active(),
                "zone_append_limit": z.zasl_bytes,
                "zoc": z.identify.zoc,
                "ozcs": z.identify.ozcs,
            })),
        })).collect::<Vec<_>>(),
    })
}
