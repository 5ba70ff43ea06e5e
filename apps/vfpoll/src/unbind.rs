//! `vfpoll reset|unbind [BDF...|all]`: gives devices back to their kernel drivers and undoes
//! `vfpoll setup`. It resets no controller (hence the module's name); the controller resets
//! under load are `vfpoll perf --reset-every` (`perf/reset_every.rs`).

use std::process::ExitCode;

use anyhow::bail;
use vfpoll_pci::bind::{recorded, unbind_to_kernel_with};
use vfpoll_pci::Bdf;

use crate::bind::each_device;
use crate::ctx::Ctx;
use crate::setup::user::{undo, Scope};

/// Options of `vfpoll reset`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI addresses, or `all` (the default): every device vfpoll bound.
    #[arg(value_name = "BDF|all")]
    pub devices: Vec<String>,
}

/// Gives each device back; prints one line per device. Exit 1 if any failed.
pub fn run(ctx: &Ctx, args: Args) -> anyhow::Result<ExitCode> {
    let mut targets: Vec<Bdf> = Vec::new();
    for d in &args.devices {
        if d == "all" {
            targets.extend(recorded(&ctx.state_dir).into_iter().map(|r| r.bdf));
        } else {
            match d.parse() {
                Ok(b) => targets.push(b),
                Err(e) => bail!("{e}; or write `all`"),
            }
        }
    }
    if args.devices.is_empty() {
        targets = recorded(&ctx.state_dir).into_iter().map(|r| r.bdf).collect();
    }
    targets.sort();
    targets.dedup();
    // What `setup --user` gave a user: all of it with `all` (or no argument), else the nodes of
    // the devices named.
    let scope = if args.devices.is_empty() || args.devices.iter().any(|d| d == "all") {
        Scope::All
    } else {
        Scope::Devices(&targets)
    };
    let mut failed = 0;
    match undo(&ctx.host, &ctx.state_dir, scope) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => {
            eprintln!("vfpoll: error: giving back what setup --user gave: {e:#}");
            failed += 1;
        }
    }
    if targets.is_empty() {
        println!(
            "nothing to give back: vfpoll has bound no device (records in {}); name a device to give back one bound by something else",
            ctx.state_dir.join("bound").display()
        );
    }
    let opts = ctx.bind_options(false);
    let mut kernel = ctx.kernel();
    Ok(each_device(targets, "reset", failed, |bdf| {
        unbind_to_kernel_with(&ctx.host, kernel.as_mut(), bdf, &opts)
    }))
}
