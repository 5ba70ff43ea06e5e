//! Bringing a port up: which driver a PCI device needs ([`probe`]) and opening it with that
//! driver ([`Port::open`], [`Port::open_all`]). It sits above both drivers, which build on
//! the device-independent API in [`crate::port`] and know nothing of each other.

use std::sync::Arc;

use vfpoll_dma::DmaContext;
use vfpoll_pci::vfio::{Container, Device};
use vfpoll_pci::{sysfs, Bdf, Host};

use crate::e1000e;
use crate::error::{NicError, Result};
use crate::pool::Mempool;
use crate::port::{Port, PortOptions};
use crate::virtio;

/// The NICs this crate drives, as text for error messages.
pub const SUPPORTED: &str = "8086:10d3 Intel 82574L (QEMU `-device e1000e`), 1af4:1041 virtio-net (modern PCI; 1af4:1000 with the modern capabilities)";

/// Which driver a PCI device needs; [`NicError::Unsupported`] names what it is otherwise.
pub fn probe(host: &Host, bdf: Bdf) -> Result<&'static str> {
    let dev = match sysfs::device(host, bdf) {
        Ok(d) => d,
        Err(sysfs::SysfsError::NoSuchDevice { .. }) => return Err(NicError::NoSuchDevice { bdf }),
        Err(e) => return Err(NicError::Vfio(e.into())),
    };
    match (dev.vendor, dev.device) {
        (e1000e::VENDOR_INTEL, e1000e::DEVICE_82574L) => Ok(e1000e::DRIVER),
        (virtio::VENDOR_VIRTIO, virtio::DEVICE_NET_MODERN) => Ok(virtio::DRIVER),
        // Transitional: driven through its modern interface only, so it must have one.
        (virtio::VENDOR_VIRTIO, virtio::DEVICE_NET_TRANSITIONAL)
            if std::fs::read(host.pci_device_dir(bdf).join("config"))
                .is_ok_and(|c| virtio::has_modern_caps(&c)) =>
        {
            Ok(virtio::DRIVER)
        }
        (vendor, device) => Err(NicError::Unsupported {
            bdf,
            vendor,
            device,
            kind: if dev.is_nvme() {
                "an NVMe controller"
            } else if dev.is_network() {
                "a network controller"
            } else {
                dev.kind()
            },
            supported: SUPPORTED,
        }),
    }
}

impl Port {
    /// Brings up the NIC `device` (opened through VFIO; checked with [`probe`]) with buffers
    /// from `pool` and rings from `dma`.
    pub fn open(device: Device, dma: &DmaContext, pool: &Mempool, opts: &PortOptions) -> Result<Self> {
        if probe(device.container().host(), device.bdf())? == virtio::DRIVER {
            virtio::VirtioNet::open_port(device, dma, pool, opts)
        } else {
            e1000e::E1000e::open_port(device, dma, pool, opts)
        }
    }

    /// Opens the NICs `bdfs` through `container`, then makes the container's DMA context and one
    /// packet pool of `pool_bufs` buffers on `opts.page_size` pages that they share, and brings
    /// every port up. Every device is checked ([`probe`]) before any is touched.
    pub fn open_all(
        container: &Arc<Container>,
        bdfs: &[Bdf],
        pool_bufs: usize,
        opts: &PortOptions,
    ) -> Result<(Vec<Port>, Mempool)> {
        for &b in bdfs {
            probe(container.host(), b)?;
        }
        // The DMA context must be made after the first device is open: it reads the IOMMU's
        // IOVA ranges from the container.
        let devices = bdfs
            .iter()
            .map(|&b| container.device(b))
            .collect::<Result<Vec<_>, _>>()?;
        let dma = DmaContext::new(container.clone());
        let pool = Mempool::new(&dma, pool_bufs, opts.page_size)?;
        let ports = devices
            .into_iter()
            .map(|d| Port::open(d, &dma, &pool, opts))
            .collect::<Result<Vec<_>>>()?;
        Ok((ports, pool))
    }
}
