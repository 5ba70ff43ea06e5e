//! Opening a store's namespaces from their spec strings, with the IOMMU backend of the command
//! line (`--iommu-backend`, `--noiommu`), as every other NVMe subcommand does.
//!
//! `vfpoll-store` can open specs itself ([`vfpoll_store::Store::open`]), with the automatic
//! backend; the CLI opens the devices here instead so that `--noiommu` and `--iommu-backend`
//! work, and so that `bench` can drive the same devices without the store for its raw rates.

use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use vfpoll_dma::DmaContext;
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::{Backend, Container};
use vfpoll_pci::Bdf;
use vfpoll_store::device::{Device, MemDevice, NvmeDevice, UringDevice, UringOptions};
use vfpoll_store::NamespaceSpec;

/// How to open the namespaces.
#[derive(Debug, Clone)]
pub struct OpenHow {
    /// VFIO's no-IOMMU mode.
    pub noiommu: bool,
    /// IOMMU backend for `vfio:` namespaces.
    pub backend: Backend,
    /// Queue entries per namespace.
    pub queue_depth: u32,
    /// Open files without O_DIRECT where the file system refuses it.
    pub allow_buffered: bool,
    /// Create missing `file:` namespaces with this size (format only).
    pub create_size: Option<u64>,
    /// Whether `file:` namespaces may be created (format).
    pub create: bool,
}

/// Parses every spec; an error names the bad one and the accepted forms.
pub fn parse_specs(specs: &[String]) -> anyhow::Result<Vec<NamespaceSpec>> {
    if specs.is_empty() {
        bail!("name the store's namespaces, e.g. vfio:0000:00:03.0/1 or file:/data/store.img");
    }
    specs
        .iter()
        .map(|s| NamespaceSpec::from_str(s).map_err(|e| anyhow::anyhow!("{e}")))
        .collect()
}

/// Opens every namespace, in order: `vfio:` controllers share one container (and a controller
/// named twice is opened once), files and block devices go through io_uring.
pub fn open_devices(specs: &[NamespaceSpec], how: &OpenHow) -> anyhow::Result<Vec<Box<dyn Device>>> {
    let bdfs: Vec<Bdf> = specs
        .iter()
        .filter_map(|s| match s {
            NamespaceSpec::Vfio { bdf, .. } => Some(*bdf),
            _ => None,
        })
        .collect();
    let mut container: Option<(Arc<Container>, DmaContext)> = None;
    let mut ctrls: Vec<(Bdf, Controller)> = Vec::new();
    let qopts = QpairOptions {
        entries: how.queue_depth.clamp(8, 1024) as u16,
        ..Default::default()
    };
    let mut out: Vec<Box<dyn Device>> = Vec::with_capacity(specs.len());
    for s in specs {
        let dev: Box<dyn Device> = match s {
            NamespaceSpec::File { path, size } => {
                let o = UringOptions {
                    create_size: if how.create {
                        size.or(how.create_size)
                    } else {
                        None
                    },
                    allow_buffered: how.allow_buffered,
                    queue_depth: how.queue_depth,
                };
                Box::new(UringDevice::open(path, &o).with_context(|| format!("opening {s}"))?)
            }
            NamespaceSpec::Block { path } => {
                let o = UringOptions {
                    create_size: None,
                    allow_buffered: how.allow_buffered,
                    queue_depth: how.queue_depth,
                };
                Box::new(UringDevice::open(path, &o).with_context(|| format!("opening {s}"))?)
            }
            NamespaceSpec::Mem { size } => Box::new(MemDevice::new(size / 4096 * 4096, 512, true)),
            NamespaceSpec::Model { size } => Box::new(model_device(*size, &qopts)?),
            NamespaceSpec::Vfio { bdf, nsid } => {
                let ctrl = match ctrls.iter().find(|(b, _)| b == bdf) {
                    Some((_, c)) => c.clone(),
                    None => {
                        let opts = ControllerOptions::default();
                        let up = || {
                            format!("bringing up the NVMe controller {bdf} (bound to vfio-pci? `vfpoll bind {bdf}`; hugepages reserved? `vfpoll setup`)")
                        };
                        let c = match &container {
                            None => {
                                let (cont, _) = crate::iommu_backend::open(how.noiommu, how.backend, &bdfs)?;
                                let (c, dma) = Controller::open_first(&cont, *bdf, opts).with_context(up)?;
                                container = Some((cont, dma));
                                c
                            }
                            Some((cont, dma)) => {
                                Controller::open(cont, *bdf, dma.clone(), opts).with_context(up)?
                            }
                        };
                        ctrls.push((*bdf, c.clone()));
                        c
                    }
                };
                let keep: Vec<Box<dyn std::any::Any + Send>> = match &container {
                    Some((c, _)) => vec![Box::new(c.clone())],
                    None => vec![],
                };
                Box::new(NvmeDevice::new(&ctrl, *nsid, &qopts, &bdf.to_string(), keep)?)
            }
        };
        out.push(dev);
    }
    Ok(out)
}

/// A namespace of `size` bytes (4 KiB blocks) on vfpoll's in-process NVMe model, through the
/// real driver.
#[cfg(feature = "model")]
fn model_device(size: u64, qopts: &QpairOptions) -> anyhow::Result<NvmeDevice> {
    use crate::model::{ModelConfig, NamespaceConfig, NvmeModel};
    use vfpoll_dma::{FakeMapper, PageSize};

    let blocks = size / 4096;
    if blocks == 0 {
        bail!("model:{size}: a model namespace needs at least 4096 bytes");
    }
    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 4096, blocks)],
        volatile_write_cache: true,
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, mapper.clone()).context("starting the NVMe model")?;
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 1,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts)
        .context("bringing up the model's controller")?;
    Ok(NvmeDevice::new(&ctrl, 1, qopts, "model", vec![Box::new(model)])?)
}

#[cfg(not(feature = "model"))]
fn model_device(size: u64, _: &QpairOptions) -> anyhow::Result<NvmeDevice> {
    Err(crate::model::unavailable(&format!("model:{size}")))
}
