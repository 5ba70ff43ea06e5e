//! The NVMe over Fabrics controller, independent of the transport: subsystems and their
//! namespaces, the discovery subsystem, Connect, properties, admin commands, I/O command
//! decoding, asynchronous events and keep-alive (NVMe-oF 1.1, NVMe Base 2.0, NVM Command Set
//! 1.0).
//!
//! Pure logic, no sockets or threads. The runtime parses NVMe/TCP PDUs and calls in:
//!
//! - [`Target::connect`] with the first capsule of a new queue (a Connect command and its
//!   1024 bytes of data): a controller is created for an admin queue (CNTLID allocated), an
//!   I/O queue joins its controller and comes with an [`IoQueue`] decoder;
//! - [`Target::admin`] with each admin command: a completion and the data for the host
//!   ([`AdminOutcome`]), or a held Asynchronous Event Request;
//! - [`IoQueue::decode`] (or [`Target::io_command`]) with each I/O command: an [`IoRequest`]
//!   for a backend, or the completion that refuses the command;
//! - [`Target::tick`] periodically, dropping expired controllers with
//!   [`Target::drop_controller`], and [`Target::disconnect`] when a connection ends.
//!
//! Configuration changes ([`Target::add_namespace`], [`Target::set_health`],
//! [`Target::set_ana_state`], ...) return the completions of held Asynchronous Event Requests
//! ([`AerCompletion`]) to send.
//!
//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1.3): each namespace has an ANA group
//! ([`NamespaceInfo::ana_group`]) and each (listener port, group) an [`AnaState`]
//! ([`Listener::ana`], [`Target::set_ana_state`]); a controller reports the states of the port
//! its admin queue came through (CMIC bit 3, the ANA log page 0Ch, ANA Change notices), and
//! refuses I/O on paths that are not accessible, so Linux's native multipath picks its paths
//! per listener.
//!
//! What the Linux initiator (`drivers/nvme/host/core.c`, `fabrics.c`, `tcp.c`) checks holds
//! here: Identify's CNTLID equals Connect's, KAS is non-zero, IOCCSZ ≥ 4, IORCSZ ≥ 1, ICDOFF
//! 0, SGLs are supported, MAXCMD is non-zero, CMIC says the subsystem may have several
//! controllers and namespaces are shared (NMIC), so that two controllers of one host are
//! accepted and native multipath sees one namespace; namespaces carry stable NGUID, UUID and
//! EUI-64 identifiers; MNAN is 1 to NN and the ANA log page of MNAN namespaces in NANAGRPID
//! groups fits MDTS (else Linux refuses the controller or turns ANA off).
//!
//! Files, bottom up; each imports only from those before it:
//! - `wire` (SQE, CQE, statuses), `types` (the IDs and records every part names), `bytes`
//!   (page field writers), `qos` (rate limits);
//! - `ana`, `config`, `identify`, `logpage`, [`resv`] (reservation rules, the state file),
//!   `controller` (one controller's registers, features, events), `io` (I/O decoding), `auth`
//!   (the authentication rules and state);
//! - `target`: the [`Target`] itself, its state and what it answers about it;
//! - the parts that act on the whole target, each an `impl Target`: `connect` (Connect, I/O
//!   queues, keep-alive, teardown), `reconfig` (configuration changes), `admin` (admin
//!   commands), `auth::target` (authentication), `resv::target` (reservations).
//!
//! The target serves plain data formats only (512 to 4096-byte blocks, no metadata, no
//! protection information).

mod admin;
mod ana;
mod auth;
mod bytes;
mod config;
mod connect;
mod controller;
mod identify;
mod io;
mod logpage;
mod qos;
mod reconfig;
pub mod resv;
mod target;
mod types;
mod wire;

#[cfg(test)]
mod tests;

pub use admin::{AdminEffect, AdminOutcome};
pub use ana::{AnaState, ANAGRPMAX, ANATT_SECONDS, ANA_DESCRIPTOR_BYTES, ANA_HEADER_BYTES};
pub use auth::{is_auth_command, AUTHENTICATION_REQUIRED, AUTHREQ_ATR};
pub use config::{
    validate_nqn, AdrFam, ConfigError, Listener, NamespaceIds, NamespaceInfo, Subsystem, TargetOptions,
    DEFAULT_MAX_NSID, DISCOVERY_NQN, NQN_MAX,
};
pub use connect::{
    connect_data_off, connect_ipo, connect_off, host_label, ConnectOutcome, CONNECT_DATA_BYTES,
};
pub use controller::{cc, csts, prop};
pub use identify::{cs_indep_off, ctrl_off, ctrl_val, nidt, ns_off, IDENTIFY_BYTES};
pub use io::{DsmRange, IoOp, IoQueue, IoRequest};
pub use logpage::{disc_off, lid, subtype, Health, DISCOVERY_RECORD_BYTES, SMART_BYTES, TREQ, TRTYPE_TCP};
pub use qos::{Limiter, Limits, RateLimit, BURST};
pub use target::Target;
pub use types::{
    AerCompletion, Cntlid, ConnInfo, ControllerInfo, QueueRef, SubsystemId, ADMIN_IN_CAPSULE,
    ADMIN_QUEUE_ENTRIES, DISCOVERY_KATO_MS,
};
pub use wire::{
    check_flags, cqe_to_bytes, data_xfer, direction, fctype, fctype_of, is_connect, sqe_from_bytes,
    sqe_to_bytes, status, Cqe, DataXfer, Direction, SqHead, Sqe, CQE_BYTES, FABRICS_OPCODE, SGL_IN_CAPSULE,
    SGL_TRANSPORT, SQE_BYTES,
};
