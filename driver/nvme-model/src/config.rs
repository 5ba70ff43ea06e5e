//! What the model reports and how it behaves.

use std::time::Duration;

pub use crate::nsconfig::NamespaceConfig;
use crate::ModelError;

/// What the model writes into the EventIdx buffer once Doorbell Buffer Config (NVMe Base 2.0
/// §5.8) is in use, each time it sees a shadow doorbell move to a new value `v`. A host rings the
/// MMIO doorbell after moving a shadow doorbell from `old` to `new` only when EventIdx lies in
/// `[old, new)` (the Linux and SPDK `need_event` rule, in 16-bit arithmetic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventIdxPolicy {
    /// EventIdx = `v` + half the queue size (modulo the size): the host never needs to ring for
    /// a move of less than half the queue, whether or not the model has seen it yet, since the
    /// model polls the shadow doorbells anyway. What a polled controller wants.
    #[default]
    Suppress,
    /// EventIdx = `v`: the host rings when it moves a doorbell the model has caught up with (how
    /// QEMU sets it), unless the model sees the new value before the host checks. For testing
    /// that a driver honours EventIdx.
    Notify,
}

impl EventIdxPolicy {
    /// The EventIdx to write for a queue of `size` entries whose doorbell moved to `value`.
    pub(crate) fn index(self, value: u32, size: u32) -> u32 {
        match self {
            EventIdxPolicy::Suppress => (value + size / 2) % size,
            EventIdxPolicy::Notify => value,
        }
    }
}

/// How the model answers a shutdown notification (CC.SHN, NVMe Base 2.0 §3.6), for testing a
/// host's shutdown waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShutdownBehavior {
    /// Both a normal and an abrupt shutdown complete at once (CSTS.SHST = 10b).
    #[default]
    Complete,
    /// A normal shutdown stays in progress (CSTS.SHST = 01b) for ever; an abrupt one completes at
    /// once. A controller whose cache flush hangs.
    AbruptOnly,
    /// No shutdown ever completes (CSTS.SHST stays 01b); clearing CC.EN still resets the
    /// controller.
    Never,
}

/// The model's configuration. `ModelConfig::default()` is a small controller with SGLs, a volatile
/// write cache, shadow doorbells and one 16 MiB namespace of 512-byte blocks; change the public
/// fields as needed.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// PCI Vendor ID reported in Identify Controller (VID; default Red Hat's, as QEMU's model).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (SSVID).
    pub ssvid: u16,
    /// Serial Number (SN, ASCII, up to 20 characters).
    pub serial: String,
    /// Model Number (MN, ASCII, up to 40 characters).
    pub model: String,
    /// Firmware Revision (FR, ASCII, up to 8 characters).
    pub firmware: String,
    /// Maximum entries of an I/O queue (CAP.MQES + 1; 2 ..= 65536; default 1024).
    pub max_queue_entries: u32,
    /// Doorbell stride exponent (CAP.DSTRD: doorbells are `4 << dstrd` bytes apart; 0 ..= 8).
    pub dstrd: u8,
    /// Maximum Data Transfer Size as a power of two of the minimum memory page size (4 KiB):
    /// 5 means 128 KiB; 0 means no limit.
    pub mdts: u8,
    /// Largest memory page size accepted in CC.MPS, as `12 + mps_max` bits (CAP.MPSMAX; default 4,
    /// 64 KiB). CAP.MPSMIN is 0 (4 KiB).
    pub mps_max: u8,
    /// Zone Append Size Limit (Identify Controller for the Zoned Namespace Command Set, ZASL) as
    /// a power of two of the minimum memory page size, like `mdts`; 0 means MDTS applies.
    pub zasl: u8,
    /// I/O submission and completion queues the controller offers (each; 1 ..= 4096; default 64).
    pub max_io_queue_pairs: u16,
    /// The namespaces; NN in Identify Controller is the largest NSID.
    pub namespaces: Vec<NamespaceConfig>,
    /// Whether SGLs are supported for I/O commands (SGLS; PSDT 01b).
    pub sgl: bool,
    /// Whether a volatile write cache is reported (VWC, feature 06h).
    pub volatile_write_cache: bool,
    /// Whether Doorbell Buffer Config (admin 7Ch, OACS bit 8) is supported.
    pub doorbell_buffer_config: bool,
    /// EventIdx policy when shadow doorbells are in use.
    pub event_idx: EventIdxPolicy,
    /// If set, every I/O command's completion is posted this long after the command was fetched
    /// (admin commands complete at once); `None` completes immediately.
    pub completion_latency: Option<Duration>,
    /// How long the controller thread busy-polls after its last activity before it starts to
    /// sleep between polls.
    pub idle_spin: Duration,
    /// The longest sleep between polls when idle (the sleep starts at a few microseconds and
    /// doubles up to this).
    pub max_idle_sleep: Duration,
    /// RTD3 Entry Latency reported in Identify Controller (RTD3E, microseconds; 0 = not
    /// reported): how long a host should wait for a normal shutdown.
    pub rtd3e_us: u32,
    /// How shutdown notifications are answered.
    pub shutdown: ShutdownBehavior,
    /// CAP.TO in units of 500 ms (1 ..= 255; default 10, 5 s): how long a host waits for
    /// CSTS.RDY to follow CC.EN. Tests of controllers that never get ready set it low.
    pub ready_timeout_500ms: u8,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            vid: 0x1b36,
            ssvid: 0x1af4,
            serial: "VFPOLL-MODEL-0001".into(),
            model: "vfpoll NVMe model".into(),
            firmware: "1.0".into(),
            max_queue_entries: 1024,
            dstrd: 0,
            mdts: 5,
            zasl: 0,
            mps_max: 4,
            max_io_queue_pairs: 64,
            namespaces: vec![NamespaceConfig::new(1, 512, 32768)],
            sgl: true,
            volatile_write_cache: true,
            doorbell_buffer_config: true,
            event_idx: EventIdxPolicy::Suppress,
            completion_latency: None,
            idle_spin: Duration::from_micros(50),
            max_idle_sleep: Duration::from_micros(100),
            rtd3e_us: 0,
            shutdown: ShutdownBehavior::Complete,
            ready_timeout_500ms: CAP_TO_500MS,
        }
    }
}

/// CAP.CSS bits (NVMe Base 2.0 §3.1.3.1): NVM command set, one or more I/O command sets, no I/O
/// command set.
pub(crate) const CAP_CSS_NVM: u8 = 1 << 0;
pub(crate) const CAP_CSS_IOCS: u8 = 1 << 6;
pub(crate) const CAP_CSS_ADMIN_ONLY: u8 = 1 << 7;

/// CAP.TO: the model reacts to CC.EN within microseconds; 5 s leaves room for a loaded test host.
const CAP_TO_500MS: u8 = 10;

impl ModelConfig {
    /// Default feature values by feature ID (Number of Queues aside: see `Controller::nq`),
    /// what Get Features reads after a controller reset.
    pub(crate) fn feature_defaults(&self) -> [u32; 16] {
        use vfpoll_nvme_spec::cmd::feature;
        let mut f = [0; 16];
        // Temperature Threshold: an over-temperature threshold of 343 K, as QEMU's.
        f[feature::TEMPERATURE_THRESHOLD as usize] = 0x0157;
        f[feature::VOLATILE_WRITE_CACHE as usize] = self.volatile_write_cache as u32;
        f
    }

    /// Checks the configuration, naming the first problem.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Config(why));
        for (what, s, max) in [
            ("serial", &self.serial, 20),
            ("model", &self.model, 40),
            ("firmware", &self.firmware, 8),
        ] {
            if s.len() > max || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return bad(format!(
                    "{what} {s:?} is not printable ASCII of at most {max} characters"
                ));
            }
        }
        if !(2..=65536).contains(&self.max_queue_entries) {
            return bad(format!(
                "max_queue_entries {} is not in 2..=65536",
                self.max_queue_entries
            ));
        }
        if self.dstrd > 8 {
            return bad(format!("dstrd {} is over 8", self.dstrd));
        }
        if self.mdts > 20 {
            return bad(format!("mdts {} is over 20", self.mdts));
        }
        if self.zasl != 0 && (self.zasl > 20 || (self.mdts != 0 && self.zasl > self.mdts)) {
            return bad(format!(
                "zasl {} is over mdts {} (0: no limit)",
                self.zasl, self.mdts
            ));
        }
        if self.mps_max > 15 {
            return bad(format!("mps_max {} is over 15", self.mps_max));
        }
        if !(1..=4096).contains(&self.max_io_queue_pairs) {
            return bad(format!(
                "max_io_queue_pairs {} is not in 1..=4096",
                self.max_io_queue_pairs
            ));
        }
        let mut seen = Vec::new();
        for ns in &self.namespaces {
            if ns.nsid == 0 || ns.nsid == u32::MAX || seen.contains(&ns.nsid) {
                return bad(format!("namespace ID {:#x} is reserved or used twice", ns.nsid));
            }
            seen.push(ns.nsid);
            ns.validate()?;
        }
        Ok(())
    }

    /// Doorbell stride in bytes.
    pub fn doorbell_stride(&self) -> usize {
        4 << self.dstrd
    }

    /// Length of BAR0: the registers and a doorbell pair for the admin queue and each I/O queue.
    pub fn bar0_len(&self) -> usize {
        let doorbells = 2 * (self.max_io_queue_pairs as usize + 1) * self.doorbell_stride();
        (vfpoll_nvme_spec::regs::off::DOORBELLS + doorbells).next_multiple_of(4096)
    }

    /// Maximum data transfer size in bytes (`None`: no limit).
    pub fn max_transfer(&self) -> Option<u64> {
        (self.mdts != 0).then(|| 4096u64 << self.mdts)
    }

    /// Maximum Zone Append data size in bytes (`None`: no limit).
    pub fn max_append(&self) -> Option<u64> {
        match self.zasl {
            0 => self.max_transfer(),
            z => Some(4096u64 << z),
        }
    }

    /// The CAP register (NVMe Base 2.0 §3.1.3.1): MQES, CQR = 1, AMS = round robin only, TO,
    /// DSTRD, CSS = NVM command set (bit 0), I/O command sets (bit 6, CC.CSS = 110b) and admin
    /// only (bit 7, CC.CSS = 111b), as QEMU reports; MPSMIN = 0, MPSMAX; no NSSR, boot
    /// partitions, PMR or CMB.
    pub fn cap(&self) -> u64 {
        let mqes = (self.max_queue_entries - 1) as u64;
        let css = CAP_CSS_NVM | CAP_CSS_IOCS | CAP_CSS_ADMIN_ONLY;
        mqes | 1 << 16
            | (self.ready_timeout_500ms.max(1) as u64) << 24
            | (self.dstrd as u64) << 32
            | (css as u64) << 37
            | (self.mps_max as u64) << 52
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfpoll_nvme_spec::regs::Cap;

    #[test]
    fn cap_decodes_with_the_driver_helpers() {
        let c = ModelConfig {
            dstrd: 2,
            max_queue_entries: 4096,
            ..Default::default()
        };
        let cap = Cap(c.cap());
        assert_eq!(cap.max_queue_entries(), 4096);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.doorbell_stride(), 16);
        assert_eq!(
            cap.command_sets(),
            0xc1,
            "NVM, I/O command sets, admin only: as QEMU"
        );
        assert_eq!(cap.mps_min(), 4096);
        assert_eq!(cap.mps_max(), 65536);
        assert_eq!(cap.timeout_ms(), 5000);
        assert!(!cap.cmb_supported());
        assert_eq!(
            c.bar0_len(),
            0x2000,
            "65 doorbell pairs, 16 bytes apart, fit in one page"
        );
        assert_eq!(ModelConfig::default().bar0_len(), 0x2000);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = ModelConfig::default();
        c.validate().unwrap();
        c.namespaces.push(NamespaceConfig::new(1, 4096, 8));
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        c.namespaces[1] = NamespaceConfig::new(2, 1000, 8);
        assert!(c.validate().unwrap_err().to_string().contains("power of two"));
        c.namespaces[1] =
            NamespaceConfig::new(2, 4096, 8).with_protection(crate::Protection::last(crate::PiType::Type1));
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("namespace 2: protection"));
        c.namespaces[1] = NamespaceConfig::new(2, 4096, 8);
        c.zasl = 6;
        assert!(c.validate().unwrap_err().to_string().contains("zasl"));
        let c = ModelConfig {
            serial: "x".repeat(21),
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }
}
