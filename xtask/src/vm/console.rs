//! What a boot prints: the guest's serial console (the init's lines, kernel warnings) and QEMU's
//! stderr, where vIOMMU faults are found.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::util::secs;

/// Copies QEMU's stderr to `out` (ours), without the one warning every boot gives (the NIC hub
/// has no host-side port, on purpose); returns the lines that are vIOMMU faults
/// ([`is_iommu_fault`]), which are copied too.
pub(super) fn filter_stderr(stderr: impl Read, mut out: impl Write) -> QemuStderr {
    let mut seen = QemuStderr::default();
    for mut line in BufReader::new(stderr).split(b'\n').map_while(|l| l.ok()) {
        if contains(&line, b"is not connected to host network") {
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        if is_iommu_fault(&text) {
            seen.faults.push(text.trim_end().to_string());
        } else if !text.trim().is_empty() {
            seen.last = Some(text.trim_end().to_string());
        }
        line.push(b'\n');
        let _ = out.write_all(&line);
    }
    seen
}

/// What [`filter_stderr`] kept of QEMU's stderr.
#[derive(Debug, Default, PartialEq)]
pub(super) struct QemuStderr {
    /// The vIOMMU fault lines ([`is_iommu_fault`]), in order.
    pub(super) faults: Vec<String>,
    /// The last other non-empty line (why QEMU refused to start, when it did).
    pub(super) last: Option<String>,
}

/// What QEMU 7.2 prints on stderr when a device's DMA is refused: the `error_report_once`
/// messages of its emulated VT-d (`hw/i386/intel_iommu.c`, as `<function>: <message>`) and the
/// DMA-mapping errors of its virtio core (`hw/virtio/virtio.c`). Each message is printed at
/// most once per call site and boot (`error_report_once`), so a boot shows the first fault of
/// each kind, which is all a verdict needs.
///
/// The NVMe (`hw/nvme`) and e1000e models print nothing of their own on a failed DMA (they
/// complete the command or descriptor, or only trace), so for them the VT-d lines are the
/// evidence. Not listed: the VT-d messages about the guest kernel's own invalidation-queue and
/// register programming (`vtd_iotlb_flush`, `vtd_fetch_inv_desc`, ...), which are no DMA.
pub const IOMMU_FAULT_MESSAGES: &[&str] = &[
    // Any DMA whose translation failed, whatever the reason below (vtd_iommu_translate).
    "vtd_iommu_translate: detected translation failure",
    // Why, from the page walk (vtd_iova_to_slpte): beyond the address width, a page-table
    // entry that cannot be read, not present or lacking the permission (an unmapped IOVA),
    // reserved bits set, or a translation into the interrupt range.
    "vtd_iova_to_slpte: detected IOVA overflow",
    "vtd_iova_to_slpte: detected read error on DMAR slpte",
    "vtd_iova_to_slpte: detected slpte permission error",
    "vtd_iova_to_slpte: detected splte reserve non-zero",
    "vtd_iova_to_slpte: xlat address is in interrupt range",
    // The device has no valid root or context entry (vtd_dev_to_context_entry and its checks).
    "vtd_root_entry_rsvd_bits_check: invalid root entry",
    "vtd_context_entry_rsvd_bits_check: invalid context entry",
    "vtd_dev_to_context_entry: invalid context entry",
    "vtd_ce_type_check: DT specified but not supported",
    "vtd_ce_type_check: PT specified but not supported",
    "vtd_ce_type_check: unknown ce type",
    // Fault recording after a refused DMA (vtd_report_dmar_fault, vtd_generate_fault_event).
    "New fault is not recorded due to ",
    "Next Fault Recording Reg is used, new fault is not recorded",
    "There are pending faults already, fault event is not generated",
    "There are previous interrupt conditions to be serviced by software, fault event is not generated",
    "Interrupt Mask set, irq is not generated",
    // A DMA write into the interrupt window (0xfee00000..) that interrupt remapping refused
    // (vtd_irte_get, vtd_interrupt_remap_msi).
    "vtd_irte_get: ",
    "vtd_interrupt_remap_msi: ",
    // virtio devices (iommu_platform=on) whose rings or buffers did not translate.
    "virtio: bogus descriptor or out of resources",
    "virtio: error trying to map MMIO memory",
    "Cannot map desc",
    "Cannot map used",
    "Cannot map avail",
    "Cannot map indirect buffer",
];

/// Whether a line of QEMU's stderr says that the vIOMMU refused a device DMA
/// ([`IOMMU_FAULT_MESSAGES`]).
pub fn is_iommu_fault(line: &str) -> bool {
    IOMMU_FAULT_MESSAGES.iter().any(|m| line.contains(m))
}

/// One paragraph for a boot with vIOMMU faults: what they mean and where they are kept.
pub fn fault_report(faults: &[String], file: &Path) -> String {
    const SHOWN: usize = 6;
    let mut s = format!(
        "QEMU's vIOMMU refused device DMA: a bug, a DMA to an address the driver never mapped \
         (or had unmapped). QEMU said ({} line(s)):",
        faults.len()
    );
    for f in faults.iter().take(SHOWN) {
        s.push_str("\n  ");
        s.push_str(f);
    }
    if faults.len() > SHOWN {
        s.push_str(&format!("\n  ... and {} more", faults.len() - SHOWN));
    }
    s.push_str(&format!(
        "\n(all in {}; QEMU prints each kind once per boot: look for the first DMA that \
         went wrong)",
        file.display()
    ));
    s
}

pub(super) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Streams the serial console to stdout (through [`ConsoleFilter`]) and, raw, to `log`;
/// returns when the job started.
pub(super) fn stream_console(
    mut stdout: impl Read,
    mut log: fs::File,
    verbose: bool,
    t0: Instant,
) -> Option<Instant> {
    let mut filter = ConsoleFilter::new(verbose);
    let mut started = None;
    let mut buf = [0u8; 8192];
    loop {
        let n = match stdout.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let _ = log.write_all(&buf[..n]);
        let mut shown = Vec::new();
        filter.feed(&buf[..n], &mut shown, |line| {
            if started.is_none() && line.starts_with(b"vm: job start") {
                let now = Instant::now();
                started = Some(now);
                if verbose {
                    eprintln!("vm: job started after {}", secs(now - t0));
                }
            }
        });
        let mut o = io::stdout().lock();
        let _ = o.write_all(&shown);
        let _ = o.flush();
    }
    let mut shown = Vec::new();
    filter.finish(&mut shown);
    let _ = io::stdout().lock().write_all(&shown);
    started
}

/// Turns the serial console into what the user should see: `\r\n` becomes `\n`, and lines of
/// the guest init (`vm: ...`) are dropped unless verbose, except `vm: error...`; so is the
/// kernel's chatter after the job. Partial lines pass as soon as they cannot be init lines, so
/// output without a newline shows up live; the init's RS byte ends such a line.
pub(super) struct ConsoleFilter {
    verbose: bool,
    line: Vec<u8>,
    /// Bytes of `line` already written out.
    shown: usize,
    /// Whether the current line is shown, once that is known.
    show: Option<bool>,
    /// A `\r` that may be the first half of `\r\n`.
    cr: bool,
    /// The job has ended: what follows is the kernel powering off.
    after_job: bool,
}

const INIT_PREFIX: &[u8] = b"vm: ";
/// Sent by the init before each of its lines: ends the current line if there is one.
const RECORD_SEPARATOR: u8 = 0x1e;
const INIT_ERROR: &[u8] = b"vm: error";

impl ConsoleFilter {
    pub(super) fn new(verbose: bool) -> Self {
        ConsoleFilter {
            verbose,
            line: Vec::new(),
            shown: 0,
            show: None,
            cr: false,
            after_job: false,
        }
    }

    /// Whether a line starting with `start` is shown; `None` while that cannot be told yet.
    fn decide(&self, start: &[u8], complete: bool) -> Option<bool> {
        if start.starts_with(INIT_ERROR) {
            Some(true)
        } else if start.starts_with(INIT_PREFIX) && (complete || !INIT_ERROR.starts_with(start)) {
            Some(self.verbose)
        } else if self.after_job {
            (complete || !INIT_PREFIX.starts_with(start)).then_some(self.verbose)
        } else if complete || !INIT_PREFIX.starts_with(start) && !start.starts_with(INIT_PREFIX) {
            Some(true)
        } else {
            None
        }
    }

    /// Filters `bytes` into `out`; calls `on_line` with each complete line.
    pub(super) fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>, mut on_line: impl FnMut(&[u8])) {
        for &b in bytes {
            if self.cr && b != b'\n' {
                self.push(b'\r');
            }
            self.cr = false;
            match b {
                b'\r' => self.cr = true,
                RECORD_SEPARATOR if self.line.is_empty() => {}
                RECORD_SEPARATOR | b'\n' => {
                    let show = self.show.or(self.decide(&self.line, true)) == Some(true);
                    if show {
                        out.extend_from_slice(&self.line[self.shown..]);
                        out.push(b'\n');
                    }
                    on_line(&self.line);
                    if self.line.starts_with(b"vm: job exit") {
                        self.after_job = true;
                    }
                    self.line.clear();
                    self.shown = 0;
                    self.show = None;
                }
                _ => self.push(b),
            }
        }
        if self.show == Some(true) {
            out.extend_from_slice(&self.line[self.shown..]);
            self.shown = self.line.len();
        }
    }

    fn push(&mut self, b: u8) {
        self.line.push(b);
        if self.show.is_none() {
            self.show = self.decide(&self.line, false);
        }
    }

    /// Flushes an unterminated last line.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.line.is_empty() && self.show.or(self.decide(&self.line, true)) == Some(true) {
            out.extend_from_slice(&self.line[self.shown..]);
        }
    }
}
