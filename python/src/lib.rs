//! # vfpoll-python: the Rust core of the `vfpoll` Python package
//!
//! The extension module `vfpoll._vfpoll` (built with maturin from `python/pyproject.toml`;
//! the pure-Python package `vfpoll` around it is in `python/vfpoll/`). A thin layer: the store
//! ([`vfpoll_store`]) does the work; this crate turns Python objects into memory ranges
//! ([`buffer`]), runs every operation with the GIL released, and maps the store's errors onto
//! the `vfpoll.StoreError` hierarchy with the store's own text ([`errors`]).
//!
//! One wheel serves every CPython from 3.9 (the stable ABI, `abi3-py39`).
//!
//! ## Why the crate is a workspace member, and how it is built and tested
//!
//! It is a member, so that `cargo fmt`, `cargo clippy --workspace` and `cargo doc --workspace`
//! check it like every other crate, but not a default member (a plain `cargo build` skips it).
//! Its library is a `cdylib` built with pyo3's `extension-module` feature on (the default
//! feature): the interpreter's symbols stay undefined until `python` loads the module, so
//! `cargo build --workspace` needs no libpython, and there is no Rust test binary to link
//! (`test = false`). It is tested from Python: `cargo xtask test` builds the wheel with maturin
//! into `target/wheels`, installs it in a virtual environment under `target/python`, and runs
//! `pytest python/tests`.
//!
//! `unsafe` lives in `ffi` (the buffer protocol, DLPack capsules, host slices of exported
//! buffers) and `cuda` (the driver calls and the staging memory), each block with its reason.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod buffer;
mod cuda;
pub mod errors;
mod ffi;
pub mod kv;
pub mod save;
mod shared;
pub mod store;

use pyo3::prelude::*;

/// The module `vfpoll._vfpoll`.
#[pymodule]
fn _vfpoll(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Library code never prints; with RUST_LOG set, the store's log goes to stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = env_logger::try_init();
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<save::Writer>()?;
    m.add_class::<save::SaveHandle>()?;
    m.add_class::<kv::KvPool>()?;
    m.add_class::<store::VersionInfo>()?;
    m.add_class::<store::EntryInfo>()?;
    m.add_function(wrap_pyfunction!(buffer_info, m)?)?;
    Ok(())
}

/// `(address, length, place, writable)` of the memory vfpoll would use for `obj` (a test hook
/// for the buffer rules: contiguity, writability, device); `place` is "host" or "cuda:N".
#[pyfunction]
#[pyo3(name = "_buffer_info", signature = (obj, writable = false))]
fn buffer_info(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<(usize, usize, String, bool)> {
    let b = buffer::Buffer::new(obj, writable, "buffer")?;
    let r = b.range();
    Ok((r.addr, r.len, r.place.to_string(), b.writable()))
}
