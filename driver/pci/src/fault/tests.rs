//! The SIGBUS handler and mapping replacement, with file mappings that are truncated under
//! them (an access past the end of a file raises SIGBUS, as a zapped BAR mapping does).
//!
//! Each SIGBUS case runs in a child process (this test binary, running only
//! [`sigbus_child`]), so that the handler installed before vfpoll's, and the default action,
//! are known, and a death by SIGBUS ends the child only.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::mmio::{BarMapping, Mmio};
use crate::vfio::{RealSys, SysOps};

const CHILD_ENV: &str = "VFPOLL_FAULT_CHILD";

/// A 2-page file mapping (as `Device::map_bar` maps a BAR: shared, read-write), guarded or not,
/// with its file.
fn file_mapping(guarded: bool) -> (Mmio, File) {
    let f = tempfile::tempfile().unwrap();
    f.set_len(8192).unwrap();
    let sys: Arc<dyn SysOps> = Arc::new(RealSys);
    let ptr = sys.mmap(f.as_raw_fd(), 0, 8192).unwrap();
    let map = if guarded {
        // SAFETY: the mapping just made, owned by the BarMapping alone, used through Mmio.
        unsafe { BarMapping::guarded(sys, ptr, 8192) }
    } else {
        BarMapping::new(sys, ptr, 8192)
    };
    (Mmio::new(Arc::new(map)), f)
}

fn run_child(case: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fault::tests::sigbus_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, case)
        .output()
        .unwrap()
}

#[test]
fn revoke_replaces_the_mapping_with_all_ones_in_place() {
    let (m, f) = file_mapping(true);
    m.write32(0x10, 7);
    assert_eq!(m.read32(0x10), 7);
    let w = m.window(0x1000, 0x100).unwrap();
    m.mapping().revoke().unwrap();
    assert!(m.gone() && w.gone());
    assert_eq!(m.read32(0x10), u32::MAX, "reads all-ones, like a vanished device");
    assert_eq!(w.read32(0), u32::MAX, "windows see the same memory");
    m.write32(0x14, 5);
    assert_eq!(m.read32(0x14), 5, "writes land in memory nobody else reads");
    // The file no longer backs the mapping: truncating it cannot fault there any more.
    f.set_len(0).unwrap();
    assert_eq!(m.read32(0x1ffc), u32::MAX);
    m.mapping().revoke().unwrap();
    assert_eq!(m.mapping().faults(), 0);
}

/// Runs the child case `case`, which must exit 0 having printed "<case> ok".
fn child_passes(case: &str) {
    let out = run_child(case);
    assert!(
        out.status.success(),
        "child: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{case} ok")));
}

#[test]
fn a_sigbus_inside_a_guarded_mapping_is_repaired() {
    child_passes("guarded");
}

#[test]
fn a_sigbus_elsewhere_goes_to_the_previous_handler() {
    child_passes("chain");
}

#[test]
fn a_sigbus_elsewhere_without_a_previous_handler_kills_as_before() {
    use std::os::unix::process::ExitStatusExt;
    let out = run_child("default");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the child should die of SIGBUS: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("faulting"),
        "it got as far as the access"
    );
}

/// Addresses the test's own SIGBUS handler saw.
static PREV_SAW: AtomicUsize = AtomicUsize::new(0);

/// The handler a program had before vfpoll's: records the address and maps anonymous memory
/// over the faulting page so the access completes.
extern "C" fn previous_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: a valid siginfo from the kernel (SA_SIGINFO).
    let info = unsafe { &*info };
    // SAFETY: SIGBUS fills `si_addr`.
    let addr = unsafe { info.si_addr() } as usize;
    PREV_SAW.store(addr, Ordering::SeqCst);
    let page = addr & !4095;
    // SAFETY: replaces one page of the test's own file mapping, which it only uses through
    // volatile accesses; a fixed anonymous mapping over it.
    unsafe {
        libc::mmap(
            page as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

/// The body of the child processes; does nothing unless run by the tests above.
#[test]
#[ignore = "the child process of the SIGBUS tests"]
fn sigbus_child() {
    let Ok(case) = std::env::var(CHILD_ENV) else {
        panic!("run by the SIGBUS tests only (set {CHILD_ENV})");
    };
    match case.as_str() {
        "guarded" => {
            let (m, f) = file_mapping(true);
            m.write32(0x1000, 3);
            f.set_len(0).unwrap();
            // Past the end of the file now: SIGBUS, repaired by vfpoll's handler.
            assert_eq!(m.read32(0x1000), u32::MAX);
            assert_eq!(m.mapping().faults(), 1);
            assert!(m.gone());
            assert_eq!(m.read32(0), u32::MAX, "the whole mapping was replaced");
            println!("guarded ok");
        }
        "chain" => {
            // SAFETY: zeroed, then filled in; installs the test's own SA_SIGINFO handler.
            let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
            act.sa_sigaction = previous_handler as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO;
            // SAFETY: `act` is valid for the call.
            let r = unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) };
            assert_eq!(r, 0);
            // vfpoll's handler goes in on top (first guarded mapping of the process).
            let (guarded, gf) = file_mapping(true);
            let (plain, pf) = file_mapping(false);
            pf.set_len(0).unwrap();
            gf.set_len(0).unwrap();
            assert_eq!(plain.read32(0x10), 0, "the previous handler mapped a zero page");
            assert_eq!(PREV_SAW.load(Ordering::SeqCst), plain.as_ptr() as usize + 0x10);
            assert_eq!(guarded.mapping().faults(), 0, "not vfpoll's fault");
            PREV_SAW.store(0, Ordering::SeqCst);
            assert_eq!(guarded.read32(0x10), u32::MAX);
            assert_eq!(guarded.mapping().faults(), 1);
            assert_eq!(
                PREV_SAW.load(Ordering::SeqCst),
                0,
                "vfpoll's fault stays with vfpoll"
            );
            println!("chain ok");
        }
        "default" => {
            let (_guarded, _gf) = file_mapping(true);
            let (plain, pf) = file_mapping(false);
            pf.set_len(0).unwrap();
            println!("faulting");
            use std::io::Write;
            std::io::stdout().flush().unwrap();
            let v = plain.read32(0);
            println!("survived with {v:#x}: wrong");
        }
        other => panic!("unknown case {other}"),
    }
}
