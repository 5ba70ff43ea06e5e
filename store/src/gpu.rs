//! Device memory (GPU) ↔ store, through vfpoll-gpu's [`CopyEngine`] and host staging
//! [`Slots`]: `cuda::CudaEngine` (feature `cuda`) copies between GPU memory and the slots with
//! the GPU's copy engine (the slots are registered with CUDA), [`vfpoll_gpu::CpuEngine`] stands
//! in for a GPU in tests.
//!
//! The path is staged: device → slots (GPU DMA) → the store's I/O buffers (a CPU copy) → the
//! namespaces (device DMA), and back for loads; copies of a window of slots are in flight at
//! once. The CPU copy is there because the slots and the store's I/O buffers are different DMA
//! memory; giving the store the slots' memory as its I/O buffers would remove it.

use std::time::Instant;

use vfpoll_gpu::{CopyEngine, Slots};

use crate::checkpoint::{CheckpointTx, ReadOptions, VersionReader};
use crate::error::{Result, StoreError};

fn slot_err(e: vfpoll_dma::DmaError) -> StoreError {
    StoreError::Invalid(format!("staging slot: {e}"))
}

/// Waits for the copy of `slot`; `Err` on a failed copy or after `timeout`.
fn wait_copy(
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    slot: usize,
    timeout: std::time::Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if engine.poll(slots, slot)? {
            return Ok(());
        }
        if start.elapsed() > timeout {
            slots.leak_on_drop();
            return Err(StoreError::Timeout {
                waited: start.elapsed(),
                outstanding: 1,
            });
        }
        engine.wait(slots, slot)?;
    }
}

/// Waits for every copy of `issued` (slot, offset, length), calling `done` for each finished
/// one in order; after the first failure the rest are only waited for.
fn drain(
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    issued: &[(usize, usize, usize)],
    timeout: std::time::Duration,
    mut done: impl FnMut(&mut Slots, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let mut first = None;
    for &(s, p, n) in issued {
        let r = wait_copy(engine, slots, s, timeout);
        if first.is_none() {
            match r {
                Ok(()) => {
                    if let Err(e) = done(slots, s, p, n) {
                        first = Some(e);
                    }
                }
                Err(e) => first = Some(e),
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Copies device bytes `dev..dev + dst.len()` into `dst` through the slots.
fn device_to_host(
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    dev: u64,
    dst: &mut [u8],
    timeout: std::time::Duration,
) -> Result<()> {
    let ss = slots.slot_size();
    let mut pos = 0usize;
    while pos < dst.len() {
        let mut issued = Vec::with_capacity(slots.count());
        let mut fail = None;
        for s in 0..slots.count() {
            if pos >= dst.len() {
                break;
            }
            let n = (dst.len() - pos).min(ss);
            if let Err(e) = engine.submit_d2h(slots, s, dev + pos as u64, n) {
                fail = Some(StoreError::from(e));
                break;
            }
            issued.push((s, pos, n));
            pos += n;
        }
        drain(engine, slots, &issued, timeout, |slots, s, p, n| {
            slots.read(s, 0, &mut dst[p..p + n]).map_err(slot_err)
        })?;
        if let Some(e) = fail {
            return Err(e);
        }
    }
    Ok(())
}

/// Copies `src` to device bytes `dev..dev + src.len()` through the slots.
fn host_to_device(
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    dev: u64,
    src: &[u8],
    timeout: std::time::Duration,
) -> Result<()> {
    let ss = slots.slot_size();
    let mut pos = 0usize;
    while pos < src.len() {
        let mut issued = Vec::with_capacity(slots.count());
        let mut fail = None;
        for s in 0..slots.count() {
            if pos >= src.len() {
                break;
            }
            let n = (src.len() - pos).min(ss);
            let r = slots
                .write(s, 0, &src[pos..pos + n])
                .map_err(slot_err)
                .and_then(|()| Ok(engine.submit_h2d(slots, s, dev + pos as u64, n)?));
            if let Err(e) = r {
                fail = Some(e);
                break;
            }
            issued.push((s, pos, n));
            pos += n;
        }
        drain(engine, slots, &issued, timeout, |_, _, _, _| Ok(()))?;
        if let Some(e) = fail {
            return Err(e);
        }
    }
    Ok(())
}

impl CheckpointTx {
    /// Puts `len` bytes of device memory at `dev_offset` (a GPU allocation behind `engine`) as
    /// entry `name`: window by window, the engine copies them into `slots`, the CPU moves them
    /// into the store's I/O buffers, and the store writes them. When it returns the device
    /// memory may be reused (the entry is staged).
    ///
    /// ```
    /// # use vfpoll_store::{FormatOptions, Store};
    /// use vfpoll_dma::{DmaContext, PageSize};
    /// use vfpoll_gpu::{CpuEngine, Slots};
    /// # fn main() -> Result<(), vfpoll_store::StoreError> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let mut opts = FormatOptions::default();
    /// # opts.store.lock_dir = Some(dir.path().into());
    /// let store = Store::format(&["mem:64M"], &opts)?;
    /// // CpuEngine stands in for a GPU; with the `cuda` feature, vfpoll_gpu::cuda::CudaEngine.
    /// let mut gpu = CpuEngine::new(1 << 20);
    /// gpu.memory_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    /// let mut slots = Slots::alloc(&DmaContext::for_testing(), 4, 64 << 10, PageSize::Base4K).unwrap();
    /// let mut tx = store.begin("model")?;
    /// tx.put_device("w", b"", &mut gpu, &mut slots, 0, 1 << 20)?;
    /// tx.commit()?;
    /// let mut back = CpuEngine::new(1 << 20);
    /// let r = store.open_version("model", None)?;
    /// r.load_device("w", 0, 1 << 20, &mut back, &mut slots, 0, &Default::default())?;
    /// assert_eq!(back.memory(), gpu.memory());
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn put_device(
        &mut self,
        name: &str,
        meta: &[u8],
        engine: &mut dyn CopyEngine,
        slots: &mut Slots,
        dev_offset: u64,
        len: u64,
    ) -> Result<()> {
        if dev_offset.checked_add(len).is_none_or(|e| e > engine.capacity()) {
            return Err(StoreError::Invalid(format!(
                "device bytes {dev_offset}..+{len} are outside the {}-byte allocation of {}",
                engine.capacity(),
                engine.describe()
            )));
        }
        let timeout = self.store().options().io_timeout;
        // Without the transaction's background writer, a writer of two windows overlaps the
        // device copies of one window with the writes of the previous one; the put still
        // returns only once everything is written.
        let temporary = !self.has_background();
        if temporary {
            self.background(2 * self.window())?;
        }
        let r = self.put_with(name, meta, len, |off, dst| {
            device_to_host(engine, slots, dev_offset + off, dst, timeout)
        });
        if temporary {
            let written = self.end_background();
            if r.is_ok() && written.is_err() {
                self.forget_last_entry();
            }
            return r.and(written);
        }
        r
    }
}

impl VersionReader {
    /// Loads `len` bytes of entry `name` from byte `offset` into device memory at `dev_offset`
    /// (a GPU allocation behind `engine`), window by window through `slots`, with every
    /// extent's crc32c checked first (unless `o.verify` is off).
    #[allow(clippy::too_many_arguments)]
    pub fn load_device(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        engine: &mut dyn CopyEngine,
        slots: &mut Slots,
        dev_offset: u64,
        o: &ReadOptions,
    ) -> Result<()> {
        if dev_offset.checked_add(len).is_none_or(|e| e > engine.capacity()) {
            return Err(StoreError::Invalid(format!(
                "device bytes {dev_offset}..+{len} are outside the {}-byte allocation of {}",
                engine.capacity(),
                engine.describe()
            )));
        }
        let store = self.store();
        let window = (store.options().io_buffers.max(2) as u64
            * store.chunk_pages()
            * crate::format::PAGE as u64
            * store.inner.members.len() as u64)
            .max(1 << 20);
        let timeout = store.options().io_timeout;
        // A reader thread reads (and checks) window k + 1 while this one copies window k to
        // the device.
        std::thread::scope(|scope| {
            let (to_copy, ready) = std::sync::mpsc::sync_channel::<Result<(u64, Vec<u8>)>>(1);
            let (to_read, free) = std::sync::mpsc::channel::<Vec<u8>>();
            let _ = to_read.send(Vec::new());
            let _ = to_read.send(Vec::new());
            scope.spawn(move || {
                let mut pos = 0u64;
                while pos < len {
                    let Ok(mut buf) = free.recv() else { return };
                    let n = (len - pos).min(window) as usize;
                    buf.resize(n, 0);
                    let r = self
                        .read_range(name, offset + pos, &mut buf, o)
                        .map(|()| (pos, buf));
                    let failed = r.is_err();
                    if to_copy.send(r).is_err() || failed {
                        return;
                    }
                    pos += n as u64;
                }
            });
            let copied = (|| {
                let mut done = 0u64;
                while done < len {
                    let (pos, buf) = ready
                        .recv()
                        .map_err(|_| StoreError::Internal("the reader thread stopped".into()))??;
                    host_to_device(engine, slots, dev_offset + pos, &buf, timeout)?;
                    done += buf.len() as u64;
                    let _ = to_read.send(buf);
                }
                Ok::<(), StoreError>(())
            })();
            // Closing both channels ends the reader wherever it waits.
            drop(ready);
            drop(to_read);
            copied
        })?;
        Ok(())
    }
}
