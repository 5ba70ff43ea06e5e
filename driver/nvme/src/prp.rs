//! Physical Region Page entries and lists (NVMe Base 2.0 §4.1.1), as pure logic.
//!
//! A transfer of `len` bytes starting at bus address `start` is described by PRP1 (the first
//! byte, which may sit anywhere in a memory page, dword aligned) and, for the remaining memory
//! pages, either PRP2 directly (exactly two pages) or PRP2 pointing at a PRP list. A list page
//! holds `page / 8` entries; when more are needed, the last entry of a full page points to the
//! next list page ("chained" lists).

use vfpoll_pci::BusAddr;

/// Where PRP list entries go: a few memory pages of DMA memory owned by a request tracker.
pub trait PrpListMem {
    /// How many list pages are available.
    fn pages(&self) -> usize;
    /// Bus address of list page `page`.
    fn page_bus(&self, page: usize) -> BusAddr;
    /// Stores entry `idx` of list page `page`.
    fn write(&mut self, page: usize, idx: usize, entry: BusAddr);
}

impl<T: PrpListMem + ?Sized> PrpListMem for &mut T {
    fn pages(&self) -> usize {
        (**self).pages()
    }
    fn page_bus(&self, page: usize) -> BusAddr {
        (**self).page_bus(page)
    }
    fn write(&mut self, page: usize, idx: usize, entry: BusAddr) {
        (**self).write(page, idx, entry)
    }
}

/// Why a transfer cannot be described with PRPs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    /// PRP1 must be dword aligned (§4.1.1: bits 1:0 are zero).
    #[error(
        "the buffer's bus address {0:#x} is not 4-byte aligned; NVMe data buffers must be dword aligned"
    )]
    Misaligned(u64),
    /// An entry after the first must start a memory page.
    #[error("memory page {index} of the transfer starts at bus address {addr:#x}, which is not page aligned; the buffer is not bus-contiguous per page")]
    UnalignedPage {
        /// Which page.
        index: usize,
        /// Its bus address.
        addr: u64,
    },
    /// More list entries are needed than the tracker's list pages hold.
    #[error("the transfer needs {needed} PRP list pages but {available} are available; split it (the driver does this at MDTS)")]
    ListTooSmall {
        /// Pages needed.
        needed: usize,
        /// Pages available.
        available: usize,
    },
    /// Zero-length transfer.
    #[error("zero-length data transfer")]
    Empty,
}

/// How many memory pages a transfer touches.
pub const fn pages_spanned(start: u64, len: usize, page: usize) -> usize {
    let first_off = (start as usize) & (page - 1);
    (first_off + len).div_ceil(page)
}

/// How many list pages `entries` list entries need (chaining costs one entry per full page).
pub const fn list_pages_for(entries: usize, page: usize) -> usize {
    let per = page / 8;
    if entries <= per {
        1
    } else {
        // Every page but the last holds per - 1 data entries plus a chain pointer.
        1 + (entries - per).div_ceil(per - 1)
    }
}

/// The largest transfer (bytes) that `list_pages` list pages can always describe, whatever the
/// first page's offset.
pub const fn max_transfer(list_pages: usize, page: usize) -> usize {
    let per = page / 8;
    let entries = list_pages * (per - 1) + 1; // the last page needs no chain entry
                                              // PRP1 covers at least one byte of a page, the list `entries` more whole pages; an unaligned
                                              // start costs one page.
    entries * page
}

/// Builds PRP1 and PRP2 for a transfer. `page_bus(i)` gives the bus address of the `i`-th memory
/// page of the transfer for `i >= 1` (page 0 is `start`'s page). List entries are written into
/// `lists` when more than two pages are touched.
pub fn build(
    start: BusAddr,
    len: usize,
    page: usize,
    mut page_bus: impl FnMut(usize) -> BusAddr,
    lists: &mut impl PrpListMem,
) -> Result<(BusAddr, BusAddr), PrpError> {
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if !start.is_aligned(4) {
        return Err(PrpError::Misaligned(start.get()));
    }
    let n = pages_spanned(start.get(), len, page);
    let mut entry = |i: usize| {
        let a = page_bus(i);
        if !a.is_aligned(page as u64) {
            Err(PrpError::UnalignedPage {
                index: i,
                addr: a.get(),
            })
        } else {
            Ok(a)
        }
    };
    match n {
        1 => Ok((start, BusAddr(0))),
        2 => Ok((start, entry(1)?)),
        _ => {
            let entries = n - 1;
            let needed = list_pages_for(entries, page);
            if needed > lists.pages() {
                return Err(PrpError::ListTooSmall {
                    needed,
                    available: lists.pages(),
                });
            }
            let per = page / 8;
            let (mut lp, mut idx) = (0, 0);
            for i in 1..n {
                let remaining = n - i;
                if idx == per - 1 && remaining > 1 {
                    // Full page with more to come: chain to the next list page.
                    lists.write(lp, idx, lists.page_bus(lp + 1));
                    lp += 1;
                    idx = 0;
                }
                lists.write(lp, idx, entry(i)?);
                idx += 1;
            }
            Ok((start, lists.page_bus(0)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    /// `build` over plain numbers, for terse tests.
    fn b(
        start: u64,
        len: usize,
        page: usize,
        bus: impl Fn(usize) -> u64,
        l: &mut Lists,
    ) -> Result<(u64, u64), PrpError> {
        build(BusAddr(start), len, page, |i| BusAddr(bus(i)), l).map(|(x, y)| (x.get(), y.get()))
    }

    /// List pages in a Vec, at fake bus addresses 0xa000_0000 + page * P.
    struct Lists(Vec<Vec<u64>>);
    impl PrpListMem for Lists {
        fn pages(&self) -> usize {
            self.0.len()
        }
        fn page_bus(&self, page: usize) -> BusAddr {
            BusAddr(0xa000_0000 + (page * P) as u64)
        }
        fn write(&mut self, page: usize, idx: usize, entry: BusAddr) {
            self.0[page][idx] = entry.get();
        }
    }

    fn lists(n: usize) -> Lists {
        Lists(vec![vec![0; P / 8]; n])
    }

    /// Walks PRP1/PRP2/lists like a controller would and returns the data page addresses.
    fn walk(prp1: u64, prp2: u64, len: usize, l: &Lists) -> Vec<u64> {
        let n = pages_spanned(prp1, len, P);
        let mut out = vec![prp1];
        if n == 2 {
            out.push(prp2);
        } else if n > 2 {
            let mut page = ((prp2 - 0xa000_0000) as usize) / P;
            let mut idx = 0;
            while out.len() < n {
                let e = l.0[page][idx];
                if idx == P / 8 - 1 && out.len() < n - 1 {
                    page = ((e - 0xa000_0000) as usize) / P;
                    idx = 0;
                    continue;
                }
                out.push(e);
                idx += 1;
            }
        }
        out
    }

    #[test]
    fn small_transfers_use_prp1_and_prp2() {
        let mut l = lists(1);
        let bus = |i: usize| 0x10_0000 + (i * P) as u64;
        assert_eq!(b(0x10_0200, 512, P, bus, &mut l), Ok((0x10_0200, 0)));
        assert_eq!(b(0x10_0000, P, P, bus, &mut l), Ok((0x10_0000, 0)));
        // 4 KiB starting mid-page touches two pages.
        assert_eq!(
            b(0x10_0800, P, P, |i| 0x20_0000 + (i * P) as u64, &mut l),
            Ok((0x10_0800, 0x20_1000))
        );
        assert_eq!(
            b(0x10_0002, 8, P, bus, &mut l),
            Err(PrpError::Misaligned(0x10_0002))
        );
        assert_eq!(b(0x10_0000, 0, P, bus, &mut l), Err(PrpError::Empty));
    }

    #[test]
    fn lists_and_chains_describe_every_page_once() {
        for (start_off, len) in [
            (0, 3 * P),
            (0x200, 3 * P),
            (0, 513 * P),
            (0, 512 * P + 1),
            (0x800, 2 << 20),
            (0, 4 << 20),
        ] {
            let start = 0x4000_0000 + start_off as u64;
            let n = pages_spanned(start, len, P);
            let need = list_pages_for(n - 1, P);
            let mut l = lists(need);
            // Scatter the data pages so any mix-up shows.
            let bus = |i: usize| 0x8_0000_0000 + (i as u64 * 7919 % 100_000) * P as u64;
            let (p1, p2) = b(start, len, P, bus, &mut l).unwrap();
            let pages = walk(p1, p2, len, &l);
            assert_eq!(pages.len(), n);
            for (i, &a) in pages.iter().enumerate().skip(1) {
                assert_eq!(a, bus(i), "page {i} of {len:#x}@{start_off:#x}");
            }
            if need > 1 {
                let mut short = lists(need - 1);
                assert_eq!(
                    b(start, len, P, bus, &mut short),
                    Err(PrpError::ListTooSmall {
                        needed: need,
                        available: need - 1
                    })
                );
            }
        }
    }

    #[test]
    fn list_page_math() {
        assert_eq!(list_pages_for(1, P), 1);
        assert_eq!(list_pages_for(512, P), 1);
        assert_eq!(list_pages_for(513, P), 2);
        assert_eq!(list_pages_for(512 + 511, P), 2);
        assert_eq!(list_pages_for(512 + 512, P), 3);
        assert_eq!(pages_spanned(0x1ffc, 8, P), 2);
        // max_transfer is safe for the worst-case offset.
        for pages in 1..4 {
            let m = max_transfer(pages, P);
            assert!(list_pages_for(pages_spanned(0xffc, m, P) - 1, P) <= pages);
        }
    }

    #[test]
    fn unaligned_later_page_is_refused() {
        let mut l = lists(1);
        let e = b(0x1000, 3 * P, P, |i| 0x10_0000 + (i * P) as u64 + 8, &mut l).unwrap_err();
        assert!(matches!(e, PrpError::UnalignedPage { index: 1, .. }));
    }
}
