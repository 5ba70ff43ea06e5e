//! `vfpoll bind BDF... [--force]`.

use std::fmt::Display;
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
    Ok(each_device(args.devices, "bind", 0, |bdf| {
        bind_vfio_with(&ctx.host, kernel.as_mut(), bdf, &opts)
    }))
}

/// Does `act` to each of `devices`, printing `{verb} {outcome}` for each one done and the error
/// for each one that failed. Exit 1 if any failed, or if `failed` (earlier failures) is not 0.
pub fn each_device<T: Display, E: Display>(
    devices: impl IntoIterator<Item = Bdf>,
    verb: &str,
    mut failed: usize,
    mut act: impl FnMut(Bdf) -> Result<T, E>,
) -> ExitCode {
    for bdf in devices {
        match act(bdf) {
            Ok(out) => println!("{verb} {out}"),
            Err(e) => {
                eprintln!("vfpoll: error: {e}");
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
