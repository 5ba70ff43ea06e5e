//! The driver's safety boundary on the admin side (issue 10, item 4), through the real driver
//! over the model: an admin transfer larger than the admin data buffer is refused before
//! anything is copied or submitted; a small admin queue wraps on the SQ head the controller
//! reports, with the Asynchronous Event Request holding a slot, and one too small to hold both
//! it and a command is refused (or, cut to two entries by MQES, gets no event request).
//! Set Features cannot switch off the Namespace Attribute Notices that keep formats current.
//!
//! Not here: clean EventIdx words for a reused queue id (the model, like QEMU, writes a new
//! queue's EventIdx itself, so a stale word cannot be seen through it), and late DMA into a
//! quarantined admin buffer (the model moves a command's data when it fetches it, before any
//! timeout, and a timed-out admin command now resets the controller).

mod drv;

use drv::*;
use vfpoll_nvme::admin::ADMIN_DATA_BYTES;
use vfpoll_nvme::{ControllerOptions, NvmeError};
use vfpoll_nvme_model::{admin_opcode as adm, ModelConfig};

#[test]
fn an_admin_transfer_larger_than_the_admin_buffer_is_refused_before_submission() {
    let r = rig(small_cfg(1024, 5));
    let before = r.model.stats().admin_commands(adm::GET_LOG_PAGE);
    for len in [ADMIN_DATA_BYTES + 4, 1 << 20, usize::MAX - 3] {
        match r.ctrl.log_page(0x02, 0xffff_ffff, len) {
            Err(NvmeError::TooLarge { len: l, mdts }) => assert_eq!((l, mdts), (len, ADMIN_DATA_BYTES)),
            other => panic!("a {len}-byte log page: {other:?}"),
        }
    }
    assert_eq!(
        r.model.stats().admin_commands(adm::GET_LOG_PAGE),
        before,
        "nothing reached the controller"
    );
    // The admin queue works on, the largest transfer included.
    let page = r.ctrl.log_page(0x02, 0xffff_ffff, 512).expect("SMART log");
    assert_eq!(page.len(), 512);
    let whole = r.ctrl.log_page(0x02, 0xffff_ffff, ADMIN_DATA_BYTES);
    assert_eq!(
        whole.expect("a log page as large as the buffer").len(),
        ADMIN_DATA_BYTES
    );
    assert_eq!(r.model.stats().admin_commands(adm::GET_LOG_PAGE), before + 2);
}

/// Admin queues of `entries` slots: every command goes through, however small the queue,
/// because the driver frees a slot only when a completion's SQ head says the controller
/// fetched the entry in it (with the Asynchronous Event Request that stays outstanding in one).
#[test]
fn a_small_admin_queue_wraps_on_the_sq_head_the_controller_reports() {
    for entries in [3u16, 4, 5] {
        let opts = ControllerOptions {
            admin_entries: entries,
            ..ctrl_opts()
        };
        let r = rig_with(small_cfg(1024, 5), opts);
        admin_commands_go_through(&r, 4 * entries as u32, &format!("{entries} entries"));
        // (Fetched in order, so counted by now.)
        let aer = r.model.stats().admin_commands(adm::ASYNC_EVENT_REQUEST);
        assert_eq!(aer, 1, "{entries} entries: the event request holds a slot");
    }
    // Two entries hold one command: the event request would take it for good. Refused...
    let mapper = std::sync::Arc::new(vfpoll_dma::FakeMapper::new());
    let model = vfpoll_nvme_model::NvmeModel::start(small_cfg(1024, 5), mapper.clone()).unwrap();
    let opts = ControllerOptions {
        admin_entries: 2,
        ..ctrl_opts()
    };
    match vfpoll_nvme::Controller::new(model.bar0(), vfpoll_dma::DmaContext::new(mapper), opts) {
        Err(NvmeError::InvalidOption(why)) => assert!(why.contains("3..=4096"), "{why}"),
        other => panic!("2 admin entries: {other:?}"),
    }
    // ... and a controller whose MQES allows only two gets no event request, and works.
    let cfg = ModelConfig {
        max_queue_entries: 2,
        ..small_cfg(1024, 5)
    };
    let r = rig(cfg);
    admin_commands_go_through(&r, 8, "MQES 1");
    assert_eq!(r.model.stats().admin_commands(adm::ASYNC_EVENT_REQUEST), 0);
}

fn admin_commands_go_through(r: &Rig, n: u32, what: &str) {
    let before = r.model.stats();
    // More commands than slots: the ring wraps.
    for i in 0..n {
        r.ctrl
            .get_feature(0x07)
            .unwrap_or_else(|e| panic!("{what}, command {i}: {e}"));
    }
    let after = r.model.stats();
    assert_eq!(
        after.admin_commands(adm::GET_FEATURES) - before.admin_commands(adm::GET_FEATURES),
        n as u64,
        "{what}: each command reached the controller once"
    );
    assert_eq!(after.errors, before.errors, "{what}: no command failed");
}

/// Set Features cannot switch off the Namespace Attribute Notices the driver keeps formats
/// current with; other bits of Asynchronous Event Configuration can be set beside them.
#[test]
fn namespace_attribute_notices_cannot_be_switched_off() {
    const AEC: u8 = 0x0b;
    let r = rig(small_cfg(1024, 5));
    let sets = |r: &Rig| r.model.stats().admin_commands(adm::SET_FEATURES);
    let before = sets(&r);
    for dw11 in [0, 0x1ff & !(1 << 8)] {
        match r.ctrl.set_feature(AEC, dw11) {
            Err(NvmeError::InvalidOption(why)) => {
                assert!(why.contains("Namespace Attribute Notices"), "{why}")
            }
            other => panic!("AEC {dw11:#x}: {other:?}"),
        }
    }
    assert_eq!(sets(&r), before, "refused before submission");
    r.ctrl
        .set_feature(AEC, 1 << 8 | 0x3)
        .expect("the notices and more");
    assert_eq!(sets(&r), before + 1);
    // A controller without them in use (an admin queue cut to two entries) may set anything.
    let r = rig(ModelConfig {
        max_queue_entries: 2,
        ..small_cfg(1024, 5)
    });
    r.ctrl.set_feature(AEC, 0).expect("no notices to keep");
}
