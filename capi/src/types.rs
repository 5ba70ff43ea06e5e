//! The plain C types of the API: constants, and the `#[repr(C)]` structs that carry identify
//! data, options and completions. Values that C passes in are integers, never Rust enums or
//! `bool`s, so that no bit pattern from C can be invalid on the Rust side.

#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// IOMMU mode for `vfpoll_env_open`: devices reach memory through the IOMMU
/// (the VFIO type1 container). The safe default.
pub const VFPOLL_IOMMU_TYPE1: u32 = 0;
/// IOMMU mode: no IOMMU (VFIO no-IOMMU mode). Devices use physical addresses and can reach all
/// memory; needs root, hugepages and `enable_unsafe_noiommu_mode`.
pub const VFPOLL_IOMMU_NONE: u32 = 1;
/// IOMMU mode: through the IOMMU, driven by iommufd (`/dev/iommu`, devices opened through
/// their VFIO cdev `/dev/vfio/devices/vfioN`; Linux 6.6+). The same protection as type1; it
/// cannot map a peer device's BAR for P2P DMA (use `VFPOLL_IOMMU_TYPE1` for that).
pub const VFPOLL_IOMMU_IOMMUFD: u32 = 2;
/// IOMMU mode: `VFPOLL_IOMMU_IOMMUFD` where `/dev/iommu` exists and the kernel offers VFIO
/// cdevs (`/dev/vfio/devices` holds some), `VFPOLL_IOMMU_TYPE1` otherwise; never no-IOMMU.
pub const VFPOLL_IOMMU_AUTO: u32 = 3;

/// DMA page size: 4 KiB pages (no hugepages needed; IOMMU mode).
pub const VFPOLL_PAGE_4K: u32 = 0;
/// DMA page size: 2 MiB hugepages (the usual choice).
pub const VFPOLL_PAGE_2M: u32 = 1;
/// DMA page size: 1 GiB hugepages (reserved at boot).
pub const VFPOLL_PAGE_1G: u32 = 2;

/// Namespace metadata: none.
pub const VFPOLL_MD_NONE: u32 = 0;
/// Namespace metadata: at the end of each block, in the data buffer (extended LBA).
pub const VFPOLL_MD_EXTENDED: u32 = 1;
/// Namespace metadata: in a separate buffer (`vfpoll_qpair_read_md`, `vfpoll_qpair_write_md`).
pub const VFPOLL_MD_SEPARATE: u32 = 2;

/// I/O command set of a namespace: NVM.
pub const VFPOLL_CSI_NVM: u32 = 0;
/// I/O command set of a namespace: Zoned Namespace.
pub const VFPOLL_CSI_ZONED: u32 = 2;

/// Protection information mode of a queue pair: the controller generates PI on writes and
/// checks and strips it on reads (PRACT = 1). Where the metadata is the PI alone, buffers hold
/// data only. The default.
pub const VFPOLL_PI_CONTROLLER: u32 = 0;
/// PI mode: as `VFPOLL_PI_CONTROLLER`, but reads are not checked (to read blocks that were never
/// written with valid PI).
pub const VFPOLL_PI_CONTROLLER_UNCHECKED: u32 = 1;
/// PI mode: the host supplies PI in the metadata it writes and gets it back on reads; the
/// controller checks what `pi_checks` says.
pub const VFPOLL_PI_HOST: u32 = 2;

/// `pi_checks` bit (host PI mode): check the guard.
pub const VFPOLL_PI_CHECK_GUARD: u32 = 1;
/// `pi_checks` bit (host PI mode): check the application tag.
pub const VFPOLL_PI_CHECK_APP_TAG: u32 = 2;
/// `pi_checks` bit (host PI mode): check the reference tag (PI types 1 and 2).
pub const VFPOLL_PI_CHECK_REF_TAG: u32 = 4;

/// What a controller says about itself (Identify Controller, NVMe Base 2.0 §5.17.2.1, and the
/// registers). Strings are NUL-terminated, trailing spaces removed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_ctrl_info {
    /// PCI Vendor ID (VID).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (SSVID).
    pub ssvid: u16,
    /// Controller ID (CNTLID).
    pub cntlid: u16,
    /// Optional NVM Command Support (ONCS): bit 2 Dataset Management, bit 3 Write Zeroes.
    pub oncs: u16,
    /// Serial Number (SN).
    pub serial: [c_char; 21],
    /// Model Number (MN).
    pub model: [c_char; 41],
    /// Firmware Revision (FR).
    pub firmware: [c_char; 9],
    /// Maximum Data Transfer Size as reported (MDTS, a power of two of CAP.MPSMIN pages; 0: no
    /// limit).
    pub mdts: u8,
    /// A volatile write cache is present (VWC): flushes matter.
    pub volatile_write_cache: bool,
    /// The NVMe version (VS): major << 16 | minor << 8 | tertiary.
    pub version: u32,
    /// MDTS in bytes (0: no limit).
    pub mdts_bytes: u64,
    /// Number of Namespaces (NN): the highest namespace ID the controller may have.
    pub namespace_count: u32,
    /// Active namespaces now (`vfpoll_ctrl_namespaces` lists them).
    pub active_namespaces: u32,
    /// Largest queue a queue pair may ask for (CAP.MQES + 1, at most vfpoll's limit).
    pub max_queue_entries: u32,
    /// I/O queue pairs the controller granted (Set Features, Number of Queues).
    pub io_queues: u32,
}

/// A namespace's geometry and format (Identify Namespace, NVM Command Set 1.0 §4.1.5).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_ns_info {
    /// Namespace ID.
    pub nsid: u32,
    /// Data bytes per logical block (the LBA size).
    pub lba_size: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Capacity in data bytes (`blocks * lba_size`).
    pub bytes: u64,
    /// Metadata bytes per logical block (0: none).
    pub metadata_size: u32,
    /// Where the metadata goes: `VFPOLL_MD_NONE`, `VFPOLL_MD_EXTENDED` or `VFPOLL_MD_SEPARATE`.
    pub metadata: u32,
    /// Protection information type (DPS): 0 none, 1, 2 or 3.
    pub pi_type: u8,
    /// Bits of the PI guard: 16, 32 or 64 (0 without PI).
    pub pi_guard_bits: u8,
    /// PI in the first bytes of the metadata (else the last).
    pub pi_first: bool,
    /// The Identify data describe a format vfpoll understands; when false, the format fields
    /// above are 0 and I/O is refused (`vfpoll_ns_transfer` says why).
    pub format_valid: bool,
    /// Index of the LBA format in use (FLBAS).
    pub lba_format: u8,
    /// LBA formats the namespace lists.
    pub lba_format_count: u8,
    /// I/O command set: `VFPOLL_CSI_NVM` or `VFPOLL_CSI_ZONED` (others are refused for I/O).
    pub command_set: u8,
    /// A zoned namespace (Zoned Namespace Command Set): writes go sequentially per zone.
    pub zoned: bool,
    /// Blocks per zone (0 when not zoned).
    pub zone_size: u64,
    /// Most open zones (0: no limit, or not zoned).
    pub max_open_zones: u32,
    /// Most active zones (0: no limit, or not zoned).
    pub max_active_zones: u32,
}

/// Options of a queue pair; `vfpoll_qpair_opts_init` fills in the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_qpair_opts {
    /// Queue entries, 2 to `max_queue_entries` of `vfpoll_ctrl_info`; at most `entries - 1`
    /// requests are in flight. Default 256.
    pub entries: u32,
    /// Milliseconds a command may take before the queue pair aborts it and completes it with
    /// `-ETIMEDOUT` (default 30000).
    pub timeout_ms: u32,
    /// Protection information mode: `VFPOLL_PI_CONTROLLER` (default),
    /// `VFPOLL_PI_CONTROLLER_UNCHECKED` or `VFPOLL_PI_HOST`.
    pub pi_mode: u32,
    /// `VFPOLL_PI_CHECK_*` bits, for `VFPOLL_PI_HOST` only (must be 0 otherwise).
    pub pi_checks: u32,
    /// Largest transfer of one command in bytes (0: MDTS); larger requests are split into
    /// several commands with one completion.
    pub max_transfer: u32,
    /// 1: describe data with SGLs where the controller supports them; 0: PRPs (default).
    pub sgl: u32,
}

/// One completed request.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vfpoll_completion {
    /// The tag given at submission.
    pub tag: u64,
    /// The command specific result on success: DW0, and DW1 in the upper half.
    pub result: u64,
    /// 0 on success, else a negative errno: `-EIO` for an NVMe error status (in
    /// `nvme_status`; a command past the queue pair's timeout is aborted and completes so), or
    /// after an unrecoverable failure of the controller or the queue pair, which completes
    /// every request in flight with `-EIO` and `buffer_lost` set.
    pub status: i32,
    /// The NVMe status field of a failed command (DW3 bits 31:17 in bits 15:1: DNR << 15 |
    /// SCT << 9 | SC << 1), 0 otherwise.
    pub nvme_status: u16,
    /// The data buffer is lost: the device might still write to it after a failure that
    /// could not be recovered, so it was never given back to its pool (free its handle with
    /// `vfpoll_buf_free`; the memory stays reserved).
    pub buffer_lost: bool,
}

/// Counters of one queue pair since its creation (`vfpoll_qpair_get_stats`): what a run cost in
/// doorbells and polls, for tuning how often to commit and poll.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vfpoll_qpair_stats {
    /// Requests accepted.
    pub requests: u64,
    /// Commands written to the submission queue (a request split at the largest transfer
    /// counts once per command).
    pub commands: u64,
    /// Completions consumed.
    pub completions: u64,
    /// Requests that completed with an error.
    pub errors: u64,
    /// SQ tail doorbell writes to the controller's registers (MMIO).
    pub sq_doorbells: u64,
    /// CQ head doorbell writes to the controller's registers (MMIO).
    pub cq_doorbells: u64,
    /// Doorbell updates that went only to the shadow doorbell buffer (no MMIO write needed).
    pub shadow_only: u64,
    /// Commands the queue pair asked the controller to abort after their timeout.
    pub aborts: u64,
    /// Controller resets this queue pair went through.
    pub resets: u64,
    /// Polls: one per `vfpoll_qpair_poll` call, one per round of up to 32 completions of a
    /// `vfpoll_qpair_poll_cb` call.
    pub polls: u64,
    /// Polls that found no completion.
    pub empty_polls: u64,
}

/// One range of a deallocate (trim): `blocks` blocks from `slba`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_range {
    /// First block.
    pub slba: u64,
    /// Number of blocks (at least 1).
    pub blocks: u32,
}

/// Called by `vfpoll_qpair_poll_cb` once per completion, with the `ctx` given to it. It may
/// submit to and poll the same queue pair (for example to resubmit); the completion is valid
/// only during the call.
pub type vfpoll_completion_cb =
    Option<unsafe extern "C" fn(ctx: *mut std::ffi::c_void, completion: *const vfpoll_completion)>;
