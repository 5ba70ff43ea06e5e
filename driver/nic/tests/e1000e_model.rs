//! The 82574 driver against the in-process device model (`model/`): bring-up, ring
//! wrap-around, one tail write per burst, batched transmit reclaim, receive refill, pool
//! exhaustion, dropped frames, link handling, teardown. Every test also checks, when its model
//! is dropped, that the device never DMAed outside the driver's mappings (see `model/`), and
//! `a_stray_dma_*` show that the check catches one.

mod model;

use std::time::Duration;

use model::{NicModel, RxFrame, HANG};
use vfpoll_dma::{DmaContext, DmaRegion, PageSize};
use vfpoll_nic::e1000e::regs::{off, Rctl, Status, Tctl};
use vfpoll_nic::e1000e::{tx_hi, E1000e, E1000eRx, E1000eTx, RxErrors};
use vfpoll_nic::{
    free_bulk, MacAddr, Mempool, NicControl, NicError, Packet, Port, PortOptions, RxQueue, TxQueue,
};

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
const PEER: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x65, 0x43, 0x21]);
const ETHERTYPE: u16 = 0x88b5;

fn opts(entries: u16) -> PortOptions {
    PortOptions {
        rx_entries: entries,
        tx_entries: entries,
        page_size: PageSize::Base4K,
        promiscuous: false,
        link_timeout: Duration::from_secs(2),
        ..PortOptions::default()
    }
}

struct Rig {
    model: NicModel,
    pool: Mempool,
    ctrl: E1000e,
    rx: E1000eRx,
    tx: E1000eTx,
}

fn rig(pool_bufs: usize, entries: u16) -> Rig {
    let (model, dma) = NicModel::start(MAC);
    let pool = Mempool::new(&dma, pool_bufs, PageSize::Base4K).unwrap();
    let (ctrl, rx, tx) = E1000e::new(model.bar(), "model", &dma, &pool, &opts(entries)).unwrap();
    Rig {
        model,
        pool,
        ctrl,
        rx,
        tx,
    }
}

/// A test frame: Ethernet header, 32-bit sequence number, then a pattern derived from it.
fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&MAC.0);
    f.extend_from_slice(&PEER.0);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    while f.len() < len {
        f.push((seq as usize + f.len()) as u8);
    }
    f.truncate(len);
    f
}

fn seq_of(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[14..18].try_into().unwrap())
}

/// Receives until `n` packets arrived (freeing them after `check`), with bursts of `burst`.
fn receive(rig: &mut Rig, n: usize, burst: usize, mut check: impl FnMut(&Packet)) -> usize {
    let mut pkts = Vec::with_capacity(burst);
    let mut got = 0;
    let mut bursts_with_packets = 0;
    let start = std::time::Instant::now();
    while got < n {
        let k = rig.rx.rx_burst(&mut pkts, burst);
        assert!(k <= burst);
        if k != 0 {
            bursts_with_packets += 1;
        }
        for p in &pkts {
            check(p);
        }
        got += k;
        free_bulk(&mut pkts);
        assert!(start.elapsed() < HANG, "received {got} of {n}");
    }
    bursts_with_packets
}

#[test]
fn bring_up_programs_the_device() {
    let rig = rig(256, 64);
    assert_eq!(rig.ctrl.info().mac, MAC);
    assert_eq!(rig.ctrl.info().name, "model");
    assert!(rig.ctrl.link().up);
    assert_eq!(rig.ctrl.link().speed_mbps, 1000);
    assert_eq!(rig.model.get(&rig.model.counters().resets), 1, "one CTRL.RST");
    let bar = rig.model.bar();
    let rctl = Rctl::from_bits_retain(bar.read32(off::RCTL));
    assert!(rctl.contains(Rctl::EN | Rctl::BAM | Rctl::SECRC), "{rctl:?}");
    assert!(!rctl.intersects(Rctl::UPE | Rctl::MPE | Rctl::LPE | Rctl::BSIZE | Rctl::BSEX));
    assert_eq!(bar.read32(off::TCTL), Tctl::enabled().bits());
    assert_eq!(bar.read32(off::IMC), u32::MAX, "every interrupt masked");
    assert_eq!(bar.read32(off::RFCTL), 0, "legacy receive descriptors");
    assert_eq!(
        (bar.read32(off::RDLEN), bar.read32(off::TDLEN)),
        (64 * 16, 64 * 16)
    );
    assert_eq!(
        bar.read32(off::RDT),
        63,
        "every receive slot but one given to the device"
    );
    assert_eq!(bar.read32(off::TDT), 0);
    assert_eq!(bar.read32(off::RAH0) >> 31, 1, "address valid");
    assert_eq!(
        rig.pool.available(),
        256 - 64,
        "the ring holds one buffer per slot"
    );
    assert_eq!(rig.rx.stats().doorbells, 1);
}

#[test]
fn transmit_wraps_the_ring_in_order_with_one_tail_write_per_burst() {
    let mut rig = rig(512, 64);
    let total = 1000u32;
    let mut pkts = Vec::with_capacity(20);
    let mut seq = 0u32;
    let mut bursts = 0;
    while seq < total {
        let k = 20.min(total - seq) as usize;
        rig.pool.alloc_exact(&mut pkts, k).unwrap();
        for p in pkts.iter_mut() {
            p.fill(&frame(seq, 60 + (seq as usize % 1455))).unwrap();
            seq += 1;
        }
        // Retry what the ring had no room for (the model is slower than the driver).
        while !pkts.is_empty() {
            if rig.tx.tx_burst(&mut pkts) != 0 {
                bursts += 1;
            }
        }
    }
    rig.tx.flush(Duration::from_secs(5)).unwrap();
    let sent = rig.model.take_sent();
    assert_eq!(sent.len(), total as usize);
    for (i, f) in sent.iter().enumerate() {
        assert_eq!(f, &frame(i as u32, 60 + i % 1455), "frame {i}");
    }
    let s = rig.tx.stats();
    assert_eq!(s.packets, total as u64);
    assert_eq!(s.doorbells, bursts, "one TDT write per burst that placed packets");
    assert!(rig.model.get(&rig.model.counters().tdt_moves) <= bursts);
    assert_eq!(
        rig.model.get(&rig.model.counters().tx_rs),
        bursts,
        "a status write-back asked for once per burst (RS on its last descriptor)"
    );
    assert_eq!(s.reclaimed, total as u64);
    assert!(
        s.reclaim_batches < s.reclaimed / 4,
        "reclaim works in batches: {} batches for {} packets",
        s.reclaim_batches,
        s.reclaimed
    );
    assert_eq!(rig.tx.in_flight(), 0);
    assert_eq!(
        rig.pool.available(),
        512 - 64,
        "every transmitted buffer back in the pool"
    );
    assert_eq!(rig.model.get(&rig.model.counters().violations), 0);
}

#[test]
fn a_full_transmit_ring_takes_what_fits_and_leaves_the_rest() {
    let mut rig = rig(512, 64);
    rig.model.pause();
    let mut pkts = Vec::with_capacity(100);
    rig.pool.alloc_exact(&mut pkts, 100).unwrap();
    for (i, p) in pkts.iter_mut().enumerate() {
        p.fill(&frame(i as u32, 64)).unwrap();
    }
    assert_eq!(rig.tx.tx_burst(&mut pkts), 63, "entries - 1 fit");
    assert_eq!(pkts.len(), 37);
    assert_eq!(
        seq_of(pkts[0].data()),
        63,
        "the rest stays with the caller, in order"
    );
    assert_eq!(rig.tx.tx_burst(&mut pkts), 0);
    assert_eq!(rig.tx.stats().ring_full, 2);
    assert_eq!(rig.tx.stats().doorbells, 1);
    assert_eq!(
        rig.model.bar().read32(off::TDT),
        63,
        "one tail write for the burst"
    );
    rig.model.resume();
    rig.tx.flush(Duration::from_secs(5)).unwrap();
    while !pkts.is_empty() {
        rig.tx.tx_burst(&mut pkts);
    }
    rig.tx.flush(Duration::from_secs(5)).unwrap();
    let sent = rig.model.take_sent();
    assert_eq!(
        sent.iter().map(|f| seq_of(f)).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    // Empty packets are dropped, not sent.
    rig.pool.alloc_exact(&mut pkts, 2).unwrap();
    pkts[1].fill(&frame(7, 60)).unwrap();
    assert_eq!(rig.tx.tx_burst(&mut pkts), 2);
    rig.tx.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(rig.tx.stats().dropped_empty, 1);
    assert_eq!(rig.model.take_sent().len(), 1);
    assert_eq!(rig.pool.available(), 512 - 64);
}

#[test]
fn receive_wraps_the_ring_refills_and_delivers_in_order() {
    let mut rig = rig(512, 64);
    let total = 1000u32;
    for s in 0..total {
        rig.model.inject(frame(s, 60 + (s as usize * 7) % 1455));
    }
    let mut next = 0u32;
    let bursts = receive(&mut rig, total as usize, 32, |p| {
        assert_eq!(
            p.data(),
            &frame(next, 60 + (next as usize * 7) % 1455)[..],
            "frame {next}"
        );
        next += 1;
    });
    let s = rig.rx.stats();
    assert_eq!(s.packets, total as u64);
    assert_eq!(
        s.doorbells,
        bursts as u64 + 1,
        "one RDT write per burst that took packets (+1 at start)"
    );
    assert_eq!((s.no_buffer, s.errors), (0, 0));
    let m = rig.model.counters();
    assert_eq!(rig.model.get(&m.rx_frames), total as u64);
    assert!(
        rig.model.get(&m.rx_ring_full) > 0,
        "1000 frames wrapped a 64-slot ring"
    );
    assert_eq!(rig.model.get(&m.violations), 0);
    // The ring still holds a buffer per slot; the cache may hold a few more.
    let out = 512 - rig.pool.available();
    assert!((64..=64 + 2 * 64).contains(&out), "{out} buffers out");
}

#[test]
fn receive_bursts_respect_max_and_the_callers_vector() {
    let mut rig = rig(512, 64);
    for s in 0..40 {
        rig.model.inject(frame(s, 100));
    }
    rig.model
        .wait("40 frames in the ring", |m| m.get(&m.counters().rx_frames) == 40);
    let mut pkts = Vec::with_capacity(64);
    assert_eq!(rig.rx.rx_burst(&mut pkts, 8), 8);
    assert_eq!(rig.rx.rx_burst(&mut pkts, 64), 32, "appends, up to what arrived");
    assert_eq!(pkts.len(), 40);
    assert!((0..40).all(|i| seq_of(pkts[i].data()) == i as u32));
    assert_eq!(rig.rx.rx_burst(&mut pkts, 64), 0);
    assert_eq!(
        rig.rx.stats().doorbells,
        3,
        "start + two bursts; none for the empty one"
    );
}

#[test]
fn an_exhausted_pool_stalls_reception_until_buffers_come_back() {
    // 64 buffers in the ring, 16 spare.
    let mut rig = rig(80, 64);
    for s in 0..100 {
        rig.model.inject(frame(s, 80));
    }
    rig.model
        .wait("a full ring", |m| m.get(&m.counters().rx_frames) == 63);
    let mut held = Vec::new();
    let mut pkts = Vec::with_capacity(32);
    for _ in 0..4 {
        rig.rx.rx_burst(&mut pkts, 32);
        held.append(&mut pkts);
    }
    assert_eq!(held.len(), 16, "one delivery per spare buffer");
    assert!(rig.rx.stats().no_buffer >= 1);
    assert_eq!(rig.pool.available(), 0);
    assert!(rig.pool.alloc().is_none());
    let e = rig.pool.alloc_exact(&mut pkts, 1).unwrap_err();
    assert!(e.to_string().contains("packet pool exhausted"), "{e}");
    // Giving the packets back lets reception continue, in order.
    free_bulk(&mut held);
    let mut next = 16;
    receive(&mut rig, 84, 32, |p| {
        assert_eq!(seq_of(p.data()), next);
        next += 1;
    });
    // A ring bigger than the pool is refused at bring-up, with the numbers.
    let (model, dma) = NicModel::start(MAC);
    let small = Mempool::new(&dma, 32, PageSize::Base4K).unwrap();
    let e = E1000e::new(model.bar(), "model", &dma, &small, &opts(64)).unwrap_err();
    assert!(
        matches!(
            e,
            NicError::PoolExhausted {
                need: 64,
                available: 32,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("make the pool larger"), "{e}");
}

#[test]
fn frames_with_errors_or_spanning_descriptors_are_dropped() {
    let mut rig = rig(256, 64);
    rig.model.inject(frame(0, 64));
    rig.model.inject_frame(RxFrame {
        data: frame(1, 64),
        errors: RxErrors::CE,
        split: None,
    });
    rig.model.inject_frame(RxFrame {
        data: frame(2, 300),
        errors: RxErrors::empty(),
        split: Some(100),
    });
    rig.model.inject_frame(RxFrame {
        data: frame(3, 64),
        errors: RxErrors::TCPE,
        split: None,
    });
    rig.model
        .wait("4 frames", |m| m.get(&m.counters().rx_frames) == 4);
    let mut pkts = Vec::new();
    assert_eq!(rig.rx.rx_burst(&mut pkts, 32), 2);
    assert_eq!(seq_of(pkts[0].data()), 0);
    assert_eq!(seq_of(pkts[1].data()), 3, "a checksum error is only a hint");
    assert_eq!(rig.rx.stats().errors, 2);
    // Dropped frames' buffers were reused, none lost: with the packets and the queue gone,
    // the pool is whole again.
    drop(pkts);
    let Rig { rx, pool, .. } = rig;
    drop(rx);
    assert_eq!(pool.available(), 256);
}

#[test]
fn link_down_is_an_error_after_the_timeout() {
    let (model, dma) = NicModel::start(MAC);
    model.set_link(false);
    let pool = Mempool::new(&dma, 256, PageSize::Base4K).unwrap();
    let mut o = opts(64);
    o.link_timeout = Duration::from_millis(50);
    let e = E1000e::new(model.bar(), "model", &dma, &pool, &o).unwrap_err();
    assert!(matches!(e, NicError::LinkDown { .. }), "{e}");
    let msg = e.to_string();
    // At least the timeout (a loaded machine may overshoot it by any amount).
    let waited: u128 = msg
        .split("link is down after waiting ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no waiting time in: {msg}"));
    assert!(waited >= 50 && msg.contains(" ms: check the cable"), "{msg}");
    assert_eq!(pool.available(), 256, "the failed bring-up gave its buffers back");
    model.set_link(true);
    o.link_timeout = HANG;
    let (ctrl, _rx, _tx) = E1000e::new(model.bar(), "model", &dma, &pool, &o).unwrap();
    // Restarting auto-negotiation drops the link (held down here, so that a slow machine
    // cannot miss the down state)...
    model.hold_autoneg(true);
    ctrl.restart_autoneg().unwrap();
    let bar = model.bar();
    model.wait("the link to go down", |_| {
        bar.read32(off::STATUS) & Status::LU.bits() == 0
    });
    assert!(!ctrl.link().up);
    assert!(matches!(
        ctrl.wait_link(Duration::from_millis(10)),
        Err(NicError::LinkDown { .. })
    ));
    // ...and it comes back on its own once auto-negotiation completes.
    model.hold_autoneg(false);
    let l = ctrl.wait_link(HANG).unwrap();
    assert!(l.up && l.full_duplex);
}

#[test]
fn promiscuous_mode_and_teardown() {
    let rig = rig(256, 64);
    let Rig {
        model,
        pool,
        mut ctrl,
        rx,
        tx,
    } = rig;
    let bar = model.bar();
    ctrl.set_promiscuous(true);
    assert!(ctrl.promiscuous());
    let r = Rctl::from_bits_retain(bar.read32(off::RCTL));
    assert!(r.contains(Rctl::UPE | Rctl::MPE | Rctl::EN), "{r:?}");
    ctrl.set_promiscuous(false);
    assert!(!Rctl::from_bits_retain(bar.read32(off::RCTL)).intersects(Rctl::UPE | Rctl::MPE));
    // Dropping the queues stops the device and gives every buffer back.
    let mut port = Port::from_parts(Box::new(ctrl), Box::new(rx), Box::new(tx));
    let mut pkts = Vec::new();
    pool.alloc_exact(&mut pkts, 10).unwrap();
    for p in &mut pkts {
        p.fill(&frame(1, 60)).unwrap();
    }
    port.tx_burst(&mut pkts);
    drop(port);
    assert_eq!(bar.read32(off::RCTL) & Rctl::EN.bits(), 0);
    assert_eq!(bar.read32(off::TCTL) & Tctl::EN.bits(), 0);
    assert_eq!(pool.available(), 256);
    assert_eq!(
        model.take_sent().len(),
        10,
        "pending transmissions were flushed first"
    );
}

#[test]
fn forwarding_between_two_ports_is_zero_copy_and_returns_buffers() {
    // Two ports in one IOMMU domain sharing one pool, as `vfpoll fwd` runs them.
    let (a, dma) = NicModel::start(MAC);
    let b = NicModel::start_on(PEER, a.mapper.clone());
    let pool = Mempool::new(&dma, 512, PageSize::Base4K).unwrap();
    let (ca, ra, ta) = E1000e::new(a.bar(), "a", &dma, &pool, &opts(64)).unwrap();
    let (cb, rb, tb) = E1000e::new(b.bar(), "b", &dma, &pool, &opts(64)).unwrap();
    let mut pa = Port::from_parts(Box::new(ca), Box::new(ra), Box::new(ta));
    let mut pb = Port::from_parts(Box::new(cb), Box::new(rb), Box::new(tb));
    assert_eq!(pb.mac(), PEER);
    let total = 500;
    for s in 0..total {
        a.inject(frame(s, 128));
    }
    let mut pkts = Vec::with_capacity(32);
    let mut forwarded = 0;
    let mut bus = std::collections::HashSet::new();
    let start = std::time::Instant::now();
    while forwarded < total as usize {
        pa.rx_burst(&mut pkts, 32);
        for p in &pkts {
            bus.insert(p.bus_addr().get());
        }
        forwarded += pb.tx_burst(&mut pkts);
        assert!(start.elapsed() < HANG, "forwarded {forwarded} of {total}");
    }
    pb.tx().flush(Duration::from_secs(5)).unwrap();
    let sent = b.take_sent();
    assert_eq!(sent.len(), total as usize);
    assert!(sent.iter().enumerate().all(|(i, f)| f == &frame(i as u32, 128)));
    assert!(bus.len() < total as usize, "buffers were recycled, not copied");
    assert_eq!(pa.rx().stats().packets, total as u64);
    assert_eq!(pb.tx().stats().packets, total as u64);
    drop((pa, pb));
    assert_eq!(pool.available(), 512);
    assert_eq!(
        a.get(&a.counters().violations) + b.get(&b.counters().violations),
        0
    );
}

/// Programs the model's transmit ring by hand, as a buggy driver might: descriptor `i` sends
/// `descs[i].1` bytes from bus address `descs[i].0`. Returns the ring once the model has
/// processed every descriptor.
fn raw_transmit(model: &NicModel, dma: &DmaContext, descs: &[(u64, u16)]) -> DmaRegion {
    let mut ring = dma.alloc_region(4096, PageSize::Base4K).unwrap();
    for (i, &(bus, len)) in descs.iter().enumerate() {
        ring.write(i * 16, &bus.to_le_bytes()).unwrap();
        ring.write(i * 16 + 8, &tx_hi(len, true).to_le_bytes()).unwrap();
    }
    let bar = model.bar();
    let base = ring.bus_addr(0).get();
    bar.write32(off::TDBAL, base as u32);
    bar.write32(off::TDBAH, (base >> 32) as u32);
    bar.write32(off::TDLEN, 4096);
    bar.write32(off::TDT, descs.len() as u32);
    bar.write32(off::TCTL, Tctl::enabled().bits());
    model.wait("the transmit ring to drain", |_| {
        bar.read32(off::TDH) == descs.len() as u32
    });
    bar.write32(off::TCTL, 0);
    ring
}

#[test]
fn a_stray_dma_past_a_buffer_or_outside_the_mappings_is_a_violation() {
    let (model, dma) = NicModel::start(MAC);
    let mut buf = dma.alloc_region(4096, PageSize::Base4K).unwrap();
    buf.write(0, &frame(0, 64)).unwrap();
    let at = |off: usize| buf.bus_addr(off).get();
    let ring = raw_transmit(
        &model,
        &dma,
        &[
            (at(0), 64),
            // 32 bytes past the end of the buffer: into the guard page after its mapping.
            (at(4096 - 32), 64),
            (0xdead_0000, 64),
        ],
    );
    assert_eq!(
        model.take_sent(),
        vec![frame(0, 64)],
        "only the good frame went out"
    );
    // Receive: a frame longer than the room left in its buffer's mapping.
    let mut rx_ring = dma.alloc_region(4096, PageSize::Base4K).unwrap();
    rx_ring.write(0, &at(4096 - 100).to_le_bytes()).unwrap();
    let bar = model.bar();
    let base = rx_ring.bus_addr(0).get();
    bar.write32(off::RDBAL, base as u32);
    bar.write32(off::RDBAH, (base >> 32) as u32);
    bar.write32(off::RDLEN, 4096);
    bar.write32(off::RDT, 1);
    model.inject(frame(1, 200));
    bar.write32(off::RCTL, Rctl::EN.bits());
    model.wait("the frame", |m| m.get(&m.counters().rx_frames) == 1);
    bar.write32(off::RCTL, 0);
    let v = model.take_violations();
    assert_eq!(v.len(), 3, "{v:?}");
    let tail = format!("{:#x}", at(4096 - 32));
    assert!(
        v[0].contains("descriptor 1 (64 bytes at ") && v[0].contains(&tail),
        "{v:?}"
    );
    assert!(v[1].contains("descriptor 2 (64 bytes at 0xdead0000)"), "{v:?}");
    assert!(
        v[2].starts_with("receive buffer of descriptor 0 (200 bytes"),
        "{v:?}"
    );
    assert_eq!(model.get(&model.counters().violations), 3);
    drop(model);
    drop((ring, rx_ring));
}

#[test]
#[should_panic(
    expected = "the driver broke the descriptor protocol 1 time(s): transmit buffer of descriptor 0"
)]
fn a_stray_dma_nobody_looked_at_fails_the_test_when_the_model_is_dropped() {
    let (model, dma) = NicModel::start(MAC);
    let buf = dma.alloc_region(4096, PageSize::Base4K).unwrap();
    let ring = raw_transmit(&model, &dma, &[(buf.bus_addr(4000).get(), 200)]);
    drop(model);
    drop(ring);
}
