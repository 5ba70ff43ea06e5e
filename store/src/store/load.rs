//! Reading what a store's namespaces hold, at open and for fsck: the superblocks (before the
//! I/O engine exists), both root slots, the catalog and every manifest, and the free space
//! rebuilt from them (FORMAT.md §3, §4, §8).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::alloc::Allocator;
use crate::device::{Device, DeviceError, IoOp};
use crate::error::{Result, StoreError};
use crate::format::{
    decode_blob, BlobKind, BlobLoc, Catalog, Corrupt, Manifest, Root, Superblock, PAGE, ROOT_OFFSETS,
};
use crate::io::{Geometry, Io, Job};
use crate::store::Finding;

fn dev_err(d: &dyn Device, e: DeviceError) -> StoreError {
    StoreError::Device {
        device: d.describe(),
        source: e,
    }
}

/// Reads `len` bytes at `off` of a device that has no engine yet (superblocks at open).
fn sync_read(dev: &mut dyn Device, off: u64, len: usize, timeout: Duration) -> Result<Vec<u8>> {
    let mut bufs = dev.alloc_buffers(1, len).map_err(|e| dev_err(dev, e))?;
    let buf = bufs
        .pop()
        .ok_or_else(|| StoreError::Internal("no buffer".into()))?;
    dev.submit(0, IoOp::Read { offset: off, buf })
        .map_err(|(e, _)| dev_err(dev, e))?;
    dev.kick().map_err(|e| dev_err(dev, e))?;
    let start = std::time::Instant::now();
    let mut done = Vec::new();
    loop {
        dev.poll(&mut done);
        if let Some(d) = done.pop() {
            d.result.map_err(|e| dev_err(dev, e))?;
            let buf = d
                .buf
                .ok_or_else(|| StoreError::Internal("read without its buffer".into()))?;
            let mut out = vec![0u8; len];
            buf.read(0, &mut out).map_err(|e| dev_err(dev, e))?;
            return Ok(out);
        }
        if start.elapsed() > timeout {
            return Err(StoreError::Timeout {
                waited: start.elapsed(),
                outstanding: 1,
            });
        }
        dev.wait(Duration::from_millis(1));
    }
}

/// Reads both superblock copies of `dev`: the valid one (A first), or why neither is.
pub(crate) fn read_superblock(dev: &mut dyn Device, timeout: Duration) -> Result<(Superblock, Vec<Finding>)> {
    let b = sync_read(dev, 0, 2 * PAGE, timeout)?;
    let name = dev.describe();
    let a = Superblock::decode(&b[..PAGE], &format!("superblock A of {name}"));
    let bb = Superblock::decode(&b[PAGE..], &format!("superblock B of {name}"));
    let mut findings = Vec::new();
    for r in [&a, &bb] {
        if let Err(c) = r {
            findings.push(Finding {
                object: c.object.clone(),
                detail: c.detail.clone(),
            });
        }
    }
    match (a, bb) {
        (Ok(s), _) | (Err(_), Ok(s)) => {
            if !findings.is_empty() {
                log::warn!("{}: using the other copy", findings[0].object);
            }
            Ok((s, findings))
        }
        (Err(ea), Err(_)) => {
            if !Superblock::has_magic(&b[..PAGE]) && !Superblock::has_magic(&b[PAGE..]) {
                Err(StoreError::NotAStore(format!(
                    "{name} holds no vfpoll store (no superblock): format it first (vfpoll store format)"
                )))
            } else {
                Err(StoreError::Corrupt(Corrupt {
                    object: format!("superblock of {name}"),
                    detail: format!("both copies are damaged ({})", ea.detail),
                }))
            }
        }
    }
}

/// Reads both root slots; the newer valid one (FORMAT.md §4).
pub(crate) fn read_root(io: &mut Io, uuid: &[u8; 16]) -> Result<Root> {
    let (roots, errs) = read_roots(io, uuid)?;
    roots
        .into_iter()
        .flatten()
        .max_by_key(|r| r.generation)
        .ok_or_else(|| {
            StoreError::Corrupt(Corrupt {
                object: "root".into(),
                detail: format!(
                    "no valid root in either slot ({}; {}): the format never finished, or both are damaged",
                    errs[0], errs[1]
                ),
            })
        })
}

/// Both root slots: each decoded or why not.
pub(crate) fn read_roots(io: &mut Io, uuid: &[u8; 16]) -> Result<([Option<Root>; 2], [String; 2])> {
    let mut b = vec![0u8; 2 * PAGE];
    io.read_member(0, ROOT_OFFSETS[0], &mut b)?;
    let mut roots = [None, None];
    let mut errs = [String::new(), String::new()];
    for slot in 0..2 {
        match Root::decode(&b[slot * PAGE..(slot + 1) * PAGE], slot, uuid) {
            Ok(r) => roots[slot] = Some(r),
            Err(c) => errs[slot] = c.detail,
        }
    }
    Ok((roots, errs))
}

/// Reads a blob at `loc` (whole pages).
pub(crate) fn read_blob(io: &mut Io, loc: &BlobLoc) -> Result<Vec<u8>> {
    let mut b = vec![0u8; loc.pages() as usize * PAGE];
    io.run(&mut [Job::Read {
        page: loc.page,
        dst: &mut b,
    }])?;
    Ok(b)
}

fn overlap(object: &str, page: u64, pages: u64) -> StoreError {
    StoreError::Corrupt(Corrupt {
        object: object.into(),
        detail: format!(
            "pages {page}..{} overlap another object or lie outside the store",
            page + pages
        ),
    })
}

/// Reads the catalog and every manifest of `root`, checks them, and rebuilds the free space
/// (FORMAT.md §8).
pub(crate) fn load_catalog(
    io: &mut Io,
    root: &Root,
    geo: &Geometry,
) -> Result<(Catalog, HashMap<u64, Arc<Manifest>>, Allocator)> {
    let mut alloc = Allocator::new(geo.pages());
    let cl = root.catalog;
    alloc
        .mark_used(cl.page, cl.pages())
        .map_err(|_| overlap("catalog", cl.page, cl.pages()))?;
    let blob = read_blob(io, &cl)?;
    let (id, body) = decode_blob(&blob, BlobKind::Catalog, &cl, "catalog")?;
    if id != root.generation {
        return Err(StoreError::Corrupt(Corrupt {
            object: "catalog".into(),
            detail: format!(
                "written for generation {id}, the root is generation {}",
                root.generation
            ),
        }));
    }
    let catalog = Catalog::decode(body)?;
    // All manifests in one batch.
    let locs: Vec<(String, &crate::format::VersionRec)> = catalog
        .checkpoints
        .iter()
        .flat_map(|c| c.versions.iter().map(move |v| (c.name.clone(), v)))
        .collect();
    let mut bufs: Vec<Vec<u8>> = locs
        .iter()
        .map(|(_, v)| vec![0u8; v.manifest.pages() as usize * PAGE])
        .collect();
    {
        let mut jobs: Vec<Job<'_>> = locs
            .iter()
            .zip(bufs.iter_mut())
            .map(|((_, v), b)| Job::Read {
                page: v.manifest.page,
                dst: b,
            })
            .collect();
        for (name, v) in &locs {
            if v.id >= root.next_id || v.manifest.page.saturating_add(v.manifest.pages()) > geo.pages() {
                return Err(StoreError::Corrupt(Corrupt {
                    object: format!("catalog entry of checkpoint {name:?} version {}", v.id),
                    detail: "version id or manifest location out of range".into(),
                }));
            }
        }
        io.run(&mut jobs)?;
    }
    let mut manifests = HashMap::new();
    for ((name, v), b) in locs.iter().zip(&bufs) {
        let object = format!("manifest of checkpoint {name:?} version {}", v.id);
        alloc
            .mark_used(v.manifest.page, v.manifest.pages())
            .map_err(|_| overlap(&object, v.manifest.page, v.manifest.pages()))?;
        let (id, body) = decode_blob(b, BlobKind::Manifest, &v.manifest, &object)?;
        let m = Manifest::decode(body, &object, geo.chunk_pages)?;
        let bytes: u64 = m.entries.iter().map(|e| e.len).sum();
        if id != v.id
            || m.id != v.id
            || &m.checkpoint != name
            || m.entries.len() != v.entries as usize
            || bytes != v.bytes
        {
            return Err(StoreError::Corrupt(Corrupt {
                object,
                detail: "does not match its catalog entry (id, checkpoint, entries or bytes)".into(),
            }));
        }
        for e in &m.entries {
            for x in &e.extents {
                alloc.mark_used(x.page, x.pages()).map_err(|_| {
                    overlap(&format!("{object} entry {:?} extent", e.name), x.page, x.pages())
                })?;
            }
        }
        manifests.insert(v.id, Arc::new(m));
    }
    for p in &catalog.pools {
        let object = format!("KV pool {:?}", p.name);
        if p.id >= root.next_id {
            return Err(StoreError::Corrupt(Corrupt {
                object,
                detail: format!(
                    "pool id {} is not below the root's next id {}",
                    p.id, root.next_id
                ),
            }));
        }
        alloc
            .mark_used(p.header_page, p.header_pages())
            .map_err(|_| overlap(&format!("{object} header table"), p.header_page, p.header_pages()))?;
        alloc
            .mark_used(p.data_page, p.data_pages())
            .map_err(|_| overlap(&format!("{object} data"), p.data_page, p.data_pages()))?;
    }
    Ok((catalog, manifests, alloc))
}
