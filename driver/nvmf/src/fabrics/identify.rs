//! Identify data the target returns (NVMe Base 2.0 §5.17.2; the reverse of what
//! `vfpoll_nvme_spec::identify` parses): the controller, a namespace, the active namespace list,
//! namespace identification descriptors and the command-set independent namespace structure.

use super::ana::{AnaState, ANAGRPMAX, ANATT_SECONDS};
use super::bytes::{put128, put16, put32, put64, put_ascii, put_str};
use super::config::NamespaceInfo;

/// Bytes of every Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;

/// Byte offsets of the Identify Controller fields the target fills (NVMe Base 2.0 Figure 275;
/// the fabrics fields from NVMe-oF 1.1, "Identify Controller fields").
pub mod ctrl_off {
    /// Serial Number, 20 ASCII bytes.
    pub const SN: usize = 4;
    /// Model Number, 40 ASCII bytes.
    pub const MN: usize = 24;
    /// Firmware Revision, 8 ASCII bytes.
    pub const FR: usize = 64;
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub const CMIC: usize = 76;
    /// Maximum Data Transfer Size (log2 of CAP.MPSMIN units).
    pub const MDTS: usize = 77;
    /// Controller ID.
    pub const CNTLID: usize = 78;
    /// Version.
    pub const VER: usize = 80;
    /// Optional Asynchronous Events Supported.
    pub const OAES: usize = 92;
    /// Controller Attributes.
    pub const CTRATT: usize = 96;
    /// Controller Type.
    pub const CNTRLTYPE: usize = 111;
    /// Optional Admin Command Support.
    pub const OACS: usize = 256;
    /// Abort Command Limit (0's based).
    pub const ACL: usize = 258;
    /// Asynchronous Event Request Limit (0's based).
    pub const AERL: usize = 259;
    /// Firmware Updates.
    pub const FRMW: usize = 260;
    /// Log Page Attributes.
    pub const LPA: usize = 261;
    /// Error Log Page Entries (0's based).
    pub const ELPE: usize = 262;
    /// Keep Alive Support (100 ms units).
    pub const KAS: usize = 320;
    /// ANA Transition Time (seconds).
    pub const ANATT: usize = 342;
    /// Asymmetric Namespace Access Capabilities.
    pub const ANACAP: usize = 343;
    /// ANA Group Identifier Maximum.
    pub const ANAGRPMAX: usize = 344;
    /// Number of ANA Group Identifiers.
    pub const NANAGRPID: usize = 348;
    /// Submission Queue Entry Size.
    pub const SQES: usize = 512;
    /// Completion Queue Entry Size.
    pub const CQES: usize = 513;
    /// Maximum Outstanding Commands.
    pub const MAXCMD: usize = 514;
    /// Number of Namespaces.
    pub const NN: usize = 516;
    /// Optional NVM Command Support.
    pub const ONCS: usize = 520;
    /// Volatile Write Cache.
    pub const VWC: usize = 525;
    /// SGL Support.
    pub const SGLS: usize = 536;
    /// Maximum Number of Allowed Namespaces.
    pub const MNAN: usize = 540;
    /// NVM Subsystem NVMe Qualified Name, 256 bytes.
    pub const SUBNQN: usize = 768;
    /// I/O Queue Command Capsule Supported Size (16-byte units).
    pub const IOCCSZ: usize = 1792;
    /// I/O Queue Response Capsule Supported Size (16-byte units).
    pub const IORCSZ: usize = 1796;
    /// In Capsule Data Offset (16-byte units).
    pub const ICDOFF: usize = 1800;
    /// Fabrics Controller Attributes.
    pub const FCATT: usize = 1802;
    /// Maximum SGL Data Block Descriptors.
    pub const MSDBD: usize = 1803;
}

/// Identify Controller values that do not come from configuration.
pub mod ctrl_val {
    /// VER and the VS property: NVMe 2.0.0 (NVMe Base 2.0 §3.1.3.2).
    pub const VERSION: u32 = 0x0002_0000;
    /// CMIC of an I/O controller: the subsystem may have several ports (bit 0) and several
    /// controllers (bit 1), and the controller reports ANA (bit 3, NVMe Base 2.0 §8.1.3).
    /// Linux refuses a second controller of a subsystem without bit 1, and with bit 3 reads
    /// the ANA log page and requires MNAN of 1 to NN.
    pub const CMIC: u8 = 0b1011;
    /// OAES bit 8: Namespace Attribute Notices.
    pub const OAES_NS_ATTR: u32 = 1 << 8;
    /// OAES bit 11: Asymmetric Namespace Access Change Notices (and AEC bit 11 enables them).
    pub const OAES_ANA: u32 = 1 << 11;
    /// OAES bit 31: Discovery Log Page Change Notification (discovery controllers).
    pub const OAES_DISCOVERY: u32 = 1 << 31;
    /// CTRATT: 128-bit host identifiers (bit 0, required of fabrics controllers) and
    /// Traffic Based Keep Alive (bit 6: any command restarts the Keep Alive Timer, so Linux
    /// skips Keep Alive commands while I/O flows).
    pub const CTRATT: u32 = 1 | 1 << 6;
    /// CNTRLTYPE of an I/O controller.
    pub const CNTRLTYPE_IO: u8 = 1;
    /// CNTRLTYPE of a discovery controller.
    pub const CNTRLTYPE_DISCOVERY: u8 = 2;
    /// ACL: 4 outstanding Abort commands (0's based).
    pub const ACL: u8 = 3;
    /// AERL: 4 outstanding Asynchronous Event Requests (0's based).
    pub const AERL: u8 = 3;
    /// FRMW: one firmware slot (bits 3:1), read-only (bit 0).
    pub const FRMW: u8 = 0b011;
    /// LPA: SMART / Health per namespace (bit 0), extended data for Get Log Page (bit 2:
    /// NUMDU and 64-bit offsets).
    pub const LPA: u8 = 0b101;
    /// ELPE: 8 Error Information log entries (0's based).
    pub const ELPE: u8 = 7;
    /// KAS: the Keep Alive Timer's granularity, 1 s in 100 ms units. Linux refuses a fabrics
    /// I/O controller reporting 0.
    pub const KAS: u16 = 10;
    /// SQES: 64-byte entries, required and maximum.
    pub const SQES: u8 = 0x66;
    /// CQES: 16-byte entries, required and maximum.
    pub const CQES: u8 = 0x44;
    /// SGLS: SGLs supported without alignment rules (bits 1:0 = 01b), the SGL Data Block
    /// address usable as an offset (bit 20, for in-capsule data) and the Transport SGL Data
    /// Block (bit 21, NVMe/TCP's R2T/C2H data). Keyed SGL Data Blocks (bit 2) are RDMA's and
    /// not reported: an NVMe/TCP target cannot take them.
    pub const SGLS: u32 = 1 | 1 << 20 | 1 << 21;
    /// VWC bits 2:1 = 10b: a Flush of all namespaces (NSID FFFFFFFFh) is not supported.
    pub const VWC_NO_BROADCAST_FLUSH: u8 = 0b100;
    /// MSDBD: one SGL data block descriptor per command, as NVMe/TCP carries.
    pub const MSDBD: u8 = 1;
    /// ANATT: how long a group may stay in the ANA Change state, in seconds.
    pub const ANATT: u8 = super::ANATT_SECONDS;
    /// ANACAP: the states reported, bits 0 to 4 (Optimized, Non-Optimized, Inaccessible,
    /// Persistent Loss, Change). Bit 6 is clear: a namespace's ANAGRPID may change while it is
    /// attached (`Target::update_namespace`). Bit 7 is clear: there is no Namespace Management
    /// to give an ANAGRPID to.
    pub const ANACAP: u8 = 0b1_1111;
    /// ANAGRPMAX and NANAGRPID: group IDs 1 to 128, every one usable.
    pub const ANAGRPMAX: u32 = super::ANAGRPMAX;
}

/// What Identify Controller reports for one controller.
#[derive(Debug, Clone)]
pub(crate) struct ControllerPage<'a> {
    pub cntlid: u16,
    pub discovery: bool,
    pub subnqn: &'a str,
    pub serial: &'a str,
    pub model: &'a str,
    pub firmware: &'a str,
    pub mdts: u8,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub vwc_present: bool,
    pub ioccsz: u32,
    /// MNAN (`ana::mnan`).
    pub mnan: u32,
}

/// Identify Controller (CNS 01h).
pub(crate) fn controller(p: &ControllerPage<'_>) -> Vec<u8> {
    use ctrl_off as o;
    use ctrl_val as v;
    let mut b = vec![0u8; IDENTIFY_BYTES];
    // VID and SSVID stay 0: a fabrics controller has no PCI identity.
    put_ascii(&mut b, o::SN, 20, p.serial);
    put_ascii(&mut b, o::MN, 40, p.model);
    put_ascii(&mut b, o::FR, 8, p.firmware);
    // A discovery controller has no namespaces and no ANA (with CMIC bit 3 Linux would check
    // MNAN against its NN of 0 and refuse it).
    b[o::CMIC] = if p.discovery { 0 } else { v::CMIC };
    b[o::MDTS] = p.mdts;
    put16(&mut b, o::CNTLID, p.cntlid);
    put32(&mut b, o::VER, v::VERSION);
    let oaes = if p.discovery {
        v::OAES_DISCOVERY
    } else {
        v::OAES_NS_ATTR | v::OAES_ANA
    };
    put32(&mut b, o::OAES, oaes);
    put32(&mut b, o::CTRATT, v::CTRATT);
    b[o::CNTRLTYPE] = if p.discovery {
        v::CNTRLTYPE_DISCOVERY
    } else {
        v::CNTRLTYPE_IO
    };
    // OACS 0: no optional admin commands (no Format NVM, namespace management, directives).
    b[o::ACL] = v::ACL;
    b[o::AERL] = v::AERL;
    if !p.discovery {
        b[o::FRMW] = v::FRMW;
        b[o::ELPE] = v::ELPE;
    }
    b[o::LPA] = v::LPA;
    put16(&mut b, o::KAS, v::KAS);
    if !p.discovery {
        b[o::ANATT] = v::ANATT;
        b[o::ANACAP] = v::ANACAP;
        put32(&mut b, o::ANAGRPMAX, v::ANAGRPMAX);
        put32(&mut b, o::NANAGRPID, v::ANAGRPMAX);
        put32(&mut b, o::MNAN, p.mnan);
    }
    b[o::SQES] = v::SQES;
    b[o::CQES] = v::CQES;
    put16(&mut b, o::MAXCMD, p.maxcmd);
    put32(&mut b, o::NN, p.nn);
    put16(&mut b, o::ONCS, p.oncs);
    b[o::VWC] = v::VWC_NO_BROADCAST_FLUSH | p.vwc_present as u8;
    put32(&mut b, o::SGLS, v::SGLS);
    put_str(&mut b, o::SUBNQN, 256, p.subnqn);
    if !p.discovery {
        put32(&mut b, o::IOCCSZ, p.ioccsz);
        put32(&mut b, o::IORCSZ, 1);
    }
    // ICDOFF 0: in-capsule data right after the SQE, as Linux's host requires. FCATT bit 0
    // clear: the dynamic controller model (Connect with CNTLID FFFFh).
    put16(&mut b, o::ICDOFF, 0);
    b[o::FCATT] = 0;
    b[o::MSDBD] = v::MSDBD;
    b
}

/// Byte offsets of the Identify Namespace fields the target fills (NVM Command Set 1.0
/// Figure 97).
pub mod ns_off {
    /// Namespace Size.
    pub const NSZE: usize = 0;
    /// Namespace Capacity.
    pub const NCAP: usize = 8;
    /// Namespace Utilization.
    pub const NUSE: usize = 16;
    /// Namespace Features.
    pub const NSFEAT: usize = 24;
    /// Number of LBA Formats (0's based).
    pub const NLBAF: usize = 25;
    /// Formatted LBA Size.
    pub const FLBAS: usize = 26;
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub const NMIC: usize = 30;
    /// Reservation Capabilities.
    pub const RESCAP: usize = 31;
    /// NVM Capacity (bytes, 128 bits).
    pub const NVMCAP: usize = 48;
    /// ANA Group Identifier.
    pub const ANAGRPID: usize = 92;
    /// Namespace Globally Unique Identifier.
    pub const NGUID: usize = 104;
    /// IEEE Extended Unique Identifier.
    pub const EUI64: usize = 120;
    /// LBA Format 0.
    pub const LBAF0: usize = 128;
}

/// Identify Namespace (CNS 00h): one LBA format, the namespace's, without metadata; shared
/// (NMIC bit 0: every controller of the subsystem sees it, and Linux needs the bit to put two
/// controllers' paths under one namespace); its ANA group. `ana` is the group's state as the
/// asking controller sees it: NUSE is 0 in the Inaccessible and Persistent Loss states (NVM
/// Command Set 1.0, Identify Namespace NUSE; Linux's target does the same).
pub(crate) fn namespace(ns: &NamespaceInfo, ana: AnaState) -> Vec<u8> {
    use ns_off as o;
    let mut b = vec![0u8; IDENTIFY_BYTES];
    put64(&mut b, o::NSZE, ns.blocks);
    put64(&mut b, o::NCAP, ns.blocks);
    let in_use = if matches!(ana, AnaState::Inaccessible | AnaState::PersistentLoss) {
        0
    } else {
        ns.blocks
    };
    put64(&mut b, o::NUSE, in_use);
    b[o::NSFEAT] = 0;
    b[o::NLBAF] = 0;
    b[o::FLBAS] = 0;
    b[o::NMIC] = 1;
    put128(&mut b, o::NVMCAP, ns.blocks as u128 * ns.block_size as u128);
    put32(&mut b, o::ANAGRPID, ns.ana_group);
    b[o::NGUID..o::NGUID + 16].copy_from_slice(&ns.nguid);
    b[o::EUI64..o::EUI64 + 8].copy_from_slice(&ns.eui64);
    // LBAF: MS 0 (bits 15:0), LBADS (bits 23:16), RP 0.
    put32(&mut b, o::LBAF0, (ns.block_shift() as u32) << 16);
    b
}

/// Active Namespace ID list (CNS 02h): the active IDs greater than `after`, ascending, at
/// most 1024.
pub(crate) fn ns_list(active: impl Iterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    for (i, nsid) in active.filter(|&n| n > after).take(IDENTIFY_BYTES / 4).enumerate() {
        put32(&mut b, 4 * i, nsid);
    }
    b
}

/// Namespace Identification Descriptor types (NVMe Base 2.0 Figure 278).
pub mod nidt {
    /// IEEE EUI-64, 8 bytes.
    pub const EUI64: u8 = 1;
    /// NGUID, 16 bytes.
    pub const NGUID: u8 = 2;
    /// UUID, 16 bytes.
    pub const UUID: u8 = 3;
    /// Command Set Identifier, 1 byte.
    pub const CSI: u8 = 4;
}

/// Namespace Identification Descriptor list (CNS 03h): EUI-64, NGUID, UUID and the NVM
/// command set's CSI (0), each with its 4-byte header (NIDT, NIDL, 2 reserved).
pub(crate) fn ns_descriptors(ns: &NamespaceInfo) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    let mut at = 0;
    let csi = [0u8];
    for (t, v) in [
        (nidt::EUI64, &ns.eui64[..]),
        (nidt::NGUID, &ns.nguid[..]),
        (nidt::UUID, &ns.uuid[..]),
        (nidt::CSI, &csi[..]),
    ] {
        if v.iter().all(|&x| x == 0) && t != nidt::CSI {
            continue;
        }
        b[at] = t;
        b[at + 1] = v.len() as u8;
        b[at + 4..at + 4 + v.len()].copy_from_slice(v);
        at += 4 + v.len();
    }
    b
}

/// Byte offsets of the I/O Command Set Independent Identify Namespace structure (CNS 08h,
/// NVMe Base 2.0 §5.17.2).
pub mod cs_indep_off {
    /// Namespace Features: bit 5 "volatile write cache not present" (added by NVMe Base 2.1;
    /// Linux reads it).
    pub const NSFEAT: usize = 0;
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub const NMIC: usize = 1;
    /// Reservation Capabilities.
    pub const RESCAP: usize = 2;
    /// Namespace Status: bit 0, the namespace is ready.
    pub const NSTAT: usize = 14;
}

/// I/O Command Set Independent Identify Namespace (CNS 08h). Linux asks for it first and
/// ignores a namespace whose NSTAT says not ready.
pub(crate) fn ns_cs_independent(ns: &NamespaceInfo) -> Vec<u8> {
    use cs_indep_off as o;
    let mut b = vec![0u8; IDENTIFY_BYTES];
    b[o::NSFEAT] = if ns.volatile_write_cache { 0 } else { 1 << 5 };
    b[o::NMIC] = 1;
    b[o::NSTAT] = 1;
    b
}
