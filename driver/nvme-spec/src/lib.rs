//! # vfpoll-nvme-spec: NVMe definitions, as data
//!
//! What the NVMe specifications define, written once for everything that speaks NVMe: the
//! driver (`vfpoll-nvme`) builds commands and decodes completions with it, the in-process
//! controller model (`vfpoll-nvme-model`) decodes the same commands and answers with the same
//! codes, and neither keeps a table of its own. No `unsafe`, no I/O, no dependencies: values,
//! layouts, and the functions that build and parse them.
//!
//! - [`regs`]: the controller registers in BAR0 (NVMe Base 2.0 §3.1.3), offsets checked at
//!   compile time, fields with named getters and builders;
//! - [`cmd`]: the submission entry ([`cmd::Command`], NVMe Base 2.0 Figure 88) and the
//!   completion entry ([`cmd::Completion`]), admin and I/O opcodes, feature identifiers,
//!   Identify CNS values, log page identifiers, SGL descriptor types;
//! - [`status`]: the status field, status code types and codes, with the spec's names;
//! - [`identify`]: the Identify Controller and Namespace data structures, and the SMART and
//!   Error Information log pages;
//! - [`zns`]: the Zoned Namespace Command Set's Identify data and zone reports.
//!
//! Each layout is tested against the byte offsets of the specification's figures, with pages
//! written by hand rather than by the code under test.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bytes;
pub mod cmd;
pub mod identify;
#[cfg(any(test, feature = "proptest"))]
pub mod proptest_support;
pub mod regs;
pub mod status;
pub mod zns;
