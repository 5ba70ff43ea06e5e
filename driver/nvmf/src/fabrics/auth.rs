//! In-band authentication (DH-HMAC-CHAP, [`crate::auth`]) wired into the target: which
//! controllers must authenticate, each queue's transaction, and what a queue may do before it
//! has authenticated (NVMe Base 2.0 §8.13; Linux's `nvmet` behaves the same way):
//!
//! - a host with a secret configured in its subsystem ([`Subsystem::host_auth`]) gets AUTHREQ
//!   (ATR, completion dword 0 bit 17) in each Connect response, admin and I/O queues alike;
//! - until the queue has authenticated, its commands other than Authentication Send and
//!   Receive fail with Authentication Required, and an I/O queue gets no decoder
//!   ([`Target::io_queue`] returns none), so no I/O reaches a backend;
//! - each failure is counted per subsystem ([`Target::auth_failures`]), logged at `warn` at
//!   most once per [`WARN_EVERY`] per host, and makes that host wait before its next
//!   AUTH_Negotiate is heard (1 s, doubling, up to [`MAX_BACKOFF`]).
//!
//! [`Subsystem::host_auth`]: super::Subsystem::host_auth
//! [`Target::io_queue`]: super::Target::io_queue
//! [`Target::auth_failures`]: super::Target::auth_failures
//! [`WARN_EVERY`]: crate::auth::WARN_EVERY
//! [`MAX_BACKOFF`]: crate::auth::MAX_BACKOFF

use std::collections::BTreeMap;
use std::sync::Arc;

use vfpoll_nvme_spec::status::{Sct, Status};

use super::types::{Cntlid, SubsystemId};
use super::wire::{fctype, fctype_of, Sqe, FABRICS_OPCODE};
use crate::auth::{Exchange, HostAuth, Throttle};

mod target;

/// AUTHREQ's ATR bit in a Connect response's dword 0: the host must authenticate the queue.
pub const AUTHREQ_ATR: u32 = 1 << 17;

/// Authentication Required (NVMe Base 2.0 Figure 103: command specific status 91h): a command
/// on a queue that has not authenticated.
pub const AUTHENTICATION_REQUIRED: Status = Status::new(Sct::CommandSpecific, 0x91, true);

/// The authentication state of the target.
#[derive(Debug, Default)]
pub(crate) struct AuthState {
    controllers: BTreeMap<Cntlid, CtrlAuth>,
    throttles: BTreeMap<(SubsystemId, String), Throttle>,
    failures: BTreeMap<SubsystemId, u64>,
}

#[derive(Debug)]
struct CtrlAuth {
    subsystem: SubsystemId,
    auth: Arc<HostAuth>,
    hostnqn: String,
    subnqn: String,
    peer: String,
    queues: BTreeMap<u16, QueueAuth>,
}

#[derive(Debug)]
struct QueueAuth {
    exchange: Exchange,
    authenticated: bool,
}

/// True for Authentication Send and Receive.
pub fn is_auth_command(sqe: &Sqe) -> bool {
    sqe.opcode() == FABRICS_OPCODE
        && matches!(
            fctype_of(sqe),
            fctype::AUTHENTICATION_SEND | fctype::AUTHENTICATION_RECEIVE
        )
}
