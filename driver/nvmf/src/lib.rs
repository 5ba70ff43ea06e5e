//! # vfpoll-nvmf: an NVMe/TCP target
//!
//! Serves namespaces (vfpoll NVMe namespaces, or RAM) to standard NVMe/TCP initiators such as
//! Linux's `nvme connect -t tcp`, per the NVMe over Fabrics 1.1 specification and the NVMe/TCP
//! Transport Specification 1.0.
//!
//! Layers, bottom up:
//! - [`auth`]: DH-HMAC-CHAP in-band authentication (secrets, messages, the per-queue
//!   transaction) as pure logic;
//! - [`pdu`]: NVMe/TCP PDUs (headers, digests, padding) as pure logic;
//! - [`fabrics`]: the NVMe-oF controller behaviour independent of the transport: subsystems,
//!   Connect, properties, admin commands, the discovery controller, keep-alive;
//! - [`backend`]: where a namespace's blocks live (a vfpoll NVMe namespace through the worker's
//!   own queue pair, or RAM), driven without blocking;
//! - `sys` (private, the crate's only `unsafe` code): socket I/O straight from and into DMA
//!   buffers;
//! - `conn` (private): one connection, in three layers that each call only those below:
//!   framing (PDUs in and out, digests, the ICReq), dispatch (Connect, admin, authentication,
//!   I/O decoding, completions) and transfer (buffers, R2T/H2CData, C2HData);
//! - [`server`]: the listener thread (accepts connections, hands each to the least loaded
//!   worker, advances the keep-alive timer) and the worker threads, each polling its own
//!   connections, backends and buffer pool, with the [`fabrics::Target`] shared behind a mutex
//!   for Connect and admin commands ([`server::Server::start`]);
//! - `testing` (hidden, feature `testing`, which only this crate's tests and examples turn
//!   on): a loopback NVMe/TCP test host and a RAM-backed server for them.
//!
//! ## Which parts need the NVMe driver
//!
//! The protocol layers ([`auth`], [`pdu`], [`fabrics`]) know NVMe only as definitions
//! (opcodes, status codes, Identify and log page layouts) and take them from
//! `vfpoll-nvme-spec`, so they are tested and fuzzed without a controller. The driver,
//! `vfpoll-nvme`, is needed only where a real controller backs a namespace: in [`backend`],
//! whose [`backend::NvmeBackend`] submits through a worker's own queue pair and turns the
//! driver's errors into the statuses a host sees, and whose
//! [`fabrics::NamespaceInfo::from_format`] refuses a format (as the driver reads it from
//! Identify Namespace) that the target does not serve.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod auth;
pub mod backend;
mod conn;
pub mod fabrics;
pub mod pdu;
pub mod server;
mod sys;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
