//! The namespace ranges a queue pair drives: where each I/O unit lies, how many are left, and
//! which range takes the next I/O.

use std::ops::Range;

use crate::report::ZoneReport;
use crate::workload::{mix64, Cursor};
use crate::zoned::{ZoneGeom, ZoneWriter};

/// One namespace range on a queue pair.
pub(super) struct NsState {
    pub(super) nsid: u32,
    /// Bytes per block in the data buffer (data, plus metadata for an extended LBA).
    pub(super) block_bytes: usize,
    /// Bytes per block in the separate metadata buffer (0: none).
    pub(super) meta_bytes: usize,
    /// Bytes of each block (data buffer) and of each block's metadata (separate buffer) that
    /// the controller writes itself (its protection information), not checked by verify.
    pub(super) data_skip: Option<Range<usize>>,
    pub(super) meta_skip: Option<Range<usize>>,
    pub(super) io_blocks: u64,
    pub(super) first_lba: u64,
    pub(super) units: u64,
    /// Where units lie in a zoned range (`None`: one after the other).
    pub(super) zone: Option<ZoneGeom>,
    /// The zones being written, while a zoned range is written.
    pub(super) writer: Option<ZoneWriter>,
    /// What was done to the zones of a zoned range.
    pub(super) zone_report: Option<ZoneReport>,
    pub(super) cursor: Cursor,
    /// Submissions left in this pass (`u64::MAX`: until stopped).
    pub(super) left: u64,
    pub(super) seed: u64,
}

impl NsState {
    /// The first LBA of I/O unit `unit` of the range.
    #[inline]
    pub(super) fn lba_of(&self, unit: u64) -> u64 {
        self.first_lba
            + match &self.zone {
                None => unit * self.io_blocks,
                Some(g) => g.offset(unit, self.io_blocks),
            }
    }

    /// Whether an I/O can be submitted now.
    #[inline]
    fn ready(&self) -> bool {
        self.left > 0 && self.writer.as_ref().is_none_or(ZoneWriter::can_write)
    }

    /// Whether I/O is still to be submitted (now, or once zone commands complete).
    fn has_work(&self) -> bool {
        self.left > 0 && self.writer.as_ref().is_none_or(ZoneWriter::live)
    }
}

/// The ranges of one queue pair, taken round robin.
pub(super) struct Ranges {
    pub(super) list: Vec<NsState>,
    next: usize,
}

impl Ranges {
    pub(super) fn new(list: Vec<NsState>) -> Self {
        Ranges { list, next: 0 }
    }

    /// The next range that can take an I/O now (round robin).
    #[inline]
    pub(super) fn pick(&mut self) -> Option<usize> {
        let n = self.list.len();
        for _ in 0..n {
            let k = self.next;
            self.next = if k + 1 == n { 0 } else { k + 1 };
            if self.list[k].ready() {
                return Some(k);
            }
        }
        None
    }

    /// Whether any range has I/O still to submit.
    pub(super) fn have_work(&self) -> bool {
        self.list.iter().any(NsState::has_work)
    }

    /// Submit nothing more.
    pub(super) fn stop(&mut self) {
        for n in &mut self.list {
            n.left = 0;
        }
    }

    /// Verify's read-back pass: every unit once more, in a new order, zones no longer written.
    pub(super) fn read_back(&mut self) {
        for n in &mut self.list {
            n.writer = None;
            n.left = n.units;
            n.seed = mix64(n.seed);
            n.cursor = Cursor::new(n.units, n.cursor.is_random(), true, n.seed);
        }
    }
}
