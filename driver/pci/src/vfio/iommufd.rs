//! The iommufd backend of [`Container`]: `/dev/iommu` with one IOAS (I/O address space) that
//! every device attaches to, devices opened through their VFIO cdev
//! (`/dev/vfio/devices/vfioN`, the single entry of `/sys/bus/pci/devices/<bdf>/vfio-dev/`).
//!
//! Bring-up (Linux `Documentation/driver-api/vfio.rst`, "VFIO device cdev"): open `/dev/iommu`,
//! `IOMMU_IOAS_ALLOC`; per device open the cdev, `VFIO_DEVICE_BIND_IOMMUFD`, then
//! `VFIO_DEVICE_ATTACH_IOMMUFD_PT` with the IOAS (the kernel allocates the IOMMU domain). DMA is
//! `IOMMU_IOAS_MAP` with `FIXED_IOVA` at the IOVA vfpoll's allocator picks, and
//! `IOMMU_IOAS_UNMAP`. After the bind the device file speaks the same VFIO device API as one
//! from a group, so [`Device`] serves both. Closing the device file unbinds it (and detaches it);
//! closing `/dev/iommu` destroys the IOAS and its mappings.
//!
//! What iommufd (6.12) cannot do that type1 can: map a peer device's BAR (its mmap is PFNMAP
//! memory, which `IOMMU_IOAS_MAP` cannot pin; dma-buf import came later), and no-IOMMU mode.
//! Both are refused with errors that name `--iommu-backend type1` / `noiommu`.

use std::io;
use std::sync::Arc;

use super::uapi::{self, attach_iommufd_pt as attach, bind_iommufd as bind, iommufd as fd_api};
use super::{
    io_err, open_error, raw, Container, DevFd, Device, IoctlArg, IommuInfo, IommuMode, SysOps, VfioError,
};
use crate::addr::Iova;
use crate::bdf::Bdf;
use crate::sysfs::{self, Host};

impl Container {
    /// Opens `/dev/iommu` and allocates the IOAS.
    pub(super) fn open_iommufd(sys: Arc<dyn SysOps>, host: Host) -> Result<Arc<Self>, VfioError> {
        let path = host.dev.join("iommu");
        let fd = sys
            .open(&path)
            .map_err(|e| open_error(e, &path, || VfioError::NoIommufd { path: path.clone() }))?;
        let mut b = [0u8; fd_api::ioas_alloc::SIZE];
        uapi::put_u32(
            &mut b,
            fd_api::ioas_alloc::SIZE_FIELD,
            fd_api::ioas_alloc::SIZE as u32,
        );
        sys.ioctl(raw(&fd), fd_api::IOAS_ALLOC, IoctlArg::Buf(&mut b))
            .map_err(io_err("IOMMU_IOAS_ALLOC"))?;
        let ioas = uapi::get_u32(&b, fd_api::ioas_alloc::OUT_IOAS_ID);
        log::debug!("opened {} in iommufd mode, IOAS {ioas}", path.display());
        Ok(Self::new(sys, host, fd, IommuMode::Iommufd, ioas))
    }

    /// The IOAS every device attaches to (iommufd mode only).
    pub fn ioas_id(&self) -> Option<u32> {
        (self.mode == IommuMode::Iommufd).then_some(self.ioas)
    }

    /// The devices bound to the iommufd and attached to the IOAS, and still open (iommufd mode;
    /// empty otherwise).
    pub fn bound_devices(&self) -> Vec<Bdf> {
        let mut v: Vec<Bdf> = self
            .lock()
            .cdevs
            .iter()
            .filter(|(_, f)| f.upgrade().is_some_and(|f| !f.closed()))
            .map(|(&b, _)| b)
            .collect();
        v.sort();
        v
    }

    /// Opens `bdf` through its cdev, binds it to the iommufd and attaches it to the IOAS. A
    /// device open already in this process shares that file (a cdev binds only once).
    pub(super) fn iommufd_device(self: &Arc<Self>, bdf: Bdf) -> Result<Device, VfioError> {
        let info = sysfs::device(&self.host, bdf)?;
        let open = self.lock().cdevs.get(&bdf).and_then(|f| f.upgrade());
        if let Some(shared) = open {
            if let Some(fd) = shared.dup(&*self.sys) {
                return Device::new(Arc::clone(self), None, Arc::new(DevFd::new(bdf, fd)), bdf);
            }
        }
        if let Some(g) = info.iommu_group {
            if self.host.dev.join(format!("vfio/noiommu-{g}")).exists() {
                return Err(VfioError::IommufdNoIommu { bdf, group: g });
            }
        }
        if info.driver.as_deref() != Some("vfio-pci") {
            return Err(VfioError::NotBound {
                bdf,
                path: self.host.pci_device_dir(bdf).join("vfio-dev"),
            });
        }
        let Some(name) = sysfs::vfio_cdev(&self.host, bdf) else {
            return Err(VfioError::NoCdev {
                bdf,
                path: self.host.pci_device_dir(bdf).join("vfio-dev"),
            });
        };
        let path = self.host.dev.join("vfio/devices").join(&name);
        let fd = self.sys.open(&path).map_err(|e| {
            open_error(e, &path, || VfioError::NoCdev {
                bdf,
                path: path.clone(),
            })
        })?;
        let mut b = [0u8; bind::SIZE];
        uapi::put_u32(&mut b, bind::ARGSZ, bind::SIZE as u32);
        uapi::put_u32(&mut b, bind::IOMMUFD, raw(&self.fd) as u32);
        if let Err(e) = self
            .sys
            .ioctl(raw(&fd), uapi::req::DEVICE_BIND_IOMMUFD, IoctlArg::Buf(&mut b))
        {
            return Err(match e.raw_os_error() {
                // EBUSY: its group is open (the legacy path); EINVAL: the device is open
                // already (a cdev opens once: vfio_df_open).
                Some(libc::EBUSY) | Some(libc::EINVAL) => {
                    // Closed first, so that this process is not counted among the holders.
                    drop(fd);
                    let mut nodes = vec![path];
                    if let Some(g) = info.iommu_group {
                        nodes.push(self.host.dev.join(format!("vfio/{g}")));
                    }
                    VfioError::DeviceBusy {
                        bdf,
                        holders: sysfs::describe_holders(&sysfs::holders(&self.host, &nodes)),
                    }
                }
                _ => VfioError::Io {
                    what: format!("VFIO_DEVICE_BIND_IOMMUFD({bdf}, {})", path.display()),
                    source: e,
                },
            });
        }
        let devid = uapi::get_u32(&b, bind::OUT_DEVID);
        let mut a = [0u8; attach::SIZE];
        uapi::put_u32(&mut a, attach::ARGSZ, attach::SIZE as u32);
        uapi::put_u32(&mut a, attach::PT_ID, self.ioas);
        self.sys
            .ioctl(
                raw(&fd),
                uapi::req::DEVICE_ATTACH_IOMMUFD_PT,
                IoctlArg::Buf(&mut a),
            )
            .map_err(io_err(format!(
                "VFIO_DEVICE_ATTACH_IOMMUFD_PT({bdf}, IOAS {})",
                self.ioas
            )))?;
        let hwpt = uapi::get_u32(&a, attach::PT_ID);
        // Each attached device may narrow the usable IOVA ranges (its reserved regions).
        let ranges = self.ioas_info()?;
        log::debug!(
            "{bdf}: {} bound to iommufd (device id {devid}), attached to IOAS {} (HWPT {hwpt}); IOVA ranges {:x?}",
            path.display(),
            self.ioas,
            ranges.iova_ranges
        );
        let fd = Arc::new(DevFd::new(bdf, fd));
        {
            let mut st = self.lock();
            if let Some(before) = &st.info {
                if before.iova_ranges != ranges.iova_ranges {
                    log::warn!(
                        "{bdf}: attaching narrowed the IOAS's IOVA ranges from {:x?} to {:x?}; a DMA context made before may hand out IOVAs this device cannot use",
                        before.iova_ranges,
                        ranges.iova_ranges
                    );
                }
            }
            st.info = Some(ranges);
            st.cdevs.insert(bdf, Arc::downgrade(&fd));
        }
        Device::new(Arc::clone(self), None, fd, bdf)
    }

    /// Forgets the cdev file of a released device (if it is the one on record), so that the
    /// device opens afresh once it is back.
    pub(super) fn forget_cdev(&self, bdf: Bdf, fd: &Arc<DevFd>) {
        let mut st = self.lock();
        if st
            .cdevs
            .get(&bdf)
            .is_some_and(|f| std::ptr::eq(f.as_ptr(), Arc::as_ptr(fd)))
        {
            st.cdevs.remove(&bdf);
        }
    }

    /// The IOAS's usable IOVA ranges and alignment (`IOMMU_IOAS_IOVA_RANGES`), as [`IommuInfo`]:
    /// `page_sizes` holds only the smallest page (the IOVA alignment, at least 4 KiB): iommufd
    /// picks large IOMMU pages itself. No limit on the number of mappings is reported.
    fn ioas_info(&self) -> Result<IommuInfo, VfioError> {
        use fd_api::iova_ranges as r;
        let mut cap = 8usize;
        loop {
            let mut arg = [0u8; r::SIZE];
            let mut array = vec![0u8; cap * r::RANGE_SIZE];
            uapi::put_u32(&mut arg, r::SIZE_FIELD, r::SIZE as u32);
            uapi::put_u32(&mut arg, r::IOAS_ID, self.ioas);
            uapi::put_u32(&mut arg, r::NUM_IOVAS, cap as u32);
            let res = self.sys.ioctl(
                raw(&self.fd),
                fd_api::IOAS_IOVA_RANGES,
                IoctlArg::BufArray {
                    arg: &mut arg,
                    ptr_at: r::ALLOWED_IOVAS,
                    array: &mut array,
                },
            );
            let n = uapi::get_u32(&arg, r::NUM_IOVAS) as usize;
            match res {
                // More ranges than room: the kernel says how many there are.
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) && n > cap => {
                    cap = n;
                    continue;
                }
                Err(e) => {
                    return Err(VfioError::Io {
                        what: format!("IOMMU_IOAS_IOVA_RANGES(IOAS {})", self.ioas),
                        source: e,
                    })
                }
                Ok(_) => {}
            }
            let iova_ranges = (0..n.min(cap))
                .map(|i| {
                    let o = i * r::RANGE_SIZE;
                    uapi::get_u64(&array, o)..=uapi::get_u64(&array, o + 8)
                })
                .collect();
            let align = uapi::get_u64(&arg, r::OUT_IOVA_ALIGNMENT).max(4096);
            if !align.is_power_of_two() {
                return Err(VfioError::Io {
                    what: format!("IOMMU_IOAS_IOVA_RANGES(IOAS {})", self.ioas),
                    source: io::Error::other(format!("IOVA alignment {align:#x} is not a power of two")),
                });
            }
            return Ok(IommuInfo {
                page_sizes: align,
                iova_ranges,
                dma_avail: None,
            });
        }
    }

    /// `IOMMU_IOAS_MAP` with `FIXED_IOVA | READABLE | WRITEABLE`.
    ///
    /// # Safety
    /// As for [`Container::map_dma`].
    pub(super) unsafe fn ioas_map(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), VfioError> {
        use fd_api::ioas_map as m;
        let mut b = [0u8; m::SIZE];
        uapi::put_u32(&mut b, m::SIZE_FIELD, m::SIZE as u32);
        uapi::put_u32(
            &mut b,
            m::FLAGS,
            fd_api::MAP_FIXED_IOVA | fd_api::MAP_READABLE | fd_api::MAP_WRITEABLE,
        );
        uapi::put_u32(&mut b, m::IOAS_ID, self.ioas);
        uapi::put_u64(&mut b, m::USER_VA, vaddr as u64);
        uapi::put_u64(&mut b, m::LENGTH, len);
        uapi::put_u64(&mut b, m::IOVA, iova.get());
        self.sys
            .ioctl(raw(&self.fd), fd_api::IOAS_MAP, IoctlArg::Buf(&mut b))
            .map_err(|source| {
                let hint = match source.raw_os_error() {
                    Some(libc::ENOMEM) => " (the memlock limit is too low: iommufd charges pinned pages to RLIMIT_MEMLOCK, summed over the user's processes: `ulimit -l unlimited` up to the hard limit, `vfpoll setup --user $USER` prints the limit a run needs and how to raise it, or run as root)",
                    Some(libc::EEXIST) => " (the IOVA range overlaps an existing mapping)",
                    Some(libc::EINVAL) => " (address, length or IOVA not aligned to the IOAS's IOVA alignment)",
                    Some(libc::ENOENT) => " (the IOVA range is outside the IOAS's allowed ranges, or the IOAS is gone)",
                    Some(libc::EFAULT) => " (the memory cannot be pinned: a device BAR's mmap (PFNMAP) cannot be mapped through iommufd on this kernel; use --iommu-backend type1)",
                    _ => "",
                };
                VfioError::Map {
                    call: "IOMMU_IOAS_MAP",
                    iova,
                    len,
                    source,
                    hint,
                }
            })?;
        Ok(())
    }

    /// `IOMMU_IOAS_UNMAP` of exactly one earlier mapping.
    pub(super) fn ioas_unmap(&self, iova: Iova, len: u64) -> Result<(), VfioError> {
        use fd_api::ioas_unmap as u;
        let mut b = [0u8; u::SIZE];
        uapi::put_u32(&mut b, u::SIZE_FIELD, u::SIZE as u32);
        uapi::put_u32(&mut b, u::IOAS_ID, self.ioas);
        uapi::put_u64(&mut b, u::IOVA, iova.get());
        uapi::put_u64(&mut b, u::LENGTH, len);
        self.sys
            .ioctl(raw(&self.fd), fd_api::IOAS_UNMAP, IoctlArg::Buf(&mut b))
            .map_err(io_err(format!("IOMMU_IOAS_UNMAP({iova}, {len:#x})")))?;
        let done = uapi::get_u64(&b, u::LENGTH);
        if done != len {
            return Err(VfioError::Io {
                what: format!("IOMMU_IOAS_UNMAP({iova}, {len:#x})"),
                source: io::Error::other(format!("the kernel unmapped {done:#x} bytes")),
            });
        }
        Ok(())
    }
}
