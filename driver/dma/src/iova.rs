//! The IOVA allocator: which bus addresses behind the IOMMU are free.
//!
//! Pure bookkeeping over the mapper's IOVA windows (control path only). Free space is a set of
//! disjoint, page-aligned ranges kept in a `BTreeMap` (start → last byte, inclusive, so a window
//! ending at `u64::MAX` needs no special case). Allocation is first fit by address with the
//! requested alignment; freeing merges a range with its neighbours, so after everything is
//! given back the free set equals the initial one.
//!
//! IOVA 0 is never handed out: a zero bus address in a descriptor is far more often a bug than
//! an intended address, and some devices treat it as "none".

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate::error::DmaError;
use vfpoll_pci::Iova;

/// Free IOVA space of one IOMMU domain.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    /// Free ranges: start → last byte (inclusive). Disjoint and never adjacent (always merged).
    free: BTreeMap<u64, u64>,
    /// The windows as built (after alignment and dropping page 0), to reject foreign frees.
    windows: Vec<(u64, u64)>,
    page: u64,
}

impl IovaAllocator {
    /// An allocator over `ranges` (inclusive, may overlap or touch) in units of `page_size`
    /// (a power of two). Parts of a range that are not whole pages are dropped, and so is the
    /// first page, so IOVA 0 is never allocated.
    ///
    /// # Panics
    /// If `page_size` is not a power of two.
    pub fn new(ranges: &[RangeInclusive<u64>], page_size: u64) -> Self {
        assert!(
            page_size.is_power_of_two(),
            "IOVA page size {page_size:#x} is not a power of two"
        );
        let mut a = IovaAllocator {
            free: BTreeMap::new(),
            windows: Vec::new(),
            page: page_size,
        };
        let mut pieces: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|r| r.start() <= r.end())
            .filter_map(|r| {
                let start = align_up(*r.start(), page_size)?.max(page_size);
                // Last byte of the last whole page within the range (a window that ends at
                // u64::MAX ends on a page boundary, 2^64).
                let last = match r.end().checked_add(1) {
                    None => u64::MAX,
                    Some(end) => (end & !(page_size - 1)).checked_sub(1)?,
                };
                (start <= last).then_some((start, last))
            })
            .collect();
        pieces.sort_unstable();
        for (s, l) in pieces {
            match a.windows.last_mut() {
                Some((_, prev_last)) if prev_last.checked_add(1).is_none_or(|n| n >= s) => {
                    *prev_last = (*prev_last).max(l);
                }
                _ => a.windows.push((s, l)),
            }
        }
        a.free = a.windows.iter().copied().collect();
        a
    }

    /// The allocation unit.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// Allocates `len` bytes (rounded up to whole pages) at an IOVA aligned to
    /// `max(page size, align)`; `align` must be a power of two (0 means "page size").
    /// Returns the IOVA; give the same rounded length back to [`IovaAllocator::free`]
    /// (see [`IovaAllocator::round_len`]).
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<Iova, DmaError> {
        let len = self.round_len(len)?;
        let align = align.max(self.page);
        if !align.is_power_of_two() {
            return Err(DmaError::Misaligned {
                what: "IOVA alignment",
                value: align,
                align: self.page,
            });
        }
        let found = self.free.iter().find_map(|(&start, &last)| {
            let at = align_up(start, align)?;
            // The range [at, at+len-1] must end at or before `last`.
            (at <= last && last - at >= len - 1).then_some((start, last, at))
        });
        let Some((start, last, at)) = found else {
            return Err(DmaError::IovaExhausted {
                requested: len,
                largest_free: self.largest_free(),
                total_free: self.total_free(),
            });
        };
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - 1);
        }
        let alloc_last = at + (len - 1);
        if alloc_last < last {
            self.free.insert(alloc_last + 1, last);
        }
        Ok(Iova(at))
    }

    /// `len` rounded up to whole pages; an error for 0 or on overflow.
    pub fn round_len(&self, len: u64) -> Result<u64, DmaError> {
        match align_up(len, self.page) {
            Some(l) if l != 0 => Ok(l),
            _ => Err(DmaError::BadLength { len }),
        }
    }

    /// Gives back `len` bytes (rounded up to whole pages) at `iova`, merging with free neighbours.
    /// Fails, changing nothing, if any part of the range is free already or outside the windows.
    pub fn free(&mut self, iova: Iova, len: u64) -> Result<(), DmaError> {
        let bad = || DmaError::IovaNotAllocated { iova, len };
        let len = self.round_len(len).map_err(|_| bad())?;
        let start = iova.get();
        if !iova.is_aligned(self.page) {
            return Err(bad());
        }
        let last = start.checked_add(len - 1).ok_or_else(bad)?;
        if !self.windows.iter().any(|&(s, l)| s <= start && last <= l) {
            return Err(bad());
        }
        let prev = self.free.range(..=start).next_back().map(|(&s, &l)| (s, l));
        let next = self.free.range(start..).next().map(|(&s, &l)| (s, l));
        if prev.is_some_and(|(_, l)| l >= start) || next.is_some_and(|(s, _)| s <= last) {
            return Err(bad());
        }
        let (mut new_start, mut new_last) = (start, last);
        if let Some((s, l)) = prev.filter(|&(_, l)| l + 1 == start) {
            self.free.remove(&s);
            new_start = s;
            debug_assert_eq!(l + 1, start);
        }
        if let Some((s, l)) = next.filter(|&(s, _)| last.checked_add(1) == Some(s)) {
            self.free.remove(&s);
            new_last = l;
        }
        self.free.insert(new_start, new_last);
        Ok(())
    }

    /// Bytes free in all (saturates at `u64::MAX`).
    pub fn total_free(&self) -> u64 {
        self.free
            .iter()
            .fold(0u64, |acc, (&s, &l)| acc.saturating_add(l - s).saturating_add(1))
    }

    /// Length of the largest free range, ignoring alignment (saturates at `u64::MAX`).
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .map(|(&s, &l)| (l - s).saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// The free ranges, in address order.
    pub fn free_ranges(&self) -> Vec<RangeInclusive<u64>> {
        self.free.iter().map(|(&s, &l)| s..=l).collect()
    }
}

pub(crate) use crate::page::align_up;

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn never_hands_out_zero_and_rounds_to_pages() {
        let mut a = IovaAllocator::new(&[0..=0xf_ffff], P);
        assert_eq!(a.free_ranges(), vec![P..=0xf_ffff]);
        let x = a.alloc(1, 0).unwrap();
        assert_eq!(x, Iova(P));
        assert_eq!(
            a.alloc(P + 1, 0).unwrap(),
            Iova(2 * P),
            "a 1-byte allocation still takes a whole page"
        );
        assert_eq!(a.total_free(), 0x10_0000 - 4 * P);
    }

    #[test]
    fn partial_pages_of_windows_are_dropped_and_windows_merged() {
        let a = IovaAllocator::new(
            &[
                0x1800..=0x4fff,
                0x5000..=0x6fff,
                0x9000..=0x9ffe,
                0x20000..=0x21000,
            ],
            P,
        );
        assert_eq!(a.free_ranges(), vec![0x2000..=0x6fff, 0x20000..=0x20fff]);
        let empty = IovaAllocator::new(&[0..=0xfff, 0x1001..=0x1ffe], P);
        assert!(empty.free_ranges().is_empty());
    }

    #[test]
    fn window_ending_at_u64_max() {
        let mut a = IovaAllocator::new(&[0..=u64::MAX], P);
        assert_eq!(a.free_ranges(), vec![P..=u64::MAX]);
        assert_eq!(a.total_free(), u64::MAX - P + 1);
        let top = a.alloc(P, 1 << 63).unwrap();
        assert_eq!(top, Iova(1 << 63));
        let last = Iova(u64::MAX - P + 1);
        a.free(top, P).unwrap();
        // Ask for the very last page by carving everything before it.
        let big = a.alloc(u64::MAX - 2 * P + 1, 0).unwrap();
        assert_eq!(big, Iova(P));
        assert_eq!(a.free_ranges(), vec![last.get()..=u64::MAX]);
        assert_eq!(a.alloc(P, 0).unwrap(), last);
        a.free(last, P).unwrap();
        a.free(big, u64::MAX - 2 * P + 1).unwrap();
        assert_eq!(a.free_ranges(), vec![P..=u64::MAX]);
    }

    #[test]
    fn alignment_is_honoured_and_leftovers_stay_free() {
        let mut a = IovaAllocator::new(&[0..=0xfff_ffff], P);
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_eq!(x, Iova(0x20_0000));
        assert_eq!(a.free_ranges(), vec![P..=0x1f_ffff, 0x40_0000..=0xfff_ffff]);
        // The hole below fits small allocations.
        assert_eq!(a.alloc(P, 0).unwrap(), Iova(P));
        assert!(matches!(a.alloc(P, 3 * P), Err(DmaError::Misaligned { .. })));
    }

    #[test]
    fn msi_window_is_never_handed_out() {
        let mut a = IovaAllocator::new(&[0..=0xfedf_ffff, 0xfef0_0000..=0xffff_ffff], 0x20_0000);
        let mut got = Vec::new();
        while let Ok(x) = a.alloc(0x20_0000, 0) {
            got.push(x.get());
        }
        assert_eq!(
            got.len(),
            (0x1_0000_0000 - 0x20_0000 - 0x20_0000) / 0x20_0000,
            "pages 0 and 0xfee00000 excluded"
        );
        assert!(got
            .iter()
            .all(|&x| x != 0 && !(0xfee0_0000..=0xfeef_ffff).contains(&x)));
    }

    #[test]
    fn exhaustion_reports_what_is_free() {
        let mut a = IovaAllocator::new(&[0..=0xf_ffff], P);
        let x = a.alloc(0x8000, 0).unwrap();
        let _y = a.alloc(0x1000, 0).unwrap();
        a.free(x, 0x8000).unwrap();
        let err = a.alloc(0x10_0000, 0).unwrap_err();
        match err {
            DmaError::IovaExhausted {
                requested,
                largest_free,
                total_free,
            } => {
                assert_eq!(requested, 0x10_0000);
                assert_eq!(largest_free, 0x10_0000 - 0xa000);
                assert_eq!(total_free, 0x10_0000 - 0x2000);
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = a.alloc(0x10_0000, 0).unwrap_err().to_string();
        assert!(
            msg.contains("drop DMA regions") && msg.contains("0x100000 bytes requested"),
            "{msg}"
        );
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let mut a = IovaAllocator::new(&[0..=0xf_ffff], P);
        let x = a.alloc(2 * P, 0).unwrap();
        let before = a.free_ranges();
        for (iova, len) in [
            (x.get() + P, 2 * P),
            (x.get() - P, P),
            (x.get() + 1, P),
            (0x20_0000, P),
            (0, P),
            (x.get(), 0),
        ] {
            assert!(
                matches!(a.free(Iova(iova), len), Err(DmaError::IovaNotAllocated { .. })),
                "free({iova:#x}, {len:#x}) accepted"
            );
            assert_eq!(a.free_ranges(), before);
        }
        let y = a.alloc(P, 0).unwrap();
        a.free(x, 2 * P).unwrap();
        assert!(a.free(x, 2 * P).is_err(), "double free accepted");
        // A range whose head is already free (overlaps the free range before it).
        assert!(
            a.free(Iova(x.get() + P), 2 * P).is_err(),
            "overlap with the preceding free range accepted"
        );
        a.free(y, P).unwrap();
        assert_eq!(a.free_ranges(), vec![P..=0xf_ffff]);
        assert!(a.alloc(0, 0).is_err());
        assert!(a.alloc(u64::MAX, 0).is_err());
    }

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Reference model: one bool per page; allocation is the lowest aligned run of free pages.
    struct Model {
        free: Vec<bool>,
    }
    impl Model {
        fn alloc(&mut self, pages: usize, align_pages: usize) -> Option<usize> {
            let at = (0..self.free.len())
                .step_by(align_pages)
                .find(|&a| a + pages <= self.free.len() && self.free[a..a + pages].iter().all(|&f| f))?;
            self.free[at..at + pages].iter_mut().for_each(|f| *f = false);
            Some(at)
        }
        fn ranges(&self) -> Vec<RangeInclusive<u64>> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < self.free.len() {
                if self.free[i] {
                    let s = i;
                    while i < self.free.len() && self.free[i] {
                        i += 1;
                    }
                    out.push(s as u64 * P..=i as u64 * P - 1);
                } else {
                    i += 1;
                }
            }
            out
        }
    }

    #[test]
    fn matches_reference_model_under_random_alloc_free() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            const PAGES: u64 = 512;
            // Up to four random windows (may overlap/touch), partly unaligned.
            let windows: Vec<RangeInclusive<u64>> = (0..1 + rng.below(4))
                .map(|_| {
                    let s = rng.below(PAGES * P);
                    let e = (s + rng.below(PAGES * P / 2)).min(PAGES * P - 1);
                    s..=e
                })
                .collect();
            let mut a = IovaAllocator::new(&windows, P);
            let mut model = Model {
                free: vec![false; PAGES as usize],
            };
            for w in &windows {
                for p in 1..PAGES {
                    // A page is usable if it lies wholly inside some window.
                    if *w.start() <= p * P && p * P + P - 1 <= *w.end() {
                        model.free[p as usize] = true;
                    }
                }
            }
            assert_eq!(
                a.free_ranges(),
                model.ranges(),
                "seed {seed}: initial windows {windows:x?}"
            );
            let initial = a.free_ranges();
            let mut live: Vec<(Iova, u64)> = Vec::new();
            for step in 0..400 {
                if live.is_empty() || rng.below(100) < 55 {
                    let len = 1 + rng.below(24 * P);
                    let align = P << rng.below(6);
                    let pages = len.div_ceil(P) as usize;
                    let want = model.alloc(pages, (align / P) as usize);
                    match (a.alloc(len, align), want) {
                        (Ok(x), Some(m)) => {
                            assert_eq!(x.get(), m as u64 * P, "seed {seed} step {step}");
                            assert!(x.get() != 0 && x.is_aligned(align));
                            live.push((x, len));
                        }
                        (Err(DmaError::IovaExhausted { requested, .. }), None) => {
                            assert_eq!(requested, pages as u64 * P);
                        }
                        (got, want) => panic!("seed {seed} step {step}: got {got:?}, model {want:?}"),
                    }
                } else {
                    let (x, len) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    a.free(x, len).unwrap();
                    let first = (x.get() / P) as usize;
                    model.free[first..first + len.div_ceil(P) as usize]
                        .iter_mut()
                        .for_each(|f| *f = true);
                }
                assert_eq!(a.free_ranges(), model.ranges(), "seed {seed} step {step}");
                assert_eq!(
                    a.total_free(),
                    model.free.iter().filter(|&&f| f).count() as u64 * P
                );
            }
            for (x, len) in live.drain(..) {
                a.free(x, len).unwrap();
            }
            assert_eq!(
                a.free_ranges(),
                initial,
                "seed {seed}: everything freed must coalesce back"
            );
        }
    }
}
