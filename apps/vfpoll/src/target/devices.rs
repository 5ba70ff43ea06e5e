//! The storage behind `vfpoll target`'s namespaces: NVMe controllers opened once through VFIO
//! (one queue pair per worker and namespace) and RAM, kept for the life of the process so a
//! reload (SIGHUP) can add namespaces without touching the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context as _};
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_nvme::{CompletionMode, Controller, ControllerOptions, QpairOptions};
use vfpoll_nvmf::backend::{Backend, MallocBackend, NvmeBackend};
use vfpoll_nvmf::fabrics::NamespaceInfo;
use vfpoll_pci::vfio::{Backend as IommuBackend, Container};
use vfpoll_pci::Bdf;

use super::plan::{NsPlan, Source};

/// The controllers and RAM the target's namespaces live on, and the DMA context its data
/// buffers come from.
pub struct Devices {
    page_size: PageSize,
    completion: CompletionMode,
    container: Option<Arc<Container>>,
    dma: DmaContext,
    // Dropped before the container (field order).
    ctrls: HashMap<Bdf, Controller>,
    storage: HashMap<(String, u32), Arc<Mutex<Vec<u8>>>>,
}

impl Devices {
    /// Opens the VFIO container when NVMe namespaces are to be served (`nvme`); RAM alone
    /// needs no device, and its buffers are mapped for none.
    /// `backend` chooses the IOMMU backend for devices bound to vfio-pci in general (the
    /// namespaces' controllers are opened later, on reloads too).
    pub fn new(nvme: bool, backend: IommuBackend, page_size: PageSize, irq: bool) -> anyhow::Result<Devices> {
        let (container, dma) = if nvme {
            let (c, _) = crate::iommu_backend::open(false, backend, &[])?;
            let dma = DmaContext::new(c.clone());
            (Some(c), dma)
        } else {
            // RAM namespaces are copied through the buffers by the CPU: no device maps them.
            (None, DmaContext::new(Arc::new(FakeMapper::new())))
        };
        Ok(Devices {
            page_size,
            completion: if irq {
                CompletionMode::Irq
            } else {
                CompletionMode::Poll
            },
            container,
            dma,
            ctrls: HashMap::new(),
            storage: HashMap::new(),
        })
    }

    /// The DMA context of the workers' buffer pools.
    pub fn dma(&self) -> &DmaContext {
        &self.dma
    }

    /// The namespace `ns` of subsystem `nqn` as the target reports it, and one backend per
    /// worker for it (`workers` of them).
    pub fn namespace(
        &mut self,
        nqn: &str,
        ns: &NsPlan,
        workers: usize,
    ) -> anyhow::Result<(NamespaceInfo, Vec<Box<dyn Backend>>)> {
        let name = ns.source.to_string();
        match ns.source {
            Source::Nvme { bdf, nsid } => {
                let Some(container) = self.container.clone() else {
                    bail!("{name}: the target started with RAM namespaces only, so its buffers are mapped for no device; restart it to serve an NVMe namespace");
                };
                let ctrl = match self.ctrls.entry(bdf) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        let opts = ControllerOptions {
                            page_size: self.page_size,
                            ..Default::default()
                        };
                        let c = Controller::open(&container, bdf, self.dma.clone(), opts)
                            .with_context(|| format!("bringing up the NVMe controller {bdf}"))?;
                        v.insert(c)
                    }
                };
                let geo = ctrl
                    .namespace(nsid)
                    .with_context(|| format!("namespace {nsid} of {bdf}"))?;
                let format = geo
                    .format
                    .map_err(|e| anyhow::anyhow!("namespace {nsid} of {bdf}: {e}"))?;
                let mut info = NamespaceInfo::from_format(nqn, ns.nsid, &name, &format, geo.blocks)?;
                info.ana_group = ns.ana_group;
                let vwc = ctrl.identify().vwc & 1 == 1;
                let mut backends: Vec<Box<dyn Backend>> = Vec::new();
                for w in 0..workers {
                    let opts = QpairOptions {
                        completion: self.completion,
                        ..QpairOptions::default()
                    };
                    let qp = ctrl.create_qpair(&opts).with_context(|| {
                        format!(
                            "creating worker {w}'s I/O queue pair on {bdf} for {nqn} namespace {}",
                            ns.nsid
                        )
                    })?;
                    backends.push(Box::new(NvmeBackend::new(
                        qp,
                        nsid,
                        geo.lba_size,
                        geo.blocks,
                        vwc,
                    )));
                }
                Ok((info, backends))
            }
            Source::Malloc { bytes, block_size } => {
                let bytes = usize::try_from(bytes).context("malloc: larger than this machine's memory")?;
                let blocks = (bytes / block_size as usize) as u64;
                if blocks == 0 {
                    bail!("{name}: holds no block of {block_size} bytes");
                }
                let mut info = NamespaceInfo::new(nqn, ns.nsid, "malloc", block_size, blocks);
                info.write_zeroes = true;
                info.deallocate = true;
                info.ana_group = ns.ana_group;
                // A namespace re-added under the same NQN and NSID keeps its data only if it
                // has the same size; otherwise it starts zeroed.
                let key = (nqn.to_owned(), ns.nsid);
                let want = blocks as usize * block_size as usize;
                let storage = match self.storage.get(&key) {
                    Some(s) if s.lock().map(|v| v.len() == want).unwrap_or(false) => s.clone(),
                    _ => {
                        let s = MallocBackend::storage(want);
                        self.storage.insert(key, s.clone());
                        s
                    }
                };
                let backends = (0..workers)
                    .map(|_| {
                        Box::new(MallocBackend::new(storage.clone(), block_size as usize)) as Box<dyn Backend>
                    })
                    .collect();
                Ok((info, backends))
            }
        }
    }
}
