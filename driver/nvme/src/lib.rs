//! # vfpoll-nvme: a polled userspace NVMe driver
//!
//! Layers, bottom up: [`regs`] (the controller's registers in BAR0). Controller bring-up, admin
//! and I/O queue pairs build on it.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]
#![forbid(unsafe_code)]

pub mod regs;
