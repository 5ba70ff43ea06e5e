//! The engine on zoned namespaces, over the real driver and the in-process model: workers own
//! whole zones, zones are reset before they are written and written in order at their write
//! pointers (several at once, one write in flight each), verify reads back every written block,
//! remainders past the last I/O of a zone are finished, long runs wrap with resets, and what
//! cannot run on zones is refused with the reason.

use std::time::Duration;

use vfpoll_engine::pattern::Found;
use vfpoll_engine::{
    split_evenly, Engine, JobSpec, Limit, Namespace, Report, Target, WorkerSpec, Workload, ZoneReport,
};
use vfpoll_nvme::Controller;
use vfpoll_nvme_model::{FaultCheck, NamespaceConfig, NvmeModel, ZoneInfo, ZoneState, ZonedConfig};

mod common;

/// Zones of namespace 1: 256 blocks of 4 KiB (1 MiB), 192 writable, as the test bed's.
const ZONE: u64 = 256;
const CAP: u64 = 192;
const ZONES: u64 = 16;

fn bring_up() -> (FaultCheck, NvmeModel, Controller) {
    let mut z = ZonedConfig::new(ZONE);
    z.zone_capacity = CAP;
    z.max_open = 4;
    z.max_active = 6;
    common::bring_up(common::config(vec![
        NamespaceConfig::new(1, 4096, ZONE * ZONES).zoned(z),
        NamespaceConfig::new(2, 4096, 2048),
    ]))
}

fn job(workload: Workload, io_size: usize, qd: u16, verify: bool, seed: u64) -> JobSpec {
    JobSpec {
        rwmix_read: 50,
        io_size,
        queue_depth: qd,
        verify,
        seed,
        ..common::job(workload, Limit::Time(Duration::from_secs(1)))
    }
}

fn ns(ctrl: &Controller, nsid: u32) -> Namespace {
    common::ns(ctrl, nsid, None)
}

fn run(job: JobSpec, workers: Vec<WorkerSpec>) -> Report {
    Engine::start(job, workers)
        .unwrap()
        .run(Duration::from_millis(100), |_| {})
        .unwrap()
}

fn refused(job: JobSpec, workers: Vec<WorkerSpec>) -> String {
    let e = Engine::start(job, workers).unwrap_err();
    let mut s = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(c) = src {
        s += &format!(": {c}");
        src = c.source();
    }
    s
}

/// The zone reports of namespace 1, worker by worker.
fn zone_reports(r: &Report) -> Vec<ZoneReport> {
    r.workers
        .iter()
        .flat_map(|w| w.queues.iter().flat_map(|q| q.zoned.iter().cloned()))
        .collect()
}

fn zones(model: &NvmeModel) -> Vec<ZoneInfo> {
    model.zones(1).unwrap()
}

/// The LBA and seed the pattern of a block names.
fn tag(model: &NvmeModel, lba: u64) -> (u64, u64) {
    let b = model.read_ns(1, lba, 1).unwrap();
    let w = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    (w(0), w(8))
}

#[test]
fn verify_on_zones_with_two_workers_at_qd16_then_again_with_resets_and_finishes() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    // 16 KiB I/Os divide the 192-block capacity: 48 per zone, every zone ends full by its last
    // write. Each worker owns 8 zones and writes 2 at once (4 open zones between 2 writers).
    let workers = split_evenly(&[None, None], &[ns(&ctrl, 1)], 16384).unwrap();
    assert_eq!(workers[0].targets[0].lbas, 0..8 * ZONE);
    assert_eq!(workers[1].targets[0].lbas, 8 * ZONE..16 * ZONE);
    let r = run(job(Workload::Write, 16384, 16, true, 1), workers);
    let v = r.verify.clone().unwrap();
    assert!(r.passed(), "{:?} {:?}", r.error_samples, v.samples);
    let blocks = ZONES * CAP;
    assert_eq!(
        (v.blocks_written, v.blocks_checked, v.mismatches),
        (blocks, blocks, 0)
    );
    let zr = zone_reports(&r);
    assert_eq!(zr.len(), 2);
    for z in &zr {
        assert_eq!(
            (z.nsid, z.zones, z.ios_per_zone, z.at_once, z.resets, z.finishes),
            (1, 8, 48, 2, 0, 0),
            "fresh zones need no reset; 16 KiB fills each zone to capacity"
        );
    }
    for z in zones(&model) {
        assert_eq!((z.state, z.capacity), (ZoneState::Full, CAP), "{z:?}");
    }
    let st = model.stats();
    assert_eq!(st.io_commands(0x01), ZONES * 48);
    assert_eq!(st.io_commands(0x79), 0, "no zone management needed");
    // Every written block names its own LBA; the unwritable rest of a zone stays zero.
    assert_eq!(tag(&model, 5 * ZONE + 191), (5 * ZONE + 191, 1));
    assert!(model
        .read_ns(1, 5 * ZONE + 192, 1)
        .unwrap()
        .iter()
        .all(|&b| b == 0));

    // Again, over full zones, with 40 KiB I/Os (10 blocks: 19 per zone, 2 blocks left) read back
    // in random order: each worker resets its 8 zones first and finishes each after its last I/O.
    let before = model.stats();
    let workers = split_evenly(&[None, None], &[ns(&ctrl, 1)], 40960).unwrap();
    let r = run(job(Workload::RandRead, 40960, 16, true, 2), workers);
    let v = r.verify.clone().unwrap();
    assert!(r.passed(), "{:?} {:?}", r.error_samples, v.samples);
    let blocks = ZONES * 190;
    assert_eq!(
        (v.blocks_written, v.blocks_checked, v.mismatches),
        (blocks, blocks, 0)
    );
    for z in zone_reports(&r) {
        assert_eq!(
            (z.zones, z.ios_per_zone, z.at_once, z.resets, z.finishes),
            (8, 19, 2, 8, 8)
        );
    }
    let st = model.stats();
    assert_eq!(st.io_commands(0x01) - before.io_commands(0x01), ZONES * 19);
    assert_eq!(st.io_commands(0x79) - before.io_commands(0x79), ZONES * 2);
    for z in zones(&model) {
        assert_eq!(z.state, ZoneState::Full, "{z:?}");
    }
    // This run's pattern up to the last I/O of each zone; the skipped remainder was reset away.
    assert_eq!(tag(&model, 7 * ZONE + 189), (7 * ZONE + 189, 2));
    assert!(model
        .read_ns(1, 7 * ZONE + 190, 2)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_counted_write_run_wraps_resetting_each_zone_before_writing_it_again() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let workers = split_evenly(&[None], &[ns(&ctrl, 1)], 16384).unwrap();
    let writes = 2 * ZONES * 48 + 5;
    let mut j = job(Workload::Write, 16384, 32, false, 3);
    j.limit = Limit::Ios(writes);
    let r = run(j, workers);
    assert_eq!(
        (r.errors, r.write.ios, r.read.ios),
        (0, writes, 0),
        "{:?}",
        r.error_samples
    );
    let zr = zone_reports(&r);
    assert_eq!(zr[0].at_once, 4, "queue depth 32, but 4 zones open at once");
    assert!(zr[0].resets >= ZONES, "{zr:?}: the second pass resets every zone");
    assert_eq!(model.stats().io_commands(0x01), writes);
    // Two whole passes and 5 writes of a third: every zone is full, or reset and written in
    // order from its start (and the third pass's 5 writes are all there is in those).
    let mut third = 0;
    for z in zones(&model) {
        match z.state {
            ZoneState::Full => {}
            ZoneState::Empty | ZoneState::ImplicitlyOpened => {
                let n = z.write_pointer - z.start;
                assert!(n.is_multiple_of(4) && n < CAP, "{z:?}");
                third += n / 4;
            }
            s => panic!("zone {z:?} left {s:?}"),
        }
    }
    assert_eq!(third, 5);
    // A timed run works the same way.
    let workers = split_evenly(&[None], &[ns(&ctrl, 1)], 16384).unwrap();
    let mut j = job(Workload::Write, 16384, 8, false, 4);
    j.limit = Limit::Time(Duration::from_millis(300));
    let r = run(j, workers);
    assert!(r.errors == 0 && r.write.ios > 0, "{:?}", r.error_samples);
}

#[test]
fn reads_stay_below_zone_capacity_and_need_no_reset() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let workers = split_evenly(&[None, None], &[ns(&ctrl, 1)], 16384).unwrap();
    run(job(Workload::Write, 16384, 8, true, 5), workers);
    let before = model.stats();
    for workload in [Workload::RandRead, Workload::Read] {
        let workers = split_evenly(&[None, None, None], &[ns(&ctrl, 1)], 16384).unwrap();
        let mut j = job(workload, 16384, 8, false, 6);
        j.limit = Limit::Ios(3000);
        let r = run(j, workers);
        assert_eq!(
            (r.errors, r.read.ios, r.write.ios),
            (0, 3000, 0),
            "{:?}",
            r.error_samples
        );
        for z in zone_reports(&r) {
            assert_eq!((z.ios_per_zone, z.at_once, z.resets), (48, 0, 0));
        }
    }
    let st = model.stats();
    assert_eq!(st.io_commands(0x02) - before.io_commands(0x02), 6000);
    assert_eq!(st.io_commands(0x79), 0, "reading resets nothing");
    for z in zones(&model) {
        assert_eq!(z.state, ZoneState::Full, "reads leave the zones as they were");
    }
}

#[test]
fn a_zoned_and_a_plain_namespace_in_one_verify_at_queue_depth_one() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let spaces = [ns(&ctrl, 1), ns(&ctrl, 2)];
    let workers = split_evenly(&[None, None], &spaces, 4096).unwrap();
    let r = run(job(Workload::Write, 4096, 1, true, 7), workers);
    let v = r.verify.clone().unwrap();
    assert!(r.passed(), "{:?} {:?}", r.error_samples, v.samples);
    assert_eq!(v.blocks_written, ZONES * CAP + 2048);
    for z in zone_reports(&r) {
        assert_eq!(z.at_once, 1, "queue depth 1: one zone at a time");
    }
    assert!(zones(&model).iter().all(|z| z.state == ZoneState::Full));
}

#[test]
fn a_failed_write_gives_its_zone_up_and_verify_names_the_blocks() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    // The first write (zone 0, LBA 0) fails without touching the medium.
    common::fail_next(&model, 0x01);
    let workers = split_evenly(&[None], &[ns(&ctrl, 1)], 16384).unwrap();
    let r = run(job(Workload::Write, 16384, 4, true, 8), workers);
    assert!(!r.passed());
    assert_eq!(r.errors, 1, "{:?}", r.error_samples);
    assert!(
        r.error_samples[0].contains("Data Transfer Error"),
        "{:?}",
        r.error_samples
    );
    let v = r.verify.clone().unwrap();
    // Zone 0 is given up (finished): all of its 192 blocks read back as zeroes.
    assert_eq!(v.mismatches, CAP);
    assert_eq!(v.blocks_written, (ZONES - 1) * CAP);
    assert!(
        v.samples.iter().all(|m| m.lba < CAP && m.found == Found::Zeroes),
        "{:?}",
        v.samples
    );
    assert_eq!(zone_reports(&r)[0].finishes, 1);
    assert!(zones(&model).iter().all(|z| z.state == ZoneState::Full));
}

#[test]
fn what_zones_cannot_take_is_refused_with_the_reason() {
    let (_no_stray_dma, _model, ctrl) = bring_up();
    let one = |io| split_evenly(&[None], &[ns(&ctrl, 1)], io).unwrap();
    for (w, verify) in [
        (Workload::RandWrite, false),
        (Workload::RandWrite, true),
        (Workload::RandRw, false),
        (Workload::Rw, false),
    ] {
        let e = refused(job(w, 4096, 4, verify, 1), one(4096));
        assert!(
            e.contains("namespace 1 is zoned")
                && e.contains(&format!("{w} cannot run on it"))
                && e.contains("a zone takes writes only in order at its write pointer")
                && e.contains("use `write`")
                && e.contains("`randread`"),
            "{e}"
        );
    }
    // Larger than the zone capacity (reads too stay below it), larger than the zone, more than
    // one command (MDTS 128 KiB).
    let e = refused(job(Workload::RandRead, 1 << 20, 4, false, 1), one(1 << 20));
    assert!(e.contains("192 blocks") && e.contains("zone capacity"), "{e}");
    let e = refused(job(Workload::Write, 2 << 20, 4, false, 1), one(2 << 20));
    assert!(e.contains("larger than its zones of 256 blocks"), "{e}");
    let e = refused(job(Workload::Write, 256 << 10, 4, false, 1), one(256 << 10));
    assert!(
        e.contains("more than one command") && e.contains("at most 131072 bytes"),
        "{e}"
    );
    // Reads of any size up to the capacity are fine, split or not.
    let mut j = job(Workload::RandRead, 256 << 10, 4, false, 1);
    j.limit = Limit::Ios(20);
    assert_eq!(run(j, one(256 << 10)).errors, 0);
    // More writers than the 4 open zones; more workers than zones.
    let five = split_evenly(&[None; 5], &[ns(&ctrl, 1)], 4096).unwrap();
    assert_eq!(five[4].targets[0].lbas, 12 * ZONE..16 * ZONE);
    let e = refused(job(Workload::Write, 4096, 4, false, 1), five.clone());
    assert!(
        e.contains(
            "lets 4 zones be open at once (max open 4, max active 6), fewer than the 5 workers writing it"
        ) && e.contains("use at most 4 workers"),
        "{e}"
    );
    let mut j = job(Workload::RandRead, 4096, 4, false, 1);
    j.limit = Limit::Ios(50);
    assert_eq!(run(j, five).errors, 0, "five readers are fine");
    let e = split_evenly(&[None; 17], &[ns(&ctrl, 1)], 4096)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("16 whole zone(s)") && e.contains("fewer than the 17 workers"),
        "{e}"
    );
    let mut small = ns(&ctrl, 1);
    small.size = Some((1 << 20) * 3 / 2);
    let w = split_evenly(&[None], &[small], 4096).unwrap();
    assert_eq!(
        w[0].targets[0].lbas,
        0..ZONE,
        "a size is rounded down to whole zones"
    );
    // Hand-made ranges: half a zone; two writers in one zone.
    let target = |lbas| Target {
        ctrl: ctrl.clone(),
        device: "model".into(),
        nsid: 1,
        lbas,
    };
    let spec = |lbas| WorkerSpec {
        core: None,
        targets: vec![target(lbas)],
    };
    let e = refused(job(Workload::Write, 4096, 4, false, 1), vec![spec(0..ZONE / 2)]);
    assert!(e.contains("are not whole zones of 256 blocks"), "{e}");
    let e = refused(
        job(Workload::Write, 4096, 4, false, 1),
        vec![spec(0..2 * ZONE), spec(ZONE..3 * ZONE)],
    );
    assert!(
        e.contains("workers 0 and 1 both write zones in LBAs 256..512"),
        "{e}"
    );
}

#[test]
fn an_offline_zone_is_named() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    model.set_zone_state(1, 3 * ZONE, ZoneState::Offline).unwrap();
    let one = || split_evenly(&[None], &[ns(&ctrl, 1)], 4096).unwrap();
    let e = refused(job(Workload::Write, 4096, 4, true, 1), one());
    assert!(
        e.contains("the zone at LBA 768 is offline: it cannot be written"),
        "{e}"
    );
    let mut j = job(Workload::RandRead, 4096, 4, false, 1);
    j.limit = Limit::Ios(10);
    let e = refused(j, one());
    assert!(
        e.contains("the zone at LBA 768 is offline: reads of it fail"),
        "{e}"
    );
}

#[test]
fn a_failed_zone_command_ends_the_run_and_is_named() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    // 40 KiB I/Os leave 2 blocks of each zone: the first zone written is finished, and that
    // Finish Zone fails.
    common::fail_next(&model, 0x79);
    let workers = split_evenly(&[None], &[ns(&ctrl, 1)], 40960).unwrap();
    let r = run(job(Workload::Write, 40960, 4, true, 9), workers);
    assert!(!r.passed());
    assert_eq!(r.errors, 1, "{:?}", r.error_samples);
    assert!(
        r.error_samples[0]
            .contains("model: namespace 1: Zone Management Send (Finish Zone) of the zone at LBA 0: ")
            && r.error_samples[0].contains("Data Transfer Error"),
        "{:?}",
        r.error_samples
    );
    // The run stopped writing at the failure: no read pass, fewer zones written than owned.
    let v = r.verify.unwrap();
    assert!(v.blocks_written < ZONES * 190 && v.blocks_checked == 0, "{v:?}");
}
