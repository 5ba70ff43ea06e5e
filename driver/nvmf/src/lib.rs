//! # vfpoll-nvmf: an NVMe/TCP target
//!
//! Serves namespaces (vfpoll NVMe namespaces, or RAM) to standard NVMe/TCP initiators such as
//! Linux's `nvme connect -t tcp`, per the NVMe over Fabrics 1.1 specification and the NVMe/TCP
//! Transport Specification 1.0.
//!
//! Layers, bottom up:
//! - [`pdu`]: NVMe/TCP PDUs (headers, digests, padding) as pure logic;
//! - [`fabrics`]: the NVMe-oF controller behaviour independent of the transport: subsystems,
//!   Connect, properties, admin commands, the discovery controller, keep-alive.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod fabrics;
pub mod pdu;
