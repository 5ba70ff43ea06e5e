//! The path most users have today, for `store_gpu --bounce FILE`: GPU memory copied to a
//! pageable host buffer with `cudaMemcpy` (`cuMemcpyDtoH`), `write()` to a file in the page
//! cache, `fsync`; back with `read()` into the host buffer and `cudaMemcpy` to the GPU. One
//! buffer of `chunk` bytes is reused, each chunk copied then written (or read then copied) in
//! turn, as a loop over tensors' `.cpu()` and `file.write()` does. The file's pages are dropped
//! from the page cache between save and load (`posix_fadvise(DONTNEED)` after the `fsync`), so
//! that the load reads the disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use vfpoll_gpu::cuda::{DeviceMemory, Gpu};

/// Seconds of the bounce save (to durable) and of the load (into GPU memory).
pub struct Bounce {
    /// `cuMemcpyDtoH` + `write()` of every chunk, then `fsync`.
    pub save: Duration,
    /// `read()` + `cuMemcpyHtoD` of every chunk, from a cold page cache.
    pub load: Duration,
}

/// Saves `host.len()` bytes of GPU memory (filled from `host` first, untimed) to `path` through
/// the bounce and loads them back into zeroed GPU memory; checks that they came back
/// identical. The file is removed afterwards.
pub fn run(
    gpu: &Arc<Gpu>,
    host: &[u8],
    path: &Path,
    chunk: usize,
) -> Result<Bounce, Box<dyn std::error::Error>> {
    let len = host.len();
    let chunk = chunk.clamp(1, len.max(1));
    let dev = DeviceMemory::alloc(gpu, len)?;
    dev.copy_from_host(0, host)?;
    let mut buf = vec![0u8; chunk];

    let t = Instant::now();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(chunk);
        dev.copy_to_host(pos, &mut buf[..n])?;
        f.write_all(&buf[..n])?;
        pos += n;
    }
    f.sync_all()?;
    let save = t.elapsed();
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    drop(f);

    dev.fill(0)?;
    let t = Instant::now();
    let mut f = File::open(path)?;
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(chunk);
        f.read_exact(&mut buf[..n])?;
        dev.copy_from_host(pos, &buf[..n])?;
        pos += n;
    }
    let load = t.elapsed();
    drop(f);
    std::fs::remove_file(path)?;

    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(chunk);
        dev.copy_to_host(pos, &mut buf[..n])?;
        if buf[..n] != host[pos..pos + n] {
            return Err(format!("the bounce load differs from the bytes saved at offset {pos}").into());
        }
        pos += n;
    }
    Ok(Bounce { save, load })
}
