//! hugetlbfs mounts: which exist, and mounting one.

use std::io;
use std::path::{Path, PathBuf};

use vfpoll_pci::sysfs::{self, Host};

use crate::{HugepageError, PageSize};

/// A mounted hugetlbfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugetlbfsMount {
    /// The mount point.
    pub path: PathBuf,
    /// Its page size (`pagesize=` option); `None` when the table does not say, which means the
    /// default huge page size.
    pub page_size: Option<PageSize>,
}

/// Every hugetlbfs in the mount table.
pub fn hugetlbfs_mounts(host: &Host) -> Result<Vec<HugetlbfsMount>, HugepageError> {
    Ok(sysfs::mounts(host)?
        .into_iter()
        .filter(|m| m.fstype == "hugetlbfs")
        .map(|m| HugetlbfsMount {
            page_size: m
                .options
                .split(',')
                .find_map(|o| o.strip_prefix("pagesize=")?.parse().ok()),
            path: m.target,
        })
        .collect())
}

/// Mounting, behind a trait so that tests need no root and touch no real mount table.
pub trait MountOps {
    /// Mounts hugetlbfs with `options` on `target`, creating the folder first.
    fn mount_hugetlbfs(&mut self, target: &Path, options: &str) -> io::Result<()>;
}

/// The real `mount(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LiveMount;

impl MountOps for LiveMount {
    fn mount_hugetlbfs(&mut self, target: &Path, options: &str) -> io::Result<()> {
        use nix::mount::{mount, MsFlags};
        std::fs::create_dir_all(target)?;
        log::debug!("mount -t hugetlbfs -o {options} nodev {}", target.display());
        mount(
            Some("nodev"),
            target,
            Some("hugetlbfs"),
            MsFlags::empty(),
            Some(options),
        )
        .map_err(io::Error::from)
    }
}

/// What [`ensure_mounted`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOutcome {
    /// A hugetlbfs of that size was mounted there already.
    AlreadyMounted(HugetlbfsMount),
    /// It was mounted now, with these options.
    Mounted {
        /// The mount point.
        path: PathBuf,
        /// The options (`pagesize=2M`).
        options: String,
    },
}

/// Mounts hugetlbfs of `size` on `path` unless one is there; see [`ensure_mounted_with`].
pub fn ensure_mounted(host: &Host, path: &Path, size: PageSize) -> Result<MountOutcome, HugepageError> {
    ensure_mounted_with(host, &mut LiveMount, path, size)
}

/// Mounts hugetlbfs with `pagesize=<size>` on `path` unless the mount table shows a hugetlbfs
/// there already. One of another page size there is an error
/// ([`HugepageError::MountedOtherSize`]); one whose size the table does not give is accepted.
pub fn ensure_mounted_with(
    host: &Host,
    m: &mut dyn MountOps,
    path: &Path,
    size: PageSize,
) -> Result<MountOutcome, HugepageError> {
    if let Some(found) = hugetlbfs_mounts(host)?.into_iter().rev().find(|x| x.path == path) {
        return match found.page_size {
            Some(f) if f != size => Err(HugepageError::MountedOtherSize {
                path: path.to_owned(),
                found: f,
                wanted: size,
            }),
            _ => Ok(MountOutcome::AlreadyMounted(found)),
        };
    }
    let options = format!("pagesize={size}");
    m.mount_hugetlbfs(path, &options)
        .map_err(|source| HugepageError::Mount {
            path: path.to_owned(),
            options: options.clone(),
            source,
        })?;
    Ok(MountOutcome::Mounted {
        path: path.to_owned(),
        options,
    })
}
