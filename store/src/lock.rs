//! One writer per store: an `flock`ed lock file named by the store's UUID, holding the PID of
//! the process that has the store open. `flock` locks belong to the open file, so a second
//! open in the same process is refused like one in another process, and the kernel drops the
//! lock when the process dies (no stale lock after a crash).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::StoreError;

/// The default directory of lock files.
pub const DEFAULT_LOCK_DIR: &str = "/run/vfpoll";

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub(crate) struct StoreLock {
    _file: Flock<File>,
    path: PathBuf,
}

impl StoreLock {
    /// Takes the lock of store `uuid` in `dir`.
    pub fn take(dir: &Path, uuid: &str) -> Result<Self, StoreError> {
        let path = dir.join(format!("store-{uuid}.lock"));
        let io = |source| StoreError::Lock {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((mut f, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                let mut s = String::new();
                let _ = f.read_to_string(&mut s);
                return Err(StoreError::InUse {
                    uuid: uuid.to_string(),
                    pid: s.trim().parse().unwrap_or(0),
                    lock: path.display().to_string(),
                });
            }
            Err((_, errno)) => return Err(io(std::io::Error::from(errno))),
        };
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(StoreLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
