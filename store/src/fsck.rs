//! fsck: checks every committed structure and every extent's crc32c (FORMAT.md §9), reports
//! findings, changes nothing.

use crate::error::{Result, StoreError};
use crate::format::{crc32c, decode_blob, BlobKind, Catalog, Manifest, Superblock, PAGE};
use crate::io::Job;
use crate::store::{read_blob, read_roots, Finding, FsckReport, Store};

/// Data read per batch.
const BATCH_BYTES: usize = 64 << 20;

fn finding(object: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding {
        object: object.into(),
        detail: detail.into(),
    }
}

impl Store {
    /// Runs fsck: re-reads and checks every superblock copy, both roots, the catalog, every
    /// manifest, every extent's crc32c and every occupied KV slot's data crc; reports what it
    /// finds and changes nothing. An error means it could not run (I/O), not a finding.
    pub fn fsck(&self) -> Result<FsckReport> {
        run(self)
    }
}

fn run(store: &Store) -> Result<FsckReport> {
    let mut rep = FsckReport::default();
    // The metadata lock is held while the checkpoints are checked: otherwise a commit (its
    // I/O on another channel) could write a newer root, and free and reuse pages of the
    // catalog, manifests and extents checked, between this snapshot and their reads.
    let m = store.meta();
    let (root, catalog, manifests, pools) = {
        let manifests: Vec<_> = m
            .catalog
            .checkpoints
            .iter()
            .flat_map(|c| c.versions.iter().map(move |v| (c.name.clone(), *v)))
            .map(|(n, v): (String, crate::format::VersionRec)| (n, v, m.manifests.get(&v.id).cloned()))
            .collect();
        (
            m.root.clone(),
            m.catalog.clone(),
            manifests,
            m.catalog.pools.clone(),
        )
    };
    let uuid = store.inner.sb.uuid;
    let mut io = store.io();
    // Superblocks.
    for (i, mem) in store.inner.members.iter().enumerate() {
        let mut b = vec![0u8; 2 * PAGE];
        io.read_member(i, 0, &mut b)?;
        for (c, copy) in ["A", "B"].iter().enumerate() {
            let object = format!("superblock {copy} of member {i} ({})", mem.device);
            match Superblock::decode(&b[c * PAGE..(c + 1) * PAGE], &object) {
                Ok(sb) if sb.uuid != uuid || sb.member != i as u32 => rep
                    .findings
                    .push(finding(object, "names another store or member")),
                Ok(_) => {}
                Err(e) => rep.findings.push(finding(e.object, e.detail)),
            }
        }
    }
    // Roots: the newest valid one must be the one in use.
    let (roots, errs) = read_roots(&mut io, &uuid)?;
    match roots.iter().flatten().max_by_key(|r| r.generation) {
        Some(r) if *r == root => {}
        Some(r) => rep.findings.push(finding(
            "root",
            format!(
                "the newest valid root is generation {}, the store runs on {}",
                r.generation, root.generation
            ),
        )),
        None => rep.findings.push(finding(
            "root",
            format!("no valid root ({}; {})", errs[0], errs[1]),
        )),
    }
    // Catalog.
    let blob = read_blob(&mut io, &root.catalog)?;
    match decode_blob(&blob, BlobKind::Catalog, &root.catalog, "catalog")
        .and_then(|(_, b)| Catalog::decode(b))
    {
        Ok(c) if c == catalog => {}
        Ok(_) => rep
            .findings
            .push(finding("catalog", "differs from the catalog in use")),
        Err(e) => rep.findings.push(finding(e.object, e.detail)),
    }
    // Manifests and extents.
    let chunk_pages = store.chunk_pages();
    let mut extents: Vec<(String, crate::format::Extent)> = Vec::new();
    for (name, v, m) in &manifests {
        rep.versions += 1;
        let object = format!("manifest of checkpoint {name:?} version {}", v.id);
        let blob = read_blob(&mut io, &v.manifest)?;
        match decode_blob(&blob, BlobKind::Manifest, &v.manifest, &object)
            .and_then(|(_, b)| Manifest::decode(b, &object, chunk_pages))
        {
            Ok(d) if m.as_deref() == Some(&d) => {}
            Ok(_) => rep
                .findings
                .push(finding(&object, "differs from the manifest in use")),
            Err(e) => rep.findings.push(finding(e.object, e.detail)),
        }
        if let Some(m) = m {
            for e in &m.entries {
                rep.entries += 1;
                let obj = format!("checkpoint {name:?} version {} entry {:?}", v.id, e.name);
                extents.extend(e.extents.iter().map(|x| (obj.clone(), *x)));
            }
        }
    }
    let mut i = 0;
    while i < extents.len() {
        let mut j = i;
        let mut bytes = 0usize;
        while j < extents.len() && (j == i || bytes + extents[j].1.len as usize <= BATCH_BYTES) {
            bytes += extents[j].1.len as usize;
            j += 1;
        }
        let mut bufs: Vec<Vec<u8>> = extents[i..j]
            .iter()
            .map(|(_, x)| vec![0u8; x.len as usize])
            .collect();
        let mut jobs: Vec<Job<'_>> = extents[i..j]
            .iter()
            .zip(bufs.iter_mut())
            .map(|((_, x), b)| Job::Read { page: x.page, dst: b })
            .collect();
        io.run(&mut jobs)?;
        drop(jobs);
        for ((obj, x), b) in extents[i..j].iter().zip(&bufs) {
            rep.extents += 1;
            rep.bytes += x.len as u64;
            let got = crc32c(b);
            if got != x.crc {
                rep.findings.push(finding(
                    obj,
                    format!(
                        "extent at logical page {}: crc32c {got:#010x}, the manifest says {:#010x}",
                        x.page, x.crc
                    ),
                ));
            }
        }
        i = j;
    }
    drop(io);
    drop(m);
    for p in &pools {
        match crate::kv::fsck_pool(store, p) {
            Ok((slots, found)) => {
                rep.kv_slots += slots;
                rep.findings.extend(found);
            }
            Err(StoreError::Corrupt(c)) => rep.findings.push(finding(c.object, c.detail)),
            Err(e) => return Err(e),
        }
    }
    Ok(rep)
}
