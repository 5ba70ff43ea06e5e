//! `--iommu-backend auto|iommufd|type1|noiommu` (and its older synonym `--noiommu`): which IOMMU
//! backend a command that opens devices uses, and opening the container with it.

use std::sync::Arc;

use anyhow::Context as _;
use vfpoll_pci::vfio::{Backend, BackendChoice, Container};
use vfpoll_pci::{Bdf, Host};

/// The help text of `--iommu-backend`, the same on every command.
pub const HELP: &str = "IOMMU backend: auto (iommufd where /dev/iommu exists and every device has a VFIO \
cdev, /dev/vfio/devices/vfioN; the type1 container otherwise), iommufd, type1, or noiommu (VFIO's unsafe \
no-IOMMU mode, the same as --noiommu). iommufd cannot map a peer device's BAR (P2P): use type1 for that";

/// The backend asked for: `--noiommu` is `--iommu-backend noiommu`, and may not be combined with
/// another backend.
pub fn requested(noiommu: bool, backend: Backend) -> anyhow::Result<Backend> {
    match (noiommu, backend) {
        (false, b) => Ok(b),
        (true, Backend::Auto | Backend::NoIommu) => Ok(Backend::NoIommu),
        (true, b) => anyhow::bail!(
            "--noiommu and --iommu-backend {b} contradict each other: --noiommu means --iommu-backend noiommu"
        ),
    }
}

/// The choice for `devices` on `host` ([`Backend::choose`]).
pub fn choose(
    host: &Host,
    noiommu: bool,
    backend: Backend,
    devices: &[Bdf],
) -> anyhow::Result<BackendChoice> {
    Ok(requested(noiommu, backend)?.choose(host, devices))
}

/// Chooses the backend for `devices` and opens the container with it; the error names the
/// backend and why it was chosen.
pub fn open(
    noiommu: bool,
    backend: Backend,
    devices: &[Bdf],
) -> anyhow::Result<(Arc<Container>, BackendChoice)> {
    let choice = choose(&Host::default(), noiommu, backend, devices)?;
    log::info!("IOMMU backend: {choice}");
    let c = Container::open(choice.mode).with_context(|| {
        format!(
            "opening the VFIO container (backend {}: {})",
            choice.mode.name(),
            choice.why
        )
    })?;
    Ok((c, choice))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noiommu_is_a_synonym_and_contradictions_are_refused() {
        assert_eq!(requested(false, Backend::Auto).unwrap(), Backend::Auto);
        assert_eq!(requested(true, Backend::Auto).unwrap(), Backend::NoIommu);
        assert_eq!(requested(true, Backend::NoIommu).unwrap(), Backend::NoIommu);
        assert_eq!(requested(false, Backend::Iommufd).unwrap(), Backend::Iommufd);
        let e = requested(true, Backend::Iommufd).unwrap_err().to_string();
        assert!(e.contains("--noiommu means --iommu-backend noiommu"), "{e}");
    }
}
