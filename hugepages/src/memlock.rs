//! `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK`: VFIO type1 charges every page it pins for DMA to the
//! locked-memory limit of the process, unless the process has `CAP_IPC_LOCK`
//! (`drivers/vfio/vfio_iommu_type1.c`, `vfio_lock_acct`).

use std::fs;
use std::io;

use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
use vfpoll_pci::sysfs::Host;

use crate::HugepageError;

/// `CAP_IPC_LOCK` (`include/uapi/linux/capability.h`).
const CAP_IPC_LOCK: u32 = 14;

/// The locked-memory limit of this process, in bytes; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memlock {
    /// The soft limit, the one that applies.
    pub soft: Option<u64>,
    /// The hard limit, up to which the process may raise the soft one.
    pub hard: Option<u64>,
}

impl Memlock {
    /// Reads the limit of the calling process (`getrlimit(RLIMIT_MEMLOCK)`).
    pub fn current() -> Result<Self, HugepageError> {
        let (soft, hard) =
            getrlimit(Resource::RLIMIT_MEMLOCK).map_err(|e| HugepageError::Rlimit(io::Error::from(e)))?;
        let lim = |v: u64| (v != RLIM_INFINITY).then_some(v);
        Ok(Memlock {
            soft: lim(soft),
            hard: lim(hard),
        })
    }

    /// Whether `bytes` may be locked under the soft limit.
    pub fn allows(&self, bytes: u64) -> bool {
        self.soft.is_none_or(|s| s >= bytes)
    }
}

/// Whether the calling process has `CAP_IPC_LOCK` in its effective set (`CapEff` in
/// `/proc/self/status`); `None` when that cannot be read.
pub fn cap_ipc_lock(host: &Host) -> Option<bool> {
    let status = fs::read_to_string(host.proc.join("self/status")).ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << CAP_IPC_LOCK) != 0)
}
