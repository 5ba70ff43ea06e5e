//! Log pages (NVMe Base 2.0 §5.16.1): Error Information, SMART / Health Information, Firmware
//! Slot Information, Changed Namespace List, and the discovery controller's Discovery log
//! page (log 70h, as NVMe-oF 1.1 defines it). The Asymmetric Namespace Access log (0Ch) is
//! built in `ana`.

use std::collections::{BTreeSet, VecDeque};

use vfpoll_nvme_spec::status::Status;

use super::bytes::{put128, put16, put32, put64, put_ascii, put_str};
use super::config::{AdrFam, Listener};

/// Log page identifiers this target returns (NVMe Base 2.0 Figure 202).
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS: u8 = 0x04;
    /// Asymmetric Namespace Access (NVMe Base 2.0 §5.16.1.13).
    pub const ANA: u8 = 0x0c;
    /// Discovery (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
}

/// Health of a namespace's storage, in the SMART / Health log's units (NVMe Base 2.0
/// Figure 207): the runtime fills it from the backend (a vfpoll NVMe namespace's own SMART
/// log, or what a RAM backend counts) and hands it to `Target::set_health`. Counters the
/// backend does not know stay 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Health {
    /// Critical Warning bits (bit 0 spare below threshold, 1 temperature, 2 reliability
    /// degraded, 3 read only, 4 volatile memory backup failed).
    pub critical_warning: u8,
    /// Composite Temperature in kelvins (0: not reported).
    pub temperature_k: u16,
    /// Available Spare, percent.
    pub available_spare: u8,
    /// Available Spare Threshold, percent.
    pub spare_threshold: u8,
    /// Percentage Used.
    pub percent_used: u8,
    /// Data Units Read: thousands of 512-byte units, rounded up ([`Health::data_units`]).
    pub data_units_read: u128,
    /// Data Units Written.
    pub data_units_written: u128,
    /// Host Read Commands.
    pub host_reads: u128,
    /// Host Write Commands.
    pub host_writes: u128,
    /// Controller Busy Time, minutes.
    pub busy_minutes: u128,
    /// Power Cycles.
    pub power_cycles: u128,
    /// Power On Hours.
    pub power_on_hours: u128,
    /// Unsafe Shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors.
    pub media_errors: u128,
}

impl Health {
    /// Bytes as SMART data units: thousands of 512-byte units, rounded up.
    pub fn data_units(bytes: u128) -> u128 {
        bytes.div_ceil(512 * 1000)
    }

    /// The health of several namespaces together (the controller-wide SMART log): counters
    /// summed, warnings or'ed, the worst temperature, spare and wear, the longest life.
    pub fn combine<'a>(all: impl IntoIterator<Item = &'a Health>) -> Health {
        let mut h = Health::default();
        let mut spare: Option<(u8, u8)> = None;
        for x in all {
            h.critical_warning |= x.critical_warning;
            h.temperature_k = h.temperature_k.max(x.temperature_k);
            spare = Some(match spare {
                Some((s, t)) if s <= x.available_spare => (s, t),
                _ => (x.available_spare, x.spare_threshold),
            });
            h.percent_used = h.percent_used.max(x.percent_used);
            h.data_units_read = h.data_units_read.saturating_add(x.data_units_read);
            h.data_units_written = h.data_units_written.saturating_add(x.data_units_written);
            h.host_reads = h.host_reads.saturating_add(x.host_reads);
            h.host_writes = h.host_writes.saturating_add(x.host_writes);
            h.busy_minutes = h.busy_minutes.saturating_add(x.busy_minutes);
            h.power_cycles = h.power_cycles.max(x.power_cycles);
            h.power_on_hours = h.power_on_hours.max(x.power_on_hours);
            h.unsafe_shutdowns = h.unsafe_shutdowns.max(x.unsafe_shutdowns);
            h.media_errors = h.media_errors.saturating_add(x.media_errors);
        }
        if let Some((s, t)) = spare {
            h.available_spare = s;
            h.spare_threshold = t;
        }
        h
    }
}

/// Bytes of the SMART / Health log.
pub const SMART_BYTES: usize = 512;

/// SMART / Health Information (log 02h, NVMe Base 2.0 Figure 207); `error_entries` is the
/// controller's count of Error Information log entries.
pub(crate) fn smart(h: &Health, error_entries: u64) -> Vec<u8> {
    let mut b = vec![0u8; SMART_BYTES];
    b[0] = h.critical_warning;
    put16(&mut b, 1, h.temperature_k);
    b[3] = h.available_spare;
    b[4] = h.spare_threshold;
    b[5] = h.percent_used;
    put128(&mut b, 32, h.data_units_read);
    put128(&mut b, 48, h.data_units_written);
    put128(&mut b, 64, h.host_reads);
    put128(&mut b, 80, h.host_writes);
    put128(&mut b, 96, h.busy_minutes);
    put128(&mut b, 112, h.power_cycles);
    put128(&mut b, 128, h.power_on_hours);
    put128(&mut b, 144, h.unsafe_shutdowns);
    put128(&mut b, 160, h.media_errors);
    put128(&mut b, 176, error_entries as u128);
    b
}

/// Firmware Slot Information (log 03h, NVMe Base 2.0 §5.16.1): slot 1 active, holding
/// `firmware`.
pub(crate) fn firmware_slot(firmware: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1;
    put_ascii(&mut b, 8, 8, firmware);
    b
}

/// Namespace IDs changed since the host last read the Changed Namespace List (log 04h).
#[derive(Debug, Clone, Default)]
pub(crate) struct ChangedNs {
    ids: BTreeSet<u32>,
    overflow: bool,
}

impl ChangedNs {
    /// The list holds 1024 IDs; past that the log says "more than 1024" (NVMe Base 2.0
    /// §5.16.1, Changed Namespace List: the first entry FFFFFFFFh, the rest zero).
    const MAX: usize = 1024;

    pub fn add(&mut self, nsid: u32) {
        if self.overflow || self.ids.contains(&nsid) {
            return;
        }
        if self.ids.len() == Self::MAX {
            self.overflow = true;
            self.ids.clear();
        } else {
            self.ids.insert(nsid);
        }
    }

    pub fn page(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4 * Self::MAX];
        if self.overflow {
            put32(&mut b, 0, u32::MAX);
        } else {
            for (i, &n) in self.ids.iter().enumerate() {
                put32(&mut b, 4 * i, n);
            }
        }
        b
    }

    pub fn clear(&mut self) {
        *self = ChangedNs::default();
    }
}

/// Error Information entries a controller keeps (ELPE + 1).
pub(crate) const ERROR_ENTRIES: usize = 8;
/// Bytes of one Error Information entry.
pub(crate) const ERROR_ENTRY_BYTES: usize = 64;

/// A controller's Error Information log (log 01h, NVMe Base 2.0 Figure 205): the last
/// [`ERROR_ENTRIES`] errors, newest first, each with its 64-bit error count.
#[derive(Debug, Clone, Default)]
pub(crate) struct ErrorLog {
    count: u64,
    entries: VecDeque<ErrorEntry>,
}

#[derive(Debug, Clone, Copy)]
struct ErrorEntry {
    count: u64,
    sqid: u16,
    cid: u16,
    status: Status,
    lba: u64,
    nsid: u32,
}

impl ErrorLog {
    /// Records a failed command. `sqid` FFFFh: not known.
    pub fn record(&mut self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        self.count = self.count.wrapping_add(1).max(1);
        if self.entries.len() == ERROR_ENTRIES {
            self.entries.pop_back();
        }
        self.entries.push_front(ErrorEntry {
            count: self.count,
            sqid,
            cid,
            status,
            lba,
            nsid,
        });
    }

    /// Errors recorded since the controller was created.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn page(&self) -> Vec<u8> {
        let mut b = vec![0u8; ERROR_ENTRIES * ERROR_ENTRY_BYTES];
        for (i, e) in self.entries.iter().enumerate() {
            let o = i * ERROR_ENTRY_BYTES;
            put64(&mut b, o, e.count);
            put16(&mut b, o + 8, e.sqid);
            put16(&mut b, o + 10, e.cid);
            // The status field with the phase tag (bit 0), which fabrics completions leave 0.
            put16(&mut b, o + 12, e.status.field());
            // Parameter Error Location: FFFFh, not recorded.
            put16(&mut b, o + 14, 0xffff);
            put64(&mut b, o + 16, e.lba);
            put32(&mut b, o + 24, e.nsid);
            // Transport Type: TCP.
            b[o + 29] = TRTYPE_TCP;
        }
        b
    }
}

/// TRTYPE of NVMe/TCP (NVMe-oF 1.1 transport types).
pub const TRTYPE_TCP: u8 = 3;

/// Subsystem types of discovery log entries (SUBTYPE).
pub mod subtype {
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The discovery subsystem the host is talking to (a "current discovery subsystem"
    /// entry, as Linux's target lists for each port).
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// TREQ of the target's entries: secure channel not required (bits 1:0 = 10b) and SQ flow
/// control disable supported (bit 2): a host may set CATTR bit 2 in Connect.
pub const TREQ: u8 = 0b110;

/// Bytes of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_BYTES: usize = 1024;

/// Byte offsets within a discovery log entry (NVMe-oF 1.1, Discovery Log Page Entry).
pub mod disc_off {
    /// Transport Type.
    pub const TRTYPE: usize = 0;
    /// Address Family.
    pub const ADRFAM: usize = 1;
    /// Subsystem Type.
    pub const SUBTYPE: usize = 2;
    /// Transport Requirements.
    pub const TREQ: usize = 3;
    /// Port ID.
    pub const PORTID: usize = 4;
    /// Controller ID (FFFFh: dynamic).
    pub const CNTLID: usize = 6;
    /// Admin Max SQ Size.
    pub const ASQSZ: usize = 8;
    /// Transport Service Identifier, 32 bytes.
    pub const TRSVCID: usize = 32;
    /// NVM Subsystem Qualified Name, 256 bytes.
    pub const SUBNQN: usize = 256;
    /// Transport Address, 256 bytes.
    pub const TRADDR: usize = 512;
    /// Transport Specific Address Subtype (TCP: SECTYPE in byte 0, 0 = none).
    pub const TSAS: usize = 768;
}

/// One discovery log entry.
#[derive(Debug, Clone)]
pub(crate) struct DiscoveryEntry<'a> {
    pub subtype: u8,
    pub listener: &'a Listener,
    /// The address to report for a wildcard listener.
    pub local_addr: Option<&'a str>,
    pub subnqn: &'a str,
}

/// The Discovery log page: a 1024-byte header (GENCTR, NUMREC, RECFMT 0) and one 1024-byte
/// record per entry.
pub(crate) fn discovery(genctr: u64, entries: &[DiscoveryEntry<'_>]) -> Vec<u8> {
    use disc_off as o;
    let mut b = vec![0u8; DISCOVERY_RECORD_BYTES * (1 + entries.len())];
    put64(&mut b, 0, genctr);
    put64(&mut b, 8, entries.len() as u64);
    put16(&mut b, 16, 0);
    for (i, e) in entries.iter().enumerate() {
        let r = &mut b[DISCOVERY_RECORD_BYTES * (i + 1)..DISCOVERY_RECORD_BYTES * (i + 2)];
        r[o::TRTYPE] = TRTYPE_TCP;
        r[o::ADRFAM] = match e.listener.adrfam {
            AdrFam::Ipv4 => 1,
            AdrFam::Ipv6 => 2,
        };
        r[o::SUBTYPE] = e.subtype;
        r[o::TREQ] = TREQ;
        put16(r, o::PORTID, e.listener.portid);
        put16(r, o::CNTLID, 0xffff);
        put16(r, o::ASQSZ, super::types::ADMIN_QUEUE_ENTRIES as u16);
        put_str(r, o::TRSVCID, 32, &e.listener.trsvcid);
        put_str(r, o::SUBNQN, 256, e.subnqn);
        let traddr = match e.local_addr {
            Some(a) if e.listener.is_wildcard() => a,
            _ => &e.listener.traddr,
        };
        put_str(r, o::TRADDR, 256, traddr);
        r[o::TSAS] = 0;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfpoll_nvme_spec::identify::{ErrorLogEntry, SmartLog};

    #[test]
    fn smart_page_parses_back() {
        let h = Health {
            critical_warning: 0b100,
            temperature_k: 310,
            available_spare: 100,
            spare_threshold: 10,
            percent_used: 3,
            data_units_read: Health::data_units(512_001),
            data_units_written: 7,
            host_reads: 1000,
            host_writes: 2000,
            power_on_hours: 42,
            media_errors: 1,
            ..Health::default()
        };
        assert_eq!(h.data_units_read, 2, "rounded up");
        let s = SmartLog::parse(&smart(&h, 5));
        assert_eq!(
            (
                s.critical_warning,
                s.temperature_k,
                s.available_spare,
                s.percent_used
            ),
            (0b100, 310, 100, 3)
        );
        assert_eq!((s.data_units_read, s.data_units_written), (2, 7));
        assert_eq!((s.host_reads, s.host_writes, s.power_on_hours), (1000, 2000, 42));
        assert_eq!((s.media_errors, s.error_log_entries), (1, 5));
        let b = Health {
            critical_warning: 1,
            temperature_k: 330,
            available_spare: 50,
            spare_threshold: 60,
            host_reads: 5,
            power_on_hours: 10,
            ..Health::default()
        };
        let c = Health::combine([&h, &b]);
        assert_eq!((c.critical_warning, c.temperature_k), (0b101, 330));
        assert_eq!((c.available_spare, c.spare_threshold), (50, 60));
        assert_eq!((c.host_reads, c.power_on_hours), (1005, 42));
    }

    #[test]
    fn error_log_keeps_the_newest_entries_first() {
        let mut l = ErrorLog::default();
        for i in 0..10u16 {
            l.record(1, i, Status::LBA_OUT_OF_RANGE, 1, i as u64 * 8);
        }
        let p = l.page();
        assert_eq!(p.len(), 512);
        let first = ErrorLogEntry::parse(&p[..64]);
        assert_eq!((first.error_count, first.cid, first.lba), (10, 9, 72));
        assert_eq!(first.status, Status::LBA_OUT_OF_RANGE.field());
        assert_eq!(p[29], TRTYPE_TCP);
        let last = ErrorLogEntry::parse(&p[7 * 64..8 * 64]);
        assert_eq!((last.error_count, last.cid), (3, 2));
        assert_eq!(l.count(), 10);
    }

    #[test]
    fn changed_namespace_list_overflows_to_all_ones() {
        let mut c = ChangedNs::default();
        c.add(7);
        c.add(3);
        c.add(7);
        let p = c.page();
        assert_eq!(
            (&p[0..4], &p[4..8], &p[8..12]),
            (&[3, 0, 0, 0][..], &[7, 0, 0, 0][..], &[0; 4][..])
        );
        for n in 1..=1025 {
            c.add(n);
        }
        let p = c.page();
        assert_eq!(&p[0..4], &[0xff; 4]);
        assert!(p[4..].iter().all(|&x| x == 0));
        c.clear();
        assert!(c.page().iter().all(|&x| x == 0));
    }
}
