//! Identify data structures (NVMe Base 2.0 §5.17.2; NVM Command Set 1.0 §4.1.5; Zoned Namespace
//! Command Set 1.1 §4.1.5) and log pages (§5.16.1), built into the controller's scratch buffer
//! and sent through the command's PRPs.

use std::sync::atomic::Ordering::Relaxed;

use crate::ctrl::{Controller, ERROR_LOG_ENTRIES, VERSION};
use crate::events::{AER_LIMIT, CHANGED_LIST_ENTRIES};
use crate::ns::{Namespace, NsState};
use crate::queue::Command;
use crate::Status;
// Identify CNS values (§5.17.2, Figure 273).
use vfpoll_nvme_spec::cmd::cns::{
    ACTIVE_NS_LIST as CNS_ACTIVE_NS_LIST, ACTIVE_NS_LIST_CSI as CNS_CSI_ACTIVE_NS_LIST,
    CONTROLLER as CNS_CONTROLLER, CONTROLLER_CSI as CNS_CSI_CONTROLLER,
    IO_COMMAND_SETS as CNS_IO_COMMAND_SETS, NAMESPACE as CNS_NAMESPACE, NAMESPACE_CSI as CNS_CSI_NAMESPACE,
    NS_DESCRIPTORS as CNS_NS_DESCRIPTORS,
};
use vfpoll_nvme_spec::cmd::log_page;
// Command Set Identifiers (§5.17.2, Figure 274): NVM and Zoned Namespace command sets.
pub(crate) use vfpoll_nvme_spec::zns::{CSI_NVM, CSI_ZONED};
/// Namespace Identification Descriptor types (Figure 279): NGUID, Command Set Identifier.
const NIDT_NGUID: u8 = 0x02;
const NIDT_CSI: u8 = 0x04;
/// Offset of LBAF0 in Identify Namespace, and of LBAFE0 in the zoned Identify Namespace.
const LBAF0: usize = 128;
const LBAFE0: usize = 2816;

/// Writes `v` little-endian at `off`.
fn put(b: &mut [u8], off: usize, v: u64, len: usize) {
    b[off..off + len].copy_from_slice(&v.to_le_bytes()[..len]);
}

/// Writes an ASCII string field, padded with spaces (§1.5: ASCII string fields).
fn put_str(b: &mut [u8], off: usize, len: usize, s: &str) {
    let field = &mut b[off..off + len];
    field.fill(b' ');
    field[..s.len()].copy_from_slice(s.as_bytes());
}

impl Controller {
    /// Identify Controller (§5.17.2.1, Figure 275), built once.
    pub(crate) fn build_identify_controller(&mut self) {
        let cfg = &self.cfg;
        let nn = self.ns.last().map_or(0, |n| n.nsid);
        let b = &mut self.id_ctrl[..];
        b.fill(0);
        put(b, 0, cfg.vid as u64, 2);
        put(b, 2, cfg.ssvid as u64, 2);
        put_str(b, 4, 20, &cfg.serial);
        put_str(b, 24, 40, &cfg.model);
        put_str(b, 64, 8, &cfg.firmware);
        b[72] = 6; // RAB: recommended arbitration burst 64
        b[77] = cfg.mdts;
        put(b, 78, 1, 2); // CNTLID
        put(b, 80, VERSION as u64, 4);
        // RTD3E: the normal-shutdown latency the configuration asks for.
        put(b, 88, cfg.rtd3e_us as u64, 4);
        // OAES: Namespace Attribute Notices (bit 8), raised after a format change.
        put(b, 92, 1 << 8, 4);
        b[111] = 1; // CNTRLTYPE: I/O controller
                    // OACS: Format NVM (bit 1), Doorbell Buffer Config (bit 8).
        put(b, 256, 1 << 1 | (cfg.doorbell_buffer_config as u64) << 8, 2);
        b[258] = 3; // ACL: 4 concurrent Aborts (0's based)
        b[259] = (AER_LIMIT - 1) as u8; // AERL (0's based)
        b[260] = 0x03; // FRMW: one slot, slot 1 read only
        b[261] = 0; // LPA: SMART log for the controller as a whole only
        b[262] = (ERROR_LOG_ENTRIES - 1) as u8; // ELPE (0's based)
        b[263] = 0; // NPSS: one power state
        put(b, 266, 0x0157, 2); // WCTEMP 343 K
        put(b, 268, 0x0175, 2); // CCTEMP 373 K
        b[512] = 0x66; // SQES: 64-byte entries, required and maximum
        b[513] = 0x44; // CQES: 16-byte entries
        put(b, 516, nn as u64, 4);
        // ONCS: Compare (bit 0), Dataset Management (bit 2), Write Zeroes (bit 3).
        put(b, 520, 0b1101, 2);
        // VWC: present (bit 0); Flush with NSID FFFFFFFFh supported (bits 2:1 = 11b).
        b[525] = if cfg.volatile_write_cache { 0x7 } else { 0 };
        b[530] = 1; // NVSCC: NVM Express disk format
                    // SGLS: supported without alignment rules (bits 1:0 = 01b), Bit Bucket (bit 16), MPTR
                    // holding an SGL descriptor (bit 19, PSDT 10b).
        put(b, 536, if cfg.sgl { 1 | 1 << 16 | 1 << 19 } else { 0 }, 4);
        let nqn = format!("nqn.2026-01.invalid.vfpoll:nvme-model:{}", cfg.serial);
        b[768..768 + nqn.len()].copy_from_slice(nqn.as_bytes());
        put(b, 2048, 2500, 2); // PSD0 MP: 25 W (0.01 W units)
    }

    /// Identify (§5.17): CNS 00h namespace (NVM Command Set), 01h controller, 02h active
    /// namespace list, 03h namespace identification descriptors, 05h I/O command set specific
    /// namespace, 06h I/O command set specific controller, 07h active namespaces of a command
    /// set (CSI in CDW11 bits 31:24), 1Ch I/O command set combinations; other CNS values are
    /// Invalid Field. As QEMU 7.2, these answer whatever CC.CSS selected.
    pub(crate) fn identify(&mut self, cmd: &Command) -> Status {
        let nsid = cmd.nsid();
        let csi = (cmd.cdw(11) >> 24) as u8;
        let nn = self.nn();
        let index = self.ns_index(nsid);
        let buf = &mut self.buf[..4096];
        buf.fill(0);
        // A namespace structure: the namespace's, zeroes for an inactive NSID in range
        // (§5.17.2.1), or Invalid Namespace.
        let ns_or_inactive = |index: Option<usize>| match index {
            Some(i) => Ok(Some(i)),
            None if nsid != 0 && nsid <= nn => Ok(None),
            None => Err(Status::INVALID_NAMESPACE),
        };
        match cmd.cdw(10) & 0xff {
            CNS_CONTROLLER => buf.copy_from_slice(&self.id_ctrl[..]),
            CNS_NAMESPACE => match ns_or_inactive(index) {
                Ok(Some(i)) => identify_namespace(&self.ns[i], &self.ns[i].lock(), buf),
                Ok(None) => {}
                Err(s) => return s,
            },
            CNS_CSI_NAMESPACE => match ns_or_inactive(index) {
                Ok(Some(i)) => {
                    let ns = &self.ns[i];
                    match (csi, ns.cfg.zoned) {
                        // NVM: LBSTM, PIC and ELBAF are all zero (no storage tags, 16-bit guard).
                        (CSI_NVM, _) => {}
                        (CSI_ZONED, Some(_)) => identify_zoned_namespace(ns, buf),
                        _ => return Status::INVALID_FIELD,
                    }
                }
                Ok(None) => {}
                Err(s) => return s,
            },
            CNS_CSI_CONTROLLER => match csi {
                CSI_NVM => {}
                CSI_ZONED => buf[0] = self.cfg.zasl,
                _ => return Status::INVALID_FIELD,
            },
            CNS_ACTIVE_NS_LIST | CNS_CSI_ACTIVE_NS_LIST => {
                let by_csi = cmd.cdw(10) & 0xff == CNS_CSI_ACTIVE_NS_LIST;
                if by_csi && csi != CSI_NVM && csi != CSI_ZONED {
                    return Status::INVALID_FIELD;
                }
                if nsid >= 0xffff_fffe {
                    return Status::INVALID_NAMESPACE;
                }
                let listed = self
                    .ns
                    .iter()
                    .filter(|n| n.nsid > nsid && (!by_csi || ns_csi(n) == csi));
                for (i, ns) in listed.take(1024).enumerate() {
                    put(buf, 4 * i, ns.nsid as u64, 4);
                }
            }
            CNS_NS_DESCRIPTORS => {
                let Some(i) = index else {
                    return Status::INVALID_NAMESPACE;
                };
                // NGUID (16 bytes), then Command Set Identifier (1 byte).
                buf[0..2].copy_from_slice(&[NIDT_NGUID, 16]);
                buf[4..20].copy_from_slice(&nguid(nsid));
                buf[20..22].copy_from_slice(&[NIDT_CSI, 1]);
                buf[24] = ns_csi(&self.ns[i]);
            }
            // One combination (vector 0): the NVM and Zoned Namespace command sets (QEMU's).
            CNS_IO_COMMAND_SETS => buf[0] = 1 << CSI_NVM | 1 << CSI_ZONED,
            _ => return Status::INVALID_FIELD,
        }
        self.send(cmd, 4096)
    }

    /// Get Log Page (§5.16): CDW10 LID and NUMDL, CDW11 NUMDU, CDW12/13 the byte offset
    /// (dword aligned). Reading past the end of a log returns zeroes; an offset past it is
    /// Invalid Field.
    pub(crate) fn get_log_page(&mut self, cmd: &Command) -> Status {
        let lid = cmd.cdw(10) as u8;
        let numd = ((cmd.cdw(10) >> 16) | (cmd.cdw(11) & 0xffff) << 16) as usize + 1;
        let len = numd * 4;
        let offset = cmd.cdw(12) as u64 | (cmd.cdw(13) as u64) << 32;
        let log_len = match lid {
            log_page::ERROR => 64 * ERROR_LOG_ENTRIES,
            log_page::SMART | log_page::FIRMWARE_SLOT => 512,
            log_page::CHANGED_NS_LIST => 4 * CHANGED_LIST_ENTRIES,
            _ => return Status::INVALID_LOG_PAGE,
        };
        if !offset.is_multiple_of(4) || offset >= log_len as u64 || len > self.buf.len() {
            return Status::INVALID_FIELD;
        }
        if lid == log_page::SMART && !matches!(cmd.nsid(), 0 | u32::MAX) {
            // LPA bit 0 clear: no per-namespace SMART data.
            return Status::INVALID_FIELD;
        }
        let end = len.max(log_len);
        self.buf[..end].fill(0);
        match lid {
            log_page::ERROR => self.error_log(),
            log_page::SMART => self.smart_log(),
            log_page::CHANGED_NS_LIST => {
                // RAE, Retain Asynchronous Event: CDW10 bit 15.
                let rae = cmd.cdw(10) & 1 << 15 != 0;
                self.events.take_changed_list(rae, &mut self.buf[..log_len]);
            }
            _ => {
                self.buf[0] = 1; // AFI: slot 1 active
                put_str(&mut self.buf, 8, 8, &self.cfg.firmware);
            }
        }
        let offset = offset as usize;
        self.buf.copy_within(offset..log_len, 0);
        self.buf[log_len - offset..end].fill(0);
        self.send(cmd, len)
    }

    /// Error Information entries, newest first (§5.16.1.2, Figure 206).
    fn error_log(&mut self) {
        let newest = self.error_count;
        let kept = newest.min(ERROR_LOG_ENTRIES as u64);
        for i in 0..kept {
            let e = self.errors[((newest - 1 - i) % ERROR_LOG_ENTRIES as u64) as usize];
            let b = &mut self.buf[64 * i as usize..64 * (i as usize + 1)];
            put(b, 0, e.count, 8);
            put(b, 8, e.sqid as u64, 2);
            put(b, 10, e.cid as u64, 2);
            put(b, 12, (e.status.field() as u64) << 1, 2); // bits 15:1 status, bit 0 phase
            put(b, 14, 0xffff, 2); // Parameter Error Location: not reported
            put(b, 16, e.lba, 8);
            put(b, 24, e.nsid as u64, 4);
        }
    }

    /// SMART / Health Information (§5.16.1.3, Figure 207), for the controller as a whole.
    fn smart_log(&mut self) {
        let st = &self.shared.stats;
        let b = &mut self.buf[..512];
        put(b, 1, 0x0141, 2); // Composite Temperature: 321 K
        b[3] = 100; // Available Spare
        b[4] = 10; // Available Spare Threshold
                   // Data Units Read/Written: thousands of 512-byte units, rounded up.
        put(b, 32, st.bytes_read.load(Relaxed).div_ceil(512_000), 8);
        put(b, 48, st.bytes_written.load(Relaxed).div_ceil(512_000), 8);
        put(b, 64, st.host_reads.load(Relaxed), 8);
        put(b, 80, st.host_writes.load(Relaxed), 8);
        put(b, 112, 1, 8); // Power Cycles
        put(b, 176, self.error_count, 8); // Number of Error Information Log Entries
    }
}

/// The command set of a namespace: Zoned Namespace if configured zoned, else NVM.
fn ns_csi(ns: &Namespace) -> u8 {
    match ns.cfg.zoned {
        Some(_) => CSI_ZONED,
        None => CSI_NVM,
    }
}

/// Identify Namespace for the NVM Command Set (NVM Command Set 1.0 §4.1.5.1, Figure 97), from
/// the format in force.
fn identify_namespace(ns: &Namespace, st: &NsState, buf: &mut [u8]) {
    let cfg = &ns.cfg;
    put(buf, 0, st.blocks, 8); // NSZE
    put(buf, 8, st.blocks, 8); // NCAP
    put(buf, 16, st.blocks, 8); // NUSE
    buf[25] = (ns.formats.len() - 1) as u8; // NLBAF (0's based)
    buf[26] = st.geo.format.flbas(); // FLBAS: index (bits 3:0, 6:5), MSET (bit 4)
    buf[27] = cfg.metadata_caps.mc(); // MC
    buf[28] = cfg.pi_caps.dpc(); // DPC
    buf[29] = st.geo.protection().map_or(0, |p| p.dps()); // DPS
                                                          // DLFEAT: deallocated blocks read as zeroes; Write Zeroes may deallocate.
    buf[33] = 0x09;
    buf[104..120].copy_from_slice(&nguid(ns.nsid));
    for (i, f) in ns.formats.iter().enumerate() {
        // LBAF: MS (bits 15:0), LBADS (23:16), RP 0.
        let lbads = f.data_size.trailing_zeros() as u64;
        put(buf, LBAF0 + 4 * i, f.metadata_size as u64 | lbads << 16, 4);
    }
}

/// Identify Namespace for the Zoned Namespace Command Set (ZNS 1.1 §4.1.5.1, Figure 44): ZOC 0,
/// OZCS (RAZB), MAR, MOR (0's based, all ones for no limit), and each LBA format's zone size.
fn identify_zoned_namespace(ns: &Namespace, buf: &mut [u8]) {
    let z = ns.cfg.zoned.expect("a zoned namespace");
    put(buf, 2, z.cross_zone_read as u64, 2); // OZCS bit 0: Read Across Zone Boundaries
    put(buf, 4, z.max_active.wrapping_sub(1) as u64, 4); // MAR
    put(buf, 8, z.max_open.wrapping_sub(1) as u64, 4); // MOR
    for i in 0..ns.formats.len() {
        put(buf, LBAFE0 + 16 * i, z.zone_size, 8); // ZSZE; ZDES 0: no descriptor extensions
    }
}

/// A namespace's NGUID: fixed bytes and the NSID, so it is stable and unique per model.
fn nguid(nsid: u32) -> [u8; 16] {
    let mut g = *b"vfpollmodel\0\0\0\0\0";
    g[12..].copy_from_slice(&nsid.to_be_bytes());
    g
}
