//! `vfpoll status [--json]`.

use std::process::ExitCode;

use serde::Serialize;
use vfpoll_hugepages::{self as hp, Memlock};
use vfpoll_pci::bind::{self, NoIommu, VFIO_PCI};
use vfpoll_pci::sysfs;
use vfpoll_pci::vfio::Backend;

use crate::ctx::Ctx;
use crate::table;

/// `vfpoll status` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON (for scripts) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Report the backend a run with this --iommu-backend would use (auto: iommufd where
    /// /dev/iommu exists and every device on vfio-pci has a VFIO cdev, type1 otherwise).
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    pub iommu_backend: Backend,
}

/// Everything `status` shows.
#[derive(Debug, Serialize)]
pub struct Report {
    /// IOMMU state.
    pub iommu: Iommu,
    /// The IOMMU backend a run on the devices bound to vfio-pci would use, and why.
    pub backend: BackendReport,
    /// NVMe controllers, NICs, and any other device on vfio-pci or bound by vfpoll.
    pub devices: Vec<Device>,
    /// Hugepage pools.
    pub hugepages: Vec<Pool>,
    /// hugetlbfs mounts.
    pub hugetlbfs: Vec<Mount>,
    /// RLIMIT_MEMLOCK of this process.
    pub memlock: MemlockReport,
}

/// IOMMU state.
#[derive(Debug, Serialize)]
pub struct Iommu {
    /// `/sys/class/iommu/*` (e.g. `dmar0`): non-empty means the IOMMU is on.
    pub units: Vec<String>,
    /// vfio's no-IOMMU switch: `on`, `off`, `unsupported` (vfio.ko built without
    /// CONFIG_VFIO_NOIOMMU) or `vfio-not-loaded`.
    pub noiommu: &'static str,
}

/// Which IOMMU backend a run would use.
#[derive(Debug, Serialize)]
pub struct BackendReport {
    /// What was asked for (`--iommu-backend`, `auto` by default).
    pub requested: String,
    /// What a run would use: `iommufd`, `type1` or `noiommu`.
    pub backend: &'static str,
    /// Why.
    pub why: String,
    /// Whether `/dev/iommu` exists (iommufd is loaded).
    pub dev_iommu: bool,
}

/// Another member of a device's IOMMU group.
#[derive(Debug, Serialize)]
pub struct Peer {
    /// Its address.
    pub bdf: String,
    /// Its driver.
    pub driver: Option<String>,
}

/// One device.
#[derive(Debug, Serialize)]
pub struct Device {
    /// Address.
    pub bdf: String,
    /// Vendor ID, 4 hex digits.
    pub vendor: String,
    /// Device ID, 4 hex digits.
    pub device: String,
    /// `nvme`, `nic`, ...
    pub kind: &'static str,
    /// Its driver now.
    pub driver: Option<String>,
    /// Whether vfpoll bound it (so `vfpoll reset` gives it back).
    pub bound_by_vfpoll: bool,
    /// The driver it had before vfpoll bound it.
    pub original_driver: Option<String>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// The VFIO group node, when there is one.
    pub group_node: Option<String>,
    /// The VFIO device cdev (`/dev/vfio/devices/vfioN`), when there is one (iommufd opens it).
    pub vfio_cdev: Option<String>,
    /// The other members of the group.
    pub group_peers: Vec<Peer>,
    /// How the kernel uses it (mounts, interfaces up).
    pub in_use: Vec<String>,
}

/// One hugepage pool.
#[derive(Debug, Serialize)]
pub struct Pool {
    /// Page size (`2M`).
    pub size: String,
    /// Page size in KiB.
    pub size_kib: u64,
    /// NUMA node; `null` for the machine-wide pool.
    pub node: Option<u32>,
    /// Pages in the pool.
    pub total: u64,
    /// Free pages.
    pub free: u64,
    /// Surplus pages.
    pub surplus: u64,
}

/// One hugetlbfs mount.
#[derive(Debug, Serialize)]
pub struct Mount {
    /// Mount point.
    pub path: String,
    /// Its page size; `null` when the mount table does not say.
    pub page_size: Option<String>,
}

/// The memlock limit, in bytes; `null` is unlimited.
#[derive(Debug, Serialize)]
pub struct MemlockReport {
    /// Soft limit.
    pub soft: Option<u64>,
    /// Hard limit.
    pub hard: Option<u64>,
    /// Whether the process has CAP_IPC_LOCK (then the limit does not apply to VFIO pinning).
    pub cap_ipc_lock: Option<bool>,
}

/// Gathers the report; `backend` is the `--iommu-backend` to report on.
pub fn gather(ctx: &Ctx, backend: Backend) -> anyhow::Result<Report> {
    let host = &ctx.host;
    let mut on_vfio = Vec::new();
    let records = bind::recorded(&ctx.state_dir);
    let mut devices = Vec::new();
    for d in sysfs::devices(host)? {
        let rec = records.iter().find(|r| r.bdf == d.bdf);
        if !(d.is_nvme() || d.is_network() || d.driver.as_deref() == Some(VFIO_PCI) || rec.is_some()) {
            continue;
        }
        if d.driver.as_deref() == Some(VFIO_PCI) {
            on_vfio.push(d.bdf);
        }
        let mut group_peers = Vec::new();
        if let Some(g) = d.iommu_group {
            for m in sysfs::group_members(host, g)?.into_iter().filter(|m| *m != d.bdf) {
                group_peers.push(Peer {
                    bdf: m.to_string(),
                    driver: sysfs::device(host, m)?.driver,
                });
            }
        }
        devices.push(Device {
            bdf: d.bdf.to_string(),
            vendor: format!("{:04x}", d.vendor),
            device: format!("{:04x}", d.device),
            kind: d.kind(),
            bound_by_vfpoll: rec.is_some(),
            original_driver: rec.and_then(|r| r.original.clone()),
            numa_node: d.numa_node,
            iommu_group: d.iommu_group,
            group_node: d
                .iommu_group
                .and_then(|g| bind::group_node(host, g))
                .map(|p| p.display().to_string()),
            vfio_cdev: sysfs::vfio_cdev(host, d.bdf)
                .map(|n| host.dev.join("vfio/devices").join(n).display().to_string()),
            group_peers,
            in_use: bind::kernel_uses(host, &d)?
                .iter()
                .map(|u| u.to_string())
                .collect(),
            driver: d.driver,
        });
    }
    let noiommu = match bind::noiommu(host) {
        NoIommu::On => "on",
        NoIommu::Off => "off",
        NoIommu::Unsupported => "unsupported",
        NoIommu::VfioNotLoaded => "vfio-not-loaded",
    };
    let hugepages = hp::pools(host)?
        .into_iter()
        .map(|p| Pool {
            size: p.size.to_string(),
            size_kib: p.size.kib(),
            node: p.node,
            total: p.total,
            free: p.free,
            surplus: p.surplus,
        })
        .collect();
    let hugetlbfs = hp::hugetlbfs_mounts(host)?
        .into_iter()
        .map(|m| Mount {
            path: m.path.display().to_string(),
            page_size: m.page_size.map(|s| s.to_string()),
        })
        .collect();
    let lim = Memlock::current()?;
    let choice = backend.choose(host, &on_vfio);
    Ok(Report {
        iommu: Iommu {
            units: bind::iommu_units(host),
            noiommu,
        },
        backend: BackendReport {
            requested: backend.to_string(),
            backend: choice.mode.name(),
            why: choice.why,
            dev_iommu: host.dev.join("iommu").exists(),
        },
        devices,
        hugepages,
        hugetlbfs,
        memlock: MemlockReport {
            soft: lim.soft,
            hard: lim.hard,
            cap_ipc_lock: hp::cap_ipc_lock(host),
        },
    })
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_owned(), T::to_string)
}

fn bytes(v: Option<u64>) -> String {
    match v {
        None => "unlimited".to_owned(),
        Some(b) if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        Some(b) if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        Some(b) => format!("{} KiB", b >> 10),
    }
}

/// The report as tables.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let iommu = if r.iommu.units.is_empty() {
        "off".to_owned()
    } else {
        format!("on ({})", r.iommu.units.join(", "))
    };
    let noiommu = match r.iommu.noiommu {
        "unsupported" => "unsupported (vfio built without CONFIG_VFIO_NOIOMMU)",
        "vfio-not-loaded" => "unknown (vfio not loaded)",
        s => s,
    };
    out.push_str(&format!("IOMMU: {iommu}; no-IOMMU mode: {noiommu}\n"));
    out.push_str(&format!(
        "IOMMU backend of a run (--iommu-backend {}): {} ({})\n\n",
        r.backend.requested, r.backend.backend, r.backend.why
    ));

    let rows: Vec<Vec<String>> = r
        .devices
        .iter()
        .map(|d| {
            let mut driver = opt(&d.driver);
            if d.bound_by_vfpoll {
                driver.push_str(&format!(
                    " (was {})",
                    d.original_driver.as_deref().unwrap_or("none")
                ));
            }
            let peers: Vec<String> = d
                .group_peers
                .iter()
                .map(|p| format!("{} {}", p.bdf, p.driver.as_deref().unwrap_or("none")))
                .collect();
            vec![
                d.bdf.clone(),
                format!("{}:{}", d.vendor, d.device),
                d.kind.to_owned(),
                driver,
                opt(&d.numa_node),
                opt(&d.iommu_group),
                if peers.is_empty() {
                    "-".to_owned()
                } else {
                    peers.join(", ")
                },
                if d.in_use.is_empty() {
                    "-".to_owned()
                } else {
                    d.in_use.join("; ")
                },
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("Devices: no NVMe controller or NIC found\n");
    } else {
        out.push_str("Devices:\n");
        out.push_str(&table::render(
            &[
                "BDF",
                "ID",
                "KIND",
                "DRIVER",
                "NODE",
                "GROUP",
                "GROUP PEERS (driver)",
                "KERNEL USE",
            ],
            &rows,
        ));
    }

    out.push_str("\nHugepages:\n");
    if r.hugepages.is_empty() {
        out.push_str("no hugepage pools (kernel without CONFIG_HUGETLBFS?)\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .hugepages
            .iter()
            .map(|p| {
                let mib = |n: u64| format!("{} MiB", (n * p.size_kib) >> 10);
                vec![
                    p.size.clone(),
                    p.node.map_or("all".to_owned(), |n| n.to_string()),
                    p.total.to_string(),
                    p.free.to_string(),
                    p.surplus.to_string(),
                    mib(p.total),
                    mib(p.free),
                ]
            })
            .collect();
        out.push_str(&table::render(
            &[
                "SIZE",
                "NODE",
                "TOTAL",
                "FREE",
                "SURPLUS",
                "TOTAL MEM",
                "FREE MEM",
            ],
            &rows,
        ));
    }
    let mounts: Vec<String> = r
        .hugetlbfs
        .iter()
        .map(|m| {
            format!(
                "{} ({})",
                m.path,
                m.page_size.as_deref().unwrap_or("default size")
            )
        })
        .collect();
    out.push_str(&format!(
        "hugetlbfs: {}\n",
        if mounts.is_empty() {
            "not mounted".to_owned()
        } else {
            mounts.join(", ")
        }
    ));
    let cap = match r.memlock.cap_ipc_lock {
        Some(true) => "; CAP_IPC_LOCK: yes (the limit does not apply to VFIO pinning)",
        Some(false) => "; CAP_IPC_LOCK: no",
        None => "",
    };
    out.push_str(&format!(
        "memlock: {} (hard {}){cap}\n",
        bytes(r.memlock.soft),
        bytes(r.memlock.hard)
    ));
    out
}

/// Prints the report.
pub fn run(ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let r = gather(ctx, a.iommu_backend)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", render(&r));
    }
    Ok(ExitCode::SUCCESS)
}
