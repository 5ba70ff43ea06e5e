//! Asynchronous events (NVMe Base 2.0 §5.2, §5.27.1.9): outstanding Asynchronous Event Request
//! commands, events waiting for one, event types masked until the host reads the log page that
//! clears them, and the Changed Namespace List log page (§5.16.1.5).
//!
//! The model raises one event: Notice, Namespace Attribute Changed (type 2h, information 00h,
//! log page 04h), when a Format NVM changes a namespace's format or the handle changes one
//! ([`crate::NvmeModel::change_namespace`]), and only while Asynchronous Event Configuration bit 8
//! is set. As in QEMU 7.2 (`nvme_enqueue_event`, `nvme_process_aers`, `nvme_changed_nslist`):
//! an event is queued only for a namespace not yet in the changed list; once one is posted,
//! further notices wait until the host reads log page 04h with RAE cleared; reading the log page
//! empties the list whatever RAE says; up to 64 events wait for a request, later ones are dropped.

use std::collections::{BTreeSet, VecDeque};

/// Asynchronous Event Request Limit: requests held at once (Identify Controller AERL + 1).
pub(crate) const AER_LIMIT: usize = 4;
/// Events kept while no request is outstanding (QEMU's `aer_max_queued` default).
const MAX_QUEUED: usize = 64;
/// Asynchronous Event Type Notice (Figure 146).
pub(crate) const TYPE_NOTICE: u8 = 0x2;
/// Notice information: Namespace Attribute Changed (Figure 150).
pub(crate) const INFO_NS_ATTR_CHANGED: u8 = 0x00;
/// Log page identifier: Changed Namespace List.
pub(crate) const LOG_CHANGED_NS_LIST: u8 = 0x04;
/// Entries of the Changed Namespace List; more changes read as one FFFFFFFFh entry.
pub(crate) const CHANGED_LIST_ENTRIES: usize = 1024;

/// One asynchronous event: its completion dword 0 (type bits 2:0, information 15:8, log page
/// 23:16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    kind: u8,
    info: u8,
    log: u8,
}

impl Event {
    fn dw0(self) -> u32 {
        self.kind as u32 | (self.info as u32) << 8 | (self.log as u32) << 16
    }
}

/// The asynchronous event state of a controller.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// CIDs of the outstanding requests, oldest first.
    held: VecDeque<u16>,
    queued: VecDeque<Event>,
    /// Event types posted and not yet cleared by reading their log page.
    masked: u8,
    changed: BTreeSet<u32>,
}

impl Events {
    /// Holds a new request; `false` past the limit (Asynchronous Event Request Limit Exceeded).
    pub(crate) fn hold(&mut self, cid: u16) -> bool {
        if self.held.len() >= AER_LIMIT {
            return false;
        }
        self.held.push_back(cid);
        true
    }

    /// Records that namespace `nsid` changed and, when `notify` (AEC bit 8) and it is not in
    /// the list already, queues a Namespace Attribute Changed notice.
    pub(crate) fn namespace_changed(&mut self, nsid: u32, notify: bool) {
        if self.changed.insert(nsid) && notify && self.queued.len() < MAX_QUEUED {
            self.queued.push_back(Event {
                kind: TYPE_NOTICE,
                info: INFO_NS_ATTR_CHANGED,
                log: LOG_CHANGED_NS_LIST,
            });
        }
    }

    /// The next completion to post, if an unmasked event and a request are both waiting:
    /// the request's CID and dword 0. The event's type is masked from then on.
    pub(crate) fn next(&mut self) -> Option<(u16, u32)> {
        if self.held.is_empty() {
            return None;
        }
        let at = self.queued.iter().position(|e| self.masked & 1 << e.kind == 0)?;
        let e = self.queued.remove(at).expect("position is in range");
        self.masked |= 1 << e.kind;
        let cid = self.held.pop_front().expect("checked not empty");
        Some((cid, e.dw0()))
    }

    /// Fills `out` (4096 bytes) with the Changed Namespace List and empties it; with `rae`
    /// clear, also unmasks notices and drops those still queued (QEMU's `nvme_clear_events`).
    pub(crate) fn take_changed_list(&mut self, rae: bool, out: &mut [u8]) {
        if self.changed.len() > CHANGED_LIST_ENTRIES {
            out[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (i, nsid) in self.changed.iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&nsid.to_le_bytes());
            }
        }
        self.changed.clear();
        if !rae {
            self.masked &= !(1 << TYPE_NOTICE);
            self.queued.retain(|e| e.kind != TYPE_NOTICE);
        }
    }

    /// Controller reset: outstanding requests, queued events and masks are gone (the changed
    /// list, a log page, stays).
    pub(crate) fn reset(&mut self) {
        self.held.clear();
        self.queued.clear();
        self.masked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTICE: u32 = 0x04_00_02;

    #[test]
    fn notices_wait_for_a_request_and_for_the_log_read() {
        let mut e = Events::default();
        e.namespace_changed(3, true);
        assert_eq!(e.next(), None, "no request yet");
        assert!(e.hold(10) && e.hold(11));
        assert_eq!(e.next(), Some((10, NOTICE)));
        e.namespace_changed(3, true);
        e.namespace_changed(1, true);
        assert_eq!(e.next(), None, "masked until the log page is read");
        let mut list = [0u8; 4096];
        e.take_changed_list(true, &mut list);
        assert_eq!(&list[..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0], "ascending");
        assert_eq!(e.next(), None, "RAE set: still masked");
        e.namespace_changed(2, true);
        e.take_changed_list(false, &mut [0u8; 4096]);
        assert_eq!(e.next(), None, "queued notices dropped with the mask");
        e.namespace_changed(2, true);
        assert_eq!(e.next(), Some((11, NOTICE)));
    }

    #[test]
    fn disabled_notices_still_list_and_the_limit_holds() {
        let mut e = Events::default();
        e.namespace_changed(5, false);
        assert!(e.hold(1));
        assert_eq!(e.next(), None);
        let mut list = [0u8; 4096];
        e.take_changed_list(false, &mut list);
        assert_eq!(list[0], 5);
        for cid in 2..=4 {
            assert!(e.hold(cid));
        }
        assert!(!e.hold(5), "AERL + 1 = 4");
        e.reset();
        assert!(e.hold(5));
    }
}
