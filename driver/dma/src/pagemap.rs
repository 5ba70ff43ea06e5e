//! Virtual → physical addresses through `/proc/self/pagemap` (no-IOMMU mode only).
//!
//! The file holds one little-endian `u64` per base page of the process's address space
//! (Linux `Documentation/admin-guide/mm/pagemap.rst`): bit 63 "present", bit 62 "swapped",
//! bits 0–54 the page frame number. Since Linux 4.2 the PFN reads as 0 unless the reader has
//! CAP_SYS_ADMIN, which is why no-IOMMU mode needs root.
//!
//! A page has a physical address only while it is in memory: lock it (and touch it) first.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::error::DmaError;
use crate::hugepage::base_page_size;
use vfpoll_pci::PhysAddr;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const PFN_MASK: u64 = (1 << 55) - 1;

/// What one pagemap entry says about a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// In memory at this page frame number.
    Present {
        /// Page frame number (physical address / base page size).
        pfn: u64,
    },
    /// In memory, but the kernel hid the frame number (reader lacks CAP_SYS_ADMIN).
    PresentPfnHidden,
    /// Swapped out.
    Swapped,
    /// Not in memory (never touched, or dropped).
    NotPresent,
}

/// Decodes one raw pagemap entry.
pub fn parse_entry(raw: u64) -> PageState {
    if raw & PRESENT != 0 {
        match raw & PFN_MASK {
            0 => PageState::PresentPfnHidden,
            pfn => PageState::Present { pfn },
        }
    } else if raw & SWAPPED != 0 {
        PageState::Swapped
    } else {
        PageState::NotPresent
    }
}

/// An open `/proc/self/pagemap`.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
    page: u64,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<Self, DmaError> {
        let file = File::open("/proc/self/pagemap").map_err(|source| DmaError::Pagemap { source })?;
        Ok(Pagemap {
            file,
            page: base_page_size(),
        })
    }

    /// The raw entry for the base page holding `vaddr`.
    pub fn entry(&self, vaddr: usize) -> Result<u64, DmaError> {
        let mut buf = [0u8; 8];
        let off = (vaddr as u64 / self.page) * 8;
        self.file
            .read_exact_at(&mut buf, off)
            .map_err(|source| DmaError::Pagemap { source })?;
        Ok(u64::from_le_bytes(buf))
    }

    /// The physical address of the byte at `vaddr`. The page must be present.
    pub fn phys_addr(&self, vaddr: usize) -> Result<PhysAddr, DmaError> {
        match parse_entry(self.entry(vaddr)?) {
            PageState::Present { pfn } => Ok(PhysAddr(pfn * self.page + vaddr as u64 % self.page)),
            PageState::PresentPfnHidden => Err(DmaError::PhysAddrNeedsRoot),
            PageState::Swapped | PageState::NotPresent => {
                Err(DmaError::PageNotPresent { vaddr: vaddr as u64 })
            }
        }
    }
}

/// The physical address of the byte at `vaddr` (opens the pagemap once per call).
pub fn virt_to_phys(vaddr: *const u8) -> Result<PhysAddr, DmaError> {
    Pagemap::open()?.phys_addr(vaddr.addr())
}

/// Whether this process may read physical frame numbers (has CAP_SYS_ADMIN in its effective
/// set), from `/proc/self/status`. For tests and diagnostics.
pub fn can_read_pfns() -> io::Result<bool> {
    const CAP_SYS_ADMIN: u32 = 21;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no CapEff line"))?;
    let caps =
        u64::from_str_radix(hex.trim(), 16).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(caps & (1 << CAP_SYS_ADMIN) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hugepage::{HugeMem, PageSize};
    use std::path::Path;

    #[test]
    fn entry_parsing() {
        assert_eq!(parse_entry(0), PageState::NotPresent);
        assert_eq!(parse_entry(PRESENT | 0x1234), PageState::Present { pfn: 0x1234 });
        assert_eq!(parse_entry(PRESENT), PageState::PresentPfnHidden);
        // Bits 55..=62 (soft-dirty, exclusive, file/shared, swapped) are not part of the PFN.
        assert_eq!(
            parse_entry(PRESENT | (0xff << 55) | 7),
            PageState::Present { pfn: 7 }
        );
        assert_eq!(
            parse_entry(PRESENT | PFN_MASK),
            PageState::Present { pfn: PFN_MASK }
        );
        assert_eq!(parse_entry(PRESENT | (1 << 55)), PageState::PresentPfnHidden);
        assert_eq!(parse_entry(SWAPPED | 0x55), PageState::Swapped);
        assert_eq!(parse_entry(1 << 61), PageState::NotPresent);
    }

    #[test]
    fn locked_page_has_a_physical_address_or_a_clear_error() {
        let mem = HugeMem::alloc(8192, PageSize::Base4K, Path::new("/sys")).unwrap();
        let p = mem.as_ptr();
        let pm = Pagemap::open().unwrap();
        if can_read_pfns().unwrap() {
            let a = pm.phys_addr(p.addr()).unwrap();
            let b = pm.phys_addr(p.addr() + 123).unwrap();
            assert_ne!(a.get(), 0);
            assert_eq!(a.get() % base_page_size(), 0);
            assert_eq!(b.get(), a.get() + 123, "offset within the page is kept");
            assert_eq!(virt_to_phys(p).unwrap(), a);
        } else {
            let e = pm.phys_addr(p.addr()).unwrap_err();
            assert!(matches!(e, DmaError::PhysAddrNeedsRoot), "{e:?}");
            assert!(e.to_string().contains("no-IOMMU mode needs root (CAP_SYS_ADMIN)"));
        }
    }

    #[test]
    fn untouched_page_is_not_present() {
        let len = 1 << 16;
        // SAFETY: a fresh private anonymous mapping; never touched, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let e = Pagemap::open().unwrap().phys_addr(p.addr() + 0x8000).unwrap_err();
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(p, len) };
        assert!(matches!(e, DmaError::PageNotPresent { .. }), "{e:?}");
    }
}
