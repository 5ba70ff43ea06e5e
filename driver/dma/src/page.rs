//! Page sizes and the kernel's hugepage counters: the bottom of the crate, imported by the
//! allocator (`hugepage`), NUMA placement (`numa`), the IOVA allocator and
//! the error type, and importing none of them.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The page size backing a DMA allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// Ordinary pages (4 KiB): for tests and in-process device models, or IOMMU mode when
    /// hugepages cannot be had. Not physically stable: do not use in no-IOMMU mode.
    Base4K,
    /// 2 MiB hugepages.
    Huge2M,
    /// 1 GiB hugepages (normally reserved at boot).
    Huge1G,
}

impl PageSize {
    /// Bytes per page.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Base4K => 4 << 10,
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// Whether this is a hugepage size.
    pub const fn is_huge(self) -> bool {
        !matches!(self, PageSize::Base4K)
    }

    /// `len` rounded up to whole pages; `None` for 0 or on overflow.
    pub fn round_up(self, len: u64) -> Option<u64> {
        align_up(len, self.bytes()).filter(|&l| l != 0)
    }

    /// The name used by `mount -o pagesize=` ("4K", "2M", "1G").
    pub(crate) const fn short_name(self) -> &'static str {
        match self {
            PageSize::Base4K => "4K",
            PageSize::Huge2M => "2M",
            PageSize::Huge1G => "1G",
        }
    }

    /// `<sys>/kernel/mm/hugepages/hugepages-<kB>kB`.
    pub fn sysfs_dir(self, sys: &Path) -> PathBuf {
        sys.join("kernel/mm/hugepages")
            .join(format!("hugepages-{}kB", self.bytes() >> 10))
    }

    /// The `mmap` flags that ask for this page size.
    pub(crate) fn mmap_flags(self) -> libc::c_int {
        match self {
            PageSize::Base4K => 0,
            PageSize::Huge2M => libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageSize::Huge1G => libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageSize::Base4K => "4 KiB",
            PageSize::Huge2M => "2 MiB",
            PageSize::Huge1G => "1 GiB",
        })
    }
}

/// The kernel's counters for one hugepage size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugepageCounters {
    /// `nr_hugepages`: pages in the pool.
    pub total: u64,
    /// `free_hugepages`: pages not faulted in (includes reserved ones).
    pub free: u64,
    /// `resv_hugepages`: free pages promised to existing mappings.
    pub reserved: u64,
}

impl HugepageCounters {
    /// Reads the counters under `sys` (normally `/sys`); `Ok(None)` if the kernel offers no
    /// pages of this size.
    pub fn read(sys: &Path, size: PageSize) -> io::Result<Option<Self>> {
        Self::read_dir(&size.sysfs_dir(sys))
    }

    /// Reads the counters in `dir` (a `hugepages-<kB>kB` directory, global or of one NUMA node);
    /// `Ok(None)` if it does not exist.
    pub fn read_dir(dir: &Path) -> io::Result<Option<Self>> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let num = |name: &str| -> io::Result<u64> {
            let path = dir.join(name);
            let text = fs::read_to_string(&path)?;
            text.trim()
                .parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
        };
        // resv_hugepages is absent in some trees; treat it as 0.
        let reserved = num("resv_hugepages").unwrap_or(0);
        Ok(Some(HugepageCounters {
            total: num("nr_hugepages")?,
            free: num("free_hugepages")?,
            reserved,
        }))
    }

    /// Pages free for a new mapping.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }
}

/// `v` rounded up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}
