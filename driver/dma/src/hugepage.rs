//! Pinned host memory for DMA: hugepages (anonymous or from a hugetlbfs mount) or, for tests
//! and device models, ordinary 4 KiB pages.
//!
//! Every allocation is
//! - `MAP_SHARED`: a private mapping becomes copy-on-write after `fork()`, and the first write
//!   by the parent then moves its virtual page to a new physical page while the device keeps
//!   writing to the old one. A shared mapping is never copied;
//! - populated and `mlock`ed: every page exists before its address is handed to a device;
//! - `MADV_DONTFORK`: a child process does not inherit the mapping at all, so nothing in the
//!   child can touch buffers the device owns.
//!
//! Hugepages do not move and are physically contiguous within one page, which is what no-IOMMU
//! mode needs. 4 KiB pages are locked but the kernel may still migrate locked pages
//! (compaction), so their physical addresses are not stable: with an IOMMU VFIO pins them
//! itself; without one, use hugepages.
//!
//! Memory asked for on a NUMA node ([`NumaPlacement::Node`], see [`crate::numa`]) is mapped
//! without `MAP_POPULATE`, bound to the node, populated (`MADV_POPULATE_WRITE`) and then checked
//! page by page; any other memory is populated by `mmap` itself. 1 GiB pages work as 2 MiB ones
//! do, but the kernel can only reserve them reliably at boot (`hugepagesz=1G hugepages=N` on
//! its command line, spread over the nodes round robin; per node in
//! `/sys/devices/system/node/node<N>/hugepages/hugepages-1048576kB/nr_hugepages`).
//!
//! This module holds the `mmap`/`mlock`/`madvise` calls of the crate.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::DmaError;
use crate::numa::{self, NumaPlacement};
pub use crate::page::{HugepageCounters, PageSize};

/// Explains a failed hugepage allocation of `len` bytes from the counters under `sys`:
/// `Some(error)` when the counters show the cause (size not offered, too few pages), `None`
/// when they look fine (then the mmap error itself is the best explanation).
pub(crate) fn diagnose_shortage(sys: &Path, size: PageSize, len: u64) -> Option<DmaError> {
    if !size.is_huge() {
        return None;
    }
    let sysfs_dir = size.sysfs_dir(sys);
    let counters = match HugepageCounters::read(sys, size) {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Some(DmaError::HugepageSizeUnsupported {
                page_size: size,
                sysfs_dir,
            })
        }
        Err(e) => {
            log::debug!("cannot read hugepage counters in {}: {e}", sysfs_dir.display());
            return None;
        }
    };
    let needed = len.div_ceil(size.bytes());
    let free = counters.available();
    if free >= needed {
        return None;
    }
    let target_pages = counters.total + (needed - free);
    Some(match size {
        PageSize::Huge1G => DmaError::Huge1GNotReserved {
            needed,
            free,
            total: counters.total,
            target_pages,
            sysfs_dir,
        },
        _ => DmaError::HugepagesUnavailable {
            page_size: size,
            needed,
            free,
            total: counters.total,
            target_pages,
            target_mib: (target_pages * size.bytes()).div_ceil(1 << 20),
            sysfs_dir,
        },
    })
}

/// The base page size of the machine (what `/proc/self/pagemap` is indexed by).
pub(crate) fn base_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions and touches no memory of ours.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v)
        .ok()
        .filter(|v| v.is_power_of_two())
        .unwrap_or(4096)
}

/// The soft RLIMIT_MEMLOCK in bytes, `None` if unlimited or unreadable.
fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively borrowed `rl`.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    (rc == 0 && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// An owned, populated, locked, never-forked mapping of host memory for DMA.
///
/// Only a raw pointer to the memory is ever handed out: see the crate docs for why no
/// reference may point into it.
#[derive(Debug)]
pub struct HugeMem {
    ptr: NonNull<u8>,
    len: usize,
    page_size: PageSize,
    /// The node every page was checked to be on ([`NumaPlacement::Node`]); `None`: not asked.
    node: Option<u32>,
}

// SAFETY: HugeMem owns its mapping outright (no thread affinity, no shared bookkeeping); it
// only hands out raw pointers, so moving it to another thread moves nothing but the ownership.
unsafe impl Send for HugeMem {}
// SAFETY: no method reads or writes the memory through `&self`; `&HugeMem` only yields the
// pointer and length, which are immutable.
unsafe impl Sync for HugeMem {}

impl HugeMem {
    /// Anonymous memory of at least `len` bytes (rounded up to whole pages) of `page_size`
    /// pages. `sys` is the sysfs root (`/sys`), read only to explain a hugepage shortage.
    pub fn alloc(len: u64, page_size: PageSize, sys: &Path) -> Result<Self, DmaError> {
        Self::alloc_placed(len, page_size, NumaPlacement::Any, sys)
    }

    /// [`HugeMem::alloc`] on the NUMA node `placement` names: bound there before the first
    /// touch and checked page by page afterwards; a node without enough free pages of
    /// `page_size`, or pages that landed elsewhere all the same, are errors.
    pub fn alloc_placed(
        len: u64,
        page_size: PageSize,
        placement: NumaPlacement,
        sys: &Path,
    ) -> Result<Self, DmaError> {
        let rounded = page_size.round_up(len).ok_or(DmaError::BadLength { len })?;
        let ulen = usize::try_from(rounded).map_err(|_| DmaError::BadLength { len })?;
        if let NumaPlacement::Node(node) = placement {
            numa::check_node(sys, node, page_size, rounded)?;
        }
        let flags =
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | populate_flag(placement) | page_size.mmap_flags();
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing; it
        // cannot overlap anything we own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ulen,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let source = io::Error::last_os_error();
            return Err(
                diagnose_shortage(sys, page_size, rounded).unwrap_or(DmaError::Mmap {
                    len: rounded,
                    page_size,
                    source,
                }),
            );
        }
        Self::finish(p, ulen, page_size, placement, sys)
    }

    /// Memory of at least `len` bytes from the hugetlbfs mount `mount`, whose page size must be
    /// `page_size`. The backing file is unlinked at once, so nothing is left behind.
    pub fn alloc_in(len: u64, page_size: PageSize, mount: &Path, sys: &Path) -> Result<Self, DmaError> {
        Self::alloc_in_placed(len, page_size, NumaPlacement::Any, mount, sys)
    }

    /// [`HugeMem::alloc_in`] on the NUMA node `placement` names (see
    /// [`HugeMem::alloc_placed`]).
    pub fn alloc_in_placed(
        len: u64,
        page_size: PageSize,
        placement: NumaPlacement,
        mount: &Path,
        sys: &Path,
    ) -> Result<Self, DmaError> {
        let rounded = page_size.round_up(len).ok_or(DmaError::BadLength { len })?;
        let ulen = usize::try_from(rounded).map_err(|_| DmaError::BadLength { len })?;
        check_hugetlbfs(mount, page_size)?;
        if let NumaPlacement::Node(node) = placement {
            numa::check_node(sys, node, page_size, rounded)?;
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            ".vfpoll-dma-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let file_err = |source| DmaError::HugetlbfsFile {
            path: mount.to_owned(),
            len: rounded,
            source,
        };
        let path = mount.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(file_err)?;
        fs::remove_file(&path).map_err(file_err)?;
        file.set_len(rounded).map_err(file_err)?;
        let flags = libc::MAP_SHARED | populate_flag(placement);
        // SAFETY: a new shared mapping of our own, just-created file at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ulen,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let source = io::Error::last_os_error();
            return Err(diagnose_shortage(sys, page_size, rounded).unwrap_or_else(|| file_err(source)));
        }
        // The mapping keeps the file alive; the descriptor is no longer needed.
        drop(file);
        Self::finish(p, ulen, page_size, placement, sys)
    }

    /// Binds a fresh mapping to its node and populates it (when a node was asked for), locks
    /// and `MADV_DONTFORK`s it, and checks where its pages are; unmaps it again on failure.
    fn finish(
        p: *mut libc::c_void,
        len: usize,
        page_size: PageSize,
        placement: NumaPlacement,
        sys: &Path,
    ) -> Result<Self, DmaError> {
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| DmaError::Mmap {
            len: len as u64,
            page_size,
            source: io::Error::other("mmap returned address 0"),
        })?;
        // From here on, Drop unmaps.
        let mut mem = HugeMem {
            ptr,
            len,
            page_size,
            node: None,
        };
        if let NumaPlacement::Node(node) = placement {
            // SAFETY: the range is our own mapping, created just above and not touched yet.
            unsafe { numa::bind(ptr.as_ptr(), len, node) }.map_err(|source| DmaError::MemCall {
                call: "mbind(MPOL_BIND)",
                source,
            })?;
            populate(p, len, page_size, node, sys)?;
        }
        // SAFETY: the range is our own mapping, created just above.
        if unsafe { libc::mlock(p, len) } != 0 {
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::ENOMEM | libc::EPERM) => DmaError::MemlockLimit {
                    needed: len as u64,
                    limit: memlock_limit(),
                    source,
                },
                _ => DmaError::MemCall {
                    call: "mlock",
                    source,
                },
            });
        }
        // SAFETY: as above; MADV_DONTFORK changes only what fork() does with the range.
        if unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) } != 0 {
            return Err(DmaError::MemCall {
                call: "madvise(MADV_DONTFORK)",
                source: io::Error::last_os_error(),
            });
        }
        if let NumaPlacement::Node(node) = placement {
            numa::verify(ptr.as_ptr(), len, page_size, node)?;
            mem.node = Some(node);
        }
        log::debug!(
            "DMA memory: {len:#x} bytes of {page_size} pages at {p:p}{}",
            mem.node.map_or(String::new(), |n| format!(" on NUMA node {n}"))
        );
        Ok(mem)
    }

    /// Start of the memory (aligned to the page size).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a multiple of the page size).
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: zero-length allocations are refused"
    )]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The page size.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// The NUMA node all pages were checked to be on, when one was asked for
    /// ([`HugeMem::alloc_placed`]); `None` otherwise (see [`numa::page_nodes`] to look).
    pub fn numa_node(&self) -> Option<u32> {
        self.node
    }
}

/// `MAP_POPULATE` unless the mapping must be bound to a node first (then [`populate`] faults
/// it in after `mbind`).
fn populate_flag(placement: NumaPlacement) -> libc::c_int {
    match placement {
        NumaPlacement::Any => libc::MAP_POPULATE,
        NumaPlacement::Node(_) => 0,
    }
}

/// Faults in a mapping bound to `node` (`MADV_POPULATE_WRITE`, Linux 5.14): a node that runs
/// out of hugepages fails here with an error that names it, where a plain first touch would
/// kill the process with SIGBUS. On older kernels (EINVAL) `mlock` populates it instead.
fn populate(p: *mut libc::c_void, len: usize, size: PageSize, node: u32, sys: &Path) -> Result<(), DmaError> {
    // SAFETY: the range is the caller's own fresh mapping; populating writes nothing into it
    // (it faults in zeroed pages) and forms no reference.
    if unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) } == 0 {
        return Ok(());
    }
    let source = io::Error::last_os_error();
    if source.raw_os_error() == Some(libc::EINVAL) {
        return Ok(());
    }
    // The node ran short after the check (another process took pages): say so with today's counters.
    Err(numa::check_node(sys, node, size, len as u64)
        .err()
        .or_else(|| diagnose_shortage(sys, size, len as u64))
        .unwrap_or(DmaError::MemCall {
            call: "madvise(MADV_POPULATE_WRITE) on a NUMA-bound mapping",
            source,
        }))
}

impl Drop for HugeMem {
    fn drop(&mut self) {
        // SAFETY: we own this mapping; no pointer into it outlives HugeMem by the contracts of
        // the types holding it (they unmap from the IOMMU first, in their own Drop).
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            log::error!(
                "munmap of DMA memory at {:p} failed: {}",
                self.ptr,
                io::Error::last_os_error()
            );
        }
    }
}

/// Checks that `mount` is a hugetlbfs with pages of `size`.
fn check_hugetlbfs(mount: &Path, size: PageSize) -> Result<(), DmaError> {
    let not = || DmaError::NotHugetlbfs {
        path: mount.to_owned(),
        page_size: size,
    };
    let c = CString::new(mount.as_os_str().as_bytes()).map_err(|_| not())?;
    // SAFETY: all-zero bytes are a valid `statfs` (plain integers).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid, exclusively borrowed out-buffer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        log::debug!("statfs {}: {}", mount.display(), io::Error::last_os_error());
        return Err(not());
    }
    #[allow(
        clippy::unnecessary_cast,
        reason = "f_type and f_bsize types differ between libcs"
    )]
    let ok = st.f_type as i64 == libc::HUGETLBFS_MAGIC as i64 && st.f_bsize as u64 == size.bytes();
    if ok {
        Ok(())
    } else {
        Err(not())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fake_sys(size: PageSize, nr: u64, free: u64, resv: u64) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let dir = size.sysfs_dir(t.path());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("nr_hugepages"), format!("{nr}\n")).unwrap();
        fs::write(dir.join("free_hugepages"), format!("{free}\n")).unwrap();
        fs::write(dir.join("resv_hugepages"), format!("{resv}\n")).unwrap();
        t
    }

    #[test]
    fn page_size_math() {
        assert_eq!(PageSize::Huge2M.round_up(1), Some(2 << 20));
        assert_eq!(PageSize::Huge2M.round_up(2 << 20), Some(2 << 20));
        assert_eq!(PageSize::Huge1G.round_up((1 << 30) + 1), Some(2 << 30));
        assert_eq!(PageSize::Base4K.round_up(0), None);
        assert_eq!(PageSize::Base4K.round_up(u64::MAX), None);
        assert_eq!(
            PageSize::Huge2M.sysfs_dir(Path::new("/sys")),
            Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB")
        );
        assert_eq!(
            PageSize::Huge1G.sysfs_dir(Path::new("/x")),
            Path::new("/x/kernel/mm/hugepages/hugepages-1048576kB")
        );
    }

    #[test]
    fn shortage_of_2m_pages_says_how_many_and_how() {
        // 4 reserved, 2 free of which 1 is promised: 1 available. Ask for 5 MiB = 3 pages.
        let t = fake_sys(PageSize::Huge2M, 4, 2, 1);
        let e = diagnose_shortage(t.path(), PageSize::Huge2M, 5 << 20).expect("shortage not seen");
        match &e {
            DmaError::HugepagesUnavailable {
                needed,
                free,
                total,
                target_pages,
                target_mib,
                ..
            } => {
                assert_eq!(
                    (*needed, *free, *total, *target_pages, *target_mib),
                    (3, 1, 4, 6, 12)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        let nr = t.path().join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
        assert!(msg.contains("3 needed, 1 free of 4"), "{msg}");
        assert!(msg.contains("`vfpoll setup --hugepages 12`"), "{msg}");
        assert!(msg.contains(&format!("`echo 6 > {}`", nr.display())), "{msg}");
        // Enough pages: no diagnosis (the mmap error stands).
        assert!(diagnose_shortage(t.path(), PageSize::Huge2M, 2 << 20).is_none());
    }

    #[test]
    fn missing_1g_pages_point_at_boot_parameters() {
        let t = fake_sys(PageSize::Huge1G, 0, 0, 0);
        let e = diagnose_shortage(t.path(), PageSize::Huge1G, 3 << 30).expect("shortage not seen");
        assert!(matches!(
            e,
            DmaError::Huge1GNotReserved {
                needed: 3,
                free: 0,
                total: 0,
                target_pages: 3,
                ..
            }
        ));
        let msg = e.to_string();
        assert!(
            msg.contains("hugepagesz=1G hugepages=3") && msg.contains("use 2 MiB pages"),
            "{msg}"
        );
    }

    #[test]
    fn unsupported_size_is_named() {
        let t = fake_sys(PageSize::Huge2M, 8, 8, 0);
        let e = diagnose_shortage(t.path(), PageSize::Huge1G, 1 << 30).expect("missing size not seen");
        assert!(matches!(
            e,
            DmaError::HugepageSizeUnsupported {
                page_size: PageSize::Huge1G,
                ..
            }
        ));
        assert!(e.to_string().contains("hugepages-1048576kB is missing"), "{e}");
        assert!(diagnose_shortage(t.path(), PageSize::Base4K, 1 << 30).is_none());
    }

    #[test]
    fn memlock_message_gives_the_fixes() {
        let e = DmaError::MemlockLimit {
            needed: 0x400000,
            limit: Some(8 << 20),
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("0x400000 bytes") && msg.contains("8388608 bytes"),
            "{msg}"
        );
        assert!(
            msg.contains("ulimit -l unlimited") && msg.contains("limits.conf") && msg.contains("root"),
            "{msg}"
        );
    }

    #[test]
    fn base_pages_are_rounded_zeroed_and_writable() {
        let m = HugeMem::alloc(5000, PageSize::Base4K, Path::new("/sys")).unwrap();
        assert_eq!(m.len(), 8192);
        assert_eq!(m.as_ptr().addr() % 4096, 0);
        let p = m.as_ptr();
        let last = p.wrapping_add(8191);
        // SAFETY: `last` lies inside the 8 KiB mapping, which nothing else uses (same below).
        assert_eq!(unsafe { last.read() }, 0);
        // SAFETY: as above.
        unsafe { last.write(0x5a) };
        // SAFETY: as above.
        assert_eq!(unsafe { last.read() }, 0x5a);
        assert!(HugeMem::alloc(0, PageSize::Base4K, Path::new("/sys")).is_err());
    }

    #[test]
    fn impossible_hugepage_request_is_explained() {
        // 1 TiB of 2 MiB pages exists nowhere this test runs; the error must come from the
        // real counters, not a bare ENOMEM.
        let e = HugeMem::alloc(1 << 40, PageSize::Huge2M, Path::new("/sys")).unwrap_err();
        assert!(
            matches!(
                e,
                DmaError::HugepagesUnavailable { needed: 524288, .. }
                    | DmaError::HugepageSizeUnsupported { .. }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_plain_directory_is_not_hugetlbfs() {
        let t = tempfile::tempdir().unwrap();
        let e = HugeMem::alloc_in(1 << 21, PageSize::Huge2M, t.path(), Path::new("/sys")).unwrap_err();
        assert!(matches!(e, DmaError::NotHugetlbfs { .. }), "{e:?}");
        assert!(
            e.to_string().contains("mount -t hugetlbfs -o pagesize=2M none"),
            "{e}"
        );
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 0, "left a file behind");
    }

    #[test]
    #[ignore = "needs hugepages"]
    fn anonymous_2m_pages() {
        let m = HugeMem::alloc(3 << 20, PageSize::Huge2M, Path::new("/sys")).unwrap();
        assert_eq!(m.len(), 4 << 20);
        assert_eq!(m.as_ptr().addr() % (2 << 20), 0);
        // SAFETY: inside the mapping.
        unsafe { m.as_ptr().wrapping_add(m.len() - 1).write(1) };
    }

    /// Needs a hugetlbfs mount with 2 MiB pages at $VFPOLL_HUGETLBFS (default /dev/hugepages).
    #[test]
    #[ignore = "needs hugepages"]
    fn hugetlbfs_2m_pages() {
        let mount = std::env::var_os("VFPOLL_HUGETLBFS")
            .map_or_else(|| PathBuf::from("/dev/hugepages"), PathBuf::from);
        let m = HugeMem::alloc_in(1, PageSize::Huge2M, &mount, Path::new("/sys")).unwrap();
        assert_eq!(m.len(), 2 << 20);
        assert_eq!(m.as_ptr().addr() % (2 << 20), 0);
        let left = fs::read_dir(&mount).unwrap().filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&format!(".vfpoll-dma-{}-", std::process::id()))
        });
        assert_eq!(left.count(), 0, "backing file not unlinked");
    }
}
