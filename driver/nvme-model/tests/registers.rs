//! Registers and the CC/CSTS state machine (NVMe Base 2.0 §3.1.3, §3.5).

mod common;

use common::*;
use vfpoll_nvme_model::{admin_opcode as adm, ModelConfig, Status};
use vfpoll_nvme_spec::regs::{off, Cap, Cc, Shutdown, ShutdownStatus, Version};

#[test]
fn cap_and_vs_after_start() {
    let h = Host::new(ModelConfig {
        max_queue_entries: 256,
        dstrd: 1,
        ..Default::default()
    });
    let cap = Cap(h.bar.read64(off::CAP));
    assert_eq!(cap.max_queue_entries(), 256);
    assert!(cap.contiguous_queues_required());
    assert_eq!(cap.doorbell_stride(), 8);
    assert_eq!(
        cap.command_sets(),
        0xc1,
        "NVM, I/O command sets, admin only (as QEMU)"
    );
    assert_eq!((cap.mps_min(), cap.mps_max()), (4096, 65536));
    assert!(cap.timeout_ms() > 0);
    assert_eq!(Version(h.bar.read32(off::VS)).to_string(), "1.4.0");
    assert_eq!(h.csts().0, 0, "starts disabled");
    assert_eq!(h.bar.read32(off::CMBSZ), 0, "no controller memory buffer");
}

#[test]
fn enable_disable_and_reenable() {
    let mut h = Host::new(ModelConfig::default());
    let csts = h.enable(good_cc(), 16);
    assert!(csts.ready() && !csts.fatal());
    h.create_qp(1, 8);
    let csts = h.disable();
    assert_eq!(csts.0, 0);
    // A reset deleted every queue: I/O queue 1 can be created again, on fresh admin queues.
    let csts = h.enable(good_cc(), 2);
    assert!(csts.ready());
    h.create_qp(1, 8);
    h.admin(Sqe::new(adm::IDENTIFY).prp(h.mem.alloc(PAGE).get(), 0).cdw(10, 1))
        .ok();
}

#[test]
fn invalid_configurations_set_cfs_until_reset() {
    let bad: [(&str, Cc, u32); 5] = [
        ("page size over MPSMAX", good_cc().with_page_size(128 * 1024), 16),
        ("IOSQES 7", good_cc().with_entry_sizes(7, 4), 16),
        ("IOCQES 3", good_cc().with_entry_sizes(6, 3), 16),
        ("CSS 001b (reserved)", good_cc().with_command_set(1), 16),
        ("one-entry admin queues", good_cc(), 1),
    ];
    let mut h = Host::new(ModelConfig::default());
    for (what, cc, entries) in bad {
        let csts = h.enable(cc, entries);
        assert!(csts.fatal() && !csts.ready(), "{what}: {csts:?}");
        h.disable();
        assert_eq!(h.csts().0, 0, "{what}: clearing EN clears CFS");
    }
    // Admin queues at addresses that do not translate (the IOMMU would fault).
    let sq = h.mem.alloc(PAGE);
    let csts = h.enable_at(good_cc(), 16, sq, vfpoll_pci::BusAddr(0x1000));
    assert!(csts.fatal(), "unmapped ACQ: {csts:?}");
    h.expect_dma_faults(&[0x1000]);
    h.disable();
    let csts = h.enable_at(good_cc(), 16, sq.add(64), sq);
    assert!(csts.fatal(), "unaligned ASQ: {csts:?}");
    h.disable();
    assert!(
        h.enable(good_cc(), 16).ready(),
        "a valid configuration works after all that"
    );
}

#[test]
fn larger_memory_page_size_is_honoured() {
    let mut h = Host::new(ModelConfig::default());
    let sq = h.mem.alloc_aligned(64 * 1024, 65536);
    let cq = h.mem.alloc_aligned(64 * 1024, 65536);
    assert!(h.enable_at(good_cc().with_page_size(65536), 8, sq, cq).ready());
    // An I/O CQ at a 4 KiB- but not 64 KiB-aligned address is refused.
    let cq1 = h.mem.alloc_aligned(2 * 64 * 1024, 65536).get() + 4096;
    let c = h.admin(
        Sqe::new(adm::CREATE_IO_CQ)
            .prp(cq1, 0)
            .cdw(10, 7 << 16 | 1)
            .cdw(11, 1),
    );
    assert_eq!(c.status, Status::INVALID_FIELD);
}

#[test]
fn shutdown_reports_complete_and_reset_clears_it() {
    let h = Host::started(ModelConfig::default());
    let cc = Cc(h.bar.read32(off::CC));
    h.bar.write32(off::CC, cc.with_shutdown(Shutdown::Normal).0);
    let csts = h.wait_csts(|c| c.shutdown_status() == ShutdownStatus::Complete);
    assert!(csts.ready());
    h.bar.write32(off::CC, good_cc().0);
    let csts = h.wait_csts(|c| !c.ready());
    assert_eq!(csts.shutdown_status(), ShutdownStatus::Normal);
}

#[test]
fn interrupt_mask_registers_are_ignored() {
    let mut h = Host::started(ModelConfig::default());
    h.bar.write32(off::INTMS, 1);
    h.bar.write32(off::INTMC, 1);
    h.admin(Sqe::new(adm::IDENTIFY).prp(h.mem.alloc(PAGE).get(), 0).cdw(10, 1))
        .ok();
}

#[test]
fn stop_joins_the_thread() {
    let h = Host::started(ModelConfig::default());
    let Host { model, .. } = h;
    model.stop().unwrap();
}
