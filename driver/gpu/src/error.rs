//! Errors of the three sides of a transfer: the block source (NVMe, file), the copy engine (the
//! GPU, or the CPU stand-in), and the pipeline that drives both. Each message says what failed
//! and, where there is something to do about it, what.

use std::path::PathBuf;
use std::time::Duration;

use vfpoll_dma::DmaError;
use vfpoll_nvme::NvmeError;

/// A block source or sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The NVMe driver refused or failed a command.
    #[error("NVMe {op} of {len} bytes at byte {offset} failed")]
    Nvme {
        /// `read` or `write`.
        op: &'static str,
        /// Byte offset in the namespace.
        offset: u64,
        /// Bytes.
        len: usize,
        /// The driver's error.
        #[source]
        source: NvmeError,
    },
    /// A file read or write failed.
    #[error("{op} of {len} bytes at byte {offset} of {path} failed")]
    File {
        /// `read` or `write`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: usize,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file ended before the range asked for.
    #[error("{path} ends at byte {end}, before the {len} bytes asked for at byte {offset}")]
    ShortFile {
        /// The file.
        path: PathBuf,
        /// Byte offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// Where the file ended.
        end: u64,
    },
    /// Slot memory could not be reached.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A request the source cannot serve (bad slot, range, alignment).
    #[error("invalid request to the block source: {0}")]
    Invalid(String),
    /// An injected fault (tests).
    #[error("injected source fault: {0}")]
    Injected(String),
}

/// The copy engine (GPU, or its CPU stand-in) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// A CUDA driver API call returned an error.
    #[error("{call} failed: {name} ({code}): {description}")]
    Cuda {
        /// The driver API function.
        call: &'static str,
        /// The `CUresult`.
        code: i32,
        /// `cuGetErrorName`.
        name: String,
        /// `cuGetErrorString`.
        description: String,
    },
    /// The CUDA driver is not there: built without the `cuda` feature, or libcuda could not be
    /// loaded, or it lacks a function.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A copy outside the device allocation or the slot.
    #[error("copy of {len} bytes at device offset {offset} is outside the {size}-byte device allocation (or longer than a slot)")]
    OutOfBounds {
        /// Device byte offset.
        offset: u64,
        /// Bytes.
        len: usize,
        /// Size of the allocation.
        size: u64,
    },
    /// The slots given are not the ones the engine registered.
    #[error("these slots are not the memory this engine registered with the GPU")]
    NotRegistered,
    /// Slot memory could not be reached.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// An injected fault (tests).
    #[error("injected copy fault: {0}")]
    Injected(String),
}

/// Which stage of the pipeline an error or a timeout came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading from the block source into a slot.
    Read,
    /// Writing a slot to the block sink.
    Write,
    /// Copying a slot to the GPU.
    HostToDevice,
    /// Copying from the GPU into a slot.
    DeviceToHost,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Read => "read from the source",
            Stage::Write => "write to the sink",
            Stage::HostToDevice => "copy to the GPU",
            Stage::DeviceToHost => "copy from the GPU",
        })
    }
}

/// A load, save or verify did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The request does not fit the source, the device memory or the slots.
    #[error("invalid transfer: {0}")]
    Invalid(String),
    /// The block source failed.
    #[error("{stage} failed for bytes {offset}..+{len}")]
    Source {
        /// Read or write.
        stage: Stage,
        /// Byte offset of the chunk in the transfer.
        offset: u64,
        /// Chunk length.
        len: usize,
        /// The source's error.
        #[source]
        source: SourceError,
    },
    /// The copy engine failed.
    #[error("{stage} failed for bytes {offset}..+{len}")]
    Copy {
        /// Host-to-device or device-to-host.
        stage: Stage,
        /// Byte offset of the chunk in the transfer.
        offset: u64,
        /// Chunk length.
        len: usize,
        /// The engine's error.
        #[source]
        source: CopyError,
    },
    /// Slot memory could not be had.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// Nothing completed for too long.
    #[error("no progress for {waited:?} ({outstanding} slots still busy, the oldest in the {stage} stage); the slots' memory is leaked so that a late device write cannot reach freed memory")]
    Timeout {
        /// The stage of the oldest busy slot.
        stage: Stage,
        /// How long nothing completed.
        waited: Duration,
        /// Slots still busy.
        outstanding: usize,
    },
    /// The GPU copy differs from the source.
    #[error("verify failed: {mismatched_bytes} bytes differ, the first at byte {first} of the transfer (source {expected:#04x}, GPU {found:#04x})")]
    Mismatch {
        /// Offset of the first differing byte, from the start of the transfer.
        first: u64,
        /// The source's byte there.
        expected: u8,
        /// The GPU's byte there.
        found: u8,
        /// How many bytes differ.
        mismatched_bytes: u64,
    },
}
