//! `vfpoll doctor`: the IOMMU backend. Which backend a run would use and why
//! ([`vfpoll_pci::vfio::Backend::choose`], as the device commands choose), and what that backend
//! needs: for iommufd, `/dev/iommu` and each device's VFIO cdev, read-write (the type1
//! container and group nodes are checked in `doctor.rs`).

use vfpoll_pci::vfio::{BackendChoice, IommuMode};
use vfpoll_pci::{sysfs, Host};

use super::types::{finding, rw, Args, Finding, Level};

/// The backend a run with these options would use, or why the options contradict each other.
pub fn choice(host: &Host, a: &Args) -> Result<BackendChoice, String> {
    crate::iommu_backend::choose(host, a.noiommu, a.iommu_backend, &a.run_devices(host))
        .map_err(|e| e.to_string())
}

/// Whether the run would use iommufd (then the type1 container and group nodes are not needed).
pub fn uses_iommufd(host: &Host, a: &Args) -> bool {
    choice(host, a).is_ok_and(|c| c.mode == IommuMode::Iommufd)
}

/// The backend findings.
pub fn check(host: &Host, a: &Args, out: &mut Vec<Finding>) {
    let c = match choice(host, a) {
        Ok(c) => c,
        Err(e) => {
            out.push(finding(
                Level::Fail,
                "backend",
                e,
                Some("drop --noiommu or --iommu-backend".into()),
            ));
            return;
        }
    };
    out.push(finding(
        Level::Ok,
        "backend",
        format!("a run uses {}: {}", c.mode.name(), c.why),
        None,
    ));
    if c.mode != IommuMode::Iommufd {
        return;
    }
    let type1 = "or run with --iommu-backend type1";
    let dev_iommu = host.dev.join("iommu");
    out.push(if !dev_iommu.exists() {
        finding(
            Level::Fail,
            "/dev/iommu",
            format!("{} is missing: iommufd is not loaded", dev_iommu.display()),
            Some(format!(
                "modprobe iommufd (the kernel needs CONFIG_IOMMUFD), {type1}"
            )),
        )
    } else if !rw(&dev_iommu) {
        finding(
            Level::Fail,
            "/dev/iommu",
            format!("{} is not read-write for this user", dev_iommu.display()),
            Some("run as root, or give the user the devices: vfpoll setup --user NAME".into()),
        )
    } else {
        finding(
            Level::Ok,
            "/dev/iommu",
            "present and read-write (iommufd); it cannot map a peer device's BAR for P2P DMA (Linux 6.12): runs that need that use --iommu-backend type1",
            None,
        )
    });
    for bdf in a.run_devices(host) {
        let check = format!("{bdf} cdev");
        let Some(name) = sysfs::vfio_cdev(host, bdf) else {
            out.push(finding(
                Level::Fail,
                &check,
                "no VFIO device cdev (no vfio-dev/ in sysfs): not bound to vfio-pci, or vfio lacks CONFIG_VFIO_DEVICE_CDEV",
                Some(format!("vfpoll bind {bdf}, {type1}")),
            ));
            continue;
        };
        let node = host.dev.join("vfio/devices").join(&name);
        out.push(if !node.exists() {
            finding(
                Level::Fail,
                &check,
                format!("{} is missing", node.display()),
                Some("check that devtmpfs is mounted on /dev; vfpoll reset then vfpoll bind".into()),
            )
        } else if !rw(&node) {
            finding(
                Level::Fail,
                &check,
                format!("{} is not read-write for this user", node.display()),
                Some("run as root, or give the user the devices: vfpoll setup --user NAME".into()),
            )
        } else {
            finding(
                Level::Ok,
                &check,
                format!(
                    "{} read-write (iommufd opens the device through it)",
                    node.display()
                ),
                None,
            )
        });
    }
}
