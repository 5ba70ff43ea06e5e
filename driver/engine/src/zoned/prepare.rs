//! Set-up of a zoned range on a worker's queue pair: Report Zones, resets, the units per zone.

use std::ops::Range;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::zns::{self, Zone, ZoneAction, ZoneFilter, ZoneState};
use vfpoll_nvme::{Controller, Namespace, QueuePair};

use super::ZoneGeom;
use crate::slots::Slots;
use crate::EngineError;

/// What a worker learned of one zoned range at set-up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prepared {
    pub geom: ZoneGeom,
    pub zones: u64,
    /// Zones that need a Finish after their last I/O.
    pub finish: bool,
    /// Zones reset at set-up.
    pub resets: u64,
}

/// Set-up of one zoned range on the worker's queue pair: read its zones, reset them when the
/// run writes (and read them again), check their states, and work out the units per zone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare<S: Slots>(
    qp: &mut QueuePair<S::Buf>,
    ctrl: &Controller,
    page: PageSize,
    timeout: Duration,
    device: &str,
    ns: &Namespace,
    lbas: Range<u64>,
    io_blocks: u64,
    write: bool,
) -> Result<Prepared, EngineError> {
    let z = ns.zoned.expect("a zoned namespace");
    let nsid = ns.nsid;
    let zb = z.identify.zone_size;
    let first = lbas.start / zb;
    let count = (lbas.end - lbas.start) / zb;
    let mut rep = Reporter::<S>::new(ctrl.dma(), page, qp.max_transfer(), device)?;
    let mut zones = rep.zones(qp, nsid, zb, first, count, z.identify.zone_ext_size, timeout)?;
    let bad = |why: String| Err(EngineError::Invalid(format!("{device} namespace {nsid}: {why}")));
    let mut resets = 0;
    if write {
        for zn in &zones {
            if matches!(zn.state, ZoneState::Offline | ZoneState::ReadOnly) {
                return bad(format!(
                    "the zone at LBA {} is {}: it cannot be written; run on a range without it (--size)",
                    zn.start, zn.state
                ));
            }
        }
        let dirty: Vec<u64> = zones
            .iter()
            .filter(|zn| zn.state != ZoneState::Empty)
            .map(|zn| zn.start)
            .collect();
        resets = dirty.len() as u64;
        reset(qp, device, nsid, &dirty, timeout)?;
        if !dirty.is_empty() {
            zones = rep.zones(qp, nsid, zb, first, count, z.identify.zone_ext_size, timeout)?;
        }
        if let Some(zn) = zones
            .iter()
            .find(|zn| zn.state != ZoneState::Empty || zn.write_pointer != zn.start)
        {
            return bad(format!(
                "the zone at LBA {} is {} with its write pointer at {} after Reset Zone; expected empty at its start",
                zn.start, zn.state, zn.write_pointer
            ));
        }
    } else if let Some(zn) = zones.iter().find(|zn| zn.state == ZoneState::Offline) {
        return bad(format!(
            "the zone at LBA {} is offline: reads of it fail; run on a range without it (--size)",
            zn.start
        ));
    }
    let cap = zones.iter().map(|zn| zn.capacity).min().unwrap_or(0);
    let per_zone = cap / io_blocks;
    if per_zone == 0 {
        return bad(format!(
            "its zones can be written up to {cap} blocks ({} bytes; the zone capacity), less than one I/O of {io_blocks} blocks: use an I/O size of at most the zone capacity",
            cap * ns.lba_size as u64
        ));
    }
    Ok(Prepared {
        geom: ZoneGeom {
            zone_blocks: zb,
            per_zone,
        },
        zones: count,
        finish: zones.iter().any(|zn| zn.capacity != per_zone * io_blocks),
        resets,
    })
}

/// Reset Zone for each zone starting at `starts`, several in flight.
fn reset<B: vfpoll_nvme::IoBuffer>(
    qp: &mut QueuePair<B>,
    device: &str,
    nsid: u32,
    starts: &[u64],
    timeout: Duration,
) -> Result<(), EngineError> {
    let (mut sent, mut done) = (0, 0);
    let mut failed: Option<EngineError> = None;
    let limit = timeout * 2 + Duration::from_secs(10);
    let deadline = Instant::now() + limit;
    while done < starts.len() {
        while sent < starts.len() && qp.free_slots() > 0 && failed.is_none() {
            let zslba = starts[sent];
            qp.zone_action(nsid, zslba, ZoneAction::Reset, false, zslba)
                .map_err(|source| EngineError::Nvme {
                    device: format!("{device} namespace {nsid}: Reset Zone of the zone at LBA {zslba}"),
                    source,
                })?;
            sent += 1;
        }
        if failed.is_some() && done == sent {
            break;
        }
        qp.poll(usize::MAX, |d| {
            done += 1;
            if let Err(source) = d.result {
                failed.get_or_insert(EngineError::Nvme {
                    device: format!(
                        "{device} namespace {nsid}: Reset Zone of the zone at LBA {}",
                        d.tag
                    ),
                    source,
                });
            }
        });
        if Instant::now() > deadline {
            return Err(EngineError::Invalid(format!(
                "{device} namespace {nsid}: {} of {} Reset Zone commands did not complete within {limit:?}",
                sent - done,
                starts.len(),
            )));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Reads zone reports through one small buffer of the worker's buffer kind.
struct Reporter<S: Slots> {
    buf: S,
    len: usize,
    device: String,
}

impl<S: Slots> Reporter<S> {
    fn new(dma: &DmaContext, page: PageSize, max_xfer: usize, device: &str) -> Result<Self, EngineError> {
        let len = (page.bytes() as usize).min(64 << 10).min(max_xfer);
        let buf = S::new(dma, len, 1, page).map_err(|source| EngineError::Dma {
            device: device.into(),
            source,
        })?;
        Ok(Reporter {
            buf,
            len,
            device: device.into(),
        })
    }

    /// The descriptors of `count` zones from zone index `first`.
    #[allow(clippy::too_many_arguments)]
    fn zones(
        &mut self,
        qp: &mut QueuePair<S::Buf>,
        nsid: u32,
        zb: u64,
        first: u64,
        count: u64,
        ext: usize,
        timeout: Duration,
    ) -> Result<Vec<Zone>, EngineError> {
        let err = |why: String| EngineError::Invalid(format!("{} namespace {nsid}: {why}", self.device));
        let mut out: Vec<Zone> = Vec::with_capacity(count as usize);
        let mut bytes = vec![0u8; self.len];
        while (out.len() as u64) < count {
            let slba = (first + out.len() as u64) * zb;
            let b = self.buf.take(0);
            if let Err(r) = qp.report_zones(nsid, slba, ZoneFilter::All, true, b, 0) {
                self.buf.put(0, r.buf);
                return Err(EngineError::Nvme {
                    device: format!("{} namespace {nsid}: Report Zones from LBA {slba}", self.device),
                    source: r.error,
                });
            }
            let deadline = Instant::now() + timeout * 2 + Duration::from_secs(10);
            let mut got = None;
            while got.is_none() {
                qp.poll(1, |d| got = Some(d));
                if got.is_none() && Instant::now() > deadline {
                    return Err(err(format!("Report Zones from LBA {slba} did not complete")));
                }
            }
            let d = got.expect("a completion");
            let Some(b) = d.buf else {
                return Err(err(
                    "the queue pair kept the zone report buffer after a failure".into()
                ));
            };
            self.buf.put(0, b);
            d.result.map_err(|source| EngineError::Nvme {
                device: format!("{} namespace {nsid}: Report Zones from LBA {slba}", self.device),
                source,
            })?;
            self.buf.load(0, &mut bytes).map_err(|source| EngineError::Dma {
                device: self.device.clone(),
                source,
            })?;
            let (_, zones) = zns::parse_report(&bytes, ext);
            if zones.is_empty() {
                return Err(err(format!("Report Zones from LBA {slba} listed no zone")));
            }
            for zn in zones {
                if out.len() as u64 == count {
                    break;
                }
                let want = (first + out.len() as u64) * zb;
                if zn.start != want {
                    return Err(err(format!(
                        "Report Zones listed a zone at LBA {} where the zone at {want} was expected",
                        zn.start
                    )));
                }
                out.push(zn);
            }
        }
        Ok(out)
    }
}
