//! Namespaces: what Identify says of each (format, command set, zoned data), and keeping that
//! true: Format NVM, re-reading the table, and the Namespace Attribute Changed event (NVMe Base
//! 2.0 §5.2, §5.23).

use std::sync::atomic::Ordering;

use crate::admin::DataDir;
use crate::cmd::{cns, log_page, Command};
use crate::ctrlr::Controller;
use crate::error::{NvmeError, Result};
use crate::format::{FormatError, NsFormat};
use crate::identify::{parse_ns_list, IdentifyController, IdentifyNamespace};
use crate::regs::Cap;
use crate::zns;

/// An active namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// Data bytes per logical block.
    pub lba_size: usize,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Metadata bytes per logical block.
    pub metadata_size: u16,
    /// The format in use (metadata placement, protection information), or why the Identify
    /// data describe none (I/O to the namespace is then refused).
    pub format: Result<NsFormat, FormatError>,
    /// The I/O command set (CSI; 0 NVM, 2 zoned). Queue pairs refuse I/O to command sets
    /// vfpoll does not drive.
    pub command_set: u8,
    /// The zoned command set's data, for a zoned namespace (command set 2 with a zone size).
    pub zoned: Option<zns::ZonedInfo>,
    /// The whole Identify Namespace page.
    pub identify: IdentifyNamespace,
}

impl Namespace {
    /// A namespace from its Identify page, the extended LBA format of its LBA format (if known:
    /// PI format and storage tag size, see [`NsFormat::parse_elbaf`]) and its command set.
    pub fn new(nsid: u32, identify: IdentifyNamespace, elbaf: Option<u32>, command_set: u8) -> Self {
        let f = identify.lba_format();
        Namespace {
            nsid,
            lba_size: f.data_size(),
            blocks: identify.nsze,
            metadata_size: f.ms,
            format: NsFormat::parse_elbaf(&identify, elbaf),
            command_set,
            zoned: None,
            identify,
        }
    }

    /// Capacity in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks * self.lba_size as u64
    }
}

impl Controller {
    /// Format NVM: erases every block of `nsid` and selects LBA format `lbaf`, keeping no
    /// metadata settings (metadata, if the format has any, in a separate buffer, no PI).
    /// Destroys data, so it runs only with `confirm` set. See [`Controller::format_with`].
    pub fn format(&self, nsid: u32, lbaf: u8, confirm: bool) -> Result<()> {
        self.format_with(
            nsid,
            FormatOptions {
                lbaf,
                ..Default::default()
            },
            confirm,
        )
    }

    /// Format NVM with metadata placement and protection information (NVMe Base 2.0 §5.23):
    /// erases every block of `nsid` and selects `opts`'s format. Destroys data, so it runs only
    /// with `confirm` set.
    ///
    /// I/O racing a format could move data sized for the old format into buffers sized for
    /// the new one, so a format runs only while the controller has no I/O queue pair, and no
    /// queue pair can be created until it is done. Afterwards the namespace's new geometry is
    /// read, and queue pairs created from then on use it.
    pub fn format_with(&self, nsid: u32, opts: FormatOptions, confirm: bool) -> Result<()> {
        if !confirm {
            return Err(NvmeError::Unconfirmed("Format NVM"));
        }
        let ns = self.namespace(nsid)?;
        if opts.lbaf as usize >= ns.identify.lba_formats.len() {
            return Err(NvmeError::InvalidOption(format!(
                "namespace {nsid} has LBA formats 0..{}; there is no format {} (`vfpoll identify` lists them)",
                ns.identify.lba_formats.len(),
                opts.lbaf
            )));
        }
        let sh = &self.shared;
        {
            let q = sh.qids.lock().unwrap_or_else(|e| e.into_inner());
            let live = q.iter().skip(1).filter(|&&u| u).count();
            if live != 0 {
                return Err(NvmeError::InvalidOption(format!(
                    "the controller has {live} I/O queue pair(s): drop them before formatting namespace {nsid} (I/O racing a format could move data sized for the old format)"
                )));
            }
            sh.formatting.store(true, Ordering::SeqCst);
        }
        let r = sh.admin_exec("Format NVM", opts.command(nsid), DataDir::None, &[]);
        let refreshed = self.refresh_namespaces();
        sh.formatting.store(false, Ordering::SeqCst);
        r?;
        refreshed
    }

    /// Reads every active namespace again and publishes the new table: queue pairs pick it up
    /// at their next submission.
    pub fn refresh_namespaces(&self) -> Result<()> {
        let sh = &self.shared;
        let list = sh
            .admin_exec(
                "Identify Active Namespaces",
                Command::identify(cns::ACTIVE_NS_LIST, 0),
                DataDir::FromDevice(4096),
                &[],
            )?
            .1;
        let mut exec = |op: &'static str, cmd: Command| -> Result<Vec<u8>> {
            Ok(sh.admin_exec(op, cmd, DataDir::FromDevice(4096), &[])?.1)
        };
        let mut namespaces = Vec::new();
        for nsid in parse_ns_list(&list) {
            if let Some(ns) = read_namespace(&mut exec, nsid, &sh.identify, sh.io_command_sets, sh.zasl)? {
                namespaces.push(ns);
            }
        }
        *sh.namespaces.write().unwrap_or_else(|e| e.into_inner()) = namespaces.into();
        sh.ns_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Handles what the controller reported asynchronously: completed Asynchronous Event
    /// Requests (a Namespace Attribute Changed notice reads the Changed Namespace List and
    /// refreshes the namespace table), re-arming each. Never waits for the admin queue: when
    /// another thread holds it, returns 0 at once. Returns how many events were handled.
    /// Queue pairs call it during their periodic health checks; a program whose queue pairs
    /// are idle can call it from time to time.
    pub fn process_events(&self) -> Result<usize> {
        let sh = &self.shared;
        let events = {
            let Ok(mut guard) = sh.admin.try_lock() else {
                return Ok(0);
            };
            let Some(q) = guard.as_mut() else { return Ok(0) };
            q.poll_events()
        };
        let mut n = 0;
        for e in events {
            n += 1;
            let ty = e.dw0 & 7;
            let info = (e.dw0 >> 8) & 0xff;
            let log = (e.dw0 >> 16) & 0xff;
            log::info!("asynchronous event: type {ty}, info {info:#x}, log page {log:#x}");
            if ty == 2 && info == 0 {
                // Notice: Namespace Attribute Changed. Reading the log clears the event.
                let _ = self.log_page(log_page::CHANGED_NS_LIST, 0xffff_ffff, 4096)?;
                self.refresh_namespaces()?;
            } else if log != 0 {
                // Other events are cleared by reading their log page too (§5.2).
                let _ = self.log_page(log as u8, 0xffff_ffff, 512);
            }
            sh.arm_event()?;
        }
        Ok(n)
    }
}

/// What [`Controller::format_with`] formats a namespace to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FormatOptions {
    /// The LBA format index (0..NLBAF).
    pub lbaf: u8,
    /// Metadata at the end of each block (extended LBA, MSET = 1), else in a separate buffer.
    pub extended: bool,
    /// Protection information type (1, 2 or 3; `None`: no PI).
    pub pi: Option<crate::format::PiType>,
    /// PI in the first bytes of the metadata (PIL = 1), else in the last.
    pub pi_first: bool,
}

impl FormatOptions {
    /// The Format NVM command (CDW10: LBAF bits 3:0 and 13:12, MSET bit 4, PI bits 7:5, PIL
    /// bit 8; no secure erase).
    pub fn command(&self, nsid: u32) -> Command {
        let mut c = Command::format_nvm(nsid, self.lbaf);
        let pi = match self.pi {
            None => 0,
            Some(crate::format::PiType::Type1) => 1,
            Some(crate::format::PiType::Type2) => 2,
            Some(crate::format::PiType::Type3) => 3,
        };
        c.dw[10] |= (self.extended as u32) << 4 | pi << 5 | (self.pi_first as u32) << 8;
        c
    }
}

/// The zoned command set's Zone Append Size Limit in bytes (`None`: MDTS applies, or the
/// controller has no zoned command set).
pub(crate) fn zasl_of(
    exec: &mut dyn FnMut(&'static str, Command) -> Result<Vec<u8>>,
    cap: &Cap,
) -> Result<Option<usize>> {
    match exec(
        "Identify Controller (zoned command set)",
        Command::identify_csi(cns::CONTROLLER_CSI, 0, zns::CSI_ZONED),
    ) {
        Ok(p) => {
            let z = zns::parse_zasl(&p);
            // A limit too large for a usize is no limit (as MDTS).
            Ok((z != 0)
                .then(|| cap.mps_min().checked_shl(z as u32))
                .flatten()
                .filter(|&b| b != 0))
        }
        // No zoned command set: the CSI is refused.
        Err(NvmeError::Status { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads namespace `nsid`: Identify Namespace, its command set (the CSI descriptor of the
/// Namespace Identification Descriptor list, when the controller runs several command sets),
/// the PI format of a PI namespace, the zoned data of a zoned one. `None` for an inactive
/// NSID.
pub(crate) fn read_namespace(
    exec: &mut dyn FnMut(&'static str, Command) -> Result<Vec<u8>>,
    nsid: u32,
    identify: &IdentifyController,
    io_command_sets: bool,
    zasl: Option<usize>,
) -> Result<Option<Namespace>> {
    let Some(id) = IdentifyNamespace::parse(&exec(
        "Identify Namespace",
        Command::identify(cns::NAMESPACE, nsid),
    )?) else {
        return Ok(None);
    };
    let mut csi = zns::CSI_NVM;
    if io_command_sets {
        let p = exec(
            "Identify Namespace Identification Descriptors",
            Command::identify(cns::NS_DESCRIPTORS, nsid),
        )?;
        csi = crate::identify::csi_of_descriptors(&p).unwrap_or(zns::CSI_NVM);
    }
    // The PI format (guard size) and storage tag size of a PI namespace are in the NVM command
    // set's own Identify Namespace page (CNS 05h, CSI 00h), on controllers with extended LBA
    // formats; without them the guard is 16 bits and there is no storage tag.
    let mut elbaf = None;
    if id.dps & 7 != 0 && identify.extended_lba_formats() {
        let p = exec(
            "Identify Namespace (NVM command set)",
            Command::identify_csi(cns::NAMESPACE_CSI, nsid, zns::CSI_NVM),
        )?;
        let at = 12 + 4 * id.format_index as usize;
        elbaf = Some(u32::from_le_bytes(p[at..at + 4].try_into().expect("4 bytes")));
    }
    let mut zoned = None;
    if csi == zns::CSI_ZONED {
        let p = exec(
            "Identify Namespace (zoned command set)",
            Command::identify_csi(cns::NAMESPACE_CSI, nsid, zns::CSI_ZONED),
        )?;
        zoned = zns::IdentifyZonedNamespace::parse(&p, id.format_index).map(|identify| zns::ZonedInfo {
            identify,
            zasl_bytes: zasl,
        });
    }
    let mut ns = Namespace::new(nsid, id, elbaf, csi);
    ns.zoned = zoned;
    Ok(Some(ns))
}
