//! How one I/O of a job moves bytes on a namespace, by the namespace's format: the data buffer
//! (data, plus metadata for an extended LBA), the separate metadata buffer, and the bytes of
//! either that the controller owns (its protection information, skipped by verify).

use std::ops::Range;

use vfpoll_nvme::format::{Access, PiMode};
use vfpoll_nvme::Namespace;

use crate::job::{JobSpec, WorkerSpec};
use crate::EngineError;

/// How one I/O of the job moves bytes on a namespace, by its format.
pub(crate) struct IoLayout {
    pub block_bytes: usize,
    pub meta_bytes: usize,
    pub data_len: usize,
    pub meta_len: usize,
    pub data_skip: Option<Range<usize>>,
    pub meta_skip: Option<Range<usize>>,
}

impl IoLayout {
    pub(crate) fn of(job: &JobSpec, device: &str, n: &Namespace) -> Result<Self, EngineError> {
        let bad = |why: String| {
            Err(EngineError::Invalid(format!(
                "{device} namespace {}: {why}",
                n.nsid
            )))
        };
        let format = match n.format {
            Ok(f) => f,
            Err(e) => return bad(format!("its format is unusable ({e})")),
        };
        let access = match Access::new(&format, job.qpair.protection) {
            Ok(a) => a,
            Err(why) => return bad(format!("({format}) cannot be used for I/O: {why}")),
        };
        if format.protection.is_some() && job.qpair.protection != PiMode::Controller {
            return bad(format!(
                "({format}) has protection information and the run does not generate it: use PiMode::Controller"
            ));
        }
        // The controller's PI inside metadata that moves (PRACT with more metadata than PI).
        let pi = format.protection.and_then(|p| {
            let size = p.format.size();
            let moves = access.block_bytes > format.data_size || access.meta_bytes != 0;
            let at = if p.first { 0 } else { format.metadata_size - size };
            moves.then_some(at..at + size)
        });
        let ds = format.data_size;
        let blocks = (job.io_size / n.lba_size) as u64;
        let (data_len, meta_len) = access.transfer(blocks);
        let extended = access.block_bytes > ds;
        Ok(IoLayout {
            block_bytes: access.block_bytes,
            meta_bytes: access.meta_bytes,
            data_len: data_len as usize,
            meta_len: meta_len as usize,
            data_skip: pi.clone().filter(|_| extended).map(|r| ds + r.start..ds + r.end),
            meta_skip: pi.filter(|_| access.meta_bytes != 0),
        })
    }
}

/// The largest data or metadata buffer any queue of the worker needs.
pub(crate) fn largest_buffer(job: &JobSpec, spec: &WorkerSpec) -> Result<usize, EngineError> {
    let mut most = 0;
    for t in &spec.targets {
        let n = t.ctrl.namespace(t.nsid).map_err(|source| EngineError::Nvme {
            device: t.device.clone(),
            source,
        })?;
        let io = IoLayout::of(job, &t.device, &n)?;
        most = most.max(io.data_len).max(io.meta_len);
    }
    Ok(most)
}
