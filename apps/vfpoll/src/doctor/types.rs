//! What the doctor's checks take and give: the options ([`Args`]), who runs them
//! ([`Process`]) and their findings ([`Finding`], [`Level`]). The bottom of `doctor`: the
//! general checks (in `doctor.rs`), `backend` and `user` import it.

use std::fmt;
use std::path::Path;

use nix::unistd::{eaccess, AccessFlags};
use vfpoll_hugepages::{self as hp, Memlock};
use vfpoll_pci::bind::VFIO_PCI;
use vfpoll_pci::{sysfs, Bdf, Host};

/// `vfpoll doctor` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Check for vfio's no-IOMMU mode instead of an IOMMU (unsafe: devices can DMA anywhere);
    /// the same as --iommu-backend noiommu.
    #[arg(long)]
    pub noiommu: bool,
    /// Check for the run's IOMMU backend: auto (iommufd where /dev/iommu exists and every
    /// device has a VFIO cdev, type1 otherwise), iommufd, type1 or noiommu.
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    pub iommu_backend: vfpoll_pci::vfio::Backend,
    /// Devices the run will use (repeatable). Default: every device on vfio-pci.
    #[arg(long = "device", value_name = "BDF")]
    pub devices: Vec<Bdf>,
    /// Hugepage memory the run needs free, and may pin, in MiB.
    #[arg(long, value_name = "MiB", default_value_t = 64)]
    pub hugepages: u64,
}

impl Args {
    /// The devices of the run: `--device`, or every device on vfio-pci.
    pub fn run_devices(&self, host: &Host) -> Vec<Bdf> {
        if !self.devices.is_empty() {
            return self.devices.clone();
        }
        sysfs::devices(host)
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.driver.as_deref() == Some(VFIO_PCI))
            .map(|d| d.bdf)
            .collect()
    }
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine.
    Ok,
    /// Works, but worth knowing.
    Warn,
    /// A run will fail.
    Fail,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How bad.
    pub level: Level,
    /// Which check (`iommu`, `modules`, a BDF, ...).
    pub check: String,
    /// What was found.
    pub detail: String,
    /// The command or step that fixes it.
    pub fix: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = match self.level {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        write!(f, "{l:<4}  {}: {}", self.check, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n      fix: {fix}")?;
        }
        Ok(())
    }
}

/// Who runs the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Effective user ID.
    pub euid: u32,
    /// Whether it has CAP_IPC_LOCK; `None` if unknown.
    pub cap_ipc_lock: Option<bool>,
    /// Its memlock limit.
    pub memlock: Memlock,
}

impl Process {
    /// This process.
    pub fn current(host: &Host) -> anyhow::Result<Self> {
        Ok(Process {
            euid: nix::unistd::geteuid().as_raw(),
            cap_ipc_lock: hp::cap_ipc_lock(host),
            memlock: Memlock::current()?,
        })
    }
}

/// A finding of `level` for `check`.
pub(crate) fn finding(level: Level, check: &str, detail: impl Into<String>, fix: Option<String>) -> Finding {
    Finding {
        level,
        check: check.to_owned(),
        detail: detail.into(),
        fix,
    }
}

/// Whether this process may read and write `p`.
pub(crate) fn rw(p: &Path) -> bool {
    eaccess(p, AccessFlags::R_OK | AccessFlags::W_OK).is_ok()
}
