//! A connection's part in reservations: a reservation command runs under the target's lock
//! (`Target::reservation`) once its data is in its buffer (the caller finishes it with the
//! status it gets), and commands refused with Reservation Conflict count in the host's
//! metrics.

use vfpoll_nvme_spec::status::Status;

use super::super::{lock, Conn, Ctx};
use crate::fabrics::{resv::RESERVATION_CONFLICT, Cqe, DataXfer, Sqe};

impl Conn {
    /// Runs reservation command `cid` (Register, Acquire and Release with their data in the
    /// command's buffer; a Report's data goes into it): the status to finish it with, `None`
    /// when there is no such command.
    pub(super) fn reservation(&mut self, cx: &mut Ctx<'_>, cid: u16) -> Option<Status> {
        let cntlid = self.queue.as_ref()?.queue.cntlid;
        let cmd = self.cmds.get(&cid)?;
        let req = cmd.req;
        let mut data = Vec::new();
        if let (Some(buf), DataXfer::InCapsule { .. } | DataXfer::FromHost { .. }) =
            (cmd.buf.as_ref(), req.data())
        {
            data = vec![0u8; buf.len()];
            if cx.pool.read(buf, 0, &mut data).is_err() {
                return Some(Status::DATA_TRANSFER_ERROR);
            }
        }
        let (mut status, out) = lock(cx.target).reservation(cntlid, &req, &data);
        if status.is_success() && !out.is_empty() {
            let written = cmd
                .buf
                .as_ref()
                .is_some_and(|buf| buf.len() >= out.len() && cx.pool.write(buf, 0, &out).is_ok());
            if !written {
                log::error!(
                    "a Reservation Report of {} bytes does not fit its buffer",
                    out.len()
                );
                status = Status::DATA_TRANSFER_ERROR;
            }
        }
        Some(status)
    }

    /// Counts a command the decoder refused with Reservation Conflict in its host's metrics.
    pub(super) fn count_conflict(&mut self, cx: &mut Ctx<'_>, sqe: &Sqe, cqe: &Cqe) {
        if cqe.status() != RESERVATION_CONFLICT {
            return;
        }
        let Some(sub) = self.io_queue().map(|io| io.subsystem()) else {
            return;
        };
        self.io_counters(cx.metrics, sub, sqe.nsid())
            .reservation_conflict();
    }
}
