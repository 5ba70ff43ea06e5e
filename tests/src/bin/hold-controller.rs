//! Test helper: brings up an NVMe controller with vfpoll's signal handlers installed, prints
//! `ready`, then waits to be killed. When a signal arrives, the handlers shut the controller
//! down, and this program's hook then writes `shst=<CSTS.SHST>` to stdout, read from the BAR
//! before the process dies (and vfio-pci resets the device). `hold-controller BDF iommu|iommufd|noiommu`

use std::io::Write;
use std::sync::atomic::{AtomicPtr, Ordering};

use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions, RegionBuf};
use vfpoll_pci::vfio::{Container, IommuMode};

/// BAR0 of the controller, for the hook.
static BAR: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// Runs in the signal handler after the shutdown: async-signal-safe work only.
extern "C" fn after(_sig: libc::c_int) {
    let bar = BAR.load(Ordering::Acquire);
    if bar.is_null() {
        return;
    }
    let csts = bar.wrapping_add(0x1c).cast::<u32>();
    // SAFETY: BAR0 of the live controller (the process still maps it), CSTS at 0x1c, aligned.
    let shst = (unsafe { csts.read_volatile() } >> 2) & 3;
    let msg = [b's', b'h', b's', b't', b'=', b'0' + shst as u8, b'\n'];
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    unsafe { libc::write(1, msg.as_ptr().cast(), msg.len()) };
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bdf = args
        .get(1)
        .expect("usage: hold-controller BDF iommu|iommufd|noiommu")
        .parse()
        .expect("BDF");
    let mode = match args.get(2).map(String::as_str) {
        Some("noiommu") => IommuMode::NoIommu,
        Some("iommufd") => IommuMode::Iommufd,
        _ => IommuMode::Type1,
    };
    // SAFETY: `after` only does async-signal-safe work.
    unsafe { vfpoll_nvme::shutdown_on_signals_then(after) }.expect("signal handlers");
    let c = Container::open(mode).expect("container");
    let (ctrl, _dma) = Controller::open_first(&c, bdf, ControllerOptions::default()).expect("controller");
    let _qp = ctrl
        .create_qpair::<RegionBuf>(&QpairOptions::default())
        .expect("queue pair");
    BAR.store(ctrl.registers().as_ptr().cast_mut(), Ordering::Release);
    println!("ready");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
