//! # vfpoll-gpu: NVMe to GPU memory with no CPU copy
//!
//! A pipelined loader that moves data between a block source (an NVMe namespace through
//! vfpoll's polled driver, the in-process NVMe model, or a file) and GPU memory through a few
//! hugepage slots: the NVMe controller writes a slot by DMA, the GPU's copy engine reads it by
//! DMA (the slots are registered with CUDA), and while slot k is copied, slots k+1.. are being
//! read. Saving runs the other way. The CPU only submits and polls.
//!
//! Layers, bottom up:
//! - [`Slots`]: the staging buffers, owned pieces of one hugepage `DmaRegion` that the NVMe
//!   controller and the GPU take turns with (a slot lent to an NVMe command is out of the
//!   CPU's and the GPU's reach until it comes back);
//! - [`BlockSource`]: submit / poll reads and writes into slots: [`NvmeSource`],
//!   [`FileSource`], [`PatternSource`] (hugepage-resident data), [`fake::MemSource`] (tests);
//! - [`CopyEngine`]: submit / poll copies between slots and device memory: `cuda::CudaEngine`
//!   (feature `cuda`), [`CpuEngine`] (ordinary memory: tests, and runs without a GPU);
//! - [`pipeline`]: [`load`], [`save`], [`verify`], with a [`Report`] (bytes, GB/s, CPU time);
//! - [`p2p`]: what peer-to-peer DMA into GPU memory would need, checked on the machine.
//!
//! ## CUDA
//!
//! With the `cuda` feature the crate calls the CUDA driver API (about 25 functions, listed in
//! `cuda::ffi`) through its own bindings, loaded with `dlopen("libcuda.so.1")` at run time:
//! building needs no CUDA, a missing driver or function is an error (never a panic), and the
//! ABI is the driver API's stable one (CUDA 12 and 13 alike). Without the feature, or without
//! the driver, the GPU side reports what is missing; the rest of the crate works as is.
//!
//! `unsafe` lives in `file` (`pread`/`pwrite` on slot memory), `cuda` (the driver calls) and
//! the `IoBuffer` impl of `slots`; every block says why it is sound. CPU copies into slot
//! memory go through vfpoll-dma's owned buffers. No Rust reference
//! is ever formed into slot memory or device memory.
//!
//! ```
//! use vfpoll_dma::{DmaContext, PageSize};
//! use vfpoll_gpu::{fake::MemSource, load, verify, CpuEngine, Options, Slots, Transfer};
//!
//! let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7) as u8).collect();
//! let mut source = MemSource::new(data, 1);
//! let mut slots = Slots::alloc(&DmaContext::for_testing(), 4, 64 << 10, PageSize::Base4K)?;
//! let mut gpu = CpuEngine::new(1_000_000);
//! let t = Transfer { source_offset: 0, device_offset: 0, len: 1_000_000 };
//! let report = load(&mut source, &mut gpu, &mut slots, &t, &Options::default())?;
//! assert_eq!(report.bytes, 1_000_000);
//! assert_eq!(gpu.memory(), source.data());
//! verify(&mut source, &mut gpu, &mut slots, &t, &Options::default())?;
//! # Ok::<(), vfpoll_gpu::PipelineError>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod engine;
pub mod error;
pub mod fake;
mod file;
pub mod p2p;
pub mod pipeline;
mod slots;
pub mod source;

pub use engine::{CopyEngine, CopyFault, CpuEngine};
pub use error::{CopyError, PipelineError, SourceError, Stage};
pub use file::{FileSource, DIRECT_ALIGN};
pub use pipeline::{load, save, verify, DataPath, Direction, Options, Report, Transfer};
pub use slots::{pattern, SlotBuf, Slots, SLOT_ALIGN};
pub use source::{BlockSource, Completion, NvmeSource, PatternSource};

/// Whether this build can drive a GPU: `Ok` with the `cuda` feature and a loadable CUDA driver,
/// otherwise an error that names what is missing.
pub fn cuda_available() -> Result<(), CopyError> {
    #[cfg(feature = "cuda")]
    {
        cuda::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CopyError::Unavailable(
            "this build has no GPU support: rebuild with the `cuda` feature (cargo build --release --features cuda -p vfpoll)".into(),
        ))
    }
}
