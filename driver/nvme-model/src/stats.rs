//! Counters the controller thread keeps for tests and benchmarks (relaxed atomics: each is
//! exact, but a snapshot taken while commands run is not one instant).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters, shared by the controller thread and the handle.
#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) admin: [AtomicU64; 256],
    pub(crate) io: [AtomicU64; 256],
    pub(crate) mmio_doorbell_writes: AtomicU64,
    pub(crate) shadow_doorbell_updates: AtomicU64,
    pub(crate) completions_posted: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) faults_applied: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) host_reads: AtomicU64,
    pub(crate) host_writes: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            admin: std::array::from_fn(|_| AtomicU64::new(0)),
            io: std::array::from_fn(|_| AtomicU64::new(0)),
            mmio_doorbell_writes: AtomicU64::new(0),
            shadow_doorbell_updates: AtomicU64::new(0),
            completions_posted: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            faults_applied: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            host_reads: AtomicU64::new(0),
            host_writes: AtomicU64::new(0),
        }
    }
}

/// Adds one (relaxed).
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl Stats {
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let load = |c: &AtomicU64| c.load(Relaxed);
        StatsSnapshot {
            admin: std::array::from_fn(|i| load(&self.admin[i])),
            io: std::array::from_fn(|i| load(&self.io[i])),
            mmio_doorbell_writes: load(&self.mmio_doorbell_writes),
            shadow_doorbell_updates: load(&self.shadow_doorbell_updates),
            completions_posted: load(&self.completions_posted),
            errors: load(&self.errors),
            faults_applied: load(&self.faults_applied),
            bytes_read: load(&self.bytes_read),
            bytes_written: load(&self.bytes_written),
        }
    }
}

/// What the controller has done so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Admin commands fetched, by opcode.
    pub admin: [u64; 256],
    /// I/O commands fetched, by opcode.
    pub io: [u64; 256],
    /// MMIO doorbell writes observed. The model polls the doorbell words, so it sees a change of
    /// value, not each store: two writes between two polls count once, and a write of the value
    /// already there is invisible. Exact when the host waits for each command's completion.
    pub mmio_doorbell_writes: u64,
    /// Shadow doorbell updates observed (Doorbell Buffer Config), counted the same way.
    pub shadow_doorbell_updates: u64,
    /// Completion queue entries written (each duplicate and wrong-phase entry included).
    pub completions_posted: u64,
    /// Completions with an error status (also in the Error Information log).
    pub errors: u64,
    /// Faults applied (matched commands).
    pub faults_applied: u64,
    /// Bytes transferred to the host by Read commands.
    pub bytes_read: u64,
    /// Bytes transferred from the host by Write commands.
    pub bytes_written: u64,
}

impl StatsSnapshot {
    /// Admin commands with this opcode.
    pub fn admin_commands(&self, opcode: u8) -> u64 {
        self.admin[opcode as usize]
    }

    /// I/O commands with this opcode.
    pub fn io_commands(&self, opcode: u8) -> u64 {
        self.io[opcode as usize]
    }

    /// All commands fetched.
    pub fn commands(&self) -> u64 {
        self.admin.iter().chain(&self.io).sum()
    }

    /// Doorbell updates of either kind.
    pub fn doorbell_updates(&self) -> u64 {
        self.mmio_doorbell_writes + self.shadow_doorbell_updates
    }
}
