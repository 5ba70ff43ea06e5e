//! `vfpoll bind BDF... [--force]`.

use std::process::ExitCode;

use vfpoll_pci::bind::bind_vfio_with;
use vfpoll_pci::Bdf;

use crate::ctx::Ctx;

/// Options of `vfpoll bind`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI addresses, e.g. 0000:00:03.0 (`vfpoll status` lists them).
    #[arg(required = true, value_name = "BDF")]
    pub devices: Vec<Bdf>,
    /// Bind even when the kernel uses the device (it loses its file systems or interfaces).
    #[arg(long)]
    pub force: bool,
}

/// Binds each device; prints one line per device. Exit 1 if any failed.
pub fn run(ctx: &Ctx, args: Args) -> anyhow::Result<ExitCode> {
    let opts = ctx.bind_options(args.force);
    let mut kernel = ctx.kernel();
    let mut failed = 0;
    for bdf in args.devices {
        match bind_vfio_with(&ctx.host, kernel.as_mut(), bdf, &opts) {
            Ok(out) => println!("bind {out}"),
            Err(e) => {
                eprintln!("vfpoll: error: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
