//! Which IOMMU backend a run uses: the request ([`Backend`], what `--iommu-backend` names) and
//! the choice made from it on this host ([`BackendChoice`]: an [`IommuMode`] and why).
//!
//! [`Backend::Auto`] takes iommufd where the kernel offers it for every device to be opened
//! (`/dev/iommu` exists and each device has a VFIO cdev, `vfio-dev/vfioN` in sysfs), and the
//! type1 container otherwise. It never takes no-IOMMU mode: that is only used when asked for.

use std::fmt;
use std::str::FromStr;

use super::IommuMode;
use crate::bdf::Bdf;
use crate::sysfs::{self, Host};

/// The IOMMU backend asked for (`--iommu-backend auto|iommufd|type1|noiommu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// iommufd where the kernel offers it for the devices, the type1 container otherwise.
    #[default]
    Auto,
    /// iommufd (`/dev/iommu`, devices opened through `/dev/vfio/devices/vfioN`; Linux 6.6+
    /// with `CONFIG_IOMMUFD` and `CONFIG_VFIO_DEVICE_CDEV`).
    Iommufd,
    /// The VFIO type1 container (`/dev/vfio/vfio` and the group nodes).
    Type1,
    /// No IOMMU (VFIO's unsafe no-IOMMU mode, through the container).
    NoIommu,
}

impl Backend {
    /// The names `FromStr` accepts, as `--iommu-backend` lists them.
    pub const NAMES: [&'static str; 4] = ["auto", "iommufd", "type1", "noiommu"];

    /// The backend for an explicit mode (the inverse of [`BackendChoice::mode`]).
    pub fn of(mode: IommuMode) -> Self {
        match mode {
            IommuMode::Type1 => Backend::Type1,
            IommuMode::Iommufd => Backend::Iommufd,
            IommuMode::NoIommu => Backend::NoIommu,
        }
    }

    /// Decides the mode for opening `devices` on `host` (an empty list: for devices bound to
    /// vfio-pci in general, as `vfpoll status` asks). Looks only at paths; opens nothing, so
    /// the reason can be shown before anything fails. An explicit backend is taken as is:
    /// opening then says what is missing.
    pub fn choose(self, host: &Host, devices: &[Bdf]) -> BackendChoice {
        let (mode, why) = match self {
            Backend::Iommufd => (
                IommuMode::Iommufd,
                "asked for (--iommu-backend iommufd)".to_string(),
            ),
            Backend::Type1 => (IommuMode::Type1, "asked for (--iommu-backend type1)".to_string()),
            Backend::NoIommu => (
                IommuMode::NoIommu,
                "asked for (--iommu-backend noiommu / --noiommu)".to_string(),
            ),
            Backend::Auto => match iommufd_offered(host, devices) {
                Ok(why) => (IommuMode::Iommufd, format!("auto: {why}")),
                Err(why) => (IommuMode::Type1, format!("auto: {why}, so the type1 container")),
            },
        };
        BackendChoice {
            requested: self,
            mode,
            why,
        }
    }
}

/// Whether iommufd can serve `devices`: `Ok(what was seen)` or `Err(what is missing)`.
fn iommufd_offered(host: &Host, devices: &[Bdf]) -> Result<String, String> {
    let dev_iommu = host.dev.join("iommu");
    if !dev_iommu.exists() {
        return Err(format!(
            "{} is missing (iommufd is not loaded: `modprobe iommufd`; the kernel needs CONFIG_IOMMUFD)",
            dev_iommu.display()
        ));
    }
    if devices.is_empty() {
        let dir = host.dev.join("vfio/devices");
        return match std::fs::read_dir(&dir).map(|d| d.count()) {
            Ok(n) if n > 0 => Ok(format!("{} exists and {} holds {n} VFIO device cdev(s)", dev_iommu.display(), dir.display())),
            _ => Err(format!(
                "{} exists but {} holds no VFIO device cdev (no device bound to vfio-pci, or vfio lacks CONFIG_VFIO_DEVICE_CDEV)",
                dev_iommu.display(),
                dir.display()
            )),
        };
    }
    let mut names = Vec::new();
    for &bdf in devices {
        let group = sysfs::device(host, bdf).ok().and_then(|d| d.iommu_group);
        if let Some(g) = group.filter(|g| host.dev.join(format!("vfio/noiommu-{g}")).exists()) {
            return Err(format!("{bdf} is in no-IOMMU group {g} (iommufd needs an IOMMU)"));
        }
        match sysfs::vfio_cdev(host, bdf) {
            Some(n) => names.push(format!("{bdf} is {n}")),
            None => {
                return Err(format!(
                    "{bdf} has no VFIO device cdev (no vfio-dev/ in sysfs: not bound to vfio-pci, or vfio lacks CONFIG_VFIO_DEVICE_CDEV)"
                ))
            }
        }
    }
    Ok(format!(
        "{} exists and every device has a VFIO cdev ({})",
        dev_iommu.display(),
        names.join(", ")
    ))
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Iommufd => "iommufd",
            Backend::Type1 => "type1",
            Backend::NoIommu => "noiommu",
        })
    }
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Backend::Auto),
            "iommufd" => Ok(Backend::Iommufd),
            "type1" | "iommu" => Ok(Backend::Type1),
            "noiommu" | "no-iommu" => Ok(Backend::NoIommu),
            _ => Err(format!(
                "unknown IOMMU backend `{s}`: use one of {}",
                Backend::NAMES.join(", ")
            )),
        }
    }
}

/// The backend a run uses and why ([`Backend::choose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendChoice {
    /// What was asked for.
    pub requested: Backend,
    /// What will be used: pass it to [`super::Container::open`].
    pub mode: IommuMode,
    /// Why, in words (what was seen, what is missing).
    pub why: String,
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.mode, self.why)
    }
}
