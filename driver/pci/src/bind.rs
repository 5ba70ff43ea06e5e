//! Handing a PCI function to `vfio-pci` and giving it back to its kernel driver.
//!
//! Mechanism (Linux `Documentation/ABI/testing/sysfs-bus-pci`): write the driver's name into the
//! device's `driver_override`, unbind the current driver through `driver/unbind`, then ask the bus
//! to probe the device again by writing its address to `/sys/bus/pci/drivers_probe`; with an
//! override set, only that driver may take it. Giving it back clears the override (a write of
//! `"\n"`), unbinds `vfio-pci` and probes again, so the kernel picks the driver whose ID table
//! matches: normally the one the device had before.
//!
//! Before touching a device, [`preflight`] refuses when the kernel still uses it (a mounted file
//! system, swap or a device-mapper/md/LVM holder on an NVMe namespace; a network interface that is
//! up) unless forced, and when its IOMMU group is not viable. The driver the device had is kept in
//! a small state file, one per device, under [`BindOptions::state_dir`] (`/run/vfpoll`), so that
//! [`unbind_to_kernel`] and `vfpoll status` can name it.
//!
//! All changes go through a [`KernelOps`]; the `*_with` functions take one, so tests can play the
//! kernel's part on a fake tree.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bdf::Bdf;
use crate::sysfs::{self, Host, KernelOps, LiveKernel, PciDevice, SysfsError};

mod inuse;
mod state;

pub use inuse::{kernel_uses, InUse};
pub use state::{recorded, recorded_driver, Record};

/// The name of the VFIO PCI driver, as in `/sys/bus/pci/drivers/`.
pub const VFIO_PCI: &str = "vfio-pci";

/// Drivers that may hold the other members of a device's IOMMU group without making it unusable
/// for VFIO: `pci-stub` claims a device without using it, `pcieport` drives bridges, which VFIO
/// accepts in a group.
const HARMLESS_PEER_DRIVERS: [&str; 3] = [VFIO_PCI, "pci-stub", "pcieport"];

/// How to bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOptions {
    /// Bind even when the kernel uses the device (mounted file system, interface up). The IOMMU
    /// group check still applies.
    pub force: bool,
    /// Where the original drivers are recorded; normally `/run/vfpoll`.
    pub state_dir: PathBuf,
    /// How long to wait for the kernel to finish a bind (the `/dev/vfio/<group>` node is made
    /// asynchronously by devtmpfs).
    pub settle: Duration,
}

/// The default [`BindOptions::state_dir`].
pub const DEFAULT_STATE_DIR: &str = "/run/vfpoll";

impl Default for BindOptions {
    fn default() -> Self {
        BindOptions {
            force: false,
            state_dir: DEFAULT_STATE_DIR.into(),
            settle: Duration::from_secs(2),
        }
    }
}

/// What a bind or unbind did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAction {
    /// The device was moved to `vfio-pci`.
    Bound,
    /// It already was on `vfio-pci`; nothing was written.
    AlreadyBound,
    /// It was given back to the kernel.
    Returned,
    /// It was not on `vfio-pci`, so there was nothing to give back; nothing was written.
    NotOnVfio,
}

/// The result of [`bind_vfio`] or [`unbind_to_kernel`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOutcome {
    /// The device.
    pub bdf: Bdf,
    /// What happened.
    pub action: BindAction,
    /// Its driver before.
    pub before: Option<String>,
    /// Its driver now.
    pub after: Option<String>,
    /// Its IOMMU group now, if any.
    pub group: Option<u32>,
    /// The VFIO group node a user-space driver opens (`/dev/vfio/3`, `/dev/vfio/noiommu-0`), when
    /// the device is on `vfio-pci`.
    pub group_node: Option<PathBuf>,
}

fn drv(d: &Option<String>) -> &str {
    d.as_deref().unwrap_or("no driver")
}

impl fmt::Display for BindOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self
            .group_node
            .as_ref()
            .map(|p| format!(" ({})", p.display()))
            .unwrap_or_default();
        match self.action {
            BindAction::Bound => write!(
                f,
                "{}: {} -> {}{node}",
                self.bdf,
                drv(&self.before),
                drv(&self.after)
            ),
            BindAction::AlreadyBound => write!(f, "{}: already bound to {VFIO_PCI}{node}", self.bdf),
            BindAction::Returned => write!(f, "{}: {} -> {}", self.bdf, drv(&self.before), drv(&self.after)),
            BindAction::NotOnVfio => write!(
                f,
                "{}: not on {VFIO_PCI} ({}); left alone",
                self.bdf,
                drv(&self.after)
            ),
        }
    }
}

/// Why a device could not be bound or given back. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// sysfs could not be read, or the device is absent.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    /// The kernel still uses the device.
    #[error("{}", in_use_message(*.bdf, .uses))]
    InUse {
        /// The device.
        bdf: Bdf,
        /// What uses it.
        uses: Vec<InUse>,
    },
    /// Other members of the IOMMU group are held by kernel drivers, so VFIO would refuse the group.
    #[error("{}", group_message(*.bdf, *.group, .others))]
    GroupNotViable {
        /// The device.
        bdf: Bdf,
        /// Its IOMMU group.
        group: u32,
        /// The members that block it, with their drivers.
        others: Vec<(Bdf, String)>,
    },
    /// `vfio-pci` is not loaded and could not be loaded.
    #[error("the {VFIO_PCI} driver is not loaded (no /sys/bus/pci/drivers/{VFIO_PCI}) and loading it failed: {detail}; load it: modprobe vfio-pci")]
    VfioPciMissing {
        /// What the module loader said.
        detail: String,
    },
    /// The device has no IOMMU group and no-IOMMU mode is off: vfio-pci would refuse it.
    #[error("{bdf} has no IOMMU group and vfio's no-IOMMU mode is off, so {VFIO_PCI} would refuse it: turn the IOMMU on (VT-d/AMD-Vi in the firmware; on Intel, intel_iommu=on on the kernel command line; AMD turns it on by default unless amd_iommu=off), or, knowing that it lets the device DMA anywhere, enable no-IOMMU mode: echo Y > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode")]
    NoIommu {
        /// The device.
        bdf: Bdf,
    },
    /// A sysfs write failed.
    #[error("cannot write {value:?} to {}: {source}{}", .path.display(), root_hint(.source))]
    Write {
        /// The attribute.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// vfio-pci did not take the device; it was given back.
    #[error("{VFIO_PCI} did not take {bdf} (its driver after the probe: {now}); it was given back ({restored}); `dmesg | tail` says why (no IOMMU group without no-IOMMU mode gives `probe ... failed with error -22`)")]
    NotTaken {
        /// The device.
        bdf: Bdf,
        /// Its driver after the failed probe.
        now: String,
        /// Its driver after the roll-back.
        restored: String,
    },
    /// `/dev/vfio` does not exist.
    #[error("{} does not exist: vfio is not loaded (modprobe vfio-pci) or devtmpfs is not mounted on /dev", .path.display())]
    NoVfioDev {
        /// The folder looked for.
        path: PathBuf,
    },
    /// The device is on vfio-pci, but its group node did not appear in time.
    #[error("{bdf} is on {VFIO_PCI} but no VFIO group node (/dev/vfio/<group> or /dev/vfio/noiommu-<group>) appeared within {} ms (group: {group}); check `dmesg | tail` and udev rules for /dev/vfio", .waited.as_millis())]
    GroupNodeMissing {
        /// The device.
        bdf: Bdf,
        /// Its group, or `none`.
        group: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The record of the original driver could not be read or written.
    #[error(
        "cannot record the original driver of {bdf} in {}: {source}{}",
        .path.display(),
        state_hint(.source)
    )]
    State {
        /// The device.
        bdf: Bdf,
        /// The state file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The device was given back, but its original driver did not take it.
    #[error("{bdf} left {VFIO_PCI}, but {expected} did not take it back (driver now: {now}); load the driver and probe again: modprobe {expected}; echo {bdf} > /sys/bus/pci/drivers_probe")]
    NotReturned {
        /// The device.
        bdf: Bdf,
        /// The driver it had before vfpoll bound it.
        expected: String,
        /// Its driver now.
        now: String,
    },
}

fn root_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => "; binding needs root (sudo vfpoll ...)",
        _ => "",
    }
}

fn state_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => "; binding needs root (sudo vfpoll ...)",
        _ => "; check that the folder is writable (/run is a tmpfs on most systems)",
    }
}

fn in_use_message(bdf: Bdf, uses: &[InUse]) -> String {
    let what: Vec<String> = uses.iter().map(|u| u.to_string()).collect();
    let mut todo: Vec<String> = uses.iter().map(|u| u.remedy()).collect();
    todo.dedup();
    format!(
        "{bdf} is in use by the kernel: {}; {}, or pass --force to take it anyway",
        what.join(", "),
        todo.join(", ")
    )
}

fn group_message(bdf: Bdf, group: u32, others: &[(Bdf, String)]) -> String {
    let who: Vec<String> = others.iter().map(|(b, d)| format!("{b} (driver {d})")).collect();
    let list: Vec<String> = others.iter().map(|(b, _)| b.to_string()).collect();
    format!(
        "IOMMU group {group} of {bdf} is not viable: it also holds {}, which VFIO cannot share with a kernel driver; bind them too (vfpoll bind {bdf} {}) or put {bdf} in a slot with its own group",
        who.join(", "),
        list.join(" ")
    )
}

/// What [`preflight`] found: the device can be bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The device as it is now.
    pub device: PciDevice,
    /// It is already on `vfio-pci`: binding does nothing.
    pub already_bound: bool,
    /// `vfio-pci` (or `vfio_iommu_type1`) is not loaded yet: binding will load it
    /// ([`missing_modules`]).
    pub needs_module: bool,
    /// Kernel uses that `force` overrides (empty unless forced).
    pub forced_over: Vec<InUse>,
}

/// The checks of [`bind_vfio`] that change nothing: the device exists, the kernel does not use it
/// (unless `force`), and its IOMMU group is viable.
pub fn preflight(host: &Host, bdf: Bdf, force: bool) -> Result<Plan, BindError> {
    let device = sysfs::device(host, bdf)?;
    let needs_module = !missing_modules(host).is_empty();
    if device.driver.as_deref() == Some(VFIO_PCI) {
        return Ok(Plan {
            device,
            already_bound: true,
            needs_module,
            forced_over: Vec::new(),
        });
    }
    let uses = kernel_uses(host, &device)?;
    if !uses.is_empty() && !force {
        return Err(BindError::InUse { bdf, uses });
    }
    if let Some(group) = device.iommu_group {
        let others = blocking_peers(host, bdf, group)?;
        if !others.is_empty() {
            return Err(BindError::GroupNotViable { bdf, group, others });
        }
    }
    Ok(Plan {
        device,
        already_bound: false,
        needs_module,
        forced_over: uses,
    })
}

/// The other members of `group` held by drivers that make it unusable for VFIO, with the driver.
pub fn blocking_peers(host: &Host, bdf: Bdf, group: u32) -> Result<Vec<(Bdf, String)>, BindError> {
    let mut out = Vec::new();
    for m in sysfs::group_members(host, group)? {
        if m == bdf {
            continue;
        }
        if let Some(d) = sysfs::device(host, m)?.driver {
            if !HARMLESS_PEER_DRIVERS.contains(&d.as_str()) {
                out.push((m, d));
            }
        }
    }
    Ok(out)
}

/// The state of vfio's no-IOMMU switch, `/sys/module/vfio/parameters/enable_unsafe_noiommu_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoIommu {
    /// vfio is not loaded, so the parameter cannot be seen.
    VfioNotLoaded,
    /// vfio is loaded but has no such parameter: it was built without `CONFIG_VFIO_NOIOMMU`.
    Unsupported,
    /// The parameter is `N`.
    Off,
    /// The parameter is `Y`.
    On,
}

/// Reads vfio's no-IOMMU switch.
pub fn noiommu(host: &Host) -> NoIommu {
    let module = host.sys.join("module/vfio");
    match fs::read_to_string(module.join("parameters/enable_unsafe_noiommu_mode")) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => NoIommu::On,
        Ok(_) => NoIommu::Off,
        Err(_) if module.is_dir() => NoIommu::Unsupported,
        Err(_) => NoIommu::VfioNotLoaded,
    }
}

/// The IOMMU units the kernel registered (`/sys/class/iommu/*`, e.g. `dmar0`); empty when the
/// IOMMU is off or absent.
pub fn iommu_units(host: &Host) -> Vec<String> {
    inuse::names(&host.sys.join("class/iommu"))
}

/// The VFIO group node of `group` that exists: `/dev/vfio/<group>` (IOMMU) or
/// `/dev/vfio/noiommu-<group>` (no-IOMMU mode).
pub fn group_node(host: &Host, group: u32) -> Option<PathBuf> {
    let dir = host.dev.join("vfio");
    [dir.join(group.to_string()), dir.join(format!("noiommu-{group}"))]
        .into_iter()
        .find(|p| p.exists())
}

/// Binds `bdf` to `vfio-pci` on the running kernel; see [`bind_vfio_with`].
pub fn bind_vfio(host: &Host, bdf: Bdf, opts: &BindOptions) -> Result<BindOutcome, BindError> {
    bind_vfio_with(host, &mut LiveKernel, bdf, opts)
}

fn write(k: &mut dyn KernelOps, path: PathBuf, value: &str) -> Result<(), BindError> {
    k.write_attr(&path, value).map_err(|source| BindError::Write {
        path,
        value: value.to_owned(),
        source,
    })
}

/// The type1 IOMMU backend of VFIO, needed to use a container when an IOMMU is on.
pub const VFIO_IOMMU_TYPE1: &str = "vfio_iommu_type1";

/// The modules binding needs that are not loaded: `vfio-pci` when
/// `/sys/bus/pci/drivers/vfio-pci` is missing, and `vfio_iommu_type1` when an IOMMU is on and
/// `/sys/module/vfio_iommu_type1` is missing (kmod's `modprobe vfio-pci` pulls it in through a
/// soft dependency; `busybox modprobe` does not).
pub fn missing_modules(host: &Host) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !host.pci_driver_dir(VFIO_PCI).is_dir() {
        v.push(VFIO_PCI);
    }
    if !iommu_units(host).is_empty() && !host.sys.join("module").join(VFIO_IOMMU_TYPE1).is_dir() {
        v.push(VFIO_IOMMU_TYPE1);
    }
    v
}

/// Loads the [`missing_modules`]; returns those it loaded. Failing to load `vfio-pci` is an error
/// ([`BindError::VfioPciMissing`]); failing to load `vfio_iommu_type1` only a warning, since
/// binding works without it (opening the container does not; `vfpoll doctor` says so).
pub fn ensure_vfio_pci(host: &Host, k: &mut dyn KernelOps) -> Result<Vec<&'static str>, BindError> {
    let mut loaded = Vec::new();
    for m in missing_modules(host) {
        log::info!("{m} is not loaded; loading it");
        let r = k.load_module(m);
        if m == VFIO_PCI {
            if !host.pci_driver_dir(VFIO_PCI).is_dir() {
                let detail = match r {
                    Err(e) => e,
                    Ok(()) => "the loader succeeded but the driver did not appear".to_owned(),
                };
                return Err(BindError::VfioPciMissing { detail });
            }
        } else if let Err(e) = r {
            log::warn!("cannot load {m}: {e}");
            continue;
        }
        loaded.push(m);
    }
    Ok(loaded)
}

/// Binds `bdf` to `vfio-pci`: checks it ([`preflight`]), loads `vfio-pci` if needed, records the
/// driver it had, moves it, and waits (up to [`BindOptions::settle`]) for its VFIO group node.
/// Binding a device that is already on `vfio-pci` succeeds and changes nothing.
pub fn bind_vfio_with(
    host: &Host,
    k: &mut dyn KernelOps,
    bdf: Bdf,
    opts: &BindOptions,
) -> Result<BindOutcome, BindError> {
    let plan = preflight(host, bdf, opts.force)?;
    let dev = plan.device;
    if plan.already_bound {
        let group_node = dev.iommu_group.and_then(|g| group_node(host, g));
        return Ok(BindOutcome {
            bdf,
            action: BindAction::AlreadyBound,
            before: dev.driver.clone(),
            after: dev.driver,
            group: dev.iommu_group,
            group_node,
        });
    }
    for u in &plan.forced_over {
        log::warn!("{bdf}: binding although {u} (--force)");
    }
    ensure_vfio_pci(host, k)?;
    if dev.iommu_group.is_none() && noiommu(host) != NoIommu::On {
        return Err(BindError::NoIommu { bdf });
    }
    state::record(&opts.state_dir, bdf, dev.driver.as_deref())?;

    let dir = host.pci_device_dir(bdf);
    write(k, dir.join("driver_override"), VFIO_PCI)?;
    if dev.driver.is_some() {
        write(k, dir.join("driver/unbind"), &bdf.to_string())?;
    }
    write(k, host.sys.join("bus/pci/drivers_probe"), &bdf.to_string())?;

    let start = Instant::now();
    loop {
        let now = sysfs::device(host, bdf)?;
        if now.driver.as_deref() != Some(VFIO_PCI) {
            // The probe is synchronous: if vfio-pci does not hold the device now, it refused it.
            let restored = roll_back(host, k, bdf)?;
            return Err(BindError::NotTaken {
                bdf,
                now: drv(&now.driver).to_owned(),
                restored,
            });
        }
        if let Some(node) = now.iommu_group.and_then(|g| group_node(host, g)) {
            log::info!("{bdf}: {} -> {VFIO_PCI}, {}", drv(&dev.driver), node.display());
            return Ok(BindOutcome {
                bdf,
                action: BindAction::Bound,
                before: dev.driver,
                after: now.driver,
                group: now.iommu_group,
                group_node: Some(node),
            });
        }
        if start.elapsed() >= opts.settle {
            let vfio = host.dev.join("vfio");
            if !vfio.is_dir() {
                return Err(BindError::NoVfioDev { path: vfio });
            }
            let group = now.iommu_group.map_or("none".to_owned(), |g| g.to_string());
            return Err(BindError::GroupNodeMissing {
                bdf,
                group,
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Clears the override and probes again after a failed bind; returns the driver the device has
/// afterwards.
fn roll_back(host: &Host, k: &mut dyn KernelOps, bdf: Bdf) -> Result<String, BindError> {
    let dir = host.pci_device_dir(bdf);
    write(k, dir.join("driver_override"), "\n")?;
    write(k, host.sys.join("bus/pci/drivers_probe"), &bdf.to_string())?;
    Ok(drv(&sysfs::device(host, bdf)?.driver).to_owned())
}

/// Gives `bdf` back to the kernel on the running system; see [`unbind_to_kernel_with`].
pub fn unbind_to_kernel(host: &Host, bdf: Bdf, opts: &BindOptions) -> Result<BindOutcome, BindError> {
    unbind_to_kernel_with(host, &mut LiveKernel, bdf, opts)
}

/// Gives `bdf` back to its kernel driver: clears `driver_override`, unbinds `vfio-pci` and probes.
/// When vfpoll recorded the original driver and that driver does not take the device, loads its
/// module and probes once more, then fails with [`BindError::NotReturned`] (keeping the record, so
/// a second call retries). A device that is not on `vfio-pci` (and has no `vfio-pci` override
/// left over, nor a record of a driver it is still waiting for) is left alone.
pub fn unbind_to_kernel_with(
    host: &Host,
    k: &mut dyn KernelOps,
    bdf: Bdf,
    opts: &BindOptions,
) -> Result<BindOutcome, BindError> {
    let dev = sysfs::device(host, bdf)?;
    let original = recorded_driver(&opts.state_dir, bdf)?;
    let outcome = |action, after: Option<String>, group| BindOutcome {
        bdf,
        action,
        before: dev.driver.clone(),
        after,
        group,
        group_node: None,
    };
    let on_vfio = dev.driver.as_deref() == Some(VFIO_PCI) || dev.driver_override.as_deref() == Some(VFIO_PCI);
    // Left without a driver by an earlier give-back whose driver did not come: try again.
    let stranded = dev.driver.is_none() && matches!(original, Some(Some(_)));
    if !on_vfio && !stranded {
        state::forget(&opts.state_dir, bdf)?;
        return Ok(outcome(
            BindAction::NotOnVfio,
            dev.driver.clone(),
            dev.iommu_group,
        ));
    }
    let dir = host.pci_device_dir(bdf);
    if on_vfio {
        write(k, dir.join("driver_override"), "\n")?;
        if dev.driver.is_some() {
            write(k, dir.join("driver/unbind"), &bdf.to_string())?;
        }
    }
    write(k, host.sys.join("bus/pci/drivers_probe"), &bdf.to_string())?;
    let mut now = sysfs::device(host, bdf)?;
    if let Some(Some(expected)) = &original {
        if now.driver.is_none() {
            log::info!("{bdf}: {expected} did not take it back; loading {expected}");
            if let Err(e) = k.load_module(expected) {
                log::warn!("loading {expected}: {e}");
            }
            write(k, host.sys.join("bus/pci/drivers_probe"), &bdf.to_string())?;
            now = sysfs::device(host, bdf)?;
        }
        if now.driver.as_deref() != Some(expected) {
            return Err(BindError::NotReturned {
                bdf,
                expected: expected.clone(),
                now: drv(&now.driver).to_owned(),
            });
        }
    }
    state::forget(&opts.state_dir, bdf)?;
    log::info!("{bdf}: {VFIO_PCI} -> {}", drv(&now.driver));
    Ok(outcome(BindAction::Returned, now.driver, now.iommu_group))
}

/// Reads a small attribute file; `None` when absent.
fn read_opt(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

#[cfg(test)]
mod tests;
