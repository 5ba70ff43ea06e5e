//! Free space of the logical space, in pages: rebuilt at open from what the committed root
//! reaches (FORMAT.md §8), never stored.

use std::collections::BTreeMap;

/// The free page ranges.
#[derive(Debug, Clone)]
pub(crate) struct Allocator {
    /// start → length, disjoint, not adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    total: u64,
    free_pages: u64,
}

/// A page range that overlaps one already in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overlap {
    pub page: u64,
}

impl Allocator {
    /// All `total` pages free.
    pub fn new(total: u64) -> Self {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        Allocator {
            free,
            total,
            free_pages: total,
        }
    }

    /// Pages free.
    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    /// Pages in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Marks `page..page + n` used; fails (changing nothing) if any of it is not free or lies
    /// outside the space.
    pub fn mark_used(&mut self, page: u64, n: u64) -> Result<(), Overlap> {
        if n == 0 {
            return Ok(());
        }
        let end = page.checked_add(n).ok_or(Overlap { page })?;
        let Some((&start, &len)) = self.free.range(..=page).next_back() else {
            return Err(Overlap { page });
        };
        if start + len < end {
            return Err(Overlap { page });
        }
        self.free.remove(&start);
        if start < page {
            self.free.insert(start, page - start);
        }
        if end < start + len {
            self.free.insert(end, start + len - end);
        }
        self.free_pages -= n;
        Ok(())
    }

    /// Gives `page..page + n` back.
    pub fn free(&mut self, page: u64, n: u64) {
        if n == 0 {
            return;
        }
        debug_assert!(page + n <= self.total);
        let mut start = page;
        let mut len = n;
        if let Some((&p, &l)) = self.free.range(..page).next_back() {
            debug_assert!(p + l <= page, "double free of page {page}");
            if p + l == page {
                self.free.remove(&p);
                start = p;
                len += l;
            }
        }
        if let Some(&l) = self.free.get(&(page + n)) {
            self.free.remove(&(page + n));
            len += l;
        }
        self.free.insert(start, len);
        self.free_pages += n;
    }

    /// `n` contiguous pages, first fit; `None` if no free range is long enough.
    pub fn alloc_contiguous(&mut self, n: u64) -> Option<u64> {
        let (&start, _) = self.free.iter().find(|(_, &l)| l >= n)?;
        self.mark_used(start, n).ok()?;
        Some(start)
    }

    /// `n` pages as few runs as the free space allows, each cut at `chunk_pages` boundaries
    /// (so a run lies on one member); `None` (taking nothing) if fewer than `n` pages are free.
    pub fn alloc_runs(&mut self, n: u64, chunk_pages: u64) -> Option<Vec<(u64, u64)>> {
        if n > self.free_pages {
            return None;
        }
        let mut got = Vec::new();
        let mut left = n;
        // Prefer one range that holds it all, then the largest ranges first.
        let pick: Vec<(u64, u64)> = match self.free.iter().find(|(_, &l)| l >= n) {
            Some((&s, _)) => vec![(s, n)],
            None => {
                let mut all: Vec<(u64, u64)> = self.free.iter().map(|(&s, &l)| (s, l)).collect();
                all.sort_by_key(|r| std::cmp::Reverse(r.1));
                let mut v = Vec::new();
                for (s, l) in all {
                    if left == 0 {
                        break;
                    }
                    let take = l.min(left);
                    v.push((s, take));
                    left -= take;
                }
                v
            }
        };
        for (s, l) in pick {
            self.mark_used(s, l).expect("picked from the free ranges");
            let mut p = s;
            let end = s + l;
            while p < end {
                let chunk_end = (p / chunk_pages + 1) * chunk_pages;
                let e = chunk_end.min(end);
                got.push((p, e - p));
                p = e;
            }
        }
        Some(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_frees_and_coalesces() {
        let mut a = Allocator::new(100);
        assert_eq!(a.alloc_contiguous(10), Some(0));
        assert_eq!(a.alloc_contiguous(10), Some(10));
        a.mark_used(50, 5).unwrap();
        assert_eq!(a.mark_used(52, 1), Err(Overlap { page: 52 }));
        assert_eq!(a.mark_used(99, 2), Err(Overlap { page: 99 }));
        assert_eq!(a.free_pages(), 75);
        a.free(0, 10);
        a.free(10, 10);
        assert_eq!(a.alloc_contiguous(20), Some(0), "coalesced");
        a.free(0, 20);
        a.free(50, 5);
        assert_eq!(a.free_pages(), 100);
        assert_eq!(a.free.len(), 1);
    }

    #[test]
    fn runs_stop_at_chunk_boundaries_and_fail_whole() {
        let mut a = Allocator::new(64);
        a.mark_used(10, 2).unwrap();
        let r = a.alloc_runs(20, 16).unwrap();
        assert_eq!(r, vec![(12, 4), (16, 16)]);
        assert_eq!(a.alloc_runs(100, 16), None);
        assert_eq!(a.free_pages(), 64 - 2 - 20);
        let r = a.alloc_runs(42, 16).unwrap();
        assert_eq!(r.iter().map(|x| x.1).sum::<u64>(), 42);
        assert_eq!(a.free_pages(), 0);
    }
}
