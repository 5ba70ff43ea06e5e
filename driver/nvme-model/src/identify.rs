//! Identify data structures (NVMe Base 2.0 §5.17.2; NVM Command Set 1.0 §4.1.5) and log pages
//! (§5.16.1), built into the controller's scratch buffer and sent through the command's PRPs.

use std::sync::atomic::Ordering::Relaxed;

use crate::admin::log_page;
use crate::ctrl::{Controller, AER_LIMIT, ERROR_LOG_ENTRIES, VERSION};
use crate::queue::Command;
use crate::Status;

/// Identify CNS values (§5.17.2, Figure 273).
const CNS_NAMESPACE: u32 = 0x00;
const CNS_CONTROLLER: u32 = 0x01;
const CNS_ACTIVE_NS_LIST: u32 = 0x02;
const CNS_NS_DESCRIPTORS: u32 = 0x03;

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
                    // SGLS: supported without alignment rules (bits 1:0 = 01b), Bit Bucket (bit 16).
        put(b, 536, if cfg.sgl { 1 | 1 << 16 } else { 0 }, 4);
        let nqn = format!("nqn.2026-01.invalid.vfpoll:nvme-model:{}", cfg.serial);
        b[768..768 + nqn.len()].copy_from_slice(nqn.as_bytes());
        put(b, 2048, 2500, 2); // PSD0 MP: 25 W (0.01 W units)
    }

    /// Identify (§5.17): CNS 00h namespace, 01h controller, 02h active namespace list,
    /// 03h namespace identification descriptors; other CNS values are Invalid Field.
    pub(crate) fn identify(&mut self, cmd: &Command) -> Status {
        let nsid = cmd.nsid();
        let nn = self.nn();
        let index = self.ns_index(nsid);
        let buf = &mut self.buf[..4096];
        buf.fill(0);
        match cmd.cdw(10) & 0xff {
            CNS_CONTROLLER => buf.copy_from_slice(&self.id_ctrl[..]),
            CNS_NAMESPACE => match index {
                Some(i) => {
                    let ns = &self.ns[i];
                    put(buf, 0, ns.blocks, 8); // NSZE
                    put(buf, 8, ns.blocks, 8); // NCAP
                    put(buf, 16, ns.blocks, 8); // NUSE
                    buf[25] = 0; // NLBAF: one format (0's based)
                    buf[26] = 0; // FLBAS: format 0, no metadata
                                 // DLFEAT: deallocated blocks read as zeroes; Write Zeroes may deallocate.
                    buf[33] = 0x09;
                    buf[104..120].copy_from_slice(&nguid(nsid));
                    put(buf, 128, (ns.lba_shift as u64) << 16, 4); // LBAF0: MS 0, LBADS
                }
                // An inactive NSID in range: a zeroed structure (§5.17.2.1).
                None if nsid != 0 && nsid <= nn => {}
                None => return Status::INVALID_NAMESPACE,
            },
            CNS_ACTIVE_NS_LIST => {
                if nsid >= 0xffff_fffe {
                    return Status::INVALID_NAMESPACE;
                }
                for (i, ns) in self.ns.iter().filter(|n| n.nsid > nsid).take(1024).enumerate() {
                    put(buf, 4 * i, ns.nsid as u64, 4);
                }
            }
            CNS_NS_DESCRIPTORS => {
                if index.is_none() {
                    return Status::INVALID_NAMESPACE;
                }
                // NGUID (NIDT 2, 16 bytes), then Command Set Identifier (NIDT 4): NVM.
                buf[0..2].copy_from_slice(&[0x02, 16]);
                buf[4..20].copy_from_slice(&nguid(nsid));
                buf[20..22].copy_from_slice(&[0x04, 1]);
            }
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
            log_page::ERROR_INFORMATION => 64 * ERROR_LOG_ENTRIES,
            log_page::SMART | log_page::FIRMWARE_SLOT => 512,
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
            log_page::ERROR_INFORMATION => self.error_log(),
            log_page::SMART => self.smart_log(),
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

/// A namespace's NGUID: fixed bytes and the NSID, so it is stable and unique per model.
fn nguid(nsid: u32) -> [u8; 16] {
    let mut g = *b"vfpollmodel\0\0\0\0\0";
    g[12..].copy_from_slice(&nsid.to_be_bytes());
    g
}
