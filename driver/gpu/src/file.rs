//! [`FileSource`]: a plain file read into (and written from) hugepage slots with `pread` /
//! `pwrite` straight on slot memory (the kernel copies from the page cache, or the disk DMAs
//! with `O_DIRECT`; vfpoll makes no copy of its own).
//!
//! Reads and writes are synchronous: `submit_*` does the system call and `poll` reports it, so
//! the GPU copies of the slots already read overlap the next read.
//!
//! This module holds the crate's `pread`/`pwrite` calls on slot memory.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::SourceError;
use crate::slots::Slots;
use crate::source::{BlockSource, Completion};

/// Alignment of offsets and lengths with `O_DIRECT` (the largest logical block size in common
/// use; slots are page-aligned).
pub const DIRECT_ALIGN: usize = 4096;

/// A file as a block source and sink. See the module docs.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    path: PathBuf,
    direct: bool,
    writable: bool,
    ready: VecDeque<Completion>,
}

impl FileSource {
    /// Opens `path` for reading, or for reading and writing (created if missing) when
    /// `writable`. `direct` bypasses the page cache (`O_DIRECT`: offsets and lengths in
    /// multiples of 4 KiB; not every file system offers it).
    pub fn open(path: &Path, writable: bool, direct: bool) -> Result<Self, SourceError> {
        let mut o = OpenOptions::new();
        o.read(true);
        if writable {
            o.write(true).create(true).truncate(false);
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o.open(path).map_err(|source| SourceError::File {
            op: "open",
            path: path.into(),
            offset: 0,
            len: 0,
            source,
        })?;
        Ok(FileSource {
            file,
            path: path.into(),
            direct,
            writable,
            ready: VecDeque::new(),
        })
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn io_err(&self, op: &'static str, offset: u64, len: usize, source: io::Error) -> SourceError {
        SourceError::File {
            op,
            path: self.path.clone(),
            offset,
            len,
            source,
        }
    }

    fn read_into(&self, slots: &mut Slots, offset: u64, len: usize, slot: usize) -> Result<(), SourceError> {
        let dst = slots.ptr_mut(slot, 0, len)?;
        let mut got = 0usize;
        while got < len {
            // SAFETY: `dst+got .. dst+len` lies inside the slot (checked by `ptr_mut`) and is
            // writable; `&mut Slots` excludes any other CPU access during the call, no NVMe
            // command holds the slot (`ptr_mut` succeeds only for a slot in hand), and the
            // pipeline hands a slot to one party at a time, so the GPU does not use it either.
            let n = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    dst.wrapping_add(got).cast(),
                    len - got,
                    (offset + got as u64) as libc::off_t,
                )
            };
            match n {
                n if n > 0 => got += n as usize,
                0 => {
                    let end = offset + got as u64;
                    if self.direct && self.len().ok() == Some(end) && len - got < DIRECT_ALIGN {
                        // The last, partial block of the file: the pipeline rounded the read up
                        // to the block size; the bytes past the end are not part of the data.
                        slots.write(slot, got, &[0u8; DIRECT_ALIGN][..len - got])?;
                        return Ok(());
                    }
                    return Err(SourceError::ShortFile {
                        path: self.path.clone(),
                        offset,
                        len,
                        end,
                    });
                }
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(self.io_err("read", offset, len, e));
                    }
                }
            }
        }
        Ok(())
    }

    fn write_from(&self, slots: &Slots, offset: u64, len: usize, slot: usize) -> Result<(), SourceError> {
        let src = slots.ptr(slot, 0, len)?;
        let mut put = 0usize;
        while put < len {
            // SAFETY: `src+put .. src+len` lies inside the slot (checked by `ptr`) and readable;
            // the kernel only reads it.
            let n = unsafe {
                libc::pwrite(
                    self.file.as_raw_fd(),
                    src.wrapping_add(put).cast(),
                    len - put,
                    (offset + put as u64) as libc::off_t,
                )
            };
            if n > 0 {
                put += n as usize;
            } else {
                let e = if n == 0 {
                    io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote nothing")
                } else {
                    io::Error::last_os_error()
                };
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(self.io_err("write", offset, len, e));
                }
            }
        }
        Ok(())
    }
}

impl BlockSource for FileSource {
    fn describe(&self) -> String {
        format!(
            "file {}{}",
            self.path.display(),
            if self.direct { " (O_DIRECT)" } else { "" }
        )
    }

    fn block_size(&self) -> usize {
        if self.direct {
            DIRECT_ALIGN
        } else {
            1
        }
    }

    fn capacity(&self) -> u64 {
        if self.writable {
            return u64::MAX;
        }
        // A file whose length cannot be read has none to offer; the read then reports why.
        let len = self.len().unwrap_or(0);
        if self.direct {
            len.next_multiple_of(DIRECT_ALIGN as u64)
        } else {
            len
        }
    }

    fn submit_read(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        let r = self.read_into(slots, offset, len, slot);
        self.ready.push_back((slot, r));
        Ok(())
    }

    fn submit_write(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        if !self.writable {
            return Err(SourceError::Invalid(format!(
                "{} was opened read-only",
                self.path.display()
            )));
        }
        let r = self.write_from(slots, offset, len, slot);
        self.ready.push_back((slot, r));
        Ok(())
    }

    fn poll(&mut self, _slots: &mut Slots, done: &mut Vec<Completion>) {
        done.extend(self.ready.drain(..));
    }

    fn outstanding(&self) -> usize {
        self.ready.len()
    }

    fn flush(&mut self) -> Result<(), SourceError> {
        self.file
            .sync_data()
            .map_err(|e| self.io_err("fdatasync", 0, 0, e))
    }
}
