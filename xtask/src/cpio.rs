//! A writer for the `newc` cpio format, the one the kernel unpacks as an initramfs
//! (Linux `Documentation/driver-api/early-userspace/buffer-format.rst`).
//!
//! The archive is left uncompressed: the kernel then has nothing to inflate, which under TCG is
//! cheaper than reading fewer bytes, and the host needs neither `cpio` nor `gzip`.

use std::io::{self, Write};

/// File type bits of `st_mode`.
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

/// An archive being written to `W`.
pub struct Writer<W: Write> {
    out: W,
    next_ino: u32,
    written: u64,
}

impl<W: Write> Writer<W> {
    /// Starts an archive.
    pub fn new(out: W) -> Self {
        Writer {
            out,
            next_ino: 1,
            written: 0,
        }
    }

    /// Adds a directory (its parents must have been added first).
    pub fn dir(&mut self, path: &str, perm: u32) -> io::Result<()> {
        self.entry(path, S_IFDIR | perm, 2, (0, 0), &[])
    }

    /// Adds a regular file with the given permission bits.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | perm, 1, (0, 0), data)
    }

    /// Adds a character device node.
    pub fn char_dev(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, S_IFCHR | perm, 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let size =
            u32::try_from(data.len()).map_err(|_| io::Error::other(format!("{name}: too large for cpio")))?;
        let name_len = u32::try_from(name.len() + 1).map_err(io::Error::other)?;
        let ino = self.next_ino;
        self.next_ino += 1;
        // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
        // rdevmajor, rdevminor, namesize, check: 8 hex digits each.
        let fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_len, 0];
        let mut header = String::from("070701");
        for f in fields {
            header.push_str(&format!("{f:08x}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Header+name and data each end on a 4-byte boundary.
    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_newc() {
        let mut w = Writer::new(Vec::new());
        w.file("init", 0o755, b"hi\n").unwrap();
        let buf = w.finish().unwrap();
        assert_eq!(&buf[..6], b"070701");
        // header 110 bytes + "init\0" = 115, padded to 116; data 3 padded to 4.
        assert_eq!(&buf[110..115], b"init\0");
        assert_eq!(&buf[116..119], b"hi\n");
        assert_eq!(&buf[120..126], b"070701");
        assert_eq!(buf.len() % 4, 0);
        let mode = u32::from_str_radix(std::str::from_utf8(&buf[14..22]).unwrap(), 16).unwrap();
        assert_eq!(mode, S_IFREG | 0o755);
    }
}
