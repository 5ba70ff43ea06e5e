//! Errors of the NVMe driver. Each message says what happened and, where there is something to
//! do about it, what.

use std::time::Duration;

use crate::status::Status;

/// An NVMe driver error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeError {
    /// The controller completed the command with an error status.
    #[error("{op} failed: {status}")]
    Status {
        /// The command, e.g. `Read` or `Identify`.
        op: &'static str,
        /// The decoded status (SCT, SC, DNR and the spec's name).
        status: Status,
    },
    /// A bring-up step did not finish within CAP.TO.
    #[error("controller bring-up step `{step}` timed out after {waited:?} (CAP.TO allows {limit:?}); CSTS={csts:#x}. Reset the device (`vfpoll reset`) and retry; if it persists the controller is unusable")]
    InitTimeout {
        /// The step.
        step: &'static str,
        /// How long it waited.
        waited: Duration,
        /// CAP.TO.
        limit: Duration,
        /// CSTS at the end.
        csts: u32,
    },
    /// CSTS.CFS is set: the controller hit a fatal error.
    #[error("the controller reports a fatal status (CSTS.CFS, CSTS={csts:#x}); it must be reset before further use")]
    ControllerFatal {
        /// CSTS.
        csts: u32,
    },
    /// CSTS reads all ones: the device no longer answers (surprise removal, link down, reset).
    #[error("the controller no longer answers (CSTS reads 0xffffffff): the device was removed or reset")]
    DeviceGone,
    /// The controller does not support what vfpoll needs.
    #[error("unsupported controller: {0}")]
    Unsupported(String),
    /// A command did not complete in time.
    #[error("{op} (queue {qid}, command id {cid}) did not complete within {timeout:?}")]
    Timeout {
        /// The command.
        op: &'static str,
        /// The queue.
        qid: u16,
        /// The command id.
        cid: u16,
        /// The limit.
        timeout: Duration,
    },
    /// No free slot in the queue: poll for completions, then submit again.
    #[error(
        "queue {qid} is full ({outstanding} commands outstanding): poll for completions and submit again"
    )]
    QueueFull {
        /// The queue.
        qid: u16,
        /// Commands in flight.
        outstanding: usize,
    },
    /// The namespace does not exist on this controller.
    #[error("namespace {nsid} does not exist on this controller (active namespaces: {active:?}); `vfpoll identify` lists them")]
    NoSuchNamespace {
        /// The NSID given.
        nsid: u32,
        /// The active ones.
        active: Vec<u32>,
    },
    /// The LBA range is outside the namespace.
    #[error("LBA range {slba}..{end} is outside namespace {nsid} ({blocks} blocks of {lba_size} bytes)")]
    LbaOutOfRange {
        /// The namespace.
        nsid: u32,
        /// First LBA asked for.
        slba: u64,
        /// One past the last LBA asked for.
        end: u64,
        /// The namespace size in blocks.
        blocks: u64,
        /// The LBA size.
        lba_size: usize,
    },
    /// The buffer length is not a whole number of blocks, or zero.
    #[error(
        "transfer length {len} is not a non-zero multiple of the {block_bytes} bytes per block that namespace {nsid} moves through the data buffer ({format})"
    )]
    BadLength {
        /// The namespace.
        nsid: u32,
        /// The length given.
        len: usize,
        /// Bytes per block in the data buffer (data, plus metadata for an extended LBA).
        block_bytes: usize,
        /// The namespace's format, described.
        format: String,
    },
    /// The namespace moves metadata in a separate buffer and the command has none (or the
    /// wrong size).
    #[error("namespace {nsid} ({format}) moves {per_block} bytes of metadata per block in a separate buffer: {what}. Submit with `read_with_metadata`/`write_with_metadata` and a metadata buffer of blocks x {per_block} bytes, or format the namespace to an LBA format without separate metadata (`vfpoll format --metadata extended`)")]
    Metadata {
        /// The namespace.
        nsid: u32,
        /// The namespace's format, described.
        format: String,
        /// Metadata bytes per block.
        per_block: usize,
        /// What is wrong.
        what: String,
    },
    /// The namespace's format or command set is one vfpoll does not drive: refused before any
    /// command is built.
    #[error("namespace {nsid} ({format}) cannot be used for I/O: {why}")]
    Refused {
        /// The namespace.
        nsid: u32,
        /// The namespace's format, described.
        format: String,
        /// Why, and what to do.
        why: String,
    },
    /// The buffer cannot be described to the controller.
    #[error("buffer unusable for DMA: {0}")]
    Buffer(#[from] crate::prp::PrpError),
    /// The transfer exceeds MDTS and splitting was not allowed.
    #[error("a transfer of {len} bytes exceeds the controller's maximum data transfer size ({mdts} bytes): split it or submit through the splitting API")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// MDTS in bytes.
        mdts: usize,
    },
    /// A destructive command was issued without its explicit guard.
    #[error("{0} destroys data: pass the explicit confirmation flag to do it")]
    Unconfirmed(&'static str),
    /// The command was in flight when the controller was reset: the controller dropped it,
    /// and may or may not have carried it out (a write may be on the media, a read's data in
    /// the buffer, or not). The buffer is handed back with it; submit it again.
    #[error("{op} on queue {qid} was aborted by a controller reset (it may or may not have been carried out): submit it again")]
    Reset {
        /// The command.
        op: &'static str,
        /// The queue.
        qid: u16,
    },
    /// The queue pair or controller was shut down after an unrecoverable error.
    #[error("the queue pair is unusable after an earlier failure: {0}")]
    Failed(String),
    /// The device was removed (the kernel asked for it back: hot unplug or unbind), or its
    /// removal was requested with `Controller::remove`: requests in flight failed with this
    /// (their buffers handed back), new ones are refused, and the device was released.
    #[error("NVMe controller {} was removed (hot unplug or unbind): its I/O failed and the device was released; open it again once it is back", removed_name(.bdf))]
    Removed {
        /// The device (`None`: a controller not opened through VFIO).
        bdf: Option<vfpoll_pci::Bdf>,
    },
    /// The controller sent a completion that does not match any command in flight.
    #[error("queue {qid}: completion for command id {cid}, which is not in flight (a controller bug); the command it belongs to will time out")]
    BogusCompletion {
        /// The queue.
        qid: u16,
        /// The command id in the completion.
        cid: u16,
    },
    /// DMA memory could not be had.
    #[error(transparent)]
    Dma(#[from] vfpoll_dma::DmaError),
    /// VFIO failed.
    #[error(transparent)]
    Vfio(#[from] vfpoll_pci::vfio::VfioError),
    /// A bad option value.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

fn removed_name(bdf: &Option<vfpoll_pci::Bdf>) -> String {
    bdf.map_or_else(|| "(no PCI device)".into(), |b| b.to_string())
}

/// `Result` with [`NvmeError`].
pub type Result<T, E = NvmeError> = std::result::Result<T, E>;
