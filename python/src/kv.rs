//! `KvPool`: batched puts and gets of fixed-size blocks under 128-bit keys, from host or GPU
//! buffers.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::buffer::{Buffer, Place, Range};
use crate::cuda::Device;
use crate::errors::{Failure, Kind};
use crate::ffi::{host_bytes, host_bytes_mut};
use crate::save::{stage, Item};
use crate::shared::{lock, Shared};

pub(crate) fn kv_stats<'py>(py: Python<'py>, s: &vfpoll_store::KvStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("puts", s.puts)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("bad_blocks", s.bad_blocks)?;
    d.set_item("deallocated", s.deallocated)?;
    Ok(d)
}

/// A key: an int in 0..2**128 or 16 bytes (little-endian).
fn key_of(k: &Bound<'_, PyAny>) -> PyResult<u128> {
    if let Ok(b) = k.cast::<PyBytes>() {
        let a: [u8; 16] = b.as_bytes().try_into().map_err(|_| {
            PyValueError::new_err(format!("a bytes key is 16 bytes, not {}", b.as_bytes().len()))
        })?;
        return Ok(u128::from_le_bytes(a));
    }
    k.extract::<u128>()
        .map_err(|_| PyValueError::new_err(format!("key {k} is not an int in 0..2**128 or 16 bytes")))
}

/// A KV block pool (fixed block size, 128-bit keys, LRU or S3-FIFO eviction: the store's
/// `kv_eviction`).
#[pyclass(module = "vfpoll._vfpoll", frozen)]
pub struct KvPool {
    shared: Arc<Shared>,
    name: String,
    block_size: u32,
}

impl KvPool {
    /// The pool `name` of the store `shared` (open in its `pools`).
    pub(crate) fn new(shared: Arc<Shared>, name: String, block_size: u32) -> KvPool {
        KvPool {
            shared,
            name,
            block_size,
        }
    }

    fn pool(&self) -> Result<vfpoll_store::KvPool, Failure> {
        self.shared.store()?;
        lock(&self.shared.pools).get(&self.name).cloned().ok_or_else(|| {
            Failure::new(
                Kind::Closed,
                format!("KV pool {:?} was closed or deleted", self.name),
            )
        })
    }

    /// The keys, and a range per key: `bufs` is a list or tuple of buffers (one per key), or
    /// one buffer (a 2-D tensor or array: `len(keys)` rows of equal length, one per key, read
    /// through a single export, which is what a batch should pass).
    fn keys_and_bufs(
        &self,
        keys: &Bound<'_, PyAny>,
        bufs: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<(Vec<u128>, Vec<Range>, Vec<Buffer>)> {
        let keys: Vec<u128> = keys.try_iter()?.map(|k| key_of(&k?)).collect::<PyResult<_>>()?;
        let mut holds = Vec::new();
        let mut ranges = Vec::with_capacity(keys.len());
        let one = if bufs.is_instance_of::<PyList>() || bufs.is_instance_of::<PyTuple>() {
            None
        } else {
            match Buffer::new(bufs, writable, "the blocks' array") {
                Ok(b) => Some(b),
                // Not memory: an iterable of buffers (a generator), else the error says both.
                Err(e) if e.is_instance_of::<PyTypeError>(bufs.py()) && bufs.try_iter().is_ok() => None,
                Err(e) => {
                    let py = bufs.py();
                    return Err(PyErr::from_type(
                        e.get_type(py),
                        format!(
                            "{} (bufs: buffers, one per key, or one array of len(keys) rows)",
                            e.value(py)
                        ),
                    ));
                }
            }
        };
        if let Some(b) = one {
            let r = b.range();
            let n = keys.len();
            if n == 0 || r.len % n != 0 {
                return Err(PyValueError::new_err(format!(
                    "an array of {} bytes does not split into {n} equal rows, one per key",
                    r.len
                )));
            }
            let row = r.len / n;
            ranges.extend((0..n).map(|i| Range {
                addr: r.addr + i * row,
                len: row,
                ..r
            }));
            holds.push(b);
        } else {
            for (i, b) in bufs.try_iter()?.enumerate() {
                let b = Buffer::new(&b?, writable, &format!("block {i}"))?;
                ranges.push(b.range());
                holds.push(b);
            }
        }
        if !writable {
            for (i, r) in ranges.iter().enumerate() {
                if r.len == 0 || r.len > self.block_size as usize {
                    return Err(PyValueError::new_err(format!(
                        "block {i} has {} bytes: a block of pool {:?} is 1 to {} bytes",
                        r.len, self.name, self.block_size
                    )));
                }
            }
        }
        if keys.len() != ranges.len() {
            return Err(PyValueError::new_err(format!(
                "{} keys and {} buffers",
                keys.len(),
                ranges.len()
            )));
        }
        Ok((keys, ranges, holds))
    }
}

#[pymethods]
impl KvPool {
    /// Stores `bufs[i]` under `keys[i]` in one submission burst (evicting blocks in the store's
    /// `kv_eviction` order when full). Not durable until `sync()`. `bufs` is one buffer per
    /// key, or one array (2-D tensor) of `len(keys)` equal rows.
    fn put_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, bufs: &Bound<'_, PyAny>) -> PyResult<()> {
        let (keys, ranges, holds) = self.keys_and_bufs(keys, bufs, false)?;
        let r = py.detach(|| -> Result<(), Failure> {
            let pool = self.pool()?;
            let gpu_len: usize = ranges
                .iter()
                .filter(|r| r.place != Place::Host)
                .map(|r| r.len.next_multiple_of(64))
                .sum();
            let mut staging = if gpu_len > 0 {
                Some(self.shared.take_staging(gpu_len)?)
            } else {
                None
            };
            let mut items = Vec::new();
            let mut at = 0;
            for r in &ranges {
                let staged_at = (r.place != Place::Host).then(|| {
                    let a = at;
                    at += r.len.next_multiple_of(64);
                    a
                });
                items.push(Item {
                    entry: String::new(),
                    meta: Vec::new(),
                    range: *r,
                    staged_at,
                });
            }
            if let Some(s) = staging.as_mut() {
                stage(&items, s)?;
            }
            let slices: Vec<&[u8]> = items
                .iter()
                .map(|it| match (it.staged_at, staging.as_ref()) {
                    (Some(a), Some(s)) => s.bytes(a, it.range.len),
                    // SAFETY: `holds` keeps the buffers until this section ends.
                    _ => unsafe { host_bytes(it.range.addr, it.range.len) },
                })
                .collect();
            let r = pool.put_many(&keys, &slices);
            drop(slices);
            if let Some(s) = staging {
                self.shared.give_staging(s);
            }
            Ok(r?)
        });
        drop(holds);
        r.map_err(|e| e.to_py(py))
    }

    /// Reads the blocks of `keys` into `bufs` (one buffer per key, or one array of `len(keys)`
    /// equal rows; each at least the block's length) in one burst; per key the block's length
    /// for a hit, `None` for a miss (a block failing its crc is a miss).
    fn get_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        bufs: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let (keys, ranges, holds) = self.keys_and_bufs(keys, bufs, true)?;
        let r = py.detach(|| -> Result<Vec<Option<usize>>, Failure> {
            let pool = self.pool()?;
            let gpu: Vec<usize> = (0..ranges.len())
                .filter(|&i| ranges[i].place != Place::Host)
                .collect();
            let per = self.block_size as usize;
            let mut staging = if gpu.is_empty() {
                None
            } else {
                Some(self.shared.take_staging(per * gpu.len())?)
            };
            let hits = {
                let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
                let mut chunks = staging
                    .as_mut()
                    .map(|s| s.bytes_mut(0, per * gpu.len()).chunks_mut(per));
                for r in &ranges {
                    if r.place == Place::Host {
                        // SAFETY: `holds` keeps the writable buffers until this section ends;
                        // keeping the buffers of one call apart is the caller's part.
                        dsts.push(unsafe { host_bytes_mut(r.addr, r.len) });
                    } else {
                        let c: &mut [u8] = chunks.as_mut().and_then(|c| c.next()).unwrap_or_default();
                        let n = r.len.min(c.len());
                        dsts.push(&mut c[..n]);
                    }
                }
                pool.get_many(&keys, &mut dsts)?
            };
            if let Some(s) = staging.as_mut() {
                let mut groups: HashMap<i32, Vec<(usize, usize)>> = HashMap::new();
                for (n, &i) in gpu.iter().enumerate() {
                    if let (Some(len), Place::Cuda(d)) = (hits[i], ranges[i].place) {
                        groups.entry(d).or_default().push((n, len.min(ranges[i].len)));
                    }
                }
                for (d, list) in groups {
                    let dev = Device::open(d)?;
                    let mut c = dev.copier(s)?;
                    for (n, len) in list {
                        if let Some(st) = ranges[gpu[n]].stream {
                            c.after(st)?;
                        }
                        c.h2d(n * per, ranges[gpu[n]].addr as u64, len)?;
                    }
                    c.finish()?;
                }
            }
            if let Some(s) = staging {
                self.shared.give_staging(s);
            }
            Ok(hits)
        });
        drop(holds);
        r.map_err(|e| e.to_py(py))
    }

    /// Whether `key` is held.
    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = key_of(key)?;
        self.pool().map(|p| p.contains(k)).map_err(|e| e.to_py(py))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.contains(py, key)
    }

    /// Removes `keys`; returns how many were held.
    fn remove_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys: Vec<u128> = keys.try_iter()?.map(|k| key_of(&k?)).collect::<PyResult<_>>()?;
        py.detach(|| -> Result<usize, Failure> { Ok(self.pool()?.remove_many(&keys)?) })
            .map_err(|e| e.to_py(py))
    }

    /// Makes every put so far durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| -> Result<(), Failure> { Ok(self.pool()?.sync()?) })
            .map_err(|e| e.to_py(py))
    }

    /// Hits, misses, evictions, puts, bad blocks and deallocations since opened here.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.pool().map_err(|e| e.to_py(py))?;
        kv_stats(py, &p.stats())
    }

    /// Block size in bytes.
    #[getter]
    fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Slots.
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<u64> {
        self.pool().map(|p| p.info().slots).map_err(|e| e.to_py(py))
    }

    /// The pool's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.pool().map(|p| p.len() as usize).map_err(|e| e.to_py(py))
    }

    fn __repr__(&self) -> String {
        format!("KvPool({:?}, block_size={})", self.name, self.block_size)
    }
}
