//! Address newtypes.
//!
//! A driver juggles four kinds of address that are all `u64` underneath and must never be mixed:
//! the CPU's virtual address of a mapping, the I/O virtual address a device uses behind an IOMMU,
//! the CPU-physical address (no-IOMMU mode), and the PCI bus address of a BAR. Each gets its own
//! type; conversions between them exist only where the hardware defines one.

use core::fmt;

macro_rules! addr_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn get(self) -> u64 {
                self.0
            }

            /// This address plus `off` bytes (panics on overflow in debug builds).
            #[inline]
            #[must_use]
            pub const fn add(self, off: u64) -> Self {
                Self(self.0 + off)
            }

            /// Whether the address is a multiple of `align` (a power of two).
            #[inline]
            pub const fn is_aligned(self, align: u64) -> bool {
                self.0 & (align - 1) == 0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

addr_type!(
    /// An I/O virtual address: what a device puts on the bus when an IOMMU translates for it
    /// (VFIO type1 mode).
    Iova
);
addr_type!(
    /// A CPU-physical address, as read from `/proc/self/pagemap` (no-IOMMU mode).
    PhysAddr
);
addr_type!(
    /// A PCI bus address: the address a device must use to reach memory or a peer's BAR.
    /// Behind an IOMMU it is an [`Iova`]; without one it is the physical address.
    BusAddr
);

impl From<Iova> for BusAddr {
    #[inline]
    fn from(a: Iova) -> Self {
        BusAddr(a.0)
    }
}

impl From<PhysAddr> for BusAddr {
    /// Without an IOMMU (no-IOMMU mode, x86) the device sees CPU-physical addresses unchanged.
    #[inline]
    fn from(a: PhysAddr) -> Self {
        BusAddr(a.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_and_alignment() {
        let a = Iova(0x1_0000_0000);
        assert_eq!(format!("{a:?}"), "Iova(0x100000000)");
        assert_eq!(format!("{a}"), "0x100000000");
        assert!(a.is_aligned(1 << 21));
        assert!(!a.add(8).is_aligned(16));
        assert_eq!(BusAddr::from(a), BusAddr(0x1_0000_0000));
    }
}
