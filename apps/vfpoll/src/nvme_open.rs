//! Opening an NVMe controller from the command line: the options every NVMe subcommand shares.

use std::sync::Arc;

use crate::units::parse_page_size;
use anyhow::Context as _;
use clap::Args as ClapArgs;
use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions};
use vfpoll_pci::vfio::{Backend, Container};
use vfpoll_pci::Bdf;

/// Which controller, and how to reach it.
#[derive(Debug, Clone, ClapArgs)]
pub struct DeviceArgs {
    /// The NVMe controller (PCI address, e.g. 0000:00:03.0), bound to vfio-pci (`vfpoll bind`).
    #[arg(long, short = 'd', value_name = "BDF")]
    pub device: Bdf,
    /// Use VFIO's no-IOMMU mode (the device sees physical addresses; needs root and
    /// enable_unsafe_noiommu_mode): the same as --iommu-backend noiommu. Without it, vfpoll uses
    /// the IOMMU and refuses devices in no-IOMMU groups.
    #[arg(long)]
    pub noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP)]
    pub iommu_backend: Backend,
    /// Page size of the DMA memory for queues and buffers: 2M (hugepages, the default), 1G, or
    /// 4K (no hugepages needed; only behind an IOMMU).
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    pub page_size: PageSize,
}

impl DeviceArgs {
    /// Opens a container (the backend chosen for the device: [`crate::iommu_backend::open`]),
    /// the controller, and brings it up.
    pub fn open(&self) -> anyhow::Result<(Controller, DmaContext, Arc<Container>)> {
        let (container, _) = crate::iommu_backend::open(self.noiommu, self.iommu_backend, &[self.device])?;
        let opts = ControllerOptions {
            page_size: self.page_size,
            ..Default::default()
        };
        let (ctrl, dma) = Controller::open_first(&container, self.device, opts)
            .with_context(|| format!("bringing up the NVMe controller {}", self.device))?;
        Ok((ctrl, dma, container))
    }
}
