//! The guest's DMA translation mode: the one type every part of the test bed names (setup picks
//! the VFIO modules by it, `vm` boots by it, `test` and `bench` loop over it).

/// How DMA is translated in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Emulated VT-d (`intel-iommu`), type1 VFIO containers.
    Iommu,
    /// No vIOMMU; vfio's unsafe no-IOMMU mode (bus address = guest-physical address).
    NoIommu,
    /// Emulated VT-d as [`Mode::Iommu`], with `/dev/iommu` (`iommufd` loaded) and VFIO device
    /// cdevs (`/dev/vfio/devices/vfioN` for each device bound to vfio-pci); only on a guest
    /// kernel with the rebuilt VFIO set ([`crate::setup::GuestKernel::iommufd`]: 6.12).
    Iommufd,
}

impl Mode {
    /// `iommu`, `noiommu` or `iommufd`: the value of `VFPOLL_TESTBED` and the default run
    /// dir's name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iommu => "iommu",
            Mode::NoIommu => "noiommu",
            Mode::Iommufd => "iommufd",
        }
    }

    /// The mode `name` names ([`Mode::name`]).
    pub fn from_name(name: &str) -> Option<Mode> {
        [Mode::Iommu, Mode::NoIommu, Mode::Iommufd]
            .into_iter()
            .find(|m| m.name() == name)
    }

    /// Whether the guest has the emulated VT-d (and QEMU may report vIOMMU faults).
    pub fn viommu(self) -> bool {
        matches!(self, Mode::Iommu | Mode::Iommufd)
    }
}
