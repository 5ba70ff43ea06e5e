//! The IOMMU side of DMA: who makes memory visible to a device, and at which bus address.
//!
//! [`DmaMapper`] is implemented for a VFIO container by the platform layer (type1 `MAP_DMA` /
//! `UNMAP_DMA`, or iommufd `IOMMU_IOAS_MAP` / `UNMAP`), and here by [`FakeMapper`] for tests and in-process device models.

use std::collections::BTreeMap;
use std::io;
use std::ops::RangeInclusive;
use std::sync::{Mutex, MutexGuard};

use crate::error::DmaError;
use vfpoll_pci::{BusAddr, Iova};

/// How a device reaches host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapKind {
    /// Behind an IOMMU: the device uses IOVAs that [`DmaMapper::map`] set up.
    Iommu,
    /// No IOMMU (VFIO no-IOMMU mode): the device uses CPU-physical addresses, read from
    /// `/proc/self/pagemap`. No map calls are made. Anything the device is told, it can reach:
    /// this mode gives no protection at all.
    NoIommu,
}

/// Makes host memory reachable by a device at an IOVA.
///
/// One mapper stands for one IOMMU domain (one VFIO container). All its users must share one
/// [`crate::DmaContext`], whose IOVA allocator hands out the addresses given to [`DmaMapper::map`].
pub trait DmaMapper: Send + Sync {
    /// Whether there is an IOMMU. With [`MapKind::NoIommu`], `map` and `unmap` are never called.
    fn kind(&self) -> MapKind;

    /// The usable IOVA windows (inclusive ranges). They respect the IOMMU's address width and
    /// leave out reserved ranges such as the x86 MSI window `0xfee00000..=0xfeefffff`
    /// (VFIO: `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`).
    fn iova_ranges(&self) -> Vec<RangeInclusive<u64>>;

    /// The smallest page the IOMMU maps (a power of two, normally 4 KiB). Addresses and lengths
    /// given to `map` are multiples of it.
    fn min_page_size(&self) -> u64;

    /// Lets the device reach `len` bytes at `vaddr` through `iova..iova+len`.
    ///
    /// # Safety
    /// `vaddr..vaddr+len` is a mapping of this process (host memory, or the mmap of another
    /// VFIO device's BAR) that stays mapped, at the same pages, until `unmap(iova, len)` has
    /// returned. `vaddr`, `len` and `iova` are multiples of [`Self::min_page_size`], and the
    /// IOVA range lies in [`Self::iova_ranges`] and is not mapped yet.
    unsafe fn map(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), DmaError>;

    /// Like [`DmaMapper::map`], for the mmap of a peer device's BAR ([`crate::register_peer_bar`]),
    /// so that a mapper that cannot map device memory (iommufd in Linux 6.12) can say so in
    /// its error. The default is `map`.
    ///
    /// # Safety
    /// As for [`DmaMapper::map`].
    unsafe fn map_peer(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), DmaError> {
        // SAFETY: forwarded from our caller.
        unsafe { self.map(vaddr, len, iova) }
    }

    /// Removes the mapping made by `map(_, len, iova)`. After it returns the device can no
    /// longer reach that memory.
    fn unmap(&self, iova: Iova, len: u64) -> Result<(), DmaError>;
}

/// One call seen by a [`FakeMapper`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapCall {
    /// A successful `map`. `vaddr` is the address as an integer, for comparisons only.
    Map {
        /// CPU address mapped.
        vaddr: usize,
        /// Length.
        len: u64,
        /// IOVA given.
        iova: Iova,
    },
    /// A `map` that failed (injected, or refused because it was invalid).
    FailedMap {
        /// CPU address.
        vaddr: usize,
        /// Length.
        len: u64,
        /// IOVA asked for.
        iova: Iova,
    },
    /// A successful `unmap`.
    Unmap {
        /// IOVA of the mapping.
        iova: Iova,
        /// Its length.
        len: u64,
    },
    /// An `unmap` that failed.
    FailedUnmap {
        /// IOVA asked for.
        iova: Iova,
        /// Length asked for.
        len: u64,
    },
}

#[derive(Debug, Default)]
struct FakeState {
    /// Live mappings: IOVA → (CPU address with exposed provenance, length).
    live: BTreeMap<u64, (usize, u64)>,
    calls: Vec<MapCall>,
    fail_next_map: bool,
    fail_next_unmap: bool,
}

/// A [`DmaMapper`] without hardware, for tests and in-process device models.
///
/// It behaves like a strict VFIO type1 container: it checks alignment, IOVA windows and
/// overlaps, records every call ([`FakeMapper::calls`]), can be told to fail the next map or
/// unmap (fault injection), and lets a device model turn a bus address back into a CPU pointer
/// over its live mappings ([`FakeMapper::translate`]), which is how a simulated device "does DMA".
///
/// By default it is an IOMMU with 4 KiB pages and the windows of a typical x86 machine with a
/// 39-bit IOMMU: `0..=0xfedfffff` and `0xfef00000..=0x7f_ffff_ffff` (the MSI window left out).
/// [`FakeMapper::no_iommu`] makes one that reports [`MapKind::NoIommu`] and refuses all map calls.
#[derive(Debug)]
pub struct FakeMapper {
    kind: MapKind,
    ranges: Vec<RangeInclusive<u64>>,
    page_size: u64,
    state: Mutex<FakeState>,
}

impl Default for FakeMapper {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeMapper {
    /// An IOMMU with 4 KiB pages and the default x86-like windows.
    pub fn new() -> Self {
        FakeMapper {
            kind: MapKind::Iommu,
            ranges: vec![0..=0xfedf_ffff, 0xfef0_0000..=0x7f_ffff_ffff],
            page_size: 4096,
            state: Mutex::new(FakeState::default()),
        }
    }

    /// A mapper that reports [`MapKind::NoIommu`] (the device sees physical addresses).
    pub fn no_iommu() -> Self {
        FakeMapper {
            kind: MapKind::NoIommu,
            ..Self::new()
        }
    }

    /// Replaces the IOVA windows.
    #[must_use]
    pub fn with_ranges(mut self, ranges: Vec<RangeInclusive<u64>>) -> Self {
        self.ranges = ranges;
        self
    }

    /// Replaces the IOMMU page size (a power of two).
    #[must_use]
    pub fn with_page_size(mut self, page_size: u64) -> Self {
        assert!(page_size.is_power_of_two(), "page size must be a power of two");
        self.page_size = page_size;
        self
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock leaves valid state behind: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next `map` fail (and map nothing).
    pub fn fail_next_map(&self) {
        self.state().fail_next_map = true;
    }

    /// Makes the next `unmap` fail (and leave the mapping in place).
    pub fn fail_next_unmap(&self) {
        self.state().fail_next_unmap = true;
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<MapCall> {
        self.state().calls.clone()
    }

    /// The live mappings as (IOVA, length), in IOVA order.
    pub fn live_mappings(&self) -> Vec<(Iova, u64)> {
        self.state()
            .live
            .iter()
            .map(|(&iova, &(_, len))| (Iova(iova), len))
            .collect()
    }

    /// The CPU pointer behind `len` bytes at bus address `bus`, if one live mapping covers all
    /// of them. This is the device model's view of DMA: it reads and writes through the pointer
    /// (with raw-pointer copies, never references) while the mapping is live.
    pub fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8> {
        let st = self.state();
        let (&iova, &(vaddr, map_len)) = st.live.range(..=bus.get()).next_back()?;
        let off = bus.get() - iova;
        if len == 0 || off.checked_add(len)? > map_len {
            return None;
        }
        let addr = vaddr.checked_add(usize::try_from(off).ok()?)?;
        Some(std::ptr::with_exposed_provenance_mut(addr))
    }

    fn check_map(&self, st: &FakeState, vaddr: usize, len: u64, iova: u64) -> Result<(), &'static str> {
        let p = self.page_size;
        let misaligned = |v: u64| v & (p - 1) != 0;
        if len == 0 || misaligned(len) || misaligned(iova) || misaligned(vaddr as u64) {
            return Err("address or length not a multiple of the IOMMU page size");
        }
        let last = iova.checked_add(len - 1).ok_or("IOVA range wraps around")?;
        if !self.ranges.iter().any(|r| *r.start() <= iova && last <= *r.end()) {
            return Err("IOVA range outside the usable windows");
        }
        let overlaps_prev = st
            .live
            .range(..=iova)
            .next_back()
            .is_some_and(|(&s, &(_, l))| s + (l - 1) >= iova);
        let overlaps_next = st.live.range(iova..).next().is_some_and(|(&s, _)| s <= last);
        if overlaps_prev || overlaps_next {
            return Err("IOVA range already mapped (EEXIST)");
        }
        Ok(())
    }
}

impl DmaMapper for FakeMapper {
    fn kind(&self) -> MapKind {
        self.kind
    }

    fn iova_ranges(&self) -> Vec<RangeInclusive<u64>> {
        self.ranges.clone()
    }

    fn min_page_size(&self) -> u64 {
        self.page_size
    }

    unsafe fn map(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), DmaError> {
        let addr = vaddr.expose_provenance();
        let mut st = self.state();
        let verdict = if self.kind == MapKind::NoIommu {
            Err("map called on a no-IOMMU mapper")
        } else if std::mem::take(&mut st.fail_next_map) {
            Err("injected map failure")
        } else {
            self.check_map(&st, addr, len, iova.get())
        };
        match verdict {
            Ok(()) => {
                st.live.insert(iova.get(), (addr, len));
                st.calls.push(MapCall::Map {
                    vaddr: addr,
                    len,
                    iova,
                });
                Ok(())
            }
            Err(why) => {
                st.calls.push(MapCall::FailedMap {
                    vaddr: addr,
                    len,
                    iova,
                });
                Err(DmaError::Map {
                    iova,
                    len,
                    source: io::Error::other(why).into(),
                })
            }
        }
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), DmaError> {
        let mut st = self.state();
        let why = if std::mem::take(&mut st.fail_next_unmap) {
            "injected unmap failure"
        } else if st.live.get(&iova.get()).is_some_and(|&(_, l)| l == len) {
            st.live.remove(&iova.get());
            st.calls.push(MapCall::Unmap { iova, len });
            return Ok(());
        } else {
            "no mapping with this IOVA and length"
        };
        st.calls.push(MapCall::FailedUnmap { iova, len });
        Err(DmaError::Unmap {
            iova,
            len,
            source: io::Error::other(why).into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(m: &FakeMapper, vaddr: usize, len: u64, iova: u64) -> Result<(), DmaError> {
        // SAFETY: the fake mapper never dereferences the pointer; it only records it.
        unsafe { m.map(std::ptr::with_exposed_provenance_mut(vaddr), len, Iova(iova)) }
    }

    #[test]
    fn records_and_checks_calls() {
        let m = FakeMapper::new();
        map(&m, 0x10000, 0x2000, 0x100000).unwrap();
        // Overlap with the live mapping, misalignment, outside the windows (MSI hole).
        assert!(map(&m, 0x20000, 0x1000, 0x101000).is_err());
        assert!(map(&m, 0x20000, 0x1000, 0x0ff000).is_ok());
        assert!(map(&m, 0x20000, 0x800, 0x200000).is_err());
        assert!(map(&m, 0x20000, 0x1000, 0xfee0_0000).is_err());
        assert!(map(&m, 0x20000, 0x1000, 0x80_0000_0000).is_err());
        assert_eq!(
            m.live_mappings(),
            vec![(Iova(0xff000), 0x1000), (Iova(0x100000), 0x2000)]
        );
        // Unmap must name a mapping exactly.
        assert!(m.unmap(Iova(0x100000), 0x1000).is_err());
        m.unmap(Iova(0x100000), 0x2000).unwrap();
        assert!(m.unmap(Iova(0x100000), 0x2000).is_err());
        let calls = m.calls();
        assert_eq!(
            calls[0],
            MapCall::Map {
                vaddr: 0x10000,
                len: 0x2000,
                iova: Iova(0x100000)
            }
        );
        assert!(matches!(calls[1], MapCall::FailedMap { .. }));
        assert_eq!(
            calls[calls.len() - 2],
            MapCall::Unmap {
                iova: Iova(0x100000),
                len: 0x2000
            }
        );
        assert_eq!(m.live_mappings(), vec![(Iova(0xff000), 0x1000)]);
    }

    #[test]
    fn fault_injection_fails_once() {
        let m = FakeMapper::new();
        m.fail_next_map();
        assert!(matches!(
            map(&m, 0x1000, 0x1000, 0x1000),
            Err(DmaError::Map { .. })
        ));
        assert!(m.live_mappings().is_empty());
        map(&m, 0x1000, 0x1000, 0x1000).unwrap();
        m.fail_next_unmap();
        assert!(matches!(
            m.unmap(Iova(0x1000), 0x1000),
            Err(DmaError::Unmap { .. })
        ));
        assert_eq!(m.live_mappings().len(), 1);
        m.unmap(Iova(0x1000), 0x1000).unwrap();
    }

    #[test]
    fn no_iommu_refuses_maps() {
        let m = FakeMapper::no_iommu();
        assert_eq!(m.kind(), MapKind::NoIommu);
        assert!(map(&m, 0x1000, 0x1000, 0x1000).is_err());
    }

    #[test]
    fn translate_covers_live_mappings_only() {
        let m = FakeMapper::new();
        map(&m, 0x40_0000, 0x3000, 0x10_0000).unwrap();
        let at = |bus: u64, len| m.translate(BusAddr(bus), len).map(|p| p.addr());
        assert_eq!(at(0x10_0000, 1), Some(0x40_0000));
        assert_eq!(at(0x10_2ff0, 0x10), Some(0x40_2ff0));
        assert_eq!(at(0x10_2ff0, 0x11), None, "runs past the mapping");
        assert_eq!(at(0x0f_ffff, 1), None, "before the mapping");
        assert_eq!(at(0x10_0000, 0), None);
        m.unmap(Iova(0x10_0000), 0x3000).unwrap();
        assert_eq!(at(0x10_0000, 1), None, "unmapped");
    }
}
