//! VFIO: container, group and device, in IOMMU (type1 or iommufd) or no-IOMMU mode.
//!
//! ```text
//! type1 / no-IOMMU:
//! Container (/dev/vfio/vfio)      one IOMMU domain: DMA map/unmap, IOVA ranges
//!   └─ Group (/dev/vfio/N or /dev/vfio/noiommu-N)   attached on first use; several per container
//!        └─ Device (fd from the group)               regions, BAR mmap, config space, reset
//! iommufd (Linux 6.6+):
//! Container (/dev/iommu + one IOAS)   IOMMU_IOAS_MAP/UNMAP, IOMMU_IOAS_IOVA_RANGES
//!   └─ Device (/dev/vfio/devices/vfioN)  VFIO_DEVICE_BIND_IOMMUFD, then ATTACH_IOMMUFD_PT to the IOAS
//! ```
//!
//! Either way a [`Container`] is one I/O address space shared by every device opened through it,
//! and a [`Device`] offers the same VFIO device API (regions, interrupts, reset) once open. Which
//! backend a run uses is decided by [`Backend::choose`] ([`backend`]). No-IOMMU mode is used only
//! when the caller asks for it ([`IommuMode::NoIommu`]); a device that sits in a no-IOMMU group
//! is refused in type1 and iommufd mode with an error that says so, never silently downgraded.
//! Every system call goes through [`SysOps`], so the same code runs against the fake kernel in
//! [`fake`] in tests.

pub mod backend;
mod error;
pub mod fake;
mod iommufd;
pub mod irq;
pub mod sys;
pub mod uapi;
pub mod watch;

use std::collections::HashMap;
use std::io;
use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::addr::{BusAddr, Iova};
use crate::bdf::Bdf;
use crate::mmio::{BarMapping, Mmio};
use crate::sysfs::{self, Host};
pub use backend::{Backend, BackendChoice};
pub use error::VfioError;
use error::{io_err, open_error};
pub use irq::{EventFd, IrqIndex, IrqInfo, Irqs};
use sys::raw;
pub use sys::{IoctlArg, RealSys, SysOps};
pub use watch::{DeviceEvent, Watch};

/// How devices reach memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IommuMode {
    /// An IOMMU translates device addresses (VFIO type1): DMA targets must be mapped first and
    /// the device sees I/O virtual addresses. The safe default.
    Type1,
    /// An IOMMU translates device addresses, driven through iommufd (`/dev/iommu`, one IOAS)
    /// with devices opened through their VFIO cdev (`/dev/vfio/devices/vfioN`). The same
    /// protection as type1; Linux 6.6+ (`CONFIG_IOMMUFD`, `CONFIG_VFIO_DEVICE_CDEV`). It cannot
    /// map a peer device's BAR for DMA (see [`VfioError::PeerBarUnderIommufd`]).
    Iommufd,
    /// No IOMMU: the device sees physical addresses and can reach all memory. Only on request;
    /// needs root and a kernel with `CONFIG_VFIO_NOIOMMU` and `enable_unsafe_noiommu_mode=1`.
    NoIommu,
}

impl IommuMode {
    /// Whether an IOMMU translates device addresses (type1 or iommufd).
    pub fn has_iommu(self) -> bool {
        self != IommuMode::NoIommu
    }

    /// The backend's short name, as `--iommu-backend` spells it (`type1`, `iommufd`, `noiommu`).
    pub fn name(self) -> &'static str {
        match self {
            IommuMode::Type1 => "type1",
            IommuMode::Iommufd => "iommufd",
            IommuMode::NoIommu => "noiommu",
        }
    }
}

impl std::fmt::Display for IommuMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IommuMode::Type1 => "iommu (type1)",
            IommuMode::Iommufd => "iommu (iommufd)",
            IommuMode::NoIommu => "no-iommu",
        })
    }
}

/// The IOMMU's properties, from `VFIO_IOMMU_GET_INFO` (type1) or `IOMMU_IOAS_IOVA_RANGES`
/// (iommufd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuInfo {
    /// Supported IOMMU page sizes (bit n set = 2^n bytes).
    pub page_sizes: u64,
    /// Usable IOVA windows (inclusive). They already exclude reserved ranges such as the MSI
    /// window, and end at the IOMMU's address width.
    pub iova_ranges: Vec<RangeInclusive<u64>>,
    /// How many more DMA mappings the kernel allows (`dma_entry_limit`), if it says.
    pub dma_avail: Option<u32>,
}

impl IommuInfo {
    /// What a kernel without the IOVA-range capability (older than 5.4) is assumed to offer:
    /// 39 address bits (the smallest common VT-d width) minus the x86 MSI window.
    pub fn fallback() -> Self {
        IommuInfo {
            page_sizes: 0x1000 | 0x20_0000 | 0x4000_0000,
            iova_ranges: vec![0..=0xfedf_ffff, 0xfef0_0000..=(1 << 39) - 1],
            dma_avail: None,
        }
    }

    /// Parses the reply of `VFIO_IOMMU_GET_INFO` (the whole `argsz` buffer).
    pub fn parse(buf: &[u8]) -> Self {
        use uapi::iommu_info as ii;
        let flags = uapi::get_u32(buf, uapi::arg::FLAGS);
        let mut info = IommuInfo::fallback();
        if flags & uapi::IOMMU_INFO_PGSIZES != 0 {
            info.page_sizes = uapi::get_u64(buf, ii::PGSIZES);
        }
        if flags & uapi::IOMMU_INFO_CAPS != 0 {
            for cap in uapi::caps(buf, uapi::get_u32(buf, ii::CAP_OFFSET)) {
                match cap.id {
                    uapi::IOMMU_CAP_IOVA_RANGE if cap.bytes.len() >= ii::IOVA_RANGES => {
                        let n = uapi::get_u32(cap.bytes, ii::NR_IOVAS) as usize;
                        let ranges: Vec<_> = (0..n)
                            .map(|i| ii::IOVA_RANGES + i * ii::RANGE_SIZE)
                            .take_while(|o| o + ii::RANGE_SIZE <= cap.bytes.len())
                            .map(|o| uapi::get_u64(cap.bytes, o)..=uapi::get_u64(cap.bytes, o + 8))
                            .collect();
                        if !ranges.is_empty() {
                            info.iova_ranges = ranges;
                        }
                    }
                    uapi::IOMMU_CAP_DMA_AVAIL if cap.bytes.len() >= ii::DMA_AVAIL + 4 => {
                        info.dma_avail = Some(uapi::get_u32(cap.bytes, ii::DMA_AVAIL));
                    }
                    _ => {}
                }
            }
        }
        info
    }

    /// The smallest page size the IOMMU maps.
    pub fn min_page_size(&self) -> u64 {
        if self.page_sizes == 0 {
            4096
        } else {
            1 << self.page_sizes.trailing_zeros()
        }
    }
}

#[derive(Debug)]
struct Group {
    id: u32,
    fd: OwnedFd,
}

#[derive(Debug)]
struct ContainerState {
    /// Attached groups by id. Groups stay attached until the container is dropped.
    groups: HashMap<u32, Arc<Group>>,
    /// Groups of released devices ([`Device::release`]): still attached (closed with the
    /// container), but no longer found by id, so a device that comes back in a group of the
    /// same number gets a fresh one.
    retired: Vec<Arc<Group>>,
    /// Set once the first group is attached and the IOMMU model chosen (type1), or after each
    /// device attached to the IOAS (iommufd).
    info: Option<IommuInfo>,
    /// iommufd: the device files bound so far, by device, so that a second open of a device
    /// shares the first one's file (a cdev binds once).
    cdevs: HashMap<Bdf, Weak<DevFd>>,
}

/// A VFIO container: one IOMMU domain shared by every device opened through it. In iommufd
/// mode, the iommufd and its one IOAS play that part.
///
/// `Send + Sync`: its state is behind a mutex and file descriptors may be used from any thread.
/// Opening devices and mapping DMA are control-path operations.
#[derive(Debug)]
pub struct Container {
    sys: Arc<dyn SysOps>,
    host: Host,
    /// `/dev/vfio/vfio`, or `/dev/iommu` in iommufd mode.
    fd: OwnedFd,
    mode: IommuMode,
    /// The IOAS every device attaches to (iommufd mode; 0 otherwise).
    ioas: u32,
    state: Mutex<ContainerState>,
}

impl Container {
    /// Opens `/dev/vfio/vfio` on the real kernel and checks it can serve `mode`.
    pub fn open(mode: IommuMode) -> Result<Arc<Self>, VfioError> {
        Self::open_with(Arc::new(RealSys), Host::default(), mode)
    }

    /// Chooses the backend for `devices` ([`Backend::choose`]) and opens it. Returns the
    /// choice too, so that callers can say which backend they use and why.
    pub fn open_backend(backend: Backend, devices: &[Bdf]) -> Result<(Arc<Self>, BackendChoice), VfioError> {
        let host = Host::default();
        let choice = backend.choose(&host, devices);
        log::info!("IOMMU backend: {choice}");
        Ok((Self::open_with(Arc::new(RealSys), host, choice.mode)?, choice))
    }

    /// Like [`Container::open`], with the system calls and paths given (tests, other roots).
    pub fn open_with(sys: Arc<dyn SysOps>, host: Host, mode: IommuMode) -> Result<Arc<Self>, VfioError> {
        if mode == IommuMode::Iommufd {
            return Self::open_iommufd(sys, host);
        }
        let path = host.dev.join("vfio/vfio");
        let fd = sys
            .open(&path)
            .map_err(|e| open_error(e, &path, || VfioError::NoVfio { path: path.clone() }))?;
        let v = sys
            .ioctl(raw(&fd), uapi::req::GET_API_VERSION, IoctlArg::None)
            .map_err(io_err("VFIO_GET_API_VERSION"))?;
        if v != uapi::API_VERSION {
            return Err(VfioError::ApiVersion(v));
        }
        let has = |ext| {
            sys.ioctl(raw(&fd), uapi::req::CHECK_EXTENSION, IoctlArg::Value(ext))
                .map(|r| r > 0)
                .unwrap_or(false)
        };
        match mode {
            IommuMode::Type1 if !has(uapi::TYPE1V2_IOMMU) && !has(uapi::TYPE1_IOMMU) => {
                // Without an attached group the type1 driver may simply not be loaded yet;
                // `VFIO_CHECK_EXTENSION` answers for the drivers registered now.
                return Err(VfioError::NoType1);
            }
            IommuMode::NoIommu if !has(uapi::NOIOMMU_IOMMU) => return Err(VfioError::NoIommuNotEnabled),
            _ => {}
        }
        log::debug!("opened {} in {mode} mode", path.display());
        Ok(Self::new(sys, host, fd, mode, 0))
    }

    fn new(sys: Arc<dyn SysOps>, host: Host, fd: OwnedFd, mode: IommuMode, ioas: u32) -> Arc<Self> {
        Arc::new(Container {
            sys,
            host,
            fd,
            mode,
            ioas,
            state: Mutex::new(ContainerState {
                groups: HashMap::new(),
                retired: Vec::new(),
                info: None,
                cdevs: HashMap::new(),
            }),
        })
    }

    /// The mode chosen at open.
    pub fn mode(&self) -> IommuMode {
        self.mode
    }

    /// The paths of the host this container works on.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The system-call layer (shared with everything opened through this container).
    pub fn sys(&self) -> &Arc<dyn SysOps> {
        &self.sys
    }

    /// The IOMMU's properties; `None` until the first device is opened (the IOMMU model is set
    /// when the first group attaches; an IOAS's ranges narrow with each device attached) and
    /// always `None` in no-IOMMU mode.
    pub fn iommu_info(&self) -> Option<IommuInfo> {
        self.lock().info.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ContainerState> {
        // A panic while holding the lock leaves only plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the device `bdf`, attaching its IOMMU group to this container first if needed
    /// (iommufd: opening its cdev, binding it and attaching it to the IOAS).
    pub fn device(self: &Arc<Self>, bdf: Bdf) -> Result<Device, VfioError> {
        if self.mode == IommuMode::Iommufd {
            return self.iommufd_device(bdf);
        }
        let info = sysfs::device(&self.host, bdf)?;
        let group_id = info.iommu_group.ok_or(VfioError::NoGroup { bdf })?;
        let group = self.attach_group(bdf, group_id)?;
        let mut name = bdf.to_string().into_bytes();
        name.push(0);
        let fd = self
            .sys
            .ioctl_new_fd(
                raw(&group.fd),
                uapi::req::GROUP_GET_DEVICE_FD,
                IoctlArg::Buf(&mut name),
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => VfioError::GroupBusy {
                    bdf,
                    group: group_id,
                    // The group is this process's: another holds the device through its cdev.
                    holders: sysfs::describe_holders(&sysfs::holders(
                        &self.host,
                        &sysfs::vfio_cdev(&self.host, bdf)
                            .map(|n| self.host.dev.join("vfio/devices").join(n))
                            .into_iter()
                            .collect::<Vec<_>>(),
                    )),
                },
                _ => VfioError::Io {
                    what: format!("VFIO_GROUP_GET_DEVICE_FD({bdf})"),
                    source: e,
                },
            })?;
        Device::new(Arc::clone(self), Some(group), Arc::new(DevFd::new(bdf, fd)), bdf)
    }

    /// Retires group `id` once no device uses it: it stays attached (its file open) until the
    /// container is dropped, but a later [`Container::device`] in a group of the same number
    /// opens that afresh. Not detached at once: the kernel is removing the device at that very
    /// moment (detaching would have it change the device's IOMMU context under the removal),
    /// and a group that is the container's last cannot be detached without tearing down the
    /// IOMMU domain and every DMA mapping the process still tracks with it. One rule for both.
    fn retire_group(&self, id: u32) {
        let mut st = self.lock();
        if st.groups.get(&id).is_some_and(|g| Arc::strong_count(g) == 1) {
            let g = st.groups.remove(&id).expect("present");
            st.retired.push(g);
            log::debug!("retired IOMMU group {id}");
        }
    }

    fn attach_group(&self, bdf: Bdf, id: u32) -> Result<Arc<Group>, VfioError> {
        let mut st = self.lock();
        if let Some(g) = st.groups.get(&id) {
            return Ok(Arc::clone(g));
        }
        let real = self.host.dev.join(format!("vfio/{id}"));
        let noiommu = self.host.dev.join(format!("vfio/noiommu-{id}"));
        let path = match self.mode {
            IommuMode::Iommufd => unreachable!("iommufd mode opens devices without their group"),
            IommuMode::Type1 if real.exists() => real,
            IommuMode::Type1 if noiommu.exists() => return Err(VfioError::NoIommuGroup { bdf, group: id }),
            IommuMode::NoIommu if noiommu.exists() => noiommu,
            IommuMode::NoIommu if real.exists() => return Err(VfioError::HasIommu { bdf, group: id }),
            IommuMode::Type1 => return Err(VfioError::NotBound { bdf, path: real }),
            IommuMode::NoIommu => return Err(VfioError::NotBound { bdf, path: noiommu }),
        };
        let fd = self.sys.open(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => VfioError::GroupBusy {
                bdf,
                group: id,
                holders: sysfs::describe_holders(&sysfs::holders(&self.host, std::slice::from_ref(&path))),
            },
            _ => open_error(e, &path, || VfioError::NotBound {
                bdf,
                path: path.clone(),
            }),
        })?;
        let mut status = [0u8; uapi::GROUP_STATUS_SIZE];
        uapi::put_u32(&mut status, uapi::arg::ARGSZ, uapi::GROUP_STATUS_SIZE as u32);
        self.sys
            .ioctl(raw(&fd), uapi::req::GROUP_GET_STATUS, IoctlArg::Buf(&mut status))
            .map_err(io_err(format!("VFIO_GROUP_GET_STATUS({})", path.display())))?;
        if uapi::get_u32(&status, uapi::arg::FLAGS) & uapi::GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                bdf,
                group: id,
                members: self.describe_members(id, bdf),
            });
        }
        let mut cfd = raw(&self.fd).to_ne_bytes();
        self.sys
            .ioctl(raw(&fd), uapi::req::GROUP_SET_CONTAINER, IoctlArg::Buf(&mut cfd))
            .map_err(io_err(format!("VFIO_GROUP_SET_CONTAINER({})", path.display())))?;
        if st.info.is_none() && st.groups.is_empty() {
            self.set_iommu(&mut st)?;
        }
        log::debug!("attached IOMMU group {id} ({})", path.display());
        let g = Arc::new(Group { id, fd });
        st.groups.insert(id, Arc::clone(&g));
        Ok(g)
    }

    /// Chooses the IOMMU model once the first group is attached, and reads the IOMMU's info.
    fn set_iommu(&self, st: &mut ContainerState) -> Result<(), VfioError> {
        let fd = raw(&self.fd);
        let models: &[u64] = match self.mode {
            IommuMode::Type1 | IommuMode::Iommufd => &[uapi::TYPE1V2_IOMMU, uapi::TYPE1_IOMMU],
            IommuMode::NoIommu => &[uapi::NOIOMMU_IOMMU],
        };
        let mut last = None;
        for &m in models {
            match self.sys.ioctl(fd, uapi::req::SET_IOMMU, IoctlArg::Value(m)) {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(VfioError::Io {
                what: "VFIO_SET_IOMMU".into(),
                source: e,
            });
        }
        if self.mode == IommuMode::Type1 {
            st.info = Some(self.query_iommu_info()?);
        }
        Ok(())
    }

    fn query_iommu_info(&self) -> Result<IommuInfo, VfioError> {
        let mut buf = vec![0u8; uapi::IOMMU_INFO_SIZE];
        loop {
            let argsz = buf.len() as u32;
            buf.fill(0);
            uapi::put_u32(&mut buf, uapi::arg::ARGSZ, argsz);
            self.sys
                .ioctl(raw(&self.fd), uapi::req::IOMMU_GET_INFO, IoctlArg::Buf(&mut buf))
                .map_err(io_err("VFIO_IOMMU_GET_INFO"))?;
            // The kernel raises argsz when the capability chain does not fit.
            let want = uapi::get_u32(&buf, uapi::arg::ARGSZ) as usize;
            if want <= buf.len() {
                return Ok(IommuInfo::parse(&buf));
            }
            buf = vec![0u8; want];
        }
    }

    fn describe_members(&self, group: u32, bdf: Bdf) -> String {
        let members = sysfs::group_members(&self.host, group).unwrap_or_default();
        let list: Vec<String> = members
            .into_iter()
            .filter(|m| *m != bdf)
            .map(|m| {
                let drv = sysfs::device(&self.host, m)
                    .ok()
                    .and_then(|d| d.driver)
                    .unwrap_or_else(|| "no driver".into());
                format!("{m} ({drv})")
            })
            .collect();
        if list.is_empty() {
            "the other members of the group".into()
        } else {
            list.join(", ")
        }
    }

    /// Maps `len` bytes at `vaddr` for device access at `iova` (read and write).
    ///
    /// # Safety
    /// The range must stay mapped in this process, and must not be freed or remapped, until
    /// [`Container::unmap_dma`] has removed the mapping: devices may access it at any time.
    pub unsafe fn map_dma(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), VfioError> {
        match self.mode {
            IommuMode::NoIommu => return Err(VfioError::NotInNoIommu),
            // SAFETY: forwarded from our caller.
            IommuMode::Iommufd => return unsafe { self.ioas_map(vaddr, len, iova) },
            IommuMode::Type1 => {}
        }
        let mut b = [0u8; uapi::DMA_MAP_SIZE];
        uapi::put_u32(&mut b, uapi::arg::ARGSZ, uapi::DMA_MAP_SIZE as u32);
        uapi::put_u32(&mut b, uapi::arg::FLAGS, uapi::DMA_MAP_READ_WRITE);
        uapi::put_u64(&mut b, uapi::dma::MAP_VADDR, vaddr as u64);
        uapi::put_u64(&mut b, uapi::dma::MAP_IOVA, iova.get());
        uapi::put_u64(&mut b, uapi::dma::MAP_SIZE, len);
        self.sys.ioctl(raw(&self.fd), uapi::req::IOMMU_MAP_DMA, IoctlArg::Buf(&mut b)).map_err(|source| {
            let hint = match source.raw_os_error() {
                Some(libc::ENOMEM) => " (the memlock limit is too low: VFIO charges pinned pages to RLIMIT_MEMLOCK: `ulimit -l unlimited` up to the hard limit, `vfpoll setup --user $USER` prints the limit a run needs and how to raise it, or run as root)",
                Some(libc::ENOSPC) => " (too many DMA mappings: raise vfio_iommu_type1.dma_entry_limit or use larger regions)",
                Some(libc::EEXIST) => " (the IOVA range overlaps an existing mapping)",
                Some(libc::EINVAL) => " (address, length or IOVA not aligned to the IOMMU page size, or outside the IOVA ranges)",
                _ => "",
            };
            VfioError::Map {
                call: "VFIO_IOMMU_MAP_DMA",
                iova,
                len,
                source,
                hint,
            }
        })?;
        Ok(())
    }

    /// Removes a mapping made by [`Container::map_dma`].
    pub fn unmap_dma(&self, iova: Iova, len: u64) -> Result<(), VfioError> {
        match self.mode {
            IommuMode::NoIommu => return Err(VfioError::NotInNoIommu),
            IommuMode::Iommufd => return self.ioas_unmap(iova, len),
            IommuMode::Type1 => {}
        }
        let mut b = [0u8; uapi::DMA_UNMAP_SIZE];
        uapi::put_u32(&mut b, uapi::arg::ARGSZ, uapi::DMA_UNMAP_SIZE as u32);
        uapi::put_u64(&mut b, uapi::dma::UNMAP_IOVA, iova.get());
        uapi::put_u64(&mut b, uapi::dma::UNMAP_SIZE, len);
        self.sys
            .ioctl(raw(&self.fd), uapi::req::IOMMU_UNMAP_DMA, IoctlArg::Buf(&mut b))
            .map_err(io_err(format!("VFIO_IOMMU_UNMAP_DMA({iova}, {len:#x})")))?;
        Ok(())
    }

    /// Maps `len` bytes of a peer device's BAR, mmapped at `vaddr`, for device access at
    /// `iova`: [`Container::map_dma`], except that iommufd's refusal (it cannot pin a BAR's
    /// PFNMAP memory: EFAULT) comes back as [`VfioError::PeerBarUnderIommufd`], which says what
    /// works.
    ///
    /// # Safety
    /// As for [`Container::map_dma`].
    pub unsafe fn map_peer_bar(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), VfioError> {
        // SAFETY: forwarded from our caller.
        match unsafe { self.map_dma(vaddr, len, iova) } {
            // EFAULT: pin_user_pages refuses VM_IO / VM_PFNMAP memory (mm/gup.c), which
            // iommufd's pfn reader passes on (drivers/iommu/iommufd/pages.c).
            Err(VfioError::Map { source, .. })
                if self.mode == IommuMode::Iommufd && source.raw_os_error() == Some(libc::EFAULT) =>
            {
                Err(VfioError::PeerBarUnderIommufd { iova, len, source })
            }
            r => r,
        }
    }

    /// The IOMMU groups attached so far (type1 and no-IOMMU mode; none in iommufd mode, which
    /// opens devices without their group: see [`Container::bound_devices`]).
    pub fn groups(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.lock().groups.values().map(|g| g.id).collect();
        v.sort_unstable();
        v
    }
}

/// A region of a device (`VFIO_DEVICE_GET_REGION_INFO`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// Region index: BARs 0..=5, ROM 6, config space 7.
    pub index: u32,
    /// Size in bytes (0 = the region is absent).
    pub size: u64,
    /// Offset of the region in the device fd (for pread/pwrite/mmap).
    pub offset: u64,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Where the region may be mmapped; `None` = all of it when `flags` has MMAP.
    pub sparse: Option<Vec<(u64, u64)>>,
}

impl RegionInfo {
    /// Parses the reply of `VFIO_DEVICE_GET_REGION_INFO`.
    pub fn parse(buf: &[u8]) -> Self {
        use uapi::{region_info as ri, sparse_mmap as sm};
        let flags = uapi::get_u32(buf, uapi::arg::FLAGS);
        let mut sparse = None;
        if flags & uapi::REGION_FLAG_CAPS != 0 {
            for cap in uapi::caps(buf, uapi::get_u32(buf, ri::CAP_OFFSET)) {
                if cap.id == uapi::REGION_CAP_SPARSE_MMAP && cap.bytes.len() >= sm::AREAS {
                    let n = uapi::get_u32(cap.bytes, sm::NR_AREAS) as usize;
                    sparse = Some(
                        (0..n)
                            .map(|i| sm::AREAS + i * sm::AREA_SIZE)
                            .take_while(|o| o + sm::AREA_SIZE <= cap.bytes.len())
                            .map(|o| {
                                (
                                    uapi::get_u64(cap.bytes, o + sm::AREA_OFFSET),
                                    uapi::get_u64(cap.bytes, o + sm::AREA_LEN),
                                )
                            })
                            .collect(),
                    );
                }
            }
        }
        RegionInfo {
            index: uapi::get_u32(buf, ri::INDEX),
            size: uapi::get_u64(buf, ri::SIZE),
            offset: uapi::get_u64(buf, ri::OFFSET),
            flags,
            sparse,
        }
    }

    /// Whether the whole region can be mmapped in one piece.
    pub fn mappable(&self) -> bool {
        self.flags & uapi::REGION_FLAG_MMAP != 0
            && match &self.sparse {
                None => true,
                Some(areas) => areas.iter().any(|&(o, s)| o == 0 && s >= self.size),
            }
    }
}

/// PCI configuration space registers used here (PCI Local Bus 3.0 §6.2).
pub mod pci_cfg {
    /// Command register (16 bits).
    pub const COMMAND: u64 = 0x04;
    /// Command: Memory Space Enable.
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    /// Command: Bus Master Enable.
    pub const COMMAND_MASTER: u16 = 1 << 2;
    /// Command: Interrupt Disable (INTx).
    pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
}

/// A device's file descriptor, which [`Device::release`] closes while the [`Device`] and the
/// interrupts made from it live on: every call goes through [`DevFd::call`], which fails with
/// [`VfioError::Released`] once it is closed, and holds the descriptor open for the call.
#[derive(Debug)]
pub(crate) struct DevFd {
    bdf: Bdf,
    fd: RwLock<Option<OwnedFd>>,
}

impl DevFd {
    fn new(bdf: Bdf, fd: OwnedFd) -> Self {
        DevFd {
            bdf,
            fd: RwLock::new(Some(fd)),
        }
    }

    /// A second descriptor of the same file, while it is open.
    fn dup(&self, sys: &dyn SysOps) -> Option<OwnedFd> {
        let g = self.fd.read().unwrap_or_else(|e| e.into_inner());
        g.as_ref().and_then(|fd| sys.dup(fd).ok())
    }

    /// Runs `f` on the descriptor; `what` names the call in an error.
    pub(crate) fn call<R>(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce(RawFd) -> io::Result<R>,
    ) -> Result<R, VfioError> {
        let g = self.fd.read().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            None => Err(VfioError::Released { bdf: self.bdf }),
            Some(fd) => f(fd.as_raw_fd()).map_err(|source| VfioError::Io { what: what(), source }),
        }
    }

    /// Whether the descriptor was closed.
    pub(crate) fn closed(&self) -> bool {
        self.fd.read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Closes the descriptor, once no call is using it.
    fn close(&self) -> bool {
        self.fd
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }
}

/// An open VFIO device.
///
/// `Send + Sync`: all methods are system calls on a file descriptor.
#[derive(Debug)]
pub struct Device {
    container: Arc<Container>,
    /// Dropped by [`Device::release`]; `None` in iommufd mode (opened through the cdev).
    group: Mutex<Option<Arc<Group>>>,
    group_id: Option<u32>,
    /// Shared with the device's enabled interrupts ([`Irqs`]).
    fd: Arc<DevFd>,
    bdf: Bdf,
    flags: u32,
    /// IRQ indexes (`VFIO_DEVICE_GET_INFO`.num_irqs).
    num_irqs: u32,
    regions: Vec<RegionInfo>,
    /// Every BAR mapping made, for [`Device::release`] to revoke.
    mappings: Mutex<Vec<Weak<BarMapping>>>,
}

impl Device {
    fn new(
        container: Arc<Container>,
        group: Option<Arc<Group>>,
        fd: Arc<DevFd>,
        bdf: Bdf,
    ) -> Result<Self, VfioError> {
        let sys = Arc::clone(&container.sys);
        let mut info = [0u8; uapi::DEVICE_INFO_SIZE];
        uapi::put_u32(&mut info, uapi::arg::ARGSZ, uapi::DEVICE_INFO_SIZE as u32);
        fd.call(
            || format!("VFIO_DEVICE_GET_INFO({bdf})"),
            |fd| sys.ioctl(fd, uapi::req::DEVICE_GET_INFO, IoctlArg::Buf(&mut info)),
        )?;
        let flags = uapi::get_u32(&info, uapi::arg::FLAGS);
        let num_regions = uapi::get_u32(&info, uapi::device_info::NUM_REGIONS);
        let num_irqs = uapi::get_u32(&info, uapi::device_info::NUM_IRQS);
        let mut regions = Vec::new();
        // Index 8 (VGA) answers EINVAL on non-VGA devices; stop after config space.
        for index in 0..num_regions.min(uapi::PCI_CONFIG_REGION + 1) {
            regions.push(Self::query_region(&*sys, &fd, bdf, index)?);
        }
        log::debug!("opened {bdf}: flags {flags:#x}, {} regions", regions.len());
        Ok(Device {
            container,
            group_id: group.as_ref().map(|g| g.id),
            group: Mutex::new(group),
            fd,
            bdf,
            flags,
            num_irqs,
            regions,
            mappings: Mutex::new(Vec::new()),
        })
    }

    fn query_region(sys: &dyn SysOps, fd: &DevFd, bdf: Bdf, index: u32) -> Result<RegionInfo, VfioError> {
        let mut buf = vec![0u8; uapi::REGION_INFO_SIZE];
        loop {
            let argsz = buf.len() as u32;
            buf.fill(0);
            uapi::put_u32(&mut buf, uapi::arg::ARGSZ, argsz);
            uapi::put_u32(&mut buf, uapi::region_info::INDEX, index);
            fd.call(
                || format!("VFIO_DEVICE_GET_REGION_INFO({bdf}, {index})"),
                |fd| sys.ioctl(fd, uapi::req::DEVICE_GET_REGION_INFO, IoctlArg::Buf(&mut buf)),
            )?;
            let want = uapi::get_u32(&buf, uapi::arg::ARGSZ) as usize;
            if want <= buf.len() {
                return Ok(RegionInfo::parse(&buf));
            }
            buf = vec![0u8; want];
        }
    }

    /// The device's address.
    pub fn bdf(&self) -> Bdf {
        self.bdf
    }

    /// The IOMMU group it was opened through (`None` in iommufd mode, opened through its cdev).
    pub fn group_id(&self) -> Option<u32> {
        self.group_id
    }

    /// The container the device belongs to.
    pub fn container(&self) -> &Arc<Container> {
        &self.container
    }

    /// Region info by index (BARs 0..=5, config space 7).
    pub fn region(&self, index: u32) -> Result<&RegionInfo, VfioError> {
        self.regions
            .get(index as usize)
            .filter(|r| r.size > 0)
            .ok_or(VfioError::Region {
                bdf: self.bdf,
                index,
                why: "does not exist on this device",
            })
    }

    /// Maps BAR `bar` (0..=5) whole and returns an MMIO accessor over it.
    ///
    /// # Safety
    /// The accessor writes device registers, and a register write can start DMA to any bus
    /// address: an NVMe controller's ASQ/ACQ/CMBMSC, a NIC's ring base, an MSI-X table entry
    /// all take one. The caller must only write values that aim the device at memory it owns
    /// and has mapped for DMA for as long as the device may use it (device drivers do this in
    /// the one module that programs the device, and hand out no writable view of the BAR).
    /// Reads have side effects on some devices (read-to-clear registers) but no memory effects.
    pub unsafe fn map_bar(&self, bar: u32) -> Result<Mmio, VfioError> {
        if bar > 5 {
            return Err(VfioError::Region {
                bdf: self.bdf,
                index: bar,
                why: "is not a BAR (BARs are 0..=5)",
            });
        }
        let r = self.region(bar)?;
        if !r.mappable() {
            return Err(VfioError::Region {
                bdf: self.bdf,
                index: bar,
                why: "cannot be mmapped (I/O port BAR, or VFIO allows only parts of it)",
            });
        }
        let len = usize::try_from(r.size).map_err(|_| VfioError::Region {
            bdf: self.bdf,
            index: bar,
            why: "is larger than the address space",
        })?;
        let sys = &self.container.sys;
        let ptr = self.fd.call(
            || format!("mmap of BAR{bar} of {}", self.bdf),
            |fd| sys.mmap(fd, r.offset, len),
        )?;
        // SAFETY: `ptr`/`len` is the mapping just made, owned by the new `BarMapping` alone and
        // only accessed through `Mmio`'s raw pointers.
        let mapping = Arc::new(unsafe { BarMapping::guarded(Arc::clone(sys), ptr, len) });
        let mut maps = self.mappings.lock().unwrap_or_else(|e| e.into_inner());
        maps.retain(|m| m.strong_count() > 0);
        maps.push(Arc::downgrade(&mapping));
        Ok(Mmio::new(mapping))
    }

    /// Lets the device go, for a removal the kernel asked for ([`DeviceEvent::Request`]) or
    /// after the device vanished: Bus Master is cleared (best effort: a vanished device does not
    /// answer), every BAR mapping made through [`Device::map_bar`] is revoked in place
    /// ([`BarMapping::revoke`]: from now on accesses through them read all-ones and write
    /// nowhere, so threads still using them cannot crash), the device file is closed (the kernel
    /// then disables the device and completes its removal), and the IOMMU group is retired
    /// (kept attached until the container goes, but a device that comes back opens a fresh
    /// one). Every later call on the
    /// device fails with [`VfioError::Released`]. Returns the mappings revoked; idempotent.
    pub fn release(&self) -> Result<usize, VfioError> {
        if self.fd.closed() {
            return Ok(0);
        }
        if let Err(e) = self.disable_bus_master() {
            log::debug!("{}: clearing Bus Master before release: {e}", self.bdf);
        }
        let maps: Vec<Arc<BarMapping>> = self
            .mappings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .filter_map(|m| m.upgrade())
            .collect();
        let mut revoked = 0;
        for m in &maps {
            match m.revoke() {
                Ok(()) => revoked += 1,
                // The kernel then waits for the last user to drop the mapping.
                Err(e) => log::warn!(
                    "{}: revoking a BAR mapping of {:#x} bytes failed ({e}); the removal completes when it is dropped",
                    self.bdf,
                    m.len()
                ),
            }
        }
        self.fd.close();
        drop(self.group.lock().unwrap_or_else(|e| e.into_inner()).take());
        match self.group_id {
            Some(id) => self.container.retire_group(id),
            None => self.container.forget_cdev(self.bdf, &self.fd),
        }
        log::info!("{}: released ({revoked} BAR mapping(s) revoked)", self.bdf);
        Ok(revoked)
    }

    /// Whether [`Device::release`] let the device go.
    pub fn released(&self) -> bool {
        self.fd.closed()
    }

    /// Whether a BAR mapping of the device was replaced after a SIGBUS (vfio-pci zapped it: the
    /// device's memory decode went off, or it was reset or removed underneath).
    pub fn mapping_faulted(&self) -> bool {
        self.mappings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .any(|m| m.faults() > 0)
    }

    /// The bus address of BAR `bar` as the PCI bus sees it (sysfs `resource`): what a peer device
    /// must use to reach this BAR in no-IOMMU mode.
    pub fn bar_bus_addr(&self, bar: u32) -> Result<BusAddr, VfioError> {
        let res = sysfs::bar_resources(&self.container.host, self.bdf)?;
        res.get(bar as usize)
            .copied()
            .flatten()
            .map(|(start, _)| BusAddr(start))
            .ok_or(VfioError::Region {
                bdf: self.bdf,
                index: bar,
                why: "has no bus address in sysfs",
            })
    }

    /// Reads `buf.len()` bytes of configuration space at `off`.
    pub fn config_read(&self, off: u64, buf: &mut [u8]) -> Result<(), VfioError> {
        let r = self.region(uapi::PCI_CONFIG_REGION)?;
        self.fd.call(
            || format!("config read of {} at {off:#x}", self.bdf),
            |fd| self.container.sys.pread(fd, buf, r.offset + off),
        )
    }

    /// Writes `buf` to configuration space at `off`.
    pub fn config_write(&self, off: u64, buf: &[u8]) -> Result<(), VfioError> {
        let r = self.region(uapi::PCI_CONFIG_REGION)?;
        self.fd.call(
            || format!("config write of {} at {off:#x}", self.bdf),
            |fd| self.container.sys.pwrite(fd, buf, r.offset + off),
        )
    }

    /// Reads a 16-bit configuration register.
    pub fn config_read_u16(&self, off: u64) -> Result<u16, VfioError> {
        let mut b = [0u8; 2];
        self.config_read(off, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Reads a 32-bit configuration register.
    pub fn config_read_u32(&self, off: u64) -> Result<u32, VfioError> {
        let mut b = [0u8; 4];
        self.config_read(off, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Writes a 16-bit configuration register.
    pub fn config_write_u16(&self, off: u64, v: u16) -> Result<(), VfioError> {
        self.config_write(off, &v.to_le_bytes())
    }

    /// Enables Memory Space and Bus Master in the command register (VFIO does not; a device
    /// cannot DMA without Bus Master) and disables INTx, since vfpoll polls.
    /// Returns the command register as written.
    pub fn enable_bus_master(&self) -> Result<u16, VfioError> {
        use pci_cfg::*;
        let cmd = self.config_read_u16(COMMAND)?;
        let new = cmd | COMMAND_MEMORY | COMMAND_MASTER | COMMAND_INTX_DISABLE;
        if new != cmd {
            self.config_write_u16(COMMAND, new)?;
        }
        let back = self.config_read_u16(COMMAND)?;
        if back & (COMMAND_MEMORY | COMMAND_MASTER) != COMMAND_MEMORY | COMMAND_MASTER {
            return Err(VfioError::Io {
                what: format!("enabling bus mastering on {}", self.bdf),
                source: io::Error::other(format!(
                    "command register reads {back:#06x} after writing {new:#06x}"
                )),
            });
        }
        Ok(back)
    }

    /// Disables Bus Master (no more DMA from the device).
    pub fn disable_bus_master(&self) -> Result<(), VfioError> {
        let cmd = self.config_read_u16(pci_cfg::COMMAND)?;
        self.config_write_u16(pci_cfg::COMMAND, cmd & !pci_cfg::COMMAND_MASTER)
    }

    /// Whether VFIO offers a reset for this device (FLR, PM reset or a bus reset that touches no
    /// other device).
    pub fn can_reset(&self) -> bool {
        self.flags & uapi::DEVICE_FLAGS_RESET != 0
    }

    /// Resets the function. Returns `false` (and does nothing) when the device offers no reset.
    pub fn reset(&self) -> Result<bool, VfioError> {
        if !self.can_reset() {
            return Ok(false);
        }
        self.fd.call(
            || format!("VFIO_DEVICE_RESET({})", self.bdf),
            |fd| {
                self.container
                    .sys
                    .ioctl(fd, uapi::req::DEVICE_RESET, IoctlArg::None)
            },
        )?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
