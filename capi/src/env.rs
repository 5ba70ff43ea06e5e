//! The environment (one VFIO container and its DMA context) and controllers opened in it, with
//! their identify data in C's shape. Safe code: the entry points in [`crate::ffi`] turn handles
//! into references and call these.

#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::format::{Access, PiFormat, PiMode, PiType, Refusal};
use vfpoll_nvme::{zns, Controller, ControllerOptions, Namespace, MAX_QUEUE_ENTRIES};
use vfpoll_pci::vfio::{Backend, Container};
use vfpoll_pci::{Bdf, Host};

use crate::error::{Error, Res};
use crate::types::*;

/// What every handle of one environment shares.
pub(crate) struct Env {
    /// The VFIO container (`None` for an environment over a device model, in tests).
    container: Option<Arc<Container>>,
    /// The container's DMA context: made when the first controller is opened (it needs the
    /// IOMMU's IOVA ranges, which VFIO reports once a device is attached), shared afterwards.
    dma: Mutex<Option<DmaContext>>,
    /// Page size of every DMA allocation (queues, pools).
    pub page_size: PageSize,
}

impl Env {
    /// An environment over a DMA context of its own and no container: for controllers brought
    /// up over an in-process device model.
    #[cfg(test)]
    pub fn for_model(dma: DmaContext, page_size: PageSize) -> Arc<Env> {
        Arc::new(Env {
            container: None,
            dma: Mutex::new(Some(dma)),
            page_size,
        })
    }
}

/// An environment: see `vfpoll_env_open`.
pub struct vfpoll_env {
    pub(crate) env: Arc<Env>,
}

/// An open NVMe controller: see `vfpoll_ctrl_open`.
pub struct vfpoll_ctrl {
    pub(crate) ctrl: Controller,
    pub(crate) env: Arc<Env>,
}

/// The IOMMU backend for a `VFPOLL_IOMMU_*` value.
pub(crate) fn iommu_mode(v: u32) -> Res<Backend> {
    match v {
        VFPOLL_IOMMU_TYPE1 => Ok(Backend::Type1),
        VFPOLL_IOMMU_NONE => Ok(Backend::NoIommu),
        VFPOLL_IOMMU_IOMMUFD => Ok(Backend::Iommufd),
        VFPOLL_IOMMU_AUTO => Ok(Backend::Auto),
        _ => Err(Error::inval(format!(
            "IOMMU mode {v} is not VFPOLL_IOMMU_TYPE1 (0), VFPOLL_IOMMU_NONE (1), VFPOLL_IOMMU_IOMMUFD (2) or VFPOLL_IOMMU_AUTO (3)"
        ))),
    }
}

/// The page size for a `VFPOLL_PAGE_*` value.
pub(crate) fn page_size(v: u32) -> Res<PageSize> {
    match v {
        VFPOLL_PAGE_4K => Ok(PageSize::Base4K),
        VFPOLL_PAGE_2M => Ok(PageSize::Huge2M),
        VFPOLL_PAGE_1G => Ok(PageSize::Huge1G),
        _ => Err(Error::inval(format!(
            "page size {v} is not VFPOLL_PAGE_4K (0), VFPOLL_PAGE_2M (1) or VFPOLL_PAGE_1G (2)"
        ))),
    }
}

impl vfpoll_env {
    /// Opens a VFIO container with `backend` (auto: chosen for the devices on vfio-pci in
    /// general, since the controllers are opened later).
    pub(crate) fn open(backend: Backend, page_size: PageSize) -> Res<Self> {
        let choice = backend.choose(&Host::default(), &[]);
        log::info!("IOMMU backend: {choice}");
        let container = Container::open(choice.mode)?;
        Ok(vfpoll_env {
            env: Arc::new(Env {
                container: Some(container),
                dma: Mutex::new(None),
                page_size,
            }),
        })
    }

    /// Opens and brings up the controller at `addr` (a PCI address).
    pub(crate) fn open_ctrl(&self, addr: &str) -> Res<vfpoll_ctrl> {
        let bdf: Bdf = addr.parse().map_err(|e| {
            Error::inval(format!(
                "{e}; give the controller's PCI address as domain:bus:device.function, e.g. 0000:00:03.0"
            ))
        })?;
        let Some(container) = &self.env.container else {
            return Err(Error::inval(
                "this environment has no VFIO container (it drives an in-process device model)",
            ));
        };
        let opts = ControllerOptions {
            page_size: self.env.page_size,
            ..Default::default()
        };
        // Held across bring-up: two threads opening the first two controllers must not make
        // two DMA contexts over one container (they would hand out the same IOVAs).
        let mut dma = self.env.dma.lock().unwrap_or_else(|e| e.into_inner());
        let ctrl = match &*dma {
            Some(d) => Controller::open(container, bdf, d.clone(), opts)?,
            None => {
                let (c, d) = Controller::open_first(container, bdf, opts)?;
                *dma = Some(d);
                c
            }
        };
        Ok(vfpoll_ctrl {
            ctrl,
            env: Arc::clone(&self.env),
        })
    }
}

/// Copies `s` into `dst` as a NUL-terminated C string, cut to fit.
fn c_string<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let s = s.trim_end();
    let n = s.len().min(N - 1);
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n..].fill(0);
}

impl vfpoll_ctrl {
    /// The controller's identify data.
    pub(crate) fn info(&self) -> vfpoll_ctrl_info {
        let c = &self.ctrl;
        let id = c.identify();
        let mut info = vfpoll_ctrl_info {
            vid: id.vid,
            ssvid: id.ssvid,
            cntlid: id.cntlid,
            oncs: id.oncs,
            serial: [0; 21],
            model: [0; 41],
            firmware: [0; 9],
            mdts: id.mdts,
            volatile_write_cache: id.has_volatile_write_cache(),
            version: c.version().0,
            mdts_bytes: c.mdts_bytes().unwrap_or(0) as u64,
            namespace_count: id.nn,
            active_namespaces: c.namespaces().len() as u32,
            max_queue_entries: c.cap().max_queue_entries().min(MAX_QUEUE_ENTRIES as u32),
            io_queues: c.io_queues_granted() as u32,
        };
        c_string(&mut info.serial, &id.serial);
        c_string(&mut info.model, &id.model);
        c_string(&mut info.firmware, &id.firmware);
        info
    }

    /// The active namespace IDs.
    pub(crate) fn namespaces(&self) -> Vec<u32> {
        self.ctrl.namespaces().iter().map(|n| n.nsid).collect()
    }

    fn namespace(&self, nsid: u32) -> Res<Namespace> {
        Ok(self.ctrl.namespace(nsid)?)
    }

    /// Namespace `nsid`'s geometry and format.
    pub(crate) fn ns_info(&self, nsid: u32) -> Res<vfpoll_ns_info> {
        let n = self.namespace(nsid)?;
        let mut info = vfpoll_ns_info {
            nsid,
            lba_size: n.lba_size as u32,
            blocks: n.blocks,
            bytes: n.bytes(),
            metadata_size: n.metadata_size as u32,
            metadata: VFPOLL_MD_NONE,
            pi_type: 0,
            pi_guard_bits: 0,
            pi_first: false,
            format_valid: n.format.is_ok(),
            lba_format: 0,
            lba_format_count: 0,
            command_set: n.command_set,
            zoned: n.zoned.is_some(),
            zone_size: 0,
            max_open_zones: 0,
            max_active_zones: 0,
        };
        if let Ok(f) = &n.format {
            info.lba_format = f.index;
            info.lba_format_count = f.count;
            info.metadata = match (f.metadata_size, f.extended) {
                (0, _) => VFPOLL_MD_NONE,
                (_, true) => VFPOLL_MD_EXTENDED,
                (_, false) => VFPOLL_MD_SEPARATE,
            };
            if let Some(p) = f.protection {
                info.pi_type = match p.ty {
                    PiType::Type1 => 1,
                    PiType::Type2 => 2,
                    PiType::Type3 => 3,
                };
                info.pi_guard_bits = match p.format {
                    PiFormat::Guard16 => 16,
                    PiFormat::Guard32 => 32,
                    PiFormat::Guard64 => 64,
                };
                info.pi_first = p.first;
            }
        }
        if let Some(z) = &n.zoned {
            info.zone_size = z.identify.zone_size;
            info.max_open_zones = z.identify.max_open().unwrap_or(0);
            info.max_active_zones = z.identify.max_active().unwrap_or(0);
        }
        Ok(info)
    }

    /// The data and metadata bytes a read or write of `blocks` blocks of `nsid` moves under
    /// protection mode `pi`, or why the namespace cannot be used for I/O (the queue pair's
    /// own refusal, word for word).
    pub(crate) fn transfer(&self, nsid: u32, pi: PiMode, blocks: u64) -> Res<(u64, u64)> {
        let n = self.namespace(nsid)?;
        let refused = |why: String| {
            let format = match &n.format {
                Ok(f) => f.to_string(),
                Err(e) => format!("unusable format: {e}"),
            };
            Error::new(
                libc::EOPNOTSUPP,
                format!("namespace {nsid} ({format}) cannot be used for I/O: {why}"),
            )
        };
        let format = n.format.map_err(|e| refused(Refusal::BadFormat(e).to_string()))?;
        match n.command_set {
            zns::CSI_NVM => {}
            zns::CSI_ZONED if n.zoned.is_some() => {}
            csi => return Err(refused(Refusal::CommandSet(csi).to_string())),
        }
        let access = Access::new(&format, pi).map_err(|r| refused(r.to_string()))?;
        Ok(access.transfer(blocks))
    }
}
