//! I/O through the real driver, checked block by block against the model's namespaces: random
//! read/write mixes from 512 bytes to several MiB that cross page, PRP-list and MDTS boundaries
//! (split requests, chained PRP lists), dword-aligned buffer offsets, `RegionBuf`s, pool
//! `DmaBuf`s and buffers scattered page by page, PRPs and SGLs, several queue pairs on several
//! threads, 512- and 4096-byte LBAs; queue-full behaviour; Write Zeroes, Dataset Management,
//! Flush, Compare; requests refused before they reach the device.

mod drv;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_dma::{DmaBuf, PageSize};
use vfpoll_nvme::prp::PrpError;
use vfpoll_nvme::{Controller, IoBuffer, NvmeError, QpairOptions, QueuePair, RegionBuf, Rejected, Sct};
use vfpoll_nvme_model::{io_opcode as io, ModelConfig, NamespaceConfig, NvmeModel};

const T: Duration = Duration::from_secs(5);

/// Namespace 1: 8 MiB of 512-byte blocks; namespace 2: 8 MiB of 4096-byte blocks.
fn io_cfg(mdts: u8) -> ModelConfig {
    ModelConfig {
        namespaces: vec![
            NamespaceConfig::new(1, 512, 16384),
            NamespaceConfig::new(2, 4096, 2048),
        ],
        mdts,
        max_io_queue_pairs: 8,
        ..Default::default()
    }
}

/// Both namespaces filled with a pattern, and their shadows.
fn seeded(model: &NvmeModel) -> Vec<Shadow> {
    for nsid in [1, 2] {
        model
            .write_ns(nsid, 0, &pattern(1000 + nsid as u64, 8 << 20))
            .unwrap();
    }
    vec![Shadow::of(model, 1), Shadow::of(model, 2)]
}

fn qp_opts(entries: u16, sgl: bool) -> QpairOptions {
    QpairOptions {
        entries,
        sgl,
        timeout: T,
        ..Default::default()
    }
}

struct Op {
    ns: usize,
    slba: u64,
    blocks: u64,
    write: bool,
    /// What a write wrote, or what a read must find.
    expect: Vec<u8>,
}

/// A byte offset for a buffer: page aligned, sector aligned, any dword, or just before a page end.
fn offset(rng: &mut Rng) -> usize {
    match rng.below(4) {
        0 => 0,
        1 => 512 * rng.below(8) as usize,
        2 => 4 * rng.below(1024) as usize,
        _ => PAGE - 4 * (1 + rng.below(4) as usize),
    }
}

/// A transfer size in bytes for LBA size `lba`: mostly small, some medium, a few up to `max`.
fn size(rng: &mut Rng, lba: usize, max: usize) -> usize {
    let bytes = match rng.below(100) {
        0..50 => 512 * (1 + rng.below(16) as usize),
        50..85 => 1 + rng.below(256 * 1024) as usize,
        _ => 1 + rng.below(max as u64) as usize,
    };
    bytes.div_ceil(lba).max(1) * lba
}

/// `ops` random reads and writes, up to `qd` in flight, inside LBA windows `win[ns]`, never two
/// overlapping in flight. Writes update the shadows when they complete; reads are checked
/// against them.
#[allow(clippy::too_many_arguments)]
fn mix(
    ctrl: &Controller,
    qp: &mut QueuePair<RegionBuf>,
    rng: &mut Rng,
    sh: &mut [Shadow],
    win: &[(u64, u64)],
    ops: usize,
    max: usize,
    qd: usize,
) {
    let mut inflight: HashMap<u64, Op> = HashMap::new();
    let mut pending: Option<(u64, Op, RegionBuf)> = None;
    let (mut submitted, mut tag) = (0, 0u64);
    let mut done = Vec::new();
    let start = Instant::now();
    let mut empty = 0;
    while submitted < ops || !inflight.is_empty() {
        if pending.is_none() && submitted < ops && inflight.len() < qd {
            let ns = rng.below(sh.len() as u64) as usize;
            let lba = sh[ns].lba;
            let (lo, hi) = win[ns];
            let blocks = (size(rng, lba, max) / lba).min((hi - lo) as usize) as u64;
            let slba = lo + rng.below(hi - lo - blocks + 1);
            let clash = inflight
                .values()
                .any(|o| o.ns == ns && o.slba < slba + blocks && slba < o.slba + o.blocks);
            if !clash {
                let write = rng.below(2) == 0;
                let len = blocks as usize * lba;
                let expect = if write {
                    let mut d = vec![0; len];
                    rng.fill(&mut d);
                    d
                } else {
                    sh[ns].get(slba, len).to_vec()
                };
                let fill = if write { expect.clone() } else { vec![0xee; len] };
                let buf = region_buf(ctrl, offset(rng), &fill);
                tag += 1;
                let op = Op {
                    ns,
                    slba,
                    blocks,
                    write,
                    expect,
                };
                pending = Some((tag, op, buf));
            }
        }
        if let Some((t, op, buf)) = pending.take() {
            let nsid = op.ns as u32 + 1;
            let r = if op.write {
                qp.write(nsid, op.slba, buf, t)
            } else {
                qp.read(nsid, op.slba, buf, t)
            };
            match r {
                Ok(()) => {
                    inflight.insert(t, op);
                    submitted += 1;
                }
                Err(Rejected {
                    error: NvmeError::QueueFull { .. },
                    buf,
                }) => pending = Some((t, op, buf)),
                Err(r) => panic!("submit of {} blocks at {}: {}", op.blocks, op.slba, r.error),
            }
        }
        if qp.poll(usize::MAX, |d| done.push(d)) == 0 {
            empty += 1;
            relax(empty);
        }
        for d in done.drain(..) {
            let op = inflight.remove(&d.tag).expect("a tag in flight, delivered once");
            let what = format!(
                "{} of {} blocks at LBA {} of namespace {}",
                if op.write { "write" } else { "read" },
                op.blocks,
                op.slba,
                op.ns + 1
            );
            d.result.unwrap_or_else(|e| panic!("{what}: {e}"));
            let buf = d.buf.expect("buffer back");
            if op.write {
                sh[op.ns].write(op.slba, &op.expect);
            } else if contents(&buf) != op.expect {
                panic!("{what} returned other data");
            }
        }
        assert!(
            start.elapsed() < HANG * 3,
            "hang: {} in flight, {:?}",
            inflight.len(),
            qp.stats()
        );
    }
}

#[test]
fn random_mix_split_at_a_small_mdts_with_prps_and_sgls() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let mut rng = Rng::new(1);
    for sgl in [false, true] {
        let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(256, sgl)).unwrap();
        assert_eq!(qp.max_transfer(), 32 * 1024);
        mix(
            &rig.ctrl,
            &mut qp,
            &mut rng,
            &mut sh,
            &[(0, 16384), (0, 2048)],
            150,
            3 << 20,
            8,
        );
        let st = qp.stats();
        assert!(st.commands > st.requests, "requests were split: {st:?}");
        assert_eq!((st.errors, st.aborts, st.bogus_completions), (0, 0, 0));
    }
    for s in &sh {
        s.check(&rig.model);
    }
    assert_eq!(rig.model.stats().errors, 0);
}

#[test]
fn transfers_of_several_mib_use_chained_prp_lists() {
    // MDTS 8 MiB: one command moves up to 2048 pages, whose PRP list takes five chained pages.
    let rig = rig(ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, 32768)],
        mdts: 11,
        max_io_queue_pairs: 4,
        ..Default::default()
    });
    let mut sh = Shadow::of(&rig.model, 1);
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(16, false)).unwrap();
    assert_eq!(qp.max_transfer(), 8 << 20);
    let big = pattern(5, 8 << 20);
    let writes = rig.model.stats().io_commands(io::WRITE);
    sync(
        &mut qp,
        |q, b| q.write(1, 0, b, 1),
        region_buf(&rig.ctrl, 0, &big),
    )
    .result
    .unwrap();
    sh.write(0, &big);
    assert_eq!(
        rig.model.stats().io_commands(io::WRITE),
        writes + 1,
        "one command"
    );
    sh.check(&rig.model);
    // Unaligned by one dword: two commands, each touching no more than 2048 pages.
    let reads = rig.model.stats().io_commands(io::READ);
    let d = sync(
        &mut qp,
        |q, b| q.read(1, 0, b, 2),
        region_buf(&rig.ctrl, 4, &vec![0; 8 << 20]),
    );
    d.result.unwrap();
    assert!(contents(&d.buf.unwrap()) == big, "8 MiB read back");
    assert_eq!(rig.model.stats().io_commands(io::READ), reads + 2);
    // 6 MiB + 3 sectors at a sector offset, written over the middle, read back.
    let mid = pattern(6, (6 << 20) + 1536);
    sync(
        &mut qp,
        |q, b| q.write(1, 4099, b, 3),
        region_buf(&rig.ctrl, 512, &mid),
    )
    .result
    .unwrap();
    sh.write(4099, &mid);
    let d = sync(
        &mut qp,
        |q, b| q.read(1, 4099, b, 4),
        region_buf(&rig.ctrl, 3072, &vec![0; mid.len()]),
    );
    d.result.unwrap();
    assert!(contents(&d.buf.unwrap()) == mid);
    sh.check(&rig.model);
    // The same with pages scattered over the bus: every list entry a different page.
    let mut qs = rig.ctrl.create_qpair::<ScatterBuf>(&qp_opts(16, true)).unwrap();
    let mut rng = Rng::new(6);
    let data = pattern(7, 3 << 20);
    let b = ScatterBuf::new(&rig.ctrl, &mut rng, 2048, &data, None);
    sync(&mut qs, |q, b| q.write(1, 20000, b, 5), b).result.unwrap();
    sh.write(20000, &data);
    let b = ScatterBuf::new(&rig.ctrl, &mut rng, 4, &vec![0; data.len()], None);
    let d = sync(&mut qs, |q, b| q.read(1, 20000, b, 6), b);
    d.result.unwrap();
    assert!(d.buf.unwrap().contents() == data);
    sh.check(&rig.model);
}

#[test]
fn scattered_pages_with_prps_and_sgls_at_page_and_mdts_edges() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let mut rng = Rng::new(3);
    for sgl in [false, true] {
        let mut qp = rig.ctrl.create_qpair::<ScatterBuf>(&qp_opts(64, sgl)).unwrap();
        // Lengths around one and two pages, the PRP2-as-list edge, MDTS and its multiples.
        for (i, len) in [
            512usize, 4096, 4608, 8192, 8704, 12288, 32768, 33280, 65536, 200704,
        ]
        .into_iter()
        .enumerate()
        {
            for start in [0, 4, 512, 4092] {
                let ns = i % 2;
                let (lba, nsid) = (sh[ns].lba, ns as u32 + 1);
                let len = len.div_ceil(lba) * lba;
                let slba = rng.below(sh[ns].data.len() as u64 / lba as u64 - (len / lba) as u64);
                let data = pattern(rng.next_u64(), len);
                let b = ScatterBuf::new(&rig.ctrl, &mut rng, start, &data, None);
                sync(&mut qp, |q, b| q.write(nsid, slba, b, 1), b).result.unwrap();
                sh[ns].write(slba, &data);
                let b = ScatterBuf::new(&rig.ctrl, &mut rng, (start + 8) % PAGE, &vec![0; len], None);
                let d = sync(&mut qp, |q, b| q.read(nsid, slba, b, 2), b);
                d.result.unwrap();
                assert!(
                    d.buf.unwrap().contents() == data,
                    "len {len} start {start} sgl {sgl}"
                );
            }
        }
    }
    for s in &sh {
        s.check(&rig.model);
    }
}

#[test]
fn pool_buffers_at_queue_depth_with_both_lba_sizes() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let mut small = rig.ctrl.dma().pool(512, 64, PageSize::Base4K).unwrap();
    let mut large = rig.ctrl.dma().pool(4096, 64, PageSize::Base4K).unwrap();
    let mut rng = Rng::new(4);
    for sgl in [false, true] {
        let mut qp = rig.ctrl.create_qpair::<DmaBuf>(&qp_opts(64, sgl)).unwrap();
        // (tag) -> (namespace, slba, write?, expected data)
        let mut inflight: HashMap<u64, (usize, u64, bool, Vec<u8>)> = HashMap::new();
        let mut tag = 0;
        for _round in 0..20 {
            let qd = 1 + rng.below(48) as usize;
            for _ in 0..qd {
                let ns = rng.below(2) as usize;
                let pool = if ns == 0 { &mut small } else { &mut large };
                let b = pool.alloc().unwrap();
                let blocks = if ns == 0 { 16384 } else { 2048 };
                // Distinct LBAs per round: a block per in-flight request.
                let slba = loop {
                    let s = rng.below(blocks);
                    if !inflight.values().any(|o| o.0 == ns && o.1 == s) {
                        break s;
                    }
                };
                let write = rng.below(2) == 0;
                let expect = if write {
                    let d = pattern(rng.next_u64(), b.len());
                    pool.write(&b, 0, &d).unwrap();
                    d
                } else {
                    pool.write(&b, 0, &vec![0xee; b.len()]).unwrap();
                    sh[ns].get(slba, b.len()).to_vec()
                };
                tag += 1;
                let nsid = ns as u32 + 1;
                let r = if write {
                    qp.write(nsid, slba, b, tag)
                } else {
                    qp.read(nsid, slba, b, tag)
                };
                r.map_err(|r| r.error).unwrap();
                inflight.insert(tag, (ns, slba, write, expect));
            }
            for d in wait_for(&mut qp, qd, HANG) {
                let (ns, slba, write, expect) = inflight.remove(&d.tag).unwrap();
                d.result.unwrap();
                let b = d.buf.unwrap();
                let pool = if ns == 0 { &mut small } else { &mut large };
                if write {
                    sh[ns].write(slba, &expect);
                } else {
                    let mut got = vec![0; b.len()];
                    pool.read(&b, 0, &mut got).unwrap();
                    assert!(got == expect, "read of LBA {slba} namespace {}", ns + 1);
                }
                pool.free(b);
            }
        }
        assert_eq!((small.available(), large.available()), (64, 64));
    }
    for s in &sh {
        s.check(&rig.model);
    }
}

#[test]
fn queue_pairs_on_four_threads_at_once() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let results: Vec<Vec<Shadow>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let ctrl = rig.ctrl.clone();
                let mut mine: Vec<Shadow> = sh
                    .iter()
                    .map(|x| Shadow {
                        nsid: x.nsid,
                        lba: x.lba,
                        data: x.data.clone(),
                    })
                    .collect();
                s.spawn(move || {
                    let mut qp = ctrl.create_qpair::<RegionBuf>(&qp_opts(128, t % 2 == 1)).unwrap();
                    let mut rng = Rng::new(100 + t);
                    let win = [(t * 4096, (t + 1) * 4096), (t * 512, (t + 1) * 512)];
                    mix(&ctrl, &mut qp, &mut rng, &mut mine, &win, 60, 1 << 20, 6);
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, mine) in results.iter().enumerate() {
        for (ns, s) in mine.iter().enumerate() {
            let per = s.data.len() / 4;
            sh[ns].data[t * per..(t + 1) * per].copy_from_slice(&s.data[t * per..(t + 1) * per]);
        }
    }
    for s in &sh {
        s.check(&rig.model);
    }
}

#[test]
fn a_full_queue_refuses_with_the_buffer_back_and_recovers() {
    let rig = rig(io_cfg(3));
    let sh = seeded(&rig.model);
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(4, false)).unwrap();
    assert_eq!(qp.free_slots(), 3, "entries - 1 in flight");
    let reads = rig.model.stats().io_commands(io::READ);
    // Several rounds, so the rings wrap.
    for round in 0..5u64 {
        for i in 0..3 {
            qp.read(1, round * 3 + i, region_buf(&rig.ctrl, 0, &[0xee; 512]), i)
                .map_err(|r| r.error)
                .unwrap();
        }
        let extra = region_buf(&rig.ctrl, 0, &[0x5a; 512]);
        let at = extra.as_ptr();
        let r = qp.read(1, 100, extra, 9).unwrap_err();
        assert!(
            matches!(r.error, NvmeError::QueueFull { outstanding: 3, .. }),
            "{:?}",
            r.error
        );
        assert!(r.buf.as_ptr() == at && contents(&r.buf) == [0x5a; 512]);
        assert!(matches!(qp.flush(1, 9), Err(NvmeError::QueueFull { .. })));
        assert!(matches!(
            qp.write_zeroes(1, 0, 1, 9),
            Err(NvmeError::QueueFull { .. })
        ));
        assert!(matches!(
            qp.deallocate(1, &[(0, 1)], 9),
            Err(NvmeError::QueueFull { .. })
        ));
        for d in wait_for(&mut qp, 3, HANG) {
            assert_eq!(contents(&d.buf.unwrap()), sh[0].get(round * 3 + d.tag, 512));
        }
    }
    assert_eq!(
        rig.model.stats().io_commands(io::READ),
        reads + 15,
        "no refused request reached the device"
    );
    // A split request needs a free command slot per part.
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(8, false)).unwrap();
    for i in 0..6 {
        qp.read(1, i, region_buf(&rig.ctrl, 0, &[0; 512]), i)
            .map_err(|r| r.error)
            .unwrap();
    }
    let big = region_buf(&rig.ctrl, 0, &vec![0; 64 * 1024]);
    let r = qp.read(1, 0, big, 7).unwrap_err();
    assert!(
        matches!(r.error, NvmeError::QueueFull { outstanding: 6, .. }),
        "{:?}",
        r.error
    );
    wait_for(&mut qp, 6, HANG);
    let d = sync(&mut qp, |q, b| q.read(1, 0, b, 7), r.buf);
    d.result.unwrap();
    assert_eq!(contents(&d.buf.unwrap()), sh[0].get(0, 64 * 1024));
}

/// A request that needs more commands than the queue can ever hold must not be told to "poll
/// and submit again": nothing it could poll for would make room.
#[test]
fn a_request_larger_than_the_whole_queue_is_not_queue_full() {
    let rig = rig(io_cfg(3));
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(4, false)).unwrap();
    let buf = region_buf(&rig.ctrl, 0, &vec![0; 128 * 1024]); // 4 parts of 32 KiB, 3 slots
    match qp.read(1, 0, buf, 1) {
        Err(Rejected {
            error: e @ NvmeError::QueueFull { .. },
            ..
        }) => panic!("{e} with nothing in flight: retrying can never succeed"),
        Err(r) => assert!(
            matches!(r.error, NvmeError::TooLarge { .. } | NvmeError::InvalidOption(_)),
            "{:?}",
            r.error
        ),
        Ok(()) => {
            wait_for(&mut qp, 1, HANG).pop().unwrap().result.unwrap();
        }
    }
}

#[test]
fn write_zeroes_deallocate_flush_compare_and_fua() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(32, false)).unwrap();
    let ok = |d: vfpoll_nvme::Done<RegionBuf>| d.result.expect("success");
    // Write Zeroes, on both namespaces, up to the namespace end.
    qp.write_zeroes(1, 100, 50, 1).unwrap();
    qp.write_zeroes(1, 16384 - 7, 7, 2).unwrap();
    qp.write_zeroes(2, 10, 2000, 3).unwrap();
    for d in wait_for(&mut qp, 3, HANG) {
        assert!(d.buf.is_none());
        ok(d);
    }
    sh[0].zero(100, 50);
    sh[0].zero(16384 - 7, 7);
    sh[1].zero(10, 2000);
    // Deallocate: a few ranges, then the most one command takes (256).
    qp.deallocate(1, &[(1000, 8), (2000, 16), (16383, 1)], 4).unwrap();
    ok(wait_for(&mut qp, 1, HANG).pop().unwrap());
    for (s, n) in [(1000, 8), (2000, 16), (16383, 1)] {
        sh[0].zero(s, n);
    }
    let many: Vec<(u64, u32)> = (0..256).map(|i| (3000 + 3 * i, 2)).collect();
    qp.deallocate(1, &many, 5).unwrap();
    ok(wait_for(&mut qp, 1, HANG).pop().unwrap());
    for &(s, n) in &many {
        sh[0].zero(s, n as u64);
    }
    qp.deallocate(2, &[(0, 1), (2047, 1)], 6).unwrap();
    ok(wait_for(&mut qp, 1, HANG).pop().unwrap());
    sh[1].zero(0, 1);
    sh[1].zero(2047, 1);
    for s in &sh {
        s.check(&rig.model);
    }
    // Flush.
    qp.flush(1, 7).unwrap();
    qp.flush(2, 8).unwrap();
    wait_for(&mut qp, 2, HANG).into_iter().for_each(|d| {
        ok(d);
    });
    // Write with FUA.
    let d = pattern(9, 8192);
    ok(sync(
        &mut qp,
        |q, b| q.write_fua(2, 100, b, 9),
        region_buf(&rig.ctrl, 4, &d),
    ));
    sh[1].write(100, &d);
    // Compare: equal, different in one byte, and across the parts of a split request.
    for (nsid, slba, len) in [
        (1u32, 5000u64, 4096usize),
        (2, 100, 8192),
        (1, 6000, 64 * 1024),
        (2, 2012, 128 * 1024),
    ] {
        let s = &sh[nsid as usize - 1];
        let same = s.get(slba, len).to_vec();
        ok(sync(
            &mut qp,
            |q, b| q.compare(nsid, slba, b, 10),
            region_buf(&rig.ctrl, 8, &same),
        ));
        let mut other = same.clone();
        other[len - 100] ^= 1;
        let d = sync(
            &mut qp,
            |q, b| q.compare(nsid, slba, b, 11),
            region_buf(&rig.ctrl, 0, &other),
        );
        let st = status_of(&d.result);
        assert_eq!(
            (st.sct(), st.sc(), st.name()),
            (Sct::Media, 0x85, Some("Compare Failure"))
        );
        assert!(d
            .result
            .unwrap_err()
            .to_string()
            .starts_with("Compare failed: Compare Failure"));
    }
    for s in &sh {
        s.check(&rig.model);
    }
    let st = rig.model.stats();
    assert_eq!(
        (
            st.io_commands(io::WRITE_ZEROES),
            st.io_commands(io::DATASET_MANAGEMENT),
            st.io_commands(io::FLUSH)
        ),
        (3, 3, 2)
    );
    let smart = rig.ctrl.smart_log().unwrap();
    assert_eq!(smart.host_writes, st.io_commands(io::WRITE));
}

#[test]
fn invalid_requests_are_refused_before_the_device() {
    let rig = rig(io_cfg(3));
    let mut qp = rig.ctrl.create_qpair::<RegionBuf>(&qp_opts(16, false)).unwrap();
    let mut nosplit = rig
        .ctrl
        .create_qpair::<RegionBuf>(&QpairOptions {
            split: false,
            ..qp_opts(16, false)
        })
        .unwrap();
    let before = rig.model.stats();
    let buf = |len: usize, off: usize| region_buf(&rig.ctrl, off, &vec![0x77; len]);
    let refused = |r: Result<(), Rejected<RegionBuf>>, at: *mut u8| {
        let r = r.expect_err("refused");
        assert_eq!(r.buf.as_ptr(), at, "the same buffer comes back");
        assert!(
            contents(&r.buf).iter().all(|&x| x == 0x77),
            "and comes back untouched"
        );
        r.error
    };
    let check = |what: &str, e: NvmeError, ok: fn(&NvmeError) -> bool| {
        assert!(ok(&e), "{what}: {e:?}");
        e.to_string()
    };
    for (what, nsid, slba, len, off) in [
        ("past the end", 1, 16384, 512, 0),
        ("across the end", 1, 16383, 1024, 0),
        ("LBA overflow", 1, u64::MAX, 512, 0),
        ("ns2 past the end", 2, 2047, 8192, 0),
    ] {
        let b = buf(len, off);
        let at = b.as_ptr();
        let e = refused(qp.read(nsid, slba, b, 0), at);
        let text = check(what, e, |e| matches!(e, NvmeError::LbaOutOfRange { .. }));
        assert!(text.contains(&format!("outside namespace {nsid}")), "{text}");
    }
    for nsid in [0, 3, 7, u32::MAX] {
        let b = buf(512, 0);
        let at = b.as_ptr();
        let e = refused(qp.write(nsid, 0, b, 0), at);
        let text = check("unknown namespace", e, |e| {
            matches!(e, NvmeError::NoSuchNamespace { .. })
        });
        assert!(text.contains("active namespaces: [1, 2]"), "{text}");
    }
    let b = buf(512, 0);
    let at = b.as_ptr();
    check(
        "512 B on a 4 KiB namespace",
        refused(qp.read(2, 0, b, 0), at),
        |e| {
            matches!(
                e,
                NvmeError::BadLength {
                    len: 512,
                    block_bytes: 4096,
                    ..
                }
            )
        },
    );
    let b = buf(512, 2);
    let at = b.as_ptr();
    check("misaligned buffer", refused(qp.read(1, 0, b, 0), at), |e| {
        matches!(e, NvmeError::Buffer(PrpError::Misaligned(_)))
    });
    let b = buf(64 * 1024, 0);
    let at = b.as_ptr();
    check(
        "too large without splitting",
        refused(nosplit.write(1, 0, b, 0), at),
        |e| {
            matches!(
                e,
                NvmeError::TooLarge {
                    len: 65536,
                    mdts: 32768
                }
            )
        },
    );
    let b = buf(4096, 0);
    let at = b.as_ptr();
    check(
        "compare past the end",
        refused(qp.compare(1, 16380, b, 0), at),
        |e| matches!(e, NvmeError::LbaOutOfRange { .. }),
    );
    let invalid = |e: &NvmeError| matches!(e, NvmeError::InvalidOption(_));
    let range = |e: &NvmeError| matches!(e, NvmeError::LbaOutOfRange { .. });
    check("zero blocks", qp.write_zeroes(1, 0, 0, 0).unwrap_err(), invalid);
    check(
        "65537 blocks",
        qp.write_zeroes(1, 0, 65537, 0).unwrap_err(),
        invalid,
    );
    check(
        "zeroes past the end",
        qp.write_zeroes(2, 2000, 49, 0).unwrap_err(),
        range,
    );
    check("no ranges", qp.deallocate(1, &[], 0).unwrap_err(), invalid);
    check(
        "257 ranges",
        qp.deallocate(1, &[(0, 1); 257], 0).unwrap_err(),
        invalid,
    );
    check(
        "range past the end",
        qp.deallocate(1, &[(0, 1), (16384, 1)], 0).unwrap_err(),
        range,
    );
    check("empty range", qp.deallocate(1, &[(5, 0)], 0).unwrap_err(), range);
    check("flush of no namespace", qp.flush(9, 0).unwrap_err(), |e| {
        matches!(e, NvmeError::NoSuchNamespace { .. })
    });
    assert_eq!(
        rig.model.stats().commands(),
        before.commands(),
        "no command reached the device"
    );
    let st = qp.stats();
    assert_eq!((st.requests, st.commands, qp.outstanding()), (0, 0, 0));
    // And the queue pairs still work.
    let d = sync(&mut qp, |q, b| q.read(2, 2047, b, 1), buf(4096, 0));
    d.result.unwrap();
    sync(&mut nosplit, |q, b| q.read(1, 0, b, 1), buf(32 * 1024, 0))
        .result
        .unwrap();
}

#[test]
fn a_buffer_prps_cannot_describe_is_refused_whole_even_after_some_parts_were_queued() {
    let rig = rig(io_cfg(3));
    let mut sh = seeded(&rig.model);
    let mut qp = rig.ctrl.create_qpair::<ScatterBuf>(&qp_opts(16, false)).unwrap();
    let mut rng = Rng::new(8);
    let before = rig.model.stats().commands();
    // 64 KiB, split in two parts of 32 KiB: the bad page in the first part, then in the second
    // (after the first part's command was already written into the submission queue).
    for bad in [3, 10] {
        let data = pattern(bad as u64, 64 * 1024);
        let b = ScatterBuf::new(&rig.ctrl, &mut rng, 0, &data, Some(bad));
        let r = qp.write(1, 64, b, 1).unwrap_err();
        assert!(
            matches!(r.error, NvmeError::Buffer(PrpError::UnalignedPage { index, .. }) if index == bad % 8),
            "{:?}",
            r.error
        );
        assert_eq!(
            (qp.outstanding(), qp.free_slots()),
            (0, 15),
            "every slot given back"
        );
    }
    assert_eq!(qp.stats().commands, 0);
    // The rewound queue stays consistent: a burst of good requests completes correctly.
    for round in 0..3u64 {
        let mut expect = HashMap::new();
        for i in 0..5u64 {
            let data = pattern(round * 10 + i, 64 * 1024);
            let b = ScatterBuf::new(&rig.ctrl, &mut rng, 4 * i as usize, &data, None);
            let slba = 1024 * (round * 5 + i);
            qp.write(1, slba, b, i).map_err(|r| r.error).unwrap();
            expect.insert(i, (slba, data));
        }
        for d in wait_for(&mut qp, 5, HANG) {
            d.result.unwrap();
            let (slba, data) = &expect[&d.tag];
            sh[0].write(*slba, data);
        }
    }
    sh[0].check(&rig.model);
    // Per round one aligned request in two parts and four unaligned ones in three (a part of an
    // unaligned buffer is a page shorter, so it spans no more pages than MDTS allows).
    assert_eq!(
        rig.model.stats().commands(),
        before + 3 * (2 + 4 * 3),
        "only the good requests' commands"
    );
}

/// Compile-time check that pool buffers, region buffers and the scattered test buffer are all
/// `IoBuffer`s (a `Vec<u8>` is not: see the `compile_fail` example in the report).
#[test]
fn buffer_types_are_io_buffers() {
    fn is_io<B: IoBuffer>() {}
    is_io::<DmaBuf>();
    is_io::<RegionBuf>();
    is_io::<ScatterBuf>();
}
