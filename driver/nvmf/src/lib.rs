//! # vfpoll-nvmf: an NVMe/TCP target
//!
//! Serves namespaces (vfpoll NVMe namespaces, or RAM) to standard NVMe/TCP initiators such as
//! Linux's `nvme connect -t tcp`, per the NVMe over Fabrics 1.1 specification and the NVMe/TCP
//! Transport Specification 1.0.
//!
//! Layers, bottom up:
//! - [`pdu`]: NVMe/TCP PDUs (headers, digests, padding) as pure logic;
//! - [`fabrics`]: the NVMe-oF controller behaviour independent of the transport: subsystems,
//!   Connect, properties, admin commands, the discovery controller, keep-alive;
//! - [`backend`]: where a namespace's blocks live (a vfpoll NVMe namespace through the worker's
//!   own queue pair, or RAM), driven without blocking;
//! - `sys` (private, the crate's only `unsafe` code): socket I/O straight from and into DMA
//!   buffers.
//!
//! The connection runtime (listeners, pinned workers, R2T flow, the `vfpoll target` command) is
//! being built on these layers (issue 11); until it lands, `sys` has no caller outside its tests.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod backend;
pub mod fabrics;
pub mod pdu;
// Used by the connection runtime, which lands next; tested on its own meanwhile.
#[cfg_attr(not(test), allow(dead_code))]
mod sys;
