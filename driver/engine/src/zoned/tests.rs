//! The zone writer's rules, driven in random order.

use super::writer::After;
use super::*;
use crate::workload::Rng;

/// Drives a writer as a queue would, completing writes and commands in random order, and
/// checks the zone rules on the way: one write in flight per zone, writes in order at each
/// zone's write pointer, at most `lanes` zones open, a finish exactly when a remainder is
/// skipped, a reset before a zone is written again.
fn drive(zones: u64, per_zone: u64, finish: bool, wrap: bool, lanes: u32, writes: u64, seed: u64) -> Sim {
    let mut w = ZoneWriter::new(zones, per_zone, finish, wrap, lanes);
    let mut sim = Sim {
        wp: vec![0; zones as usize],
        full: vec![false; zones as usize],
        passes: vec![0; zones as usize],
        ..Default::default()
    };
    let mut rng = Rng::new(seed);
    // In flight: (lane, unit) writes and (lane, cmd) commands.
    let mut writes_out: Vec<(u16, u64)> = Vec::new();
    let mut cmds_out: Vec<(u16, ZoneCmd)> = Vec::new();
    let mut left = writes;
    loop {
        while left > 0 {
            let Some((lane, unit)) = w.next_write() else { break };
            let (z, k) = (unit / per_zone, unit % per_zone);
            assert!(
                !writes_out.iter().any(|&(_, u)| u / per_zone == z),
                "two writes in flight to zone {z}"
            );
            assert!(!sim.full[z as usize], "write to full zone {z}");
            assert_eq!(sim.wp[z as usize], k, "zone {z}: write not at the write pointer");
            sim.wp[z as usize] += 1;
            writes_out.push((lane, unit));
            left -= 1;
            sim.written += 1;
            let open = sim
                .wp
                .iter()
                .zip(&sim.full)
                .filter(|(&p, &f)| p > 0 && !f)
                .count();
            sim.max_open = sim.max_open.max(open);
        }
        if writes_out.is_empty() && cmds_out.is_empty() {
            break;
        }
        let n = writes_out.len() + cmds_out.len();
        let pick = rng.below(n as u64) as usize;
        if pick < writes_out.len() {
            let (lane, unit) = writes_out.swap_remove(pick);
            let z = unit / per_zone;
            if sim.wp[z as usize] == per_zone && !finish {
                sim.full[z as usize] = true; // written to capacity
            }
            let a = w.write_done(lane, true, left > 0);
            assert_eq!(a.skipped, 0);
            if let Some(c) = a.cmd {
                cmds_out.push((lane, c));
            }
        } else {
            let (lane, c) = cmds_out.swap_remove(pick - writes_out.len());
            match c {
                ZoneCmd::Finish(z) => {
                    assert!(finish, "finish without a skipped remainder");
                    assert_eq!(sim.wp[z as usize], per_zone, "zone {z} finished early");
                    sim.full[z as usize] = true;
                    sim.finishes += 1;
                }
                ZoneCmd::Reset(z) => {
                    assert!(sim.full[z as usize], "zone {z} reset before it was full");
                    sim.wp[z as usize] = 0;
                    sim.full[z as usize] = false;
                    sim.passes[z as usize] += 1;
                    sim.resets += 1;
                }
            }
            if let Some(c) = w.command_done(lane, left > 0) {
                cmds_out.push((lane, c));
            }
        }
    }
    sim.left = left;
    sim
}

#[derive(Default, Debug)]
struct Sim {
    wp: Vec<u64>,
    full: Vec<bool>,
    passes: Vec<u32>,
    written: u64,
    left: u64,
    max_open: usize,
    finishes: u64,
    resets: u64,
}

#[test]
fn one_pass_writes_every_unit_once_in_order() {
    for (zones, per_zone, finish, lanes) in [
        (16, 48, false, 4),
        (16, 19, true, 4),
        (5, 3, true, 5),
        (3, 7, false, 1),
    ] {
        for seed in 0..20 {
            let total = zones * per_zone;
            let s = drive(zones, per_zone, finish, false, lanes, total, seed);
            assert_eq!((s.written, s.left), (total, 0));
            assert!(s.wp.iter().all(|&p| p == per_zone), "{:?}", s.wp);
            assert!(s.full.iter().all(|&f| f), "every zone ends full");
            assert!(s.max_open <= lanes as usize, "{} open", s.max_open);
            assert_eq!(s.finishes, if finish { zones } else { 0 });
            assert_eq!(s.resets, 0);
        }
    }
}

#[test]
fn long_runs_wrap_and_reset_each_zone_before_rewriting_it() {
    for (zones, lanes) in [(4, 4), (6, 4), (2, 1)] {
        for seed in 0..20 {
            let per_zone = 5;
            let writes = zones * per_zone * 3 + 2;
            let s = drive(zones, per_zone, seed % 2 == 0, true, lanes, writes, seed);
            assert_eq!(s.written, writes);
            assert!(s.max_open <= lanes as usize);
            // Two more passes' worth of zones, each reset when taken again (a zone another
            // lane still holds is passed over, so the count per zone varies).
            assert!(s.resets >= zones * 2 - u64::from(lanes), "{} resets", s.resets);
            assert_eq!(s.passes.iter().map(|&p| u64::from(p)).sum::<u64>(), s.resets);
        }
    }
}

#[test]
fn a_failed_write_gives_its_zone_up_and_parked_lanes_end() {
    let mut w = ZoneWriter::new(2, 4, false, false, 2);
    let (l0, u0) = w.next_write().unwrap();
    let (l1, u1) = w.next_write().unwrap();
    assert_eq!((u0, u1), (0, 4));
    assert!(w.next_write().is_none() && !w.can_write());
    // The first write of zone 0 fails: the 3 units left are skipped, the zone finished.
    let a = w.write_done(l0, false, true);
    assert_eq!(
        a,
        After {
            cmd: Some(ZoneCmd::Finish(0)),
            skipped: 3
        }
    );
    // No zone left to take (verify never wraps): the lane parks.
    assert_eq!(w.command_done(l0, true), None);
    assert!(w.live());
    assert_eq!(w.write_done(l1, true, true), After::default());
    for _ in 0..3 {
        let (l, _) = w.next_write().unwrap();
        assert_eq!(l, l1);
        w.write_done(l, true, true);
    }
    assert!(!w.live() && !w.can_write());
    assert_eq!(untag(zone_tag(3, 7)), (3, 7));
    assert_ne!(zone_tag(0, 0) & ZONE_TAG, 0);
}

#[test]
fn units_map_to_zones_below_capacity() {
    let g = ZoneGeom {
        zone_blocks: 256,
        per_zone: 19,
    };
    assert_eq!(g.offset(0, 10), 0);
    assert_eq!(g.offset(18, 10), 180);
    assert_eq!(g.offset(19, 10), 256);
    assert_eq!(g.offset(40, 10), 512 + 20);
    assert_eq!(one_command(512 << 10, 4096), 512 << 10);
    assert_eq!(one_command(512 << 10, 520), ((512 << 10) - 4096) / 520 * 520);
}
