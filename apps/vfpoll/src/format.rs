//! `vfpoll format`: Format NVM a namespace to another LBA format, metadata placement and
//! protection information. Every block of the namespace is erased, so it runs only with `--yes`.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args as ClapArgs;
use vfpoll_nvme::format::PiType;
use vfpoll_nvme::FormatOptions;

use crate::ctx::Ctx;
use crate::nvme_open::DeviceArgs;

/// Arguments of `vfpoll format`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Namespace.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// LBA format index (`vfpoll identify` lists the namespace's formats).
    #[arg(long)]
    lbaf: u8,
    /// Where the metadata of a format with metadata travels: `extended` (at the end of each
    /// block, in the data buffer) or `separate` (its own buffer).
    #[arg(long, default_value = "separate", value_parser = ["extended", "separate"])]
    metadata: String,
    /// Protection information type: none, 1, 2 or 3 (needs at least 8 bytes of metadata).
    #[arg(long, default_value = "none", value_parser = ["none", "1", "2", "3"])]
    pi: String,
    /// Put the PI in the first bytes of the metadata instead of the last.
    #[arg(long)]
    pi_first: bool,
    /// Confirm: every block of the namespace is erased.
    #[arg(long)]
    yes: bool,
}

/// Runs `vfpoll format`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    if !a.yes {
        bail!(
            "formatting namespace {} of {} erases every block: pass --yes to do it",
            a.nsid,
            a.dev.device
        );
    }
    let (ctrl, _dma, _container) = a.dev.open()?;
    let before = ctrl.namespace(a.nsid)?;
    let opts = FormatOptions {
        lbaf: a.lbaf,
        extended: a.metadata == "extended",
        pi: match a.pi.as_str() {
            "1" => Some(PiType::Type1),
            "2" => Some(PiType::Type2),
            "3" => Some(PiType::Type3),
            _ => None,
        },
        pi_first: a.pi_first,
    };
    ctrl.format_with(a.nsid, opts, true)?;
    let after = ctrl.namespace(a.nsid)?;
    let show = |n: &vfpoll_nvme::Namespace| match &n.format {
        Ok(f) => format!("{} blocks, {f}", n.blocks),
        Err(e) => format!("{} blocks, an unusable format ({e})", n.blocks),
    };
    println!(
        "{} namespace {}: formatted\n  before: {}\n  after:  {}",
        a.dev.device,
        a.nsid,
        show(&before),
        show(&after)
    );
    Ok(ExitCode::SUCCESS)
}
