//! NUMA placement of DMA memory: which node a region's pages must come from, binding a fresh
//! mapping to it before its first touch (`mbind(2)`), checking where the pages landed
//! (`move_pages(2)` with no target nodes only reports), and the per-node hugepage counters
//! (`/sys/devices/system/node/node<N>/hugepages/`) that explain a shortage on one node.
//!
//! A device reaches memory on its own node faster than memory across the interconnect, and a
//! polling thread wants its queues and buffers on the node it runs on. The kernel's default
//! (allocate where the faulting thread runs) gets this right only by luck, so a region can be
//! asked for on a node ([`NumaPlacement::Node`]): the mapping is bound with `MPOL_BIND`, which
//! allows no fallback, and a region whose pages are elsewhere all the same is refused, never
//! silently used. A strict binding rather than `MPOL_PREFERRED` because hugepages are a pool
//! reserved per node: "preferred" would quietly take another node's pages when this one's ran
//! out, which is the very case the caller must hear about.
//!
//! This module holds the `mbind` and `move_pages` calls of the crate.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::DmaError;
use crate::page::{HugepageCounters, PageSize};

/// `mbind(2)` flag: fail if pages already in the range break the policy
/// (`include/uapi/linux/mempolicy.h`, `MPOL_MF_STRICT`). Nothing is faulted in yet when this
/// crate binds, so it only guards against a mistake here.
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;

/// Words of the node mask passed to `mbind`: 1024 nodes, the largest `MAX_NUMNODES` of the
/// distributions' x86_64 and arm64 kernels (`CONFIG_NODES_SHIFT=10`).
const NODEMASK_WORDS: usize = 16;
const NODEMASK_BITS: usize = NODEMASK_WORDS * libc::c_ulong::BITS as usize;

/// Where DMA memory must come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NumaPlacement {
    /// Wherever the kernel puts it (the calling thread's memory policy: normally the node the
    /// thread runs on when it first touches the memory). Not checked.
    #[default]
    Any,
    /// NUMA node N and no other: the mapping is bound to it before its first touch
    /// (`MPOL_BIND`), and where its pages landed is checked.
    Node(u32),
}

impl NumaPlacement {
    /// The placement for a device's memory from its sysfs `numa_node` (as
    /// `vfpoll_pci::sysfs::PciDevice::numa_node` reads it): that node, or [`NumaPlacement::Any`]
    /// where the platform reports none (-1: one node, or firmware without the information).
    pub fn device_node(numa_node: Option<u32>) -> Self {
        numa_node.map_or(NumaPlacement::Any, NumaPlacement::Node)
    }

    /// The node asked for, if any.
    pub fn node(self) -> Option<u32> {
        match self {
            NumaPlacement::Any => None,
            NumaPlacement::Node(n) => Some(n),
        }
    }
}

/// `<sys>/devices/system/node`.
fn node_root(sys: &Path) -> PathBuf {
    sys.join("devices/system/node")
}

/// `<sys>/devices/system/node/node<N>/hugepages/hugepages-<kB>kB`.
pub fn node_hugepage_dir(sys: &Path, node: u32, size: PageSize) -> PathBuf {
    node_root(sys)
        .join(format!("node{node}"))
        .join("hugepages")
        .join(format!("hugepages-{}kB", size.bytes() >> 10))
}

/// Parses a kernel node list (`0`, `0-1`, `0,2-3`; empty: none).
pub fn parse_node_list(s: &str) -> Option<Vec<u32>> {
    let mut nodes = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                nodes.extend(a..=b);
            }
            None => nodes.push(part.trim().parse().ok()?),
        }
    }
    Some(nodes)
}

/// The nodes that have memory (`<sys>/devices/system/node/has_memory`, else `online`); `[0]`
/// on a kernel without NUMA support, which has no such directory.
pub fn memory_nodes(sys: &Path) -> Vec<u32> {
    let root = node_root(sys);
    ["has_memory", "online"]
        .iter()
        .find_map(|f| fs::read_to_string(root.join(f)).ok())
        .and_then(|s| parse_node_list(&s))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![0])
}

/// The hugepage counters of one node; `Ok(None)` when the node or the size is absent. The
/// kernel keeps no per-node count of pages promised to mappings (`resv_hugepages` is global),
/// so [`HugepageCounters::reserved`] is 0 here and `free` may include pages another process
/// has reserved but not touched yet.
pub fn node_counters(sys: &Path, node: u32, size: PageSize) -> io::Result<Option<HugepageCounters>> {
    HugepageCounters::read_dir(&node_hugepage_dir(sys, node, size))
}

/// Checks, before anything is mapped, that `node` exists with memory and (for hugepages) has
/// `len` bytes of free pages of `size`.
pub(crate) fn check_node(sys: &Path, node: u32, size: PageSize, len: u64) -> Result<(), DmaError> {
    let nodes = memory_nodes(sys);
    if !nodes.contains(&node) {
        return Err(DmaError::NumaNodeAbsent {
            node,
            nodes: nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        });
    }
    if !size.is_huge() {
        return Ok(());
    }
    let needed = len.div_ceil(size.bytes());
    let sysfs_dir = node_hugepage_dir(sys, node, size);
    match node_counters(sys, node, size) {
        Ok(Some(c)) if c.free >= needed => Ok(()),
        Ok(Some(c)) => Err(DmaError::NumaHugepagesShort {
            node,
            page_size: size,
            needed,
            free: c.free,
            total: c.total,
            target_pages: c.total + (needed - c.free),
            sysfs_dir,
        }),
        // No counters for this node (size not offered there, or a kernel without per-node
        // sysfs): the global diagnosis after a failed fault says more.
        Ok(None) => Ok(()),
        Err(e) => {
            log::debug!("cannot read {}: {e}", sysfs_dir.display());
            Ok(())
        }
    }
}

/// Binds `ptr..ptr+len` to `node` with `MPOL_BIND`: every page faulted in from now on comes
/// from that node, or the fault fails (hugetlb) / the kernel reclaims there first.
///
/// # Safety
/// `ptr..ptr+len` must be a mapping the caller owns (the call changes only its policy).
pub(crate) unsafe fn bind(ptr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    let idx = node as usize;
    if idx >= NODEMASK_BITS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("node {node} is beyond the {NODEMASK_BITS} nodes this crate can name"),
        ));
    }
    let bits = libc::c_ulong::BITS as usize;
    let mut mask: [libc::c_ulong; NODEMASK_WORDS] = [0; NODEMASK_WORDS];
    mask[idx / bits] |= 1 << (idx % bits);
    // SAFETY: mbind reads `mask` (NODEMASK_WORDS words, of which it looks at maxnode - 1 bits:
    // the kernel's get_nodes() drops one, hence the + 1) and changes the memory policy of the
    // caller's own range; it touches no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            libc::MPOL_BIND,
            mask.as_ptr(),
            NODEMASK_BITS + 1,
            MPOL_MF_STRICT,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The node of each page of `ptr..ptr+len` (pages of `page` bytes), as `move_pages(2)` with no
/// target nodes reports it: a node number, or a negative errno for a page that is not present
/// (`-ENOENT`) or not mapped (`-EFAULT`). Moves nothing.
pub fn page_nodes(ptr: *const u8, len: usize, page: usize) -> io::Result<Vec<i32>> {
    if page == 0 || !page.is_power_of_two() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("page size {page} is not a power of two"),
        ));
    }
    let count = len.div_ceil(page);
    let pages: Vec<*const libc::c_void> = (0..count).map(|i| ptr.wrapping_add(i * page).cast()).collect();
    let mut status = vec![i32::MIN; count];
    // SAFETY: with `nodes` null, move_pages only queries: it reads `count` addresses from
    // `pages` and writes `count` ints into `status`, both ours and that long; the addresses
    // themselves are only looked up in our page tables, never dereferenced.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            count as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(status)
}

/// Checks that every page of `ptr..ptr+len` is on `node`: the region is refused otherwise.
pub(crate) fn verify(ptr: *const u8, len: usize, page: PageSize, node: u32) -> Result<(), DmaError> {
    let nodes = page_nodes(ptr, len, page.bytes() as usize).map_err(|source| DmaError::MemCall {
        call: "move_pages (where the pages are)",
        source,
    })?;
    let wrong: Vec<(usize, i32)> = nodes
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n != node as i32)
        .map(|(i, &n)| (i, n))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(DmaError::NumaMisplaced {
        node,
        page_size: page,
        pages: nodes.len(),
        found: describe(&wrong),
    })
}

/// `page 0 on node 1, pages 2..=3 not present (-2)`, shortened after a few runs.
fn describe(wrong: &[(usize, i32)]) -> String {
    let mut runs: Vec<(usize, usize, i32)> = Vec::new();
    for &(i, n) in wrong {
        match runs.last_mut() {
            Some((_, end, m)) if *end + 1 == i && *m == n => *end = i,
            _ => runs.push((i, i, n)),
        }
    }
    let text = |&(a, b, n): &(usize, usize, i32)| {
        let pages = if a == b {
            format!("page {a}")
        } else {
            format!("pages {a}..={b}")
        };
        match n {
            n if n >= 0 => format!("{pages} on node {n}"),
            n if n == -libc::ENOENT => format!("{pages} not present"),
            n => format!("{pages}: error {}", -n),
        }
    };
    let mut s: Vec<String> = runs.iter().take(4).map(text).collect();
    if runs.len() > 4 {
        s.push(format!("and {} more runs", runs.len() - 4));
    }
    s.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists() {
        assert_eq!(parse_node_list("0\n"), Some(vec![0]));
        assert_eq!(parse_node_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_node_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_node_list(""), Some(vec![]));
        assert_eq!(parse_node_list("3-1"), None);
        assert_eq!(parse_node_list("x"), None);
    }

    fn fake_node(t: &Path, node: u32, size: PageSize, nr: u64, free: u64) {
        let d = node_hugepage_dir(t, node, size);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("nr_hugepages"), format!("{nr}\n")).unwrap();
        fs::write(d.join("free_hugepages"), format!("{free}\n")).unwrap();
        fs::write(d.join("surplus_hugepages"), "0\n").unwrap();
    }

    #[test]
    fn a_node_short_of_pages_is_named_with_the_fix() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(node_root(t.path())).unwrap();
        fs::write(node_root(t.path()).join("has_memory"), "0-1\n").unwrap();
        fake_node(t.path(), 0, PageSize::Huge1G, 2, 2);
        fake_node(t.path(), 1, PageSize::Huge1G, 2, 1);
        assert_eq!(memory_nodes(t.path()), [0, 1]);
        assert!(check_node(t.path(), 0, PageSize::Huge1G, 2 << 30).is_ok());
        let e = check_node(t.path(), 1, PageSize::Huge1G, 2 << 30).unwrap_err();
        assert!(
            matches!(
                e,
                DmaError::NumaHugepagesShort {
                    node: 1,
                    needed: 2,
                    free: 1,
                    total: 2,
                    target_pages: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        let nr = node_hugepage_dir(t.path(), 1, PageSize::Huge1G).join("nr_hugepages");
        assert!(msg.contains(&format!("echo 3 > {}", nr.display())), "{msg}");
        assert!(msg.contains("node 1"), "{msg}");
        // 4 KiB pages need no reservation; a node that does not exist is named.
        assert!(check_node(t.path(), 1, PageSize::Base4K, 1 << 30).is_ok());
        let e = check_node(t.path(), 2, PageSize::Base4K, 4096).unwrap_err();
        assert!(
            e.to_string().contains("node 2") && e.to_string().contains("0,1"),
            "{e}"
        );
    }

    #[test]
    fn without_numa_sysfs_there_is_node_0() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(memory_nodes(t.path()), [0]);
    }

    #[test]
    fn placement_from_a_device() {
        assert_eq!(NumaPlacement::device_node(None), NumaPlacement::Any);
        assert_eq!(NumaPlacement::device_node(Some(1)), NumaPlacement::Node(1));
        assert_eq!(NumaPlacement::Node(3).node(), Some(3));
        assert_eq!(NumaPlacement::default().node(), None);
    }

    #[test]
    fn misplaced_pages_are_summarised() {
        let s = describe(&[(0, 1), (1, 1), (2, 1), (5, -libc::ENOENT), (7, 0)]);
        assert_eq!(s, "pages 0..=2 on node 1, page 5 not present, page 7 on node 0");
    }

    #[test]
    fn bound_memory_lands_on_its_node_and_is_reported() {
        // Node 0 exists wherever the test runs; its pages are where move_pages says.
        let node = memory_nodes(Path::new("/sys"))[0];
        let m = crate::HugeMem::alloc_placed(
            64 << 10,
            PageSize::Base4K,
            NumaPlacement::Node(node),
            Path::new("/sys"),
        )
        .expect("4 KiB pages on the first memory node");
        assert_eq!(m.numa_node(), Some(node));
        let nodes = page_nodes(m.as_ptr(), m.len(), 4096).unwrap();
        assert_eq!(nodes, vec![node as i32; 16]);
        // A node that does not exist is refused before anything is mapped.
        let e = crate::HugeMem::alloc_placed(
            4096,
            PageSize::Base4K,
            NumaPlacement::Node(1000),
            Path::new("/sys"),
        )
        .unwrap_err();
        assert!(matches!(e, DmaError::NumaNodeAbsent { node: 1000, .. }), "{e:?}");
        // A page that is not mapped is reported as such, not as a node.
        let unmapped = page_nodes(std::ptr::null(), 4096, 4096).unwrap();
        assert!(unmapped[0] < 0, "{unmapped:?}");
    }
}
