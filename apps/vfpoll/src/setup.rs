//! `vfpoll setup`: hugepages, hugetlbfs, vfio-pci and the bindings, one printed line per action;
//! with `--user`, what an unprivileged user needs for a run ([`user`]).

use std::path::PathBuf;
use std::process::ExitCode;

use vfpoll_hugepages::{self as hp, MountOutcome, PageSize, Reserved};
use vfpoll_pci::bind::{self, BindError, Plan};
use vfpoll_pci::sysfs::{self, PciDevice};
use vfpoll_pci::Bdf;

use crate::ctx::{Ctx, Selector};

pub mod user;

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
    /// Give this user (login name or numeric user ID) what a run without root needs: the VFIO
    /// nodes of the bound devices (/dev/vfio/N, and /dev/vfio/devices/vfioN and /dev/iommu
    /// where the kernel has them) and the hugetlbfs mount, chowned to it (recorded under
    /// /run/vfpoll; `vfpoll reset` gives them back); prints the memlock limit its runs need
    /// (the --hugepages reservation) and how to set it.
    #[arg(long, value_name = "NAME|UID")]
    pub user: Option<String>,
    /// With --user: raise the memlock limit of this running process of the user to the
    /// --hugepages reservation (prlimit(2); never lowers it). Repeatable.
    #[arg(long, value_name = "PID", requires = "user")]
    pub pid: Vec<u32>,
    /// The runs will use VFIO's no-IOMMU mode (the device commands' --noiommu). Nothing else
    /// changes, but --user is refused: no-IOMMU mode needs root (CAP_SYS_RAWIO for
    /// /dev/vfio/noiommu-N, CAP_SYS_ADMIN for physical addresses from /proc/self/pagemap).
    #[arg(long)]
    pub noiommu: bool,
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
    // Checked before anything changes.
    let who = match &a.user {
        Some(_) if a.noiommu => anyhow::bail!(
            "--user cannot be given with --noiommu: {}",
            user::NOIOMMU_NEEDS_ROOT
        ),
        Some(spec) => Some(user::resolve(&ctx.host, spec)?),
        None => None,
    };
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
    // The devices on vfio-pci (or, in a dry run, that would be) at the end.
    let mut on_vfio: Vec<Bdf> = Vec::new();
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
            on_vfio.push(t.bdf);
            continue;
        }
        let from = plan.device.driver.as_deref().unwrap_or("no driver");
        if a.dry_run {
            println!("bind {what}: would move from {from} to vfio-pci");
            on_vfio.push(t.bdf);
            continue;
        }
        match bind::bind_vfio_with(&ctx.host, kernel.as_mut(), t.bdf, &ctx.bind_options(force)) {
            Ok(out) => {
                let node = out
                    .group_node
                    .map(|p| format!(", {}", p.display()))
                    .unwrap_or_default();
                println!("bind {what}: {from} -> vfio-pci{node}");
                on_vfio.push(t.bdf);
            }
            Err(e) => fail(e.to_string()),
        }
    }

    // 4. The user.
    if let Some(u) = &who {
        give_user(ctx, &a, u, &on_vfio, pages * a.page_size.bytes(), &mut fail);
    }
    if failed > 0 {
        anyhow::bail!("{failed} setup step(s) failed (see above); the others were done");
    }
    Ok(ExitCode::SUCCESS)
}

/// Gives `u` the nodes of `devices`, `/dev/iommu` and the hugetlbfs mount; prints the memlock
/// limit its runs need (`need` bytes) and raises it for `--pid`.
fn give_user(ctx: &Ctx, a: &Args, u: &user::User, devices: &[Bdf], need: u64, fail: &mut dyn FnMut(String)) {
    let would = if a.dry_run { "would give" } else { "gave" };
    let give = |bdf: Option<Bdf>, path: &std::path::Path, fail: &mut dyn FnMut(String)| {
        let what = match bdf {
            Some(b) => format!("{} ({b})", path.display()),
            None => path.display().to_string(),
        };
        match user::give(&ctx.host, &ctx.state_dir, u, bdf, path, a.dry_run) {
            Ok(user::Change::Unchanged) => println!("user {u}: {what}: owned by it already; unchanged"),
            Ok(user::Change::Given { was }) => println!(
                "user {u}: {what}: {would} it (was owner {} (uid {}), mode {:o})",
                user::name_of(&ctx.host, was.uid),
                was.uid,
                was.mode
            ),
            Err(e) => fail(format!("{e:#}")),
        }
    };
    for &bdf in devices {
        match user::device_nodes(&ctx.host, bdf) {
            Err(_) if a.dry_run => println!("user {u}: would give it the VFIO nodes of {bdf} once bound"),
            Ok(nodes) if nodes.iter().any(|n| user::is_noiommu_node(n)) => fail(format!(
                "{bdf} is in a no-IOMMU group ({}): cannot give it to {u}: {}",
                nodes[0].display(),
                user::NOIOMMU_NEEDS_ROOT
            )),
            Ok(nodes) => nodes.iter().for_each(|n| give(Some(bdf), n, fail)),
            Err(e) => fail(format!("cannot give {bdf} to {u}: {e:#}")),
        }
    }
    let iommu = ctx.host.dev.join("iommu");
    if iommu.exists() {
        give(None, &iommu, fail);
    }
    let container = ctx.host.dev.join("vfio/vfio");
    if container.exists() {
        match user::open_to_all(&ctx.host, &ctx.state_dir, &container, a.dry_run) {
            Ok(user::Change::Unchanged) => {
                println!(
                    "user {u}: {}: read-write for everyone already; unchanged",
                    container.display()
                )
            }
            Ok(user::Change::Given { was }) => println!(
                "user {u}: {}: {} it read-write for everyone, as the kernel does (was mode {:o})",
                container.display(),
                if a.dry_run { "would make" } else { "made" },
                was.mode
            ),
            Err(e) => fail(format!("{e:#}")),
        }
    }
    let mount = user::on_host(&ctx.host, &a.mount);
    let mounted = hp::hugetlbfs_mounts(&ctx.host)
        .unwrap_or_default()
        .iter()
        .any(|m| m.path == a.mount);
    if mounted {
        give(None, &mount, fail);
    } else if a.dry_run {
        println!("user {u}: would give it the hugetlbfs on {}", a.mount.display());
    }
    for line in user::memlock_advice(u, need) {
        println!("{line}");
    }
    for &pid in &a.pid {
        match user::raise_memlock(&ctx.host, u, pid, need, a.dry_run) {
            Ok(line) => println!("{line}"),
            Err(e) => fail(format!("{e:#}")),
        }
    }
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
