//! Interrupt mode of the 82574 driver against the in-process device model (`model/`, which
//! models IMS/IMC/ICR, IVAR routing, EIAC auto-clear and IAM auto-mask): the registers the
//! driver programs for MSI-X and MSI, `wait` sleeping until a frame arrives and returning on
//! its timeout otherwise, no lost wakeup for a frame that lands before or while arming, the
//! device disarmed whenever the queue polls (no interrupts while polling), hybrid mode, and
//! poll-mode ports refusing to wait.

mod model;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use model::NicModel;
use vfpoll_dma::PageSize;
use vfpoll_nic::e1000e::regs::{intr, off};
use vfpoll_nic::e1000e::{E1000e, E1000eRx, E1000eTx};
use vfpoll_nic::{
    free_bulk, CompletionMode, IrqKind, MacAddr, Mempool, NicError, Packet, PortOptions, RxQueue,
};
use vfpoll_pci::vfio::EventFd;

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

fn opts(completion: CompletionMode) -> PortOptions {
    PortOptions {
        rx_entries: 64,
        tx_entries: 64,
        page_size: PageSize::Base4K,
        link_timeout: Duration::from_secs(2),
        completion,
        ..PortOptions::default()
    }
}

struct Rig {
    model: NicModel,
    _pool: Mempool,
    _ctrl: E1000e,
    rx: E1000eRx,
    _tx: E1000eTx,
    /// The model's copy of the vector's eventfd (the driver has another).
    fd: EventFd,
}

fn rig(completion: CompletionMode, kind: IrqKind) -> Rig {
    let (model, dma) = NicModel::start(MAC);
    let fd = EventFd::new().unwrap();
    // MSI-X: vector 0 is the receive queue's; a second vector shows the routing matters.
    let mut fds = vec![fd.try_clone().unwrap()];
    if kind == IrqKind::Msix {
        fds.push(EventFd::new().unwrap());
    }
    model.set_interrupts(fds, kind == IrqKind::Msix);
    let pool = Mempool::new(&dma, 256, PageSize::Base4K).unwrap();
    let (ctrl, rx, tx) = E1000e::new_with_interrupt(
        model.bar(),
        "model",
        &dma,
        &pool,
        &opts(completion),
        fd.try_clone().unwrap(),
        kind,
    )
    .unwrap();
    Rig {
        model,
        _pool: pool,
        _ctrl: ctrl,
        rx,
        _tx: tx,
        fd,
    }
}

fn frame(seq: u8) -> Vec<u8> {
    let mut f = MAC.0.to_vec();
    f.extend_from_slice(&[0x52, 0x54, 0, 0x65, 0x43, 0x21, 0x88, 0xb5]);
    f.resize(64, seq);
    f
}

fn drain(rx: &mut E1000eRx) -> usize {
    let mut pkts: Vec<Packet> = Vec::with_capacity(32);
    let n = rx.rx_burst(&mut pkts, 32);
    free_bulk(&mut pkts);
    n
}

fn interrupts(m: &NicModel) -> u64 {
    m.get(&m.counters().interrupts)
}

#[test]
fn msix_routing_and_auto_mask_are_programmed() {
    let rig = rig(CompletionMode::Irq, IrqKind::Msix);
    let bar = rig.model.bar();
    assert_eq!(
        bar.read32(off::IVAR),
        intr::IVAR_VALID,
        "RX queue 0 on vector 0; TX queue 0 and other causes not routed"
    );
    assert_eq!(bar.read32(off::EIAC), intr::RXQ0, "RxQ0 auto-cleared");
    assert_eq!(bar.read32(off::IAM), intr::RXQ0, "RxQ0 auto-masked");
    let ext = bar.read32(off::CTRL_EXT);
    assert_eq!(
        ext & (intr::CTRL_EXT_EIAME | intr::CTRL_EXT_PBA_CLR | intr::CTRL_EXT_IAME),
        intr::CTRL_EXT_EIAME | intr::CTRL_EXT_PBA_CLR,
        "{ext:#x}"
    );
    assert_eq!(rig.model.ims(), 0, "masked until the queue sleeps");
    assert_eq!(rig.rx.completion_mode(), CompletionMode::Irq);
    assert_eq!(rig.rx.event_fd().map(|f| f.as_raw_fd()), Some(rig.rx.as_raw_fd()));
}

#[test]
fn an_idle_wait_times_out_and_leaves_the_device_disarmed() {
    let mut rig = rig(CompletionMode::Irq, IrqKind::Msix);
    let t = Instant::now();
    assert!(!rig.rx.wait(Some(Duration::from_millis(100))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(100), "{:?}", t.elapsed());
    assert_eq!(rig.model.ims(), 0, "disarmed on return");
    assert_eq!(interrupts(&rig.model), 0);
}

#[test]
fn a_frame_wakes_the_sleeping_queue_through_its_vector() {
    let mut rig = rig(CompletionMode::Irq, IrqKind::Msix);
    for round in 0..5u8 {
        let before = interrupts(&rig.model);
        let t = Instant::now();
        std::thread::scope(|s| {
            let model = &rig.model;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                model.inject(frame(round));
            });
            assert!(rig.rx.wait(Some(Duration::from_secs(10))).unwrap(), "woken");
        });
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(25) && took < Duration::from_secs(10),
            "{took:?}"
        );
        assert_eq!(drain(&mut rig.rx), 1, "round {round}");
        assert_eq!(interrupts(&rig.model), before + 1, "one message per frame");
        assert_eq!(rig.model.ims(), 0, "auto-masked, and disarmed by wait");
    }
}

#[test]
fn no_wakeup_is_lost_and_polling_costs_no_interrupts() {
    let mut rig = rig(CompletionMode::Irq, IrqKind::Msix);
    // Frames while polling (disarmed): received, no interrupt.
    for i in 0..10 {
        rig.model.inject(frame(i));
    }
    let mut got = 0;
    let t = Instant::now();
    while got < 10 && t.elapsed() < Duration::from_secs(10) {
        got += drain(&mut rig.rx);
    }
    assert_eq!(got, 10);
    assert_eq!(interrupts(&rig.model), 0, "a polling queue is not interrupted");

    // A frame already in the ring before wait: no sleep, and the stale RxQ0 cause the polled
    // frames left in ICR does not fire either (cleared before IMS).
    rig.model.inject(frame(10));
    rig.model
        .wait("the frame written back", |m| m.get(&m.counters().rx_frames) == 11);
    let t = Instant::now();
    assert!(rig.rx.wait(Some(Duration::from_secs(10))).unwrap());
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(drain(&mut rig.rx), 1);

    // Armed by hand (epoll users), a frame that lands after arming is in the eventfd.
    assert!(!rig.rx.arm().unwrap(), "nothing there yet");
    assert_ne!(rig.model.ims() & intr::RXQ0, 0, "armed");
    rig.model.inject(frame(11));
    assert!(
        rig.fd.wait(Some(Duration::from_secs(10))).unwrap(),
        "eventfd readable"
    );
    assert_eq!(drain(&mut rig.rx), 1);
    rig.rx.disarm();
    assert_eq!(rig.model.ims(), 0);
    assert_eq!(interrupts(&rig.model), 1);
}

#[test]
fn msi_uses_the_receive_timer_cause() {
    let mut rig = rig(CompletionMode::Irq, IrqKind::Msi);
    assert_eq!(rig.model.bar().read32(off::IVAR), 0, "no MSI-X routing with MSI");
    std::thread::scope(|s| {
        let model = &rig.model;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            model.inject(frame(1));
        });
        assert!(rig.rx.wait(Some(Duration::from_secs(10))).unwrap());
    });
    assert_eq!(drain(&mut rig.rx), 1);
    assert_eq!(interrupts(&rig.model), 1);
    assert_eq!(rig.model.ims(), 0, "IMC on return (MSI has no auto-mask)");
    // The cause stays in ICR until the next arm clears it: no interrupt storm, no stale wake.
    assert!(!rig.rx.wait(Some(Duration::from_millis(50))).unwrap());
    assert_eq!(interrupts(&rig.model), 1);
}

#[test]
fn hybrid_catches_a_frame_while_spinning() {
    let spin = Duration::from_millis(500);
    let mut rig = rig(CompletionMode::Hybrid { spin }, IrqKind::Msix);
    std::thread::scope(|s| {
        let model = &rig.model;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            model.inject(frame(1));
        });
        assert!(rig.rx.wait(Some(Duration::from_secs(10))).unwrap());
    });
    assert_eq!(drain(&mut rig.rx), 1);
    assert_eq!(interrupts(&rig.model), 0, "seen while spinning, never armed");
    // Past the spin it sleeps like Irq.
    let t = Instant::now();
    assert!(!rig.rx.wait(Some(Duration::from_millis(700))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(700));
}

#[test]
fn poll_mode_refuses_to_wait() {
    let (model, dma) = NicModel::start(MAC);
    let pool = Mempool::new(&dma, 256, PageSize::Base4K).unwrap();
    let (_c, mut rx, _t) =
        E1000e::new(model.bar(), "model", &dma, &pool, &opts(CompletionMode::Poll)).unwrap();
    assert_eq!(rx.completion_mode(), CompletionMode::Poll);
    assert!(rx.event_fd().is_none());
    match rx.wait(Some(Duration::from_millis(1))) {
        Err(NicError::InvalidOption(m)) => assert!(m.contains("CompletionMode::Irq"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(rx.arm().is_err());
    // An interrupt given with a poll-mode port is refused with the fix.
    let (model2, dma2) = NicModel::start(MAC);
    let pool2 = Mempool::new(&dma2, 256, PageSize::Base4K).unwrap();
    let e = E1000e::new_with_interrupt(
        model2.bar(),
        "model2",
        &dma2,
        &pool2,
        &opts(CompletionMode::Poll),
        EventFd::new().unwrap(),
        IrqKind::Msix,
    )
    .unwrap_err();
    assert!(e.to_string().contains("Irq or Hybrid"), "{e}");
}
