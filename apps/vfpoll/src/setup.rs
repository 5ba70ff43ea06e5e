//! `vfpoll setup`: hugepages, hugetlbfs, vfio-pci and the bindings, one printed line per action.

use std::path::PathBuf;
use std::process::ExitCode;

use vfpoll_hugepages::{self as hp, MountOutcome, PageSize, Reserved};
use vfpoll_pci::bind::{self, BindError, Plan};
use vfpoll_pci::sysfs::{self, PciDevice};
use vfpoll_pci::Bdf;

use crate::ctx::{Ctx, Selector};

/// `vfpoll setup` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Hugepage memory the pools must hold at least, in MiB, rounded up to whole pages (pools that
    /// already hold more are left as they are).
    #[arg(long, value_name = "MiB", default_value_t = 64)]
    pub hugepages: u64,
    /// Huge page size: 2M or 1G.
    #[arg(long, value_name = "SIZE", default_value = "2M")]
    pub page_size: PageSize,
    /// Reserve all pages on this NUMA node (default: spread evenly over the nodes).
    #[arg(long, value_name = "N")]
    pub node: Option<u32>,
    /// Where to mount hugetlbfs (with pagesize=SIZE) if nothing is mounted there.
    #[arg(long, value_name = "PATH", default_value = hp::DEFAULT_MOUNT)]
    pub mount: PathBuf,
    /// What to bind to vfio-pci (repeatable): a PCI address, `nvme` (every NVMe controller the
    /// kernel does not use), `nic` (every NIC whose interfaces are all down) or `none`.
    /// Default: nvme.
    #[arg(long, value_name = "BDF|nvme|nic|none")]
    pub bind: Vec<Selector>,
    /// Bind devices named by address even when the kernel uses them. Devices picked by `nvme` or
    /// `nic` are never forced: those in use are skipped.
    #[arg(long)]
    pub force: bool,
    /// Print what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// One device to bind, and whether the user named it (else a kind selected it).
struct Target {
    bdf: Bdf,
    named: bool,
}

fn id(d: &PciDevice) -> String {
    format!("{} {:04x}:{:04x}", d.kind(), d.vendor, d.device)
}

fn targets(ctx: &Ctx, sel: &[Selector]) -> anyhow::Result<Vec<Target>> {
    let sel = if sel.is_empty() {
        &[Selector::Nvme][..]
    } else {
        sel
    };
    let mut out: Vec<Target> = Vec::new();
    let mut add = |bdf, named| {
        if let Some(t) = out.iter_mut().find(|t: &&mut Target| t.bdf == bdf) {
            t.named |= named;
        } else {
            out.push(Target { bdf, named });
        }
    };
    let needs_scan = sel.iter().any(|s| matches!(s, Selector::Nvme | Selector::Nic));
    let all = if needs_scan {
        sysfs::devices(&ctx.host)?
    } else {
        Vec::new()
    };
    for s in sel {
        match s {
            Selector::Bdf(b) => add(*b, true),
            Selector::Nvme => all.iter().filter(|d| d.is_nvme()).for_each(|d| add(d.bdf, false)),
            Selector::Nic => all
                .iter()
                .filter(|d| d.is_network())
                .for_each(|d| add(d.bdf, false)),
            Selector::None => {}
        }
    }
    out.sort_by_key(|t| t.bdf);
    Ok(out)
}

/// Runs the setup; exit 1 when any step failed (the others still run).
pub fn run(ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let would = if a.dry_run { "would " } else { "" };
    let mut failed = 0usize;
    let mut fail = |msg: String| {
        eprintln!("vfpoll: error: {msg}");
        failed += 1;
    };

    // 1. Hugepages.
    let pages = a.page_size.pages_for(a.hugepages << 20);
    for r in hugepages(ctx, &a, pages) {
        match r {
            Ok(r) if r.wanted > r.before => {
                let to = if a.dry_run { r.wanted } else { r.after };
                println!(
                    "hugepages: {would}grow the {} pool from {} to {to} pages",
                    pool_name(&r),
                    r.before
                );
            }
            Ok(r) => println!(
                "hugepages: the {} pool holds {} pages (>= {}); unchanged",
                pool_name(&r),
                r.before,
                r.wanted
            ),
            Err(e) => fail(e.to_string()),
        }
    }

    // 2. hugetlbfs.
    let mounted = hp::hugetlbfs_mounts(&ctx.host)?
        .into_iter()
        .rev()
        .find(|m| m.path == a.mount);
    match mounted {
        Some(m) if m.page_size.is_some_and(|s| s != a.page_size) => fail(format!(
            "{} holds a hugetlbfs of {} pages, not {}: pass --mount with another path",
            a.mount.display(),
            m.page_size.unwrap_or(a.page_size),
            a.page_size
        )),
        Some(_) => println!("hugetlbfs: mounted on {}; unchanged", a.mount.display()),
        None if a.dry_run => {
            println!(
                "hugetlbfs: would mount (pagesize={}) on {}",
                a.page_size,
                a.mount.display()
            )
        }
        None => match hp::ensure_mounted_with(&ctx.host, ctx.mounter().as_mut(), &a.mount, a.page_size) {
            Ok(MountOutcome::Mounted { path, options }) => {
                println!("hugetlbfs: mounted ({options}) on {}", path.display())
            }
            Ok(MountOutcome::AlreadyMounted(m)) => {
                println!("hugetlbfs: mounted on {}; unchanged", m.path.display())
            }
            Err(e) => fail(e.to_string()),
        },
    }

    // 3. Bindings.
    let mut kernel = ctx.kernel();
    let mut module_checked = false;
    for t in targets(ctx, &a.bind)? {
        let force = a.force && t.named;
        let plan: Plan = match bind::preflight(&ctx.host, t.bdf, force) {
            Ok(p) => p,
            Err(e @ (BindError::InUse { .. } | BindError::GroupNotViable { .. })) if !t.named => {
                println!("bind {}: skipped: {e}", t.bdf);
                continue;
            }
            Err(e) => {
                fail(e.to_string());
                continue;
            }
        };
        if !module_checked {
            module_checked = true;
            let missing = bind::missing_modules(&ctx.host);
            if a.dry_run && !missing.is_empty() {
                println!("modules: would load {}", missing.join(", "));
            } else if !missing.is_empty() {
                match bind::ensure_vfio_pci(&ctx.host, kernel.as_mut()) {
                    Ok(l) if !l.is_empty() => println!("modules: loaded {}", l.join(", ")),
                    Ok(_) => {}
                    Err(e) => {
                        fail(e.to_string());
                        break;
                    }
                }
            }
        }
        let what = format!("{} ({})", t.bdf, id(&plan.device));
        if plan.already_bound {
            println!("bind {what}: already on vfio-pci; unchanged");
            continue;
        }
        let from = plan.device.driver.as_deref().unwrap_or("no driver");
        if a.dry_run {
            println!("bind {what}: would move from {from} to vfio-pci");
            continue;
        }
        match bind::bind_vfio_with(&ctx.host, kernel.as_mut(), t.bdf, &ctx.bind_options(force)) {
            Ok(out) => {
                let node = out
                    .group_node
                    .map(|p| format!(", {}", p.display()))
                    .unwrap_or_default();
                println!("bind {what}: {from} -> vfio-pci{node}");
            }
            Err(e) => fail(e.to_string()),
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} setup step(s) failed (see above); the others were done");
    }
    Ok(ExitCode::SUCCESS)
}

fn pool_name(r: &Reserved) -> String {
    format!(
        "{} {}",
        r.node.map_or("machine-wide".to_owned(), |n| format!("node{n}")),
        r.size
    )
}

/// Reserves (or, in a dry run, plans) the hugepage pools: on `--node`, else spread over the NUMA
/// nodes, else machine-wide; one result per pool.
fn hugepages(ctx: &Ctx, a: &Args, pages: u64) -> Vec<Result<Reserved, hp::HugepageError>> {
    let nodes = hp::numa_nodes(&ctx.host);
    let shares: Vec<(Option<u32>, u64)> = match a.node {
        Some(n) => vec![(Some(n), pages)],
        None if nodes.is_empty() => vec![(None, pages)],
        None => nodes
            .iter()
            .map(|&n| Some(n))
            .zip(hp::spread(pages, nodes.len()))
            .collect(),
    };
    let mut k = ctx.kernel();
    shares
        .into_iter()
        .map(|(node, wanted)| {
            if a.dry_run {
                let p = hp::pool(&ctx.host, a.page_size, node)?;
                Ok(Reserved {
                    size: a.page_size,
                    node,
                    wanted,
                    before: p.total,
                    after: p.total,
                })
            } else {
                hp::reserve_with(&ctx.host, k.as_mut(), a.page_size, node, wanted)
            }
        })
        .collect()
}
