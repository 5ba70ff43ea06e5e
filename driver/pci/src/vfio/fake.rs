//! A fake VFIO kernel: enough of `/dev/vfio` and `/dev/iommu` to drive [`super::Container`]
//! and [`super::Device`] in tests, with the failures a real machine produces (no vfio module,
//! group not viable, group busy, no no-IOMMU support, refused DMA maps, a device cdev bound
//! twice, a BAR's mmap that iommufd cannot pin).
//!
//! Paths still come from a [`crate::sysfs::Host`]: tests build a fake sysfs tree and create the
//! `/dev/vfio/N`, `/dev/vfio/devices/vfioN` and `/dev/iommu` nodes as plain files; opening one
//! of them here yields a real descriptor (of `/dev/null`; for a device cdev, one end of a socket
//! pair, so that the fake can tell when every descriptor of that file is closed, as the kernel
//! unbinds a cdev then) that the fake keys its state by.
//!
//! The fake reads and writes the arguments at offsets written out by hand from the kernel's
//! headers, not at [`super::uapi`]'s (which come from the generated bindings): it is a second,
//! independent reading of the same layouts, so that a wrong offset on either side fails a test.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::irq::{IrqIndex, IrqSet};
use super::sys::{IoctlArg, SysOps};
use super::uapi::{self, req};
use crate::mmio::{self, Mmio};

/// Offset of region `i` in a device fd (vfio-pci uses `i << 40` too).
pub const fn region_offset(index: u32) -> u64 {
    (index as u64) << 40
}

/// One region of a fake device: `(size, VFIO_REGION_INFO_FLAG_*, sparse mmap areas)`.
pub type FakeRegion = (u64, u32, Option<Vec<(u64, u64)>>);

/// A fake PCI function behind VFIO.
#[derive(Debug)]
pub struct FakeDevice {
    /// `(size, flags, sparse areas)` per region index 0..=7.
    pub regions: Vec<FakeRegion>,
    /// 256 bytes of configuration space.
    pub config: Vec<u8>,
    /// Command-register bits the device refuses to set (to model a broken device).
    pub command_stuck_zero: u16,
    /// Whether `VFIO_DEVICE_RESET` is offered.
    pub can_reset: bool,
    /// How many resets were done.
    pub resets: u32,
    /// Backing memory of each mappable BAR.
    pub bars: HashMap<u32, Mmio>,
    /// Vectors per IRQ index (INTx, MSI, MSI-X, ERR, REQ); 0 = the device lacks it.
    pub irq_counts: [u32; 5],
    /// Every `VFIO_DEVICE_SET_IRQS` the device accepted, in order.
    pub irq_sets: Vec<IrqSet>,
    /// The enabled interrupt index among INTx/MSI/MSI-X, and the eventfd bound to each of its
    /// vectors (-1: none), as vfio-pci tracks them.
    pub irq_enabled: Option<(IrqIndex, Vec<i32>)>,
    /// The eventfd bound to the error (3) and request (4) indexes, by index.
    pub irq_triggers: HashMap<u32, i32>,
}

impl FakeDevice {
    /// A device with a 16 KiB BAR0 (mmappable) and config space, no reset.
    pub fn simple() -> Self {
        let mut regions = vec![(0, 0, None); 8];
        regions[0] = (
            0x4000,
            uapi::REGION_FLAG_READ | uapi::REGION_FLAG_WRITE | uapi::REGION_FLAG_MMAP,
            None,
        );
        regions[7] = (256, uapi::REGION_FLAG_READ | uapi::REGION_FLAG_WRITE, None);
        let mut bars = HashMap::new();
        bars.insert(0, mmio::anonymous(0x4000).expect("anonymous mapping"));
        FakeDevice {
            regions,
            config: vec![0; 256],
            command_stuck_zero: 0,
            can_reset: false,
            resets: 0,
            bars,
            irq_counts: [1, 1, 16, 1, 1],
            irq_sets: Vec::new(),
            irq_enabled: None,
            irq_triggers: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone)]
enum Obj {
    Container,
    Group(u32),
    Device(String),
    /// `/dev/iommu`.
    Iommufd,
    /// A device cdev opened but not bound yet (by BDF).
    Cdev(String),
}

/// A device cdev bound to the fake iommufd.
#[derive(Debug)]
pub struct FakeBinding {
    /// The device id the bind returned.
    pub devid: u32,
    /// The IOAS it is attached to.
    pub ioas: Option<u32>,
    /// The fake's end of the socket pair behind the device's file: reads end of file once the
    /// process has closed every descriptor of it.
    peer: UnixStream,
}

impl FakeBinding {
    /// Whether the process still has the bound file open.
    pub fn open(&self) -> bool {
        let mut b = [0u8; 1];
        !matches!((&self.peer).read(&mut b), Ok(0))
    }
}

/// The state of the fake kernel; tests set it up and inspect it through [`FakeVfio::with`].
#[derive(Debug)]
pub struct FakeState {
    /// What `VFIO_GET_API_VERSION` answers.
    pub api_version: i32,
    /// IOMMU models `VFIO_CHECK_EXTENSION` reports.
    pub models: Vec<u64>,
    /// The model set by `VFIO_SET_IOMMU`.
    pub iommu_set: Option<u64>,
    /// Groups whose status reads not viable.
    pub not_viable: Vec<u32>,
    /// Groups whose open fails with EBUSY.
    pub busy: Vec<u32>,
    /// Groups attached to the container.
    pub attached: Vec<u32>,
    /// Devices by BDF string.
    pub devices: HashMap<String, FakeDevice>,
    /// IOVA windows reported through the IOVA-range capability.
    pub iova_ranges: Vec<(u64, u64)>,
    /// Live DMA mappings `(iova, len, vaddr)`.
    pub mappings: Vec<(u64, u64, u64)>,
    /// Fail the next map with this errno.
    pub fail_next_map: Option<i32>,
    /// iommufd: the IOASes allocated.
    pub ioases: Vec<u32>,
    /// iommufd: the cdevs by name (`vfio0`) and the device each stands for (BDF).
    pub cdevs: HashMap<String, String>,
    /// iommufd: devices bound, by BDF.
    pub bound: HashMap<String, FakeBinding>,
    /// iommufd: what `IOMMU_IOAS_IOVA_RANGES` says of the IOVA alignment.
    pub iova_alignment: u64,
    /// iommufd: fail the next bind with this errno.
    pub fail_next_bind: Option<i32>,
    /// Every BAR mmap made (start, length): PFNMAP memory, which type1 maps and iommufd cannot
    /// pin (EFAULT).
    pub pfnmap: Vec<(u64, u64)>,
    open: HashMap<RawFd, Obj>,
    /// The fake's ends of the socket pairs of open cdev files, by the process's descriptor.
    cdev_peers: HashMap<RawFd, UnixStream>,
    next_id: u32,
}

/// The fake kernel. Share it as `Arc<FakeVfio>` (or `Arc<dyn SysOps>`).
#[derive(Debug)]
pub struct FakeVfio {
    state: Mutex<FakeState>,
}

impl Default for FakeVfio {
    fn default() -> Self {
        FakeVfio {
            state: Mutex::new(FakeState {
                api_version: uapi::API_VERSION,
                models: vec![uapi::TYPE1_IOMMU, uapi::TYPE1V2_IOMMU],
                iommu_set: None,
                not_viable: vec![],
                busy: vec![],
                attached: vec![],
                devices: HashMap::new(),
                iova_ranges: vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 39) - 1)],
                mappings: vec![],
                fail_next_map: None,
                ioases: vec![],
                cdevs: HashMap::new(),
                bound: HashMap::new(),
                iova_alignment: 4096,
                fail_next_bind: None,
                pfnmap: vec![],
                open: HashMap::new(),
                cdev_peers: HashMap::new(),
                next_id: 1,
            }),
        }
    }
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl FakeVfio {
    /// Raises interrupt `index` (ERR or REQ) of device `bdf`, as vfio-pci does on an AER error
    /// or a removal request: signals the eventfd bound to it. Fails when none is bound.
    pub fn raise(&self, bdf: &str, index: IrqIndex) -> io::Result<()> {
        let fd = self
            .with(|st| {
                st.devices
                    .get(bdf)
                    .and_then(|d| d.irq_triggers.get(&index.0).copied())
            })
            .ok_or_else(|| io::Error::other(format!("no eventfd bound to {index} of {bdf}")))?;
        super::sys::signal_eventfd(fd)
    }

    /// Runs `f` on the state (to set it up or check it).
    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn new_fd(&self) -> io::Result<OwnedFd> {
        Ok(OwnedFd::from(File::open("/dev/null")?))
    }

    fn iommu_info(st: &FakeState, buf: &mut [u8]) {
        // Header (24 bytes), then one IOVA-range capability and one DMA-avail capability.
        let range_cap = 16 + 16 * st.iova_ranges.len();
        let need = uapi::IOMMU_INFO_SIZE + range_cap + 12;
        if buf.len() < need {
            uapi::put_u32(buf, 0, need as u32);
            uapi::put_u32(buf, 4, uapi::IOMMU_INFO_PGSIZES | uapi::IOMMU_INFO_CAPS);
            uapi::put_u64(buf, 8, 0x4020_1000);
            return;
        }
        uapi::put_u32(buf, 0, need as u32);
        uapi::put_u32(buf, 4, uapi::IOMMU_INFO_PGSIZES | uapi::IOMMU_INFO_CAPS);
        uapi::put_u64(buf, 8, 0x4020_1000);
        uapi::put_u32(buf, 16, uapi::IOMMU_INFO_SIZE as u32);
        let c = uapi::IOMMU_INFO_SIZE;
        uapi::put_u16(buf, c, uapi::IOMMU_CAP_IOVA_RANGE);
        uapi::put_u16(buf, c + 2, 1);
        uapi::put_u32(buf, c + 4, (c + range_cap) as u32);
        uapi::put_u32(buf, c + 8, st.iova_ranges.len() as u32);
        for (i, &(s, e)) in st.iova_ranges.iter().enumerate() {
            uapi::put_u64(buf, c + 16 + 16 * i, s);
            uapi::put_u64(buf, c + 24 + 16 * i, e);
        }
        let d = c + range_cap;
        uapi::put_u16(buf, d, uapi::IOMMU_CAP_DMA_AVAIL);
        uapi::put_u16(buf, d + 2, 1);
        uapi::put_u32(buf, d + 4, 0);
        uapi::put_u32(buf, d + 8, 65535 - st.mappings.len() as u32);
    }

    /// `VFIO_DEVICE_SET_IRQS` as vfio-pci (Linux 6.1, `vfio_pci_set_irqs_ioctl`) checks it: one
    /// of INTx/MSI/MSI-X enabled at a time, vectors within the enabled count (no resizing), an
    /// eventfd (or -1) per vector, unmask only of INTx.
    fn set_irqs(dev: &mut FakeDevice, b: &[u8]) -> io::Result<i32> {
        let set = IrqSet::parse(b).ok_or(errno(libc::EINVAL))?;
        let total = *dev
            .irq_counts
            .get(set.index.0 as usize)
            .ok_or(errno(libc::EINVAL))?;
        let data = set.flags & 0x7;
        let action = set.flags & 0x38;
        if data.count_ones() != 1 || action.count_ones() != 1 {
            return Err(errno(libc::EINVAL));
        }
        let end = set.start.checked_add(set.count).ok_or(errno(libc::EINVAL))?;
        if end > total {
            return Err(errno(libc::EINVAL));
        }
        let trigger = action == uapi::IRQ_SET_ACTION_TRIGGER;
        let is_intr = set.index.0 <= IrqIndex::MSIX.0;
        match &mut dev.irq_enabled {
            // Disable all.
            Some((i, _))
                if trigger && *i == set.index && data == uapi::IRQ_SET_DATA_NONE && set.count == 0 =>
            {
                dev.irq_enabled = None;
            }
            // Rebind vectors of the enabled index.
            Some((i, fds)) if trigger && *i == set.index && data == uapi::IRQ_SET_DATA_EVENTFD => {
                if end as usize > fds.len() || set.fds.iter().any(|&f| f < -1) {
                    return Err(errno(libc::EINVAL));
                }
                fds[set.start as usize..end as usize].copy_from_slice(&set.fds);
            }
            // Another interrupt index while one is enabled.
            Some((i, _)) if is_intr && *i != set.index => return Err(errno(libc::EINVAL)),
            Some((i, _)) if *i == set.index && action == uapi::IRQ_SET_ACTION_UNMASK => {
                if set.index != IrqIndex::INTX {
                    return Err(errno(libc::EINVAL));
                }
            }
            None if trigger && is_intr && data == uapi::IRQ_SET_DATA_EVENTFD => {
                if set.start != 0 || set.count == 0 || set.fds.iter().any(|&f| f < 0) {
                    return Err(errno(libc::EINVAL));
                }
                dev.irq_enabled = Some((set.index, set.fds.clone()));
            }
            None if trigger && data == uapi::IRQ_SET_DATA_NONE && set.count == 0 => {
                dev.irq_triggers.remove(&set.index.0);
            }
            _ if !is_intr && trigger && data == uapi::IRQ_SET_DATA_EVENTFD => {
                match set.fds.first() {
                    Some(&fd) if fd >= 0 => dev.irq_triggers.insert(set.index.0, fd),
                    _ => dev.irq_triggers.remove(&set.index.0),
                };
            }
            Some(_) if !is_intr && trigger && data == uapi::IRQ_SET_DATA_NONE && set.count == 0 => {
                dev.irq_triggers.remove(&set.index.0);
            }
            _ => return Err(errno(libc::EINVAL)),
        }
        dev.irq_sets.push(set);
        Ok(0)
    }

    fn region_info(dev: &FakeDevice, buf: &mut [u8]) -> io::Result<i32> {
        let index = uapi::get_u32(buf, 8);
        let Some((size, flags, sparse)) = dev.regions.get(index as usize) else {
            return Err(errno(libc::EINVAL));
        };
        let mut flags = *flags;
        let need = uapi::REGION_INFO_SIZE + sparse.as_ref().map_or(0, |a| 16 + 16 * a.len());
        if sparse.is_some() {
            flags |= uapi::REGION_FLAG_CAPS;
        }
        uapi::put_u32(buf, 0, need as u32);
        uapi::put_u32(buf, 4, flags);
        uapi::put_u64(buf, 16, *size);
        uapi::put_u64(buf, 24, region_offset(index));
        if let (Some(areas), true) = (sparse, buf.len() >= need) {
            let c = uapi::REGION_INFO_SIZE;
            uapi::put_u32(buf, 12, c as u32);
            uapi::put_u16(buf, c, uapi::REGION_CAP_SPARSE_MMAP);
            uapi::put_u16(buf, c + 2, 1);
            uapi::put_u32(buf, c + 8, areas.len() as u32);
            for (i, &(o, s)) in areas.iter().enumerate() {
                uapi::put_u64(buf, c + 16 + 16 * i, o);
                uapi::put_u64(buf, c + 24 + 16 * i, s);
            }
        }
        Ok(0)
    }
}

impl FakeVfio {
    /// `VFIO_DEVICE_BIND_IOMMUFD` on a cdev (nothing else works before it): one bind per
    /// device while its file is open (vfio_df_open: EINVAL otherwise).
    fn cdev_bind(
        st: &mut FakeState,
        fd: RawFd,
        bdf: String,
        request: u64,
        arg: IoctlArg<'_>,
    ) -> io::Result<i32> {
        use uapi::bind_iommufd as b;
        let IoctlArg::Buf(buf) = arg else {
            return Err(errno(libc::EINVAL));
        };
        if request != req::DEVICE_BIND_IOMMUFD {
            return Err(errno(libc::EINVAL));
        }
        if let Some(e) = st.fail_next_bind.take() {
            return Err(errno(e));
        }
        let ifd = uapi::get_u32(buf, b::IOMMUFD) as i32;
        if uapi::get_u32(buf, b::ARGSZ) as usize != b::SIZE
            || uapi::get_u32(buf, b::FLAGS) != 0
            || !matches!(st.open.get(&ifd), Some(Obj::Iommufd))
        {
            return Err(errno(libc::EINVAL));
        }
        if st.bound.get(&bdf).is_some_and(FakeBinding::open) {
            return Err(errno(libc::EINVAL));
        }
        let peer = st.cdev_peers.remove(&fd).ok_or(errno(libc::EBADF))?;
        let devid = st.next_id;
        st.next_id += 1;
        st.bound.insert(
            bdf.clone(),
            FakeBinding {
                devid,
                ioas: None,
                peer,
            },
        );
        st.open.insert(fd, Obj::Device(bdf));
        uapi::put_u32(buf, b::OUT_DEVID, devid);
        Ok(0)
    }

    /// The `/dev/iommu` ioctls: IOAS alloc, IOVA ranges, map, unmap, as iommufd (Linux 6.12,
    /// `ioas.c`, `io_pagetable.c`) checks them.
    fn iommufd_ioctl(st: &mut FakeState, request: u64, arg: IoctlArg<'_>) -> io::Result<i32> {
        use uapi::iommufd as f;
        match (request, arg) {
            (f::IOAS_ALLOC, IoctlArg::Buf(b)) => {
                if uapi::get_u32(b, 0) as usize != f::ioas_alloc::SIZE {
                    return Err(errno(libc::EINVAL));
                }
                let id = st.next_id;
                st.next_id += 1;
                st.ioases.push(id);
                uapi::put_u32(b, f::ioas_alloc::OUT_IOAS_ID, id);
                Ok(0)
            }
            (f::IOAS_IOVA_RANGES, IoctlArg::BufArray { arg, ptr_at, array }) => {
                use f::iova_ranges as r;
                if ptr_at != r::ALLOWED_IOVAS || !st.ioases.contains(&uapi::get_u32(arg, r::IOAS_ID)) {
                    return Err(errno(libc::ENOENT));
                }
                let cap = uapi::get_u32(arg, r::NUM_IOVAS) as usize;
                assert!(
                    cap * r::RANGE_SIZE <= array.len(),
                    "num_iovas larger than the array"
                );
                for (i, &(s, e)) in st.iova_ranges.iter().enumerate().take(cap) {
                    uapi::put_u64(array, i * r::RANGE_SIZE, s);
                    uapi::put_u64(array, i * r::RANGE_SIZE + 8, e);
                }
                uapi::put_u32(arg, r::NUM_IOVAS, st.iova_ranges.len() as u32);
                uapi::put_u64(arg, r::OUT_IOVA_ALIGNMENT, st.iova_alignment);
                if st.iova_ranges.len() > cap {
                    return Err(errno(libc::EMSGSIZE));
                }
                Ok(0)
            }
            (f::IOAS_MAP, IoctlArg::Buf(b)) => {
                use f::ioas_map as m;
                if let Some(e) = st.fail_next_map.take() {
                    return Err(errno(e));
                }
                let flags = uapi::get_u32(b, m::FLAGS);
                let (vaddr, len, iova) = (
                    uapi::get_u64(b, m::USER_VA),
                    uapi::get_u64(b, m::LENGTH),
                    uapi::get_u64(b, m::IOVA),
                );
                if !st.ioases.contains(&uapi::get_u32(b, m::IOAS_ID)) {
                    return Err(errno(libc::ENOENT));
                }
                let a = st.iova_alignment;
                if flags & f::MAP_FIXED_IOVA == 0 || len == 0 || iova % a != 0 || len % a != 0 {
                    return Err(errno(libc::EINVAL));
                }
                let inside = st
                    .iova_ranges
                    .iter()
                    .any(|&(s, e)| iova >= s && iova.checked_add(len - 1).is_some_and(|end| end <= e));
                if !inside {
                    return Err(errno(libc::EADDRINUSE));
                }
                if st
                    .mappings
                    .iter()
                    .any(|&(i, l, _)| iova < i + l && i < iova + len)
                {
                    return Err(errno(libc::EEXIST));
                }
                // Pinning a BAR's mmap fails: PFNMAP memory has no struct pages.
                if st.pfnmap.iter().any(|&(p, l)| vaddr < p + l && p < vaddr + len) {
                    return Err(errno(libc::EFAULT));
                }
                st.mappings.push((iova, len, vaddr));
                Ok(0)
            }
            (f::IOAS_UNMAP, IoctlArg::Buf(b)) => {
                use f::ioas_unmap as u;
                let (iova, len) = (uapi::get_u64(b, u::IOVA), uapi::get_u64(b, u::LENGTH));
                let before = st.mappings.len();
                st.mappings.retain(|&(i, l, _)| !(i == iova && l == len));
                if st.mappings.len() == before {
                    return Err(errno(libc::ENOENT));
                }
                Ok(0)
            }
            _ => Err(errno(libc::ENOTTY)),
        }
    }
}

impl SysOps for FakeVfio {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        if !path.exists() {
            return Err(errno(libc::ENOENT));
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = path
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if parent == "devices" {
            let bdf = self
                .with(|st| st.cdevs.get(&name).cloned())
                .ok_or(errno(libc::ENODEV))?;
            let (mine, peer) = UnixStream::pair()?;
            peer.set_nonblocking(true)?;
            let fd = OwnedFd::from(mine);
            self.with(|st| {
                st.open.insert(fd.as_raw_fd(), Obj::Cdev(bdf));
                st.cdev_peers.insert(fd.as_raw_fd(), peer);
            });
            return Ok(fd);
        }
        let obj = if name == "vfio" {
            Obj::Container
        } else if name == "iommu" {
            Obj::Iommufd
        } else {
            let id: u32 = name
                .trim_start_matches("noiommu-")
                .parse()
                .map_err(|_| errno(libc::ENODEV))?;
            if self.with(|st| st.busy.contains(&id)) {
                return Err(errno(libc::EBUSY));
            }
            Obj::Group(id)
        };
        let fd = self.new_fd()?;
        self.with(|st| st.open.insert(fd.as_raw_fd(), obj));
        Ok(fd)
    }

    fn ioctl(&self, fd: RawFd, request: u64, arg: IoctlArg<'_>) -> io::Result<i32> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let obj = match st.open.get(&fd) {
            Some(Obj::Container) => None,
            Some(Obj::Group(g)) => Some(Ok(*g)),
            Some(Obj::Device(d)) => Some(Err(d.clone())),
            Some(Obj::Iommufd) => return Self::iommufd_ioctl(&mut st, request, arg),
            Some(Obj::Cdev(d)) => {
                let d = d.clone();
                return Self::cdev_bind(&mut st, fd, d, request, arg);
            }
            None => return Err(errno(libc::EBADF)),
        };
        match (obj, request, arg) {
            (Some(Err(d)), req::DEVICE_ATTACH_IOMMUFD_PT, IoctlArg::Buf(b)) => {
                let ioas = uapi::get_u32(b, uapi::attach_iommufd_pt::PT_ID);
                if uapi::get_u32(b, 0) as usize != uapi::attach_iommufd_pt::SIZE || !st.ioases.contains(&ioas)
                {
                    return Err(errno(libc::EINVAL));
                }
                let binding = st.bound.get_mut(&d).ok_or(errno(libc::EINVAL))?;
                binding.ioas = Some(ioas);
                // The kernel answers with the HWPT it allocated for the IOAS.
                uapi::put_u32(b, uapi::attach_iommufd_pt::PT_ID, ioas + 1000);
                Ok(0)
            }
            (None, req::GET_API_VERSION, IoctlArg::None) => Ok(st.api_version),
            (None, req::CHECK_EXTENSION, IoctlArg::Value(m)) => Ok(st.models.contains(&m) as i32),
            (None, req::SET_IOMMU, IoctlArg::Value(m)) => {
                if st.attached.is_empty() || !st.models.contains(&m) || st.iommu_set.is_some() {
                    return Err(errno(libc::EINVAL));
                }
                st.iommu_set = Some(m);
                Ok(0)
            }
            (None, req::IOMMU_GET_INFO, IoctlArg::Buf(b)) => {
                if st.iommu_set.is_none() || st.iommu_set == Some(uapi::NOIOMMU_IOMMU) {
                    return Err(errno(libc::EINVAL));
                }
                Self::iommu_info(&st, b);
                Ok(0)
            }
            (None, req::IOMMU_MAP_DMA, IoctlArg::Buf(b)) => {
                if let Some(e) = st.fail_next_map.take() {
                    return Err(errno(e));
                }
                let (vaddr, iova, len) = (uapi::get_u64(b, 8), uapi::get_u64(b, 16), uapi::get_u64(b, 24));
                let inside = st
                    .iova_ranges
                    .iter()
                    .any(|&(s, e)| iova >= s && iova.checked_add(len - 1).is_some_and(|end| end <= e));
                if len == 0
                    || !iova.is_multiple_of(4096)
                    || !len.is_multiple_of(4096)
                    || !vaddr.is_multiple_of(4096)
                    || !inside
                {
                    return Err(errno(libc::EINVAL));
                }
                if st
                    .mappings
                    .iter()
                    .any(|&(i, l, _)| iova < i + l && i < iova + len)
                {
                    return Err(errno(libc::EEXIST));
                }
                st.mappings.push((iova, len, vaddr));
                Ok(0)
            }
            (None, req::IOMMU_UNMAP_DMA, IoctlArg::Buf(b)) => {
                let (iova, len) = (uapi::get_u64(b, 8), uapi::get_u64(b, 16));
                let before = st.mappings.len();
                st.mappings.retain(|&(i, l, _)| !(i == iova && l == len));
                if st.mappings.len() == before {
                    return Err(errno(libc::EINVAL));
                }
                Ok(0)
            }
            (Some(Ok(g)), req::GROUP_GET_STATUS, IoctlArg::Buf(b)) => {
                let mut flags = 0;
                if !st.not_viable.contains(&g) {
                    flags |= uapi::GROUP_FLAGS_VIABLE;
                }
                if st.attached.contains(&g) {
                    flags |= uapi::GROUP_FLAGS_CONTAINER_SET;
                }
                uapi::put_u32(b, 4, flags);
                Ok(0)
            }
            (Some(Ok(g)), req::GROUP_SET_CONTAINER, IoctlArg::Buf(b)) => {
                let cfd = i32::from_ne_bytes(b[..4].try_into().expect("4 bytes"));
                if !matches!(st.open.get(&cfd), Some(Obj::Container)) || st.not_viable.contains(&g) {
                    return Err(errno(libc::EINVAL));
                }
                st.attached.push(g);
                Ok(0)
            }
            (Some(Ok(_)), req::GROUP_GET_DEVICE_FD, _) => Err(errno(libc::EINVAL)),
            (Some(Err(d)), req::DEVICE_GET_INFO, IoctlArg::Buf(b)) => {
                let dev = &st.devices[&d];
                let mut flags = uapi::DEVICE_FLAGS_PCI;
                if dev.can_reset {
                    flags |= uapi::DEVICE_FLAGS_RESET;
                }
                uapi::put_u32(b, 4, flags);
                uapi::put_u32(b, 8, 9);
                uapi::put_u32(b, 12, 5);
                Ok(0)
            }
            (Some(Err(d)), req::DEVICE_GET_REGION_INFO, IoctlArg::Buf(b)) => {
                Self::region_info(&st.devices[&d], b)
            }
            (Some(Err(d)), req::DEVICE_GET_IRQ_INFO, IoctlArg::Buf(b)) => {
                let dev = &st.devices[&d];
                let index = uapi::get_u32(b, 8);
                let count = *dev.irq_counts.get(index as usize).ok_or(errno(libc::EINVAL))?;
                let mut flags = uapi::IRQ_INFO_EVENTFD;
                if index == IrqIndex::INTX.0 {
                    flags |= uapi::IRQ_INFO_MASKABLE | uapi::IRQ_INFO_AUTOMASKED;
                } else {
                    flags |= uapi::IRQ_INFO_NORESIZE;
                }
                uapi::put_u32(b, 4, flags);
                uapi::put_u32(b, 12, count);
                Ok(0)
            }
            (Some(Err(d)), req::DEVICE_SET_IRQS, IoctlArg::Buf(b)) => {
                Self::set_irqs(st.devices.get_mut(&d).expect("device"), b)
            }
            (Some(Err(d)), req::DEVICE_RESET, IoctlArg::None) => {
                let dev = st.devices.get_mut(&d).expect("device");
                if !dev.can_reset {
                    return Err(errno(libc::EINVAL));
                }
                dev.resets += 1;
                dev.config[4..6].fill(0);
                Ok(0)
            }
            _ => Err(errno(libc::ENOTTY)),
        }
    }

    fn ioctl_new_fd(&self, fd: RawFd, request: u64, arg: IoctlArg<'_>) -> io::Result<OwnedFd> {
        let IoctlArg::Buf(name) = arg else {
            return Err(errno(libc::EINVAL));
        };
        let name = String::from_utf8_lossy(name.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
        let ok = self.with(|st| {
            request == req::GROUP_GET_DEVICE_FD
                && matches!(st.open.get(&fd), Some(Obj::Group(g)) if st.attached.contains(g))
                && st.iommu_set.is_some()
                && st.devices.contains_key(&name)
        });
        if !ok {
            return Err(errno(libc::EINVAL));
        }
        let new = self.new_fd()?;
        self.with(|st| st.open.insert(new.as_raw_fd(), Obj::Device(name)));
        Ok(new)
    }

    fn dup(&self, fd: &OwnedFd) -> io::Result<OwnedFd> {
        let new = fd.try_clone()?;
        self.with(|st| {
            let obj = st.open.get(&fd.as_raw_fd()).cloned().ok_or(errno(libc::EBADF))?;
            st.open.insert(new.as_raw_fd(), obj);
            Ok(new)
        })
    }

    fn pread(&self, fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.with(|st| {
            let Some(Obj::Device(d)) = st.open.get(&fd) else {
                return Err(errno(libc::EBADF));
            };
            let dev = &st.devices[d];
            let o = off
                .checked_sub(region_offset(uapi::PCI_CONFIG_REGION))
                .ok_or(errno(libc::EINVAL))? as usize;
            let src = dev.config.get(o..o + buf.len()).ok_or(errno(libc::EINVAL))?;
            buf.copy_from_slice(src);
            Ok(())
        })
    }

    fn pwrite(&self, fd: RawFd, buf: &[u8], off: u64) -> io::Result<()> {
        self.with(|st| {
            let Some(Obj::Device(d)) = st.open.get(&fd) else {
                return Err(errno(libc::EBADF));
            };
            let d = d.clone();
            let dev = st.devices.get_mut(&d).expect("device");
            let o = off
                .checked_sub(region_offset(uapi::PCI_CONFIG_REGION))
                .ok_or(errno(libc::EINVAL))? as usize;
            let dst = dev.config.get_mut(o..o + buf.len()).ok_or(errno(libc::EINVAL))?;
            dst.copy_from_slice(buf);
            if o <= 4 && o + buf.len() >= 6 {
                let cmd = u16::from_le_bytes([dev.config[4], dev.config[5]]) & !dev.command_stuck_zero;
                dev.config[4..6].copy_from_slice(&cmd.to_le_bytes());
            }
            Ok(())
        })
    }

    fn mmap(&self, fd: RawFd, off: u64, len: usize) -> io::Result<NonNull<u8>> {
        self.with(|st| {
            let Some(Obj::Device(d)) = st.open.get(&fd) else {
                return Err(errno(libc::EBADF));
            };
            let index = (off >> 40) as u32;
            let bar = st.devices[d].bars.get(&index).ok_or(errno(libc::EINVAL))?;
            if len > bar.len() {
                return Err(errno(libc::EINVAL));
            }
            let p = NonNull::new(bar.as_ptr()).ok_or(errno(libc::EINVAL))?;
            let m = (p.as_ptr() as u64, len as u64);
            if !st.pfnmap.contains(&m) {
                st.pfnmap.push(m);
            }
            Ok(p)
        })
    }

    unsafe fn munmap(&self, _ptr: NonNull<u8>, _len: usize) -> io::Result<()> {
        // The memory belongs to the fake device's BAR and is released with it.
        Ok(())
    }
}
