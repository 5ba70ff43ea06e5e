//! # vfpoll-nvme: a polled userspace NVMe driver
//!
//! Layers, bottom up: [`regs`] (the controller's registers in BAR0), [`cmd`] (queue entries and
//! command builders), [`status`] (completion status with names), [`prp`] (data pointers).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod cmd;
pub mod prp;
pub mod regs;
pub mod status;
