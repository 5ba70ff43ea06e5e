//! # libvfpoll: vfpoll's NVMe driver for C
//!
//! A C API over `vfpoll-nvme`, built as `libvfpoll.so` and `libvfpoll.a`, with the header
//! `include/vfpoll.h` generated from this crate by cbindgen (checked in; a test fails when it
//! is stale) and a pkg-config file (`vfpoll.pc.in`, installed by `install.sh`).
//!
//! The objects, each an opaque handle:
//! - `vfpoll_env`: a VFIO container (IOMMU mode) and its DMA page size;
//! - `vfpoll_ctrl`: a controller opened by PCI address, with identify data and namespaces;
//! - `vfpoll_pool` and `vfpoll_buf`: DMA buffers, allocated once, copied in and out (or reached
//!   in place through `vfpoll_buf_data`, for zero-copy);
//! - `vfpoll_qpair`: an I/O queue pair: submit read, write, write zeroes, flush and deallocate
//!   with a 64-bit tag, ring the doorbell once per batch, poll completions into an array or a
//!   callback;
//! - `vfpoll_store`, `vfpoll_ckpt_tx`, `vfpoll_ckpt_reader`, `vfpoll_kv_pool`: the store
//!   (`vfpoll-store`): checkpoints committed all or nothing and read back by name or byte
//!   range, and KV block pools, on namespaces named by spec strings ([`store`],
//!   [`store_ffi`]).
//!
//! Errors are negative errno values; `vfpoll_last_error()` gives this thread's message. No
//! panic crosses into C ([`error`]'s guard runs every entry point).
//!
//! Layout: [`types`] (the C structs and constants), [`env`], [`pool`] and [`qpair`] (safe
//! Rust over the driver), and [`ffi`] (the entry points: every dereference of a C pointer, and
//! the trust model; [`store_ffi`] holds the store's entry points under the same model). The one
//! other `unsafe` item is `pool`'s `IoBuffer` implementation for a
//! buffer lent to a command.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod env;
pub mod error;
pub mod ffi;
pub mod pool;
pub mod qpair;
pub mod store;
pub mod store_ffi;
pub mod types;

#[cfg(test)]
mod tests;
