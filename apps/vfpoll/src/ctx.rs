//! What every subcommand needs: where the machine's trees are, where vfpoll keeps its records,
//! and how to change the kernel (for real, or only in files under `--root`).

use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use vfpoll_hugepages::{LiveMount, MountOps};
use vfpoll_pci::bind::{BindOptions, DEFAULT_STATE_DIR};
use vfpoll_pci::sysfs::{KernelOps, LiveKernel};
use vfpoll_pci::{Bdf, Host};

/// The machine a command works on.
pub struct Ctx {
    /// The sysfs/procfs/devtmpfs roots.
    pub host: Host,
    /// Where the original drivers of bound devices are recorded.
    pub state_dir: PathBuf,
    /// `--root` was given: a fake tree, on which nothing but files may change.
    pub fake: bool,
}

impl Ctx {
    /// The real machine, or the fake tree under `root`.
    pub fn new(root: Option<PathBuf>) -> Self {
        match root {
            Some(r) => Ctx {
                host: Host::under(&r),
                state_dir: r.join("run/vfpoll"),
                fake: true,
            },
            None => Ctx {
                host: Host::default(),
                state_dir: DEFAULT_STATE_DIR.into(),
                fake: false,
            },
        }
    }

    /// How to write attributes and load modules.
    pub fn kernel(&self) -> Box<dyn KernelOps> {
        if self.fake {
            Box::new(FilesOnly)
        } else {
            Box::new(LiveKernel)
        }
    }

    /// How to mount.
    pub fn mounter(&self) -> Box<dyn MountOps> {
        if self.fake {
            Box::new(FilesOnly)
        } else {
            Box::new(LiveMount)
        }
    }

    /// Bind options with this context's state folder.
    pub fn bind_options(&self, force: bool) -> BindOptions {
        BindOptions {
            force,
            state_dir: self.state_dir.clone(),
            ..BindOptions::default()
        }
    }
}

/// Under `--root`: attribute writes go to the files of the fake tree; modules and mounts are
/// refused.
struct FilesOnly;

impl KernelOps for FilesOnly {
    fn write_attr(&mut self, path: &Path, value: &str) -> io::Result<()> {
        LiveKernel.write_attr(path, value)
    }

    fn load_module(&mut self, name: &str) -> Result<(), String> {
        Err(format!("not loading {name}: --root names a fake tree"))
    }
}

impl MountOps for FilesOnly {
    fn mount_hugetlbfs(&mut self, target: &Path, _: &str) -> io::Result<()> {
        Err(io::Error::other(format!(
            "not mounting {}: --root names a fake tree",
            target.display()
        )))
    }
}

/// A device named on the command line: an address, or every device of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    /// One device.
    Bdf(Bdf),
    /// Every NVMe controller the kernel does not use.
    Nvme,
    /// Every NIC whose interfaces are down.
    Nic,
    /// Nothing.
    None,
}

impl FromStr for Selector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nvme" => Ok(Selector::Nvme),
            "nic" => Ok(Selector::Nic),
            "none" => Ok(Selector::None),
            _ => s
                .parse()
                .map(Selector::Bdf)
                .map_err(|e| format!("{e}; or use nvme, nic or none")),
        }
    }
}
