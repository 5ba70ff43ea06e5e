//! Authentication Send and Receive on an I/O queue, and the commands of an I/O queue that has
//! not authenticated yet: both go to [`Target::authenticate`](crate::fabrics::Target::authenticate)
//! (the admin queue's go through `Target::admin`). Once the queue has authenticated, the
//! target hands out its decoder.

use super::{lock, Conn, Ctx};
use crate::fabrics::{self, AdminOutcome, QueueRef, Sqe};
use crate::pdu;

impl Conn {
    /// Runs `sqe` (its in-capsule `data`) through the queue's authentication.
    pub(super) fn auth_command(
        &mut self,
        cx: &mut Ctx<'_>,
        sqe: &Sqe,
        data: &[u8],
        head: u16,
        queue: QueueRef,
    ) {
        let in_data = match fabrics::data_xfer(sqe, pdu::FABRICS_MAX_ICD) {
            Ok(x) => x.in_capsule_slice(data).unwrap_or(&[]),
            Err(_) => &[],
        };
        let mut target = lock(cx.target);
        let outcome = target.authenticate(queue, sqe, in_data);
        let io = target.io_queue(queue);
        drop(target);
        if let Some(q) = self.queue.as_mut().filter(|q| q.io.is_none()) {
            q.io = io;
        }
        if let AdminOutcome::Complete { cqe, data, .. } = outcome {
            if !data.is_empty() {
                self.c2h_vec(sqe.cid(), &data);
            }
            self.respond(cqe, head, queue.qid);
        }
    }
}
