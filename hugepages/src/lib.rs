//! # vfpoll-hugepages: hugepage pools, hugetlbfs mounts and the memlock limit
//!
//! DMA buffers of vfpoll live in huge pages: one 2 MiB page is one IOMMU mapping and one
//! physically contiguous run. This crate reads and grows the kernel's pools, per page size and
//! per NUMA node (`/sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB/`, or
//! `/sys/kernel/mm/hugepages/hugepages-<kB>kB/` on a machine without NUMA nodes in sysfs), mounts
//! hugetlbfs, and reads the `RLIMIT_MEMLOCK` that VFIO charges pinned pages to.
//!
//! Every path goes through a [`Host`], so the tests run on fake trees. Writes go through
//! [`KernelOps`] and mounts through [`MountOps`], so tests can play the kernel's part. Nothing here
//! prints: errors say what to do, diagnostics go to `log`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use vfpoll_pci::sysfs::{Host, KernelOps, LiveKernel, SysfsError};

mod memlock;
mod mount;

pub use memlock::{cap_ipc_lock, Memlock};
pub use mount::{
    ensure_mounted, ensure_mounted_with, hugetlbfs_mounts, HugetlbfsMount, LiveMount, MountOps, MountOutcome,
};

/// The default hugetlbfs mount point.
pub const DEFAULT_MOUNT: &str = "/dev/hugepages";

/// A huge page size, as the kernel names its pools (`hugepages-2048kB`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PageSize {
    kib: u64,
}

impl PageSize {
    /// 2 MiB, the x86-64 PMD size.
    pub const SIZE_2M: PageSize = PageSize { kib: 2048 };
    /// 1 GiB, the x86-64 PUD size (CPU flag `pdpe1gb`).
    pub const SIZE_1G: PageSize = PageSize { kib: 1 << 20 };

    /// A size in KiB.
    pub const fn from_kib(kib: u64) -> Self {
        PageSize { kib }
    }

    /// The size in KiB.
    pub const fn kib(self) -> u64 {
        self.kib
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.kib * 1024
    }

    /// The pages needed to hold `bytes`, rounded up.
    pub const fn pages_for(self, bytes: u64) -> u64 {
        bytes.div_ceil(self.bytes())
    }

    /// The pool's folder name, `hugepages-2048kB`.
    pub fn dir_name(self) -> String {
        format!("hugepages-{}kB", self.kib)
    }
}

/// `2M`, `1G`, or `64K`: the form hugetlbfs' `pagesize=` option takes.
impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kib {
            k if k % (1 << 20) == 0 => write!(f, "{}G", k >> 20),
            k if k % 1024 == 0 => write!(f, "{}M", k >> 10),
            k => write!(f, "{k}K"),
        }
    }
}

/// Why a string is not a page size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a huge page size: write it as 2M or 1G (also 2048kB, 1GiB)")]
pub struct PageSizeParseError(pub String);

impl FromStr for PageSize {
    type Err = PageSizeParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PageSizeParseError(s.to_owned());
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        let n: u64 = t[..split].parse().map_err(|_| err())?;
        let shift = match t[split..].to_ascii_lowercase().as_str() {
            "k" | "kb" | "kib" => 0,
            "m" | "mb" | "mib" => 10,
            "g" | "gb" | "gib" => 20,
            _ => return Err(err()),
        };
        let kib = n
            .checked_shl(shift)
            .filter(|k| *k > 0 && k.is_power_of_two())
            .ok_or_else(err)?;
        Ok(PageSize { kib })
    }
}

/// One pool: a page size on one NUMA node, or on the whole machine (`node: None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// The page size.
    pub size: PageSize,
    /// The NUMA node, `None` for the machine-wide pool.
    pub node: Option<u32>,
    /// `nr_hugepages`: pages in the pool.
    pub total: u64,
    /// `free_hugepages`: pages not in use.
    pub free: u64,
    /// `surplus_hugepages`: pages over `nr_hugepages` from overcommit.
    pub surplus: u64,
}

/// Errors of this crate; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum HugepageError {
    /// The kernel has no pool of this size.
    #[error("this kernel offers no {size} huge pages ({} is absent); {}", .path.display(), size_hint(*.size))]
    UnsupportedSize {
        /// The size asked for.
        size: PageSize,
        /// The pool folder looked for.
        path: PathBuf,
    },
    /// No such NUMA node.
    #[error("there is no NUMA node {node} with huge pages ({} is absent); the nodes are: {nodes}", .path.display())]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// The folder looked for.
        path: PathBuf,
        /// The nodes present.
        nodes: String,
    },
    /// A pool file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A pool file could not be written.
    #[error("cannot write {value} to {}: {source}{}", .path.display(), root_hint(.source))]
    Write {
        /// The file.
        path: PathBuf,
        /// The value.
        value: u64,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The kernel gave fewer pages than asked for.
    #[error("only {got} of {wanted} huge pages of {size} could be reserved{}: the memory is fragmented or too small. Reserve them right after boot, or drop caches and compact, then retry: echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory; or reserve them at boot with the kernel command line {}", node_text(*.node), cmdline_hint(*.size, *.wanted))]
    Shortfall {
        /// The page size.
        size: PageSize,
        /// The node, `None` for the machine-wide pool.
        node: Option<u32>,
        /// Pages asked for.
        wanted: u64,
        /// Pages in the pool after the write.
        got: u64,
    },
    /// hugetlbfs could not be mounted.
    #[error("cannot mount hugetlbfs ({options}) on {}: {source}{}", .path.display(), root_hint(.source))]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The mount options.
        options: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A hugetlbfs of another page size is mounted there already.
    #[error("{} already holds a hugetlbfs of {found} pages, not {wanted}: mount the {wanted} one elsewhere (--mount /dev/hugepages-{wanted}) or umount {}", .path.display(), .path.display())]
    MountedOtherSize {
        /// The mount point.
        path: PathBuf,
        /// The size mounted there.
        found: PageSize,
        /// The size asked for.
        wanted: PageSize,
    },
    /// The memlock limit could not be read.
    #[error("cannot read RLIMIT_MEMLOCK: {0}")]
    Rlimit(#[source] io::Error),
    /// The mount table could not be read.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
}

fn size_hint(size: PageSize) -> &'static str {
    if size == PageSize::SIZE_1G {
        "1 GiB pages need the CPU flag pdpe1gb; use --page-size 2M, or boot with hugepagesz=1G hugepages=N"
    } else {
        "the sizes this kernel offers are the folders in /sys/kernel/mm/hugepages"
    }
}

fn root_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => "; this needs root (sudo vfpoll setup)",
        _ => "",
    }
}

fn node_text(node: Option<u32>) -> String {
    node.map(|n| format!(" on NUMA node {n}")).unwrap_or_default()
}

fn cmdline_hint(size: PageSize, wanted: u64) -> String {
    if size == PageSize::SIZE_2M {
        format!("hugepages={wanted}")
    } else {
        format!("hugepagesz={size} hugepages={wanted}")
    }
}

fn node_root(host: &Host) -> PathBuf {
    host.sys.join("devices/system/node")
}

/// The folder of a pool: per node, or machine-wide for `node: None`.
pub fn pool_dir(host: &Host, size: PageSize, node: Option<u32>) -> PathBuf {
    match node {
        Some(n) => node_root(host)
            .join(format!("node{n}/hugepages"))
            .join(size.dir_name()),
        None => host.sys.join("kernel/mm/hugepages").join(size.dir_name()),
    }
}

/// The NUMA nodes that have huge page pools, sorted; empty on a kernel without NUMA in sysfs.
pub fn numa_nodes(host: &Host) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(node_root(host))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("hugepages").is_dir())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The page sizes the kernel offers, smallest first.
pub fn sizes(host: &Host) -> Vec<PageSize> {
    let mut v: Vec<PageSize> = fs::read_dir(host.sys.join("kernel/mm/hugepages"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name();
                    let kib = n
                        .to_str()?
                        .strip_prefix("hugepages-")?
                        .strip_suffix("kB")?
                        .parse()
                        .ok()?;
                    Some(PageSize::from_kib(kib))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

fn read_count(path: &Path) -> Result<u64, HugepageError> {
    let s = fs::read_to_string(path).map_err(|source| HugepageError::Read {
        path: path.to_owned(),
        source,
    })?;
    s.trim().parse().map_err(|e| HugepageError::Read {
        path: path.to_owned(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("`{}` is not a count: {e}", s.trim()),
        ),
    })
}

fn checked_dir(host: &Host, size: PageSize, node: Option<u32>) -> Result<PathBuf, HugepageError> {
    let dir = pool_dir(host, size, node);
    if dir.is_dir() {
        return Ok(dir);
    }
    match node {
        Some(n) if !node_root(host).join(format!("node{n}/hugepages")).is_dir() => {
            let nodes: Vec<String> = numa_nodes(host).iter().map(u32::to_string).collect();
            let nodes = if nodes.is_empty() {
                "none".to_owned()
            } else {
                nodes.join(", ")
            };
            Err(HugepageError::NoSuchNode {
                node: n,
                path: dir,
                nodes,
            })
        }
        _ => Err(HugepageError::UnsupportedSize { size, path: dir }),
    }
}

/// Reads one pool.
pub fn pool(host: &Host, size: PageSize, node: Option<u32>) -> Result<Pool, HugepageError> {
    let dir = checked_dir(host, size, node)?;
    // `surplus_hugepages` is absent on some old kernels; it is only informative.
    let surplus = read_count(&dir.join("surplus_hugepages")).unwrap_or(0);
    Ok(Pool {
        size,
        node,
        total: read_count(&dir.join("nr_hugepages"))?,
        free: read_count(&dir.join("free_hugepages"))?,
        surplus,
    })
}

/// Every pool: per size, per NUMA node where the kernel has node folders, else machine-wide.
pub fn pools(host: &Host) -> Result<Vec<Pool>, HugepageError> {
    let nodes = numa_nodes(host);
    let mut out = Vec::new();
    for size in sizes(host) {
        if nodes.is_empty() {
            out.push(pool(host, size, None)?);
        }
        for &n in &nodes {
            out.push(pool(host, size, Some(n))?);
        }
    }
    Ok(out)
}

/// What [`reserve`] did to one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// The page size.
    pub size: PageSize,
    /// The node, `None` for the machine-wide pool.
    pub node: Option<u32>,
    /// Pages asked for.
    pub wanted: u64,
    /// `nr_hugepages` before.
    pub before: u64,
    /// `nr_hugepages` after.
    pub after: u64,
}

impl Reserved {
    /// Whether the pool was changed.
    pub fn changed(&self) -> bool {
        self.before != self.after
    }
}

/// Makes the pool hold at least `pages` pages; see [`reserve_with`].
pub fn reserve(
    host: &Host,
    size: PageSize,
    node: Option<u32>,
    pages: u64,
) -> Result<Reserved, HugepageError> {
    reserve_with(host, &mut LiveKernel, size, node, pages)
}

/// Makes the pool of `size` on `node` (machine-wide for `None`) hold at least `pages` pages:
/// writes `nr_hugepages` when it holds fewer, reads it back, and fails with
/// [`HugepageError::Shortfall`] when the kernel found fewer. A pool that is already big enough is
/// not touched (vfpoll never shrinks a pool that something else may use).
pub fn reserve_with(
    host: &Host,
    k: &mut dyn KernelOps,
    size: PageSize,
    node: Option<u32>,
    pages: u64,
) -> Result<Reserved, HugepageError> {
    let nr = checked_dir(host, size, node)?.join("nr_hugepages");
    let before = read_count(&nr)?;
    let mut r = Reserved {
        size,
        node,
        wanted: pages,
        before,
        after: before,
    };
    if before >= pages {
        return Ok(r);
    }
    log::info!("{}: {before} -> {pages}", nr.display());
    k.write_attr(&nr, &pages.to_string())
        .map_err(|source| HugepageError::Write {
            path: nr.clone(),
            value: pages,
            source,
        })?;
    r.after = read_count(&nr)?;
    if r.after < pages {
        return Err(HugepageError::Shortfall {
            size,
            node,
            wanted: pages,
            got: r.after,
        });
    }
    Ok(r)
}

/// How [`reserve_spread`] splits `pages` over `nodes` nodes: evenly, the first nodes taking one
/// more when it does not divide.
pub fn spread(pages: u64, nodes: usize) -> Vec<u64> {
    let n = nodes.max(1) as u64;
    (0..n).map(|i| pages / n + u64::from(i < pages % n)).collect()
}

/// Reserves `pages` pages spread evenly over the NUMA nodes; see [`reserve_spread_with`].
pub fn reserve_spread(host: &Host, size: PageSize, pages: u64) -> Result<Vec<Reserved>, HugepageError> {
    reserve_spread_with(host, &mut LiveKernel, size, pages)
}

/// Reserves `pages` pages spread evenly over the NUMA nodes ([`spread`]), each node's pool
/// holding at least its share; on a machine without node folders, in the machine-wide pool.
/// Every node is tried; the first shortfall is returned after all were.
pub fn reserve_spread_with(
    host: &Host,
    k: &mut dyn KernelOps,
    size: PageSize,
    pages: u64,
) -> Result<Vec<Reserved>, HugepageError> {
    let nodes = numa_nodes(host);
    if nodes.is_empty() {
        return Ok(vec![reserve_with(host, k, size, None, pages)?]);
    }
    let mut out = Vec::new();
    let mut first_err = None;
    for (&node, share) in nodes.iter().zip(spread(pages, nodes.len())) {
        match reserve_with(host, k, size, Some(node), share) {
            Ok(r) => out.push(r),
            Err(e) => {
                log::warn!("{e}");
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(out), Err)
}

#[cfg(test)]
mod tests;
