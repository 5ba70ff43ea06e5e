//! `vfpoll identify`: what the controller says about itself and its namespaces.

use std::process::ExitCode;

use clap::Args as ClapArgs;
use serde_json::json;
use vfpoll_nvme::identify::{oacs, oncs};
use vfpoll_nvme::Controller;

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
    for n in c.namespaces() {
        let f = n.identify.lba_format();
        s.push_str(&format!(
            "  nsid {:<3} {:>12} blocks x {:>4} B = {:>10}  (format {} of {}, metadata {} B)\n",
            n.nsid,
            n.blocks,
            n.lba_size,
            size(n.bytes()),
            n.identify.format_index,
            n.identify.lba_formats.len(),
            f.ms
        ));
    }
    s
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
        })).collect::<Vec<_>>(),
    })
}
