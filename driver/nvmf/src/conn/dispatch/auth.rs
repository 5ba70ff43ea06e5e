//! Authentication Send and Receive on an I/O queue, and the commands of an I/O queue that has
//! not authenticated yet: both go to [`Target::authenticate`](crate::fabrics::Target::authenticate)
//! (the admin queue's go through `Target::admin`). Once the queue has authenticated, the
//! target hands out its decoder.

use super::super::{lock, Conn, Ctx};
use super::in_capsule;
use crate::fabrics::{AdminOutcome, QueueRef, Sqe};

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
        let mut target = lock(cx.target);
        let outcome = target.authenticate(queue, sqe, in_capsule(sqe, data));
        let io = target.io_queue(queue);
        drop(target);
        if let Some(q) = self.queue.as_mut().filter(|q| q.io.is_none()) {
            q.io = io;
        }
        if let AdminOutcome::Complete { cqe, data, .. } = outcome {
            if !data.is_empty() {
                self.wire.c2h_bytes(sqe.cid(), &data);
            }
            self.respond(cqe, head, queue.qid);
        }
    }
}
