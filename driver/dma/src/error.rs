//! The one error type of the DMA layer.
//!
//! Every message says what went wrong *and* what to do about it, because most of these errors
//! surface at start-up on an operator's terminal (no hugepages, memlock limit, no root).

use std::io;
use std::path::PathBuf;

use crate::page::PageSize;
use vfpoll_pci::Iova;

/// The error a [`crate::DmaMapper`] returns as the cause of a failed map or unmap
/// (an `io::Error` from an ioctl, a `VfioError`, ...).
pub type MapperSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the DMA memory layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DmaError {
    /// No free IOVA range is large enough.
    #[error(
        "IOVA space exhausted: {requested:#x} bytes requested, the largest free range is {largest_free:#x} bytes \
         ({total_free:#x} bytes free in all); drop DMA regions and pools you no longer need, or ask for a smaller \
         region or pool"
    )]
    IovaExhausted {
        /// Bytes asked for (rounded up to the page size).
        requested: u64,
        /// Length of the largest free range, ignoring alignment.
        largest_free: u64,
        /// Sum of all free ranges.
        total_free: u64,
    },

    /// An IOVA range was given back that was not allocated (double free or foreign range).
    #[error(
        "IOVA range {iova}+{len:#x} is not allocated (double free, or a range from another allocator); \
         this is a bookkeeping bug in the caller: report it"
    )]
    IovaNotAllocated {
        /// Start of the range.
        iova: Iova,
        /// Its length.
        len: u64,
    },

    /// A length of zero, or one so large that it overflows when rounded to the page size.
    #[error(
        "a DMA length of {len:#x} bytes cannot be used: pass a non-zero length that fits the address space"
    )]
    BadLength {
        /// The length given.
        len: u64,
    },

    /// A null pointer was given as memory to register.
    #[error("a null pointer was given as DMA memory: pass the start of a mapping")]
    NullPointer,

    /// An address or length is not aligned as the IOMMU or the hardware needs.
    #[error("{what} {value:#x} is not aligned to {align:#x} bytes: align it (IOMMUs map whole pages, registers need natural alignment)")]
    Misaligned {
        /// What was misaligned ("address", "length", "offset").
        what: &'static str,
        /// The value.
        value: u64,
        /// The alignment needed.
        align: u64,
    },

    /// A copy or access falls outside a region, buffer or BAR.
    #[error("an access of {len} bytes at offset {offset:#x} does not fit the {size}-byte DMA area: check the offset arithmetic")]
    OutOfBounds {
        /// Offset of the access.
        offset: usize,
        /// Bytes accessed.
        len: usize,
        /// Size of the area.
        size: usize,
    },

    /// A pool buffer was used with a pool it does not come from (or a slot buffer with slots).
    #[error("DMA buffer {index} was used with a pool or slot set it does not come from: keep each buffer with the pool or slots that made it")]
    ForeignBuffer {
        /// The buffer's index in its own pool.
        index: usize,
    },

    /// The CPU asked for a buffer that a device command holds.
    #[error("DMA buffer {index} is lent to a device command: touch it only after the completion has given it back")]
    InUse {
        /// The buffer's index (a slot number).
        index: usize,
    },

    /// The IOMMU maps in larger units than the pages asked for.
    #[error(
        "the IOMMU maps in units of {mapper_page:#x} bytes, more than the {page_size} pages asked for: \
         allocate with a larger page size (PageSize::Huge2M)"
    )]
    PageTooSmall {
        /// The mapper's minimum page size.
        mapper_page: u64,
        /// The page size of the memory.
        page_size: PageSize,
    },

    /// The pool's buffer size or count cannot be used.
    #[error("cannot carve a pool of {count} buffers of {buf_size} bytes out of {page_size} pages: {reason}")]
    BadPoolGeometry {
        /// Buffer size asked for.
        buf_size: usize,
        /// Number of buffers asked for.
        count: usize,
        /// Page size of the backing memory.
        page_size: PageSize,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },

    /// Not enough free hugepages of a size that the kernel offers.
    #[error(
        "not enough free {page_size} hugepages: {needed} needed, {free} free of {total} reserved; reserve more with \
         `vfpoll setup --hugepages {target_mib}` or `echo {target_pages} > {nr_path}`",
        nr_path = sysfs_dir.join("nr_hugepages").display()
    )]
    HugepagesUnavailable {
        /// The page size.
        page_size: PageSize,
        /// Pages this allocation needs.
        needed: u64,
        /// Pages free and not reserved by other mappings.
        free: u64,
        /// Pages reserved in all (`nr_hugepages`).
        total: u64,
        /// The `nr_hugepages` value that would leave enough free pages.
        target_pages: u64,
        /// `target_pages` in MiB.
        target_mib: u64,
        /// `/sys/kernel/mm/hugepages/hugepages-<kB>kB`.
        sysfs_dir: PathBuf,
    },

    /// 1 GiB pages are not reserved (they normally have to be reserved at boot).
    #[error(
        "not enough free 1 GiB hugepages: {needed} needed, {free} free of {total} reserved; reserve them at boot with \
         the kernel parameters `hugepagesz=1G hugepages={target_pages}` (at run time `echo {target_pages} > {nr_path}` \
         works only while memory is not fragmented), or use 2 MiB pages",
        nr_path = sysfs_dir.join("nr_hugepages").display()
    )]
    Huge1GNotReserved {
        /// Pages this allocation needs.
        needed: u64,
        /// Pages free and not reserved by other mappings.
        free: u64,
        /// Pages reserved in all.
        total: u64,
        /// The `nr_hugepages` value that would leave enough free pages.
        target_pages: u64,
        /// `/sys/kernel/mm/hugepages/hugepages-1048576kB`.
        sysfs_dir: PathBuf,
    },

    /// The NUMA node asked for has no memory here (or does not exist).
    #[error(
        "NUMA node {node} has no memory on this machine (nodes with memory: {nodes}): ask for one of those, \
         or for no node (the kernel's choice)"
    )]
    NumaNodeAbsent {
        /// The node asked for.
        node: u32,
        /// The nodes with memory, as a list (`0,1`).
        nodes: String,
    },

    /// The NUMA node asked for has too few free hugepages of the size.
    #[error(
        "NUMA node {node} has {free} free {page_size} hugepages of {total}, {needed} needed (free pages of other \
         nodes do not count: the memory is bound to node {node}): reserve more on that node with \
         `echo {target_pages} > {nr_path}`{boot_hint}, or ask for another node",
        nr_path = sysfs_dir.join("nr_hugepages").display(),
        boot_hint = if *page_size == PageSize::Huge1G {
            " (1 GiB pages can seldom be had after boot: `hugepagesz=1G hugepages=<node>:<count>,...` on the \
             kernel command line reserves them per node)"
        } else {
            ""
        }
    )]
    NumaHugepagesShort {
        /// The node.
        node: u32,
        /// The page size.
        page_size: PageSize,
        /// Pages this allocation needs.
        needed: u64,
        /// Free pages on the node (some may be promised to mappings of other processes: the
        /// kernel keeps that count only globally).
        free: u64,
        /// Pages reserved on the node in all.
        total: u64,
        /// The node's `nr_hugepages` value that would leave enough free pages.
        target_pages: u64,
        /// `/sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB`.
        sysfs_dir: PathBuf,
    },

    /// Memory bound to a NUMA node has pages elsewhere (refused, not used).
    #[error(
        "DMA memory bound to NUMA node {node} ({pages} pages of {page_size}) is not all there: {found}; \
         the region was freed instead of used. A cpuset or memory policy that excludes node {node} does this \
         (check /proc/self/status Mems_allowed)"
    )]
    NumaMisplaced {
        /// The node asked for.
        node: u32,
        /// The page size.
        page_size: PageSize,
        /// Pages in the region.
        pages: usize,
        /// Which pages are where (runs).
        found: String,
    },

    /// The kernel offers no hugepages of this size at all.
    #[error(
        "this kernel offers no {page_size} hugepages ({sysfs_dir} is missing): use 2 MiB pages, or for 1 GiB pages \
         a CPU with the pdpe1gb flag and a kernel with hugetlbfs",
        sysfs_dir = sysfs_dir.display()
    )]
    HugepageSizeUnsupported {
        /// The page size.
        page_size: PageSize,
        /// The sysfs folder that would describe it.
        sysfs_dir: PathBuf,
    },

    /// `mlock` failed because of RLIMIT_MEMLOCK.
    #[error(
        "cannot lock {needed:#x} bytes of DMA memory: RLIMIT_MEMLOCK is {limit_text} ({source}); run `ulimit -l unlimited` \
         before starting (up to the hard limit), run as root (CAP_IPC_LOCK), or raise `memlock` in /etc/security/limits.conf; \
         `sudo vfpoll setup --user $USER --pid $$` raises a running shell's limit to the hugepage reservation",
        limit_text = match limit { Some(l) => format!("{l} bytes"), None => "unlimited".to_owned() }
    )]
    MemlockLimit {
        /// Bytes that had to be locked.
        needed: u64,
        /// The soft limit, `None` if unlimited.
        limit: Option<u64>,
        /// What `mlock` said.
        #[source]
        source: io::Error,
    },

    /// `mmap` failed for another reason than missing hugepages.
    #[error("mmap of {len:#x} bytes of {page_size} pages failed ({source}); check free memory and any hugetlb cgroup limit")]
    Mmap {
        /// Bytes asked for.
        len: u64,
        /// Page size asked for.
        page_size: PageSize,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Another memory-management call failed (`madvise`, `mlock` for a reason other than the limit).
    #[error(
        "{call} on DMA memory failed ({source}); this kernel may lack the feature: report the kernel version"
    )]
    MemCall {
        /// The call that failed.
        call: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The path given as hugetlbfs mount is not one, or has another page size.
    #[error(
        "{path} is not a hugetlbfs mount with {page_size} pages: mount one with \
         `mount -t hugetlbfs -o pagesize={short} none {path}`, or pass no mount to use anonymous hugepages",
        path = path.display(),
        short = page_size.short_name()
    )]
    NotHugetlbfs {
        /// The path given.
        path: PathBuf,
        /// The page size wanted.
        page_size: PageSize,
    },

    /// Creating or sizing the backing file in a hugetlbfs mount failed.
    #[error("cannot create a {len:#x}-byte file in {path} ({source}); check its permissions and free hugepages", path = path.display())]
    HugetlbfsFile {
        /// The mount.
        path: PathBuf,
        /// Bytes asked for.
        len: u64,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// `/proc/self/pagemap` cannot be read.
    #[error("cannot read /proc/self/pagemap ({source}); no-IOMMU mode needs procfs mounted and root")]
    Pagemap {
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The pagemap hides physical frame numbers from this process.
    #[error(
        "no-IOMMU mode needs root (CAP_SYS_ADMIN) to read physical addresses from /proc/self/pagemap: \
         run as root, or use the IOMMU (VFIO type1) mode"
    )]
    PhysAddrNeedsRoot,

    /// The page is not in memory, so it has no physical address.
    #[error(
        "the page at {vaddr:#x} is not in memory (swapped out or never touched): touch and mlock DMA memory \
         before asking for its physical address"
    )]
    PageNotPresent {
        /// The virtual address looked up.
        vaddr: u64,
    },

    /// The IOMMU refused a mapping.
    #[error(
        "IOMMU map of {len:#x} bytes at IOVA {iova} failed ({source}); check RLIMIT_MEMLOCK (VFIO counts mapped \
         pages against it: `ulimit -l unlimited`, `sudo vfpoll setup --user $USER --pid $$`, or run as root) and the \
         container's IOVA ranges"
    )]
    Map {
        /// IOVA asked for.
        iova: Iova,
        /// Length asked for.
        len: u64,
        /// The cause.
        #[source]
        source: MapperSource,
    },

    /// The IOMMU backend cannot map a peer device's BAR ([`crate::register_peer_bar`]): iommufd
    /// in Linux 6.12 cannot pin a BAR's PFNMAP memory. The source says what works instead.
    #[error(
        "IOMMU map of {len:#x} bytes of a peer device's BAR at IOVA {iova} was refused by this IOMMU backend"
    )]
    PeerMap {
        /// IOVA asked for.
        iova: Iova,
        /// Length asked for.
        len: u64,
        /// The cause, with the way out.
        #[source]
        source: MapperSource,
    },

    /// The IOMMU refused to unmap.
    #[error("IOMMU unmap of {len:#x} bytes at IOVA {iova} failed ({source}); the range stays mapped until the VFIO container is closed")]
    Unmap {
        /// IOVA of the mapping.
        iova: Iova,
        /// Its length.
        len: u64,
        /// The cause.
        #[source]
        source: MapperSource,
    },
}
