//! Can the NVMe controller write straight into GPU memory (peer-to-peer DMA)? What that needs,
//! checked on this machine, and the path a transfer takes.
//!
//! For a device behind an IOMMU to DMA into GPU memory, the GPU memory must be mapped into the
//! device's IOMMU domain. The GPU memory has no CPU mapping vfpoll could hand to VFIO's
//! `MAP_DMA` (unlike another VFIO device's BAR), so the only user-space route is a dma-buf:
//! `cuMemGetHandleForAddressRange` exports the allocation, and iommufd's `IOMMU_IOAS_MAP_FILE`
//! would map it. That needs: an IOMMU; iommufd (`/dev/iommu`) with VFIO's device cdev
//! (`/dev/vfio/devices`); a kernel whose iommufd accepts a dma-buf *from this exporter*; and a
//! queue-pair buffer type over the mapped IOVAs in vfpoll-nvme. In 6.18 `IOMMU_IOAS_MAP_FILE`
//! takes memfds only (it arrived in 6.13); later kernels accept dma-bufs exported by VFIO
//! itself, over a private protocol, and importing other exporters' (such as nvidia's) needs a
//! physical-address interface that was still being written in 2026. Without an IOMMU (VFIO
//! no-IOMMU mode) the controller needs the GPU pages' bus addresses, which only the kernel
//! (`nvidia_p2p_get_pages`, or a dma-buf importer) can learn.
//!
//! So [`Check::path`] is [`DataPath::Staged`] today; the check says exactly what is missing.

use std::fs;
use std::path::Path;

use crate::pipeline::DataPath;

/// One prerequisite of peer-to-peer DMA into GPU memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prerequisite {
    /// What is needed.
    pub what: &'static str,
    /// Whether this machine has it.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// What this machine offers for peer-to-peer DMA into GPU memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Kernel release.
    pub kernel: String,
    /// The prerequisites, in the order they are needed.
    pub items: Vec<Prerequisite>,
}

/// The kernel options that matter, and why.
pub const KERNEL_OPTIONS: &[(&str, &str)] = &[
    (
        "CONFIG_IOMMUFD",
        "iommufd, the IOMMU interface that can map a file",
    ),
    ("CONFIG_VFIO_DEVICE_CDEV", "VFIO devices bound to iommufd"),
    ("CONFIG_VFIO_PCI_DMABUF", "VFIO's dma-buf support (6.19+)"),
    ("CONFIG_DMABUF_MOVE_NOTIFY", "dynamic dma-buf importers"),
    ("CONFIG_PCI_P2PDMA", "peer-to-peer DMA between PCI devices"),
    ("CONFIG_VFIO_NOIOMMU", "VFIO without an IOMMU"),
];

impl Check {
    /// Looks at the machine under `root` (`/` normally; a fake tree in tests). `dmabuf` is the
    /// outcome of exporting a GPU allocation as a dma-buf (`Ok(detail)` or `Err(why)`), when
    /// tried (the item is left out otherwise). `config` is the kernel configuration text, when the caller could read it (it may
    /// be gzip-compressed in `/proc/config.gz`); otherwise `/boot/config-<release>` is read.
    pub fn probe(root: &Path, dmabuf: Option<Result<String, String>>, config: Option<String>) -> Check {
        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap_or_default();
        let exists = |p: &str| root.join(p).exists();
        let kernel = read("proc/sys/kernel/osrelease").trim().to_string();
        let mut items = Vec::new();
        let groups = fs::read_dir(root.join("sys/kernel/iommu_groups"))
            .map(|d| d.count())
            .unwrap_or(0);
        items.push(Prerequisite {
            what: "an IOMMU",
            ok: groups > 0,
            detail: format!("{groups} IOMMU groups in /sys/kernel/iommu_groups"),
        });
        items.push(Prerequisite {
            what: "VFIO",
            ok: exists("dev/vfio/vfio"),
            detail: presence("/dev/vfio/vfio", exists("dev/vfio/vfio")),
        });
        let iommufd = exists("dev/iommu") && exists("sys/module/iommufd");
        items.push(Prerequisite {
            what: "iommufd",
            ok: iommufd,
            detail: format!(
                "{}, {}",
                presence("/dev/iommu", exists("dev/iommu")),
                presence("/sys/module/iommufd", exists("sys/module/iommufd"))
            ),
        });
        items.push(Prerequisite {
            what: "VFIO device cdev (VFIO on iommufd)",
            ok: exists("dev/vfio/devices"),
            detail: presence("/dev/vfio/devices", exists("dev/vfio/devices")),
        });
        let config = config.or_else(|| {
            let p = format!("boot/config-{kernel}");
            fs::read_to_string(root.join(&p)).ok()
        });
        let detail = match &config {
            Some(text) => KERNEL_OPTIONS
                .iter()
                .map(|(opt, _)| format!("{opt}={}", config_value(text, opt)))
                .collect::<Vec<_>>()
                .join(" "),
            None if exists("proc/config.gz") => {
                "only /proc/config.gz (compressed): read it with zcat".to_string()
            }
            None => format!("no /boot/config-{kernel} and no /proc/config.gz"),
        };
        let iommufd_cfg = config
            .as_deref()
            .is_some_and(|t| matches!(config_value(t, "CONFIG_IOMMUFD"), "y" | "m"));
        items.push(Prerequisite {
            what: "kernel built with iommufd",
            ok: iommufd_cfg,
            detail,
        });
        if let Some(r) = dmabuf {
            let (ok, detail) = match r {
                Ok(d) => (true, d),
                Err(e) => (false, e),
            };
            items.push(Prerequisite {
                what: "GPU memory exported as a dma-buf",
                ok,
                detail,
            });
        }
        items.push(Prerequisite {
            what: "iommufd importing the GPU's dma-buf (IOMMU_IOAS_MAP_FILE)",
            ok: false,
            detail: format!(
                "kernel {kernel}: IOMMU_IOAS_MAP_FILE maps memfds only; the dma-buf import of later kernels (6.19+) takes VFIO-exported dma-bufs only, not the GPU driver's"
            ),
        });
        items.push(Prerequisite {
            what: "vfpoll NVMe buffers in GPU memory",
            ok: false,
            detail: "not implemented: needs a vfpoll_nvme buffer type over IOVAs mapped from a dma-buf"
                .into(),
        });
        Check { kernel, items }
    }

    /// Whether every prerequisite is met.
    pub fn possible(&self) -> bool {
        self.items.iter().all(|i| i.ok)
    }

    /// The prerequisites that are missing.
    pub fn missing(&self) -> impl Iterator<Item = &Prerequisite> {
        self.items.iter().filter(|i| !i.ok)
    }

    /// The path a transfer takes here: peer-to-peer when possible, staged otherwise.
    pub fn path(&self) -> DataPath {
        if self.possible() {
            DataPath::PeerToPeer
        } else {
            DataPath::Staged
        }
    }
}

fn presence(path: &str, there: bool) -> String {
    format!("{path} {}", if there { "present" } else { "absent" })
}

/// The value of `opt` in a kernel configuration: `y`, `m`, a string, or `n` when unset.
pub fn config_value<'a>(text: &'a str, opt: &str) -> &'a str {
    for line in text.lines() {
        if let Some(v) = line.strip_prefix(opt).and_then(|r| r.strip_prefix('=')) {
            return v.trim();
        }
    }
    "n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_machine_is_staged_with_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        fs::write(root.join("proc/sys/kernel/osrelease"), "6.18.44\n").unwrap();
        fs::create_dir_all(root.join("boot")).unwrap();
        fs::write(
            root.join("boot/config-6.18.44"),
            "CONFIG_IOMMUFD=y\n# CONFIG_VFIO_DEVICE_CDEV is not set\nCONFIG_PCI_P2PDMA=y\n",
        )
        .unwrap();
        let c = Check::probe(root, Some(Ok("fd 7".into())), None);
        assert_eq!(c.kernel, "6.18.44");
        assert_eq!(c.path(), DataPath::Staged);
        let missing: Vec<_> = c.missing().map(|i| i.what).collect();
        assert!(missing.contains(&"an IOMMU"), "{missing:?}");
        assert!(missing.contains(&"iommufd"), "{missing:?}");
        assert!(!missing.contains(&"kernel built with iommufd"), "{missing:?}");
        assert!(!missing.contains(&"GPU memory exported as a dma-buf"));
        let cfg = &c
            .items
            .iter()
            .find(|i| i.what == "kernel built with iommufd")
            .unwrap()
            .detail;
        assert!(
            cfg.contains("CONFIG_IOMMUFD=y") && cfg.contains("CONFIG_VFIO_DEVICE_CDEV=n"),
            "{cfg}"
        );
    }

    #[test]
    fn config_values() {
        let t = "CONFIG_A=y\nCONFIG_AB=m\n# CONFIG_C is not set\n";
        assert_eq!(config_value(t, "CONFIG_A"), "y");
        assert_eq!(config_value(t, "CONFIG_AB"), "m");
        assert_eq!(config_value(t, "CONFIG_C"), "n");
    }
}
