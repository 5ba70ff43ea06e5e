//! Namespaces: what Identify says of each (format, command set, zoned data). Keeping that true
//! (Format NVM, re-reading the table, the Namespace Attribute Changed event) is the
//! controller's (`ctrlr/namespaces.rs`).

use crate::cmd::{cns, Command};
use crate::error::{NvmeError, Result};
use crate::format::{FormatError, NsFormat};
use crate::identify::{IdentifyController, IdentifyNamespace};
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

/// What [`crate::Controller::format_with`] formats a namespace to.
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
