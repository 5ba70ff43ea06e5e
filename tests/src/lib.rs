//! Shared helpers of the test-bed tests.
//!
//! The tests in `tests/*.rs` run inside the QEMU guest (`guest_*`, through `cargo xtask test`)
//! and on the host afterwards (`host_check_*`, reading the image files the guest wrote). The
//! guest layout is fixed by `xtask` (see its module docs): NVMe A at 00:03.0, NVMe B at 00:04.0,
//! two e1000e at 00:05.0/00:06.0, ivshmem at 00:07.0, virtio-net at 00:0a.0; in the boots of
//! `recovery_removal`, hot-pluggable NVMe R at 01:00.0 behind a root port ([`qmp`]).

use std::fs;
use std::path::{Path, PathBuf};

use vfpoll_pci::bind::{self, BindAction, BindOptions};
use vfpoll_pci::vfio::IommuMode;
use vfpoll_pci::{Bdf, Host};

/// NVMe controller A (serial `vfpoll-a`, CMB, namespaces 1 and 2).
pub const NVME_A: &str = "0000:00:03.0";
/// NVMe controller B (serial `vfpoll-b`, namespace 1).
pub const NVME_B: &str = "0000:00:04.0";
/// First e1000e.
pub const NIC_0: &str = "0000:00:05.0";
/// Second e1000e.
pub const NIC_1: &str = "0000:00:06.0";
/// virtio-net (modern PCI, 1af4:1041, MAC 52:54:00:00:00:03) on the e1000e's hub.
pub const VIRTIO_NET: &str = "0000:00:0a.0";
/// ivshmem-plain (GPU-BAR stand-in; BAR2 is 64 MiB backed by `gpubar.shm` on the host).
pub const IVSHMEM: &str = "0000:00:07.0";

/// Parses a BDF constant.
pub fn bdf(s: &str) -> Bdf {
    s.parse().expect("valid BDF constant")
}

/// The test-bed mode of this boot, from `VFPOLL_TESTBED`: `iommu` (vIOMMU, type1 container),
/// `iommufd` (vIOMMU, iommufd and VFIO device cdevs; the 6.12 guest kernel) or `noiommu`.
/// Panics outside the test bed, so a guest test can never pass by not running.
pub fn mode() -> IommuMode {
    match std::env::var("VFPOLL_TESTBED").as_deref() {
        Ok("iommu") => IommuMode::Type1,
        Ok("iommufd") => IommuMode::Iommufd,
        Ok("noiommu") => IommuMode::NoIommu,
        other => {
            panic!("VFPOLL_TESTBED is {other:?}: guest_* tests run inside the test bed (cargo xtask test)")
        }
    }
}

/// The mode name as the harness writes it.
pub fn mode_name() -> &'static str {
    match mode() {
        IommuMode::Type1 => "iommu",
        IommuMode::Iommufd => "iommufd",
        IommuMode::NoIommu => "noiommu",
    }
}

/// A peer-BAR registration (`DmaContext::register_peer_bar`) as this boot's mode expects it:
/// the region, or under iommufd `None` after checking that the kernel refused it with the
/// documented error (it names `IOMMU_IOAS_MAP` and the way out, `--iommu-backend type1`).
/// `what` names the BAR in messages.
pub fn peer_or_refusal(
    r: Result<vfpoll_dma::PeerRegion, vfpoll_dma::DmaError>,
    what: &str,
) -> Option<vfpoll_dma::PeerRegion> {
    if mode() != IommuMode::Iommufd {
        return Some(r.unwrap_or_else(|e| panic!("registering {what}: {e}")));
    }
    let e = match r {
        Ok(_) => panic!("iommufd mapped {what}: the kernel was expected to refuse a BAR's PFNMAP memory"),
        Err(e) => e,
    };
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    println!("{what} under iommufd: {msg}");
    assert!(
        msg.contains("iommufd cannot map a peer device's BAR") && msg.contains("--iommu-backend type1"),
        "{msg}"
    );
    assert!(
        msg.contains("IOMMU_IOAS_MAP"),
        "the kernel's refusal is named: {msg}"
    );
    None
}

/// The `--iommu-backend` arguments that make a `vfpoll` command use this boot's backend
/// (`--noiommu` in no-IOMMU mode, as before the flag existed).
pub fn backend_args() -> &'static [&'static str] {
    match mode() {
        IommuMode::Type1 => &["--iommu-backend", "type1"],
        IommuMode::Iommufd => &["--iommu-backend", "iommufd"],
        IommuMode::NoIommu => &["--noiommu"],
    }
}

/// Checks that `c` really uses this boot's backend, from the kernel's side too: in iommufd mode
/// the process holds `/dev/iommu` and a `/dev/vfio/devices/vfioN` open and no `/dev/vfio/vfio`
/// (so that an iommufd test cannot pass on type1 by accident), in the others the reverse.
pub fn assert_backend(c: &vfpoll_pci::vfio::Container) {
    assert_eq!(c.mode(), mode(), "the container's backend is not this boot's");
    let open: Vec<String> = fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let has = |p: &str| open.iter().any(|o| o == p);
    let cdevs = open
        .iter()
        .filter(|o| o.starts_with("/dev/vfio/devices/vfio"))
        .count();
    match mode() {
        IommuMode::Iommufd => {
            assert!(c.ioas_id().is_some(), "iommufd mode without an IOAS");
            assert!(has("/dev/iommu"), "/dev/iommu is not open: {open:?}");
            assert!(cdevs > 0, "no VFIO device cdev is open: {open:?}");
            assert!(
                !has("/dev/vfio/vfio"),
                "the type1 container is open in iommufd mode: {open:?}"
            );
            assert!(c.groups().is_empty(), "groups attached in iommufd mode");
        }
        _ => {
            assert!(c.ioas_id().is_none());
            assert!(has("/dev/vfio/vfio"), "the VFIO container is not open: {open:?}");
            assert!(
                !has("/dev/iommu") && cdevs == 0,
                "iommufd in use in {}: {open:?}",
                mode_name()
            );
        }
    }
}

/// The boot's random seed (`VFPOLL_SEED`), shared by the guest run and its host check.
pub fn seed() -> u64 {
    std::env::var("VFPOLL_SEED")
        .expect("VFPOLL_SEED is set by cargo xtask test")
        .parse()
        .expect("VFPOLL_SEED is a decimal u64")
}

/// The run dir of a host check (`VFPOLL_RUN_DIR`).
pub fn run_dir() -> PathBuf {
    std::env::var_os("VFPOLL_RUN_DIR")
        .expect("VFPOLL_RUN_DIR is set by cargo xtask test for host checks")
        .into()
}

/// The mode of the boot a host check looks at (`VFPOLL_RUN_MODE`).
pub fn run_mode() -> String {
    std::env::var("VFPOLL_RUN_MODE").expect("VFPOLL_RUN_MODE is set by cargo xtask test")
}

/// The guest's output folder (`/out`, the run dir's `out/` on the host).
pub fn out_dir() -> PathBuf {
    std::env::var_os("VFPOLL_TESTBED_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/out".into())
}

/// A deterministic pseudo-random byte stream (xorshift64*), the same in guest and host check.
#[derive(Debug, Clone)]
pub struct Pattern(u64);

impl Pattern {
    /// A stream for `seed` and a `stream` number (different streams for different purposes).
    pub fn new(seed: u64, stream: u64) -> Self {
        Pattern((seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Binds `bdfs` to vfio-pci (idempotent) and returns the outcomes.
pub fn bind_all(bdfs: &[&str]) -> Vec<bind::BindOutcome> {
    let host = Host::default();
    bdfs.iter()
        .map(|b| {
            let o = bind::bind_vfio(&host, bdf(b), &BindOptions::default())
                .unwrap_or_else(|e| panic!("bind {b}: {e}"));
            assert!(
                matches!(o.action, BindAction::Bound | BindAction::AlreadyBound),
                "{o}"
            );
            o
        })
        .collect()
}

/// Runs `cmd` with `args` and returns its output; panics (with both output streams) unless it
/// succeeds.
pub fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The interface of a NIC bound to its kernel driver.
pub fn netdev(bdf_s: &str) -> String {
    let dir = Host::default().pci_device_dir(bdf(bdf_s)).join("net");
    fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .next()
        .expect("an interface")
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned()
}

/// Makes sure at least `pages` 2 MiB hugepages are reserved.
pub fn reserve_hugepages(pages: u64) {
    vfpoll_hugepages::reserve(&Host::default(), vfpoll_hugepages::PageSize::SIZE_2M, None, pages)
        .unwrap_or_else(|e| panic!("reserving {pages} hugepages: {e}"));
}

/// Reads `len` bytes at `off` of a host file (host checks).
pub fn read_file_range(path: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.seek(SeekFrom::Start(off)).expect("seek");
    let mut v = vec![0u8; len];
    f.read_exact(&mut v)
        .unwrap_or_else(|e| panic!("{} at {off:#x}+{len:#x}: {e}", path.display()));
    v
}

/// Writes a small key=value manifest into the guest's `/out` for the host check.
pub fn write_manifest(name: &str, lines: &[(String, String)]) {
    let text: String = lines.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    fs::write(out_dir().join(name), text).expect("write manifest to /out");
}

/// Reads a manifest written by [`write_manifest`] from the run dir (host checks).
pub fn read_manifest(name: &str) -> Vec<(String, String)> {
    let p = run_dir().join("out").join(name);
    let text =
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (did the guest test run?)", p.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The first value of `key` in a manifest.
pub fn manifest_get<'a>(m: &'a [(String, String)], key: &str) -> &'a str {
    m.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("manifest has no `{key}`"))
}

// ---- teardown checks: every DMA buffer came back ----
//
// A buffer handed to a queue pair comes back with its completion (or with the rejection of
// its submission). One that does not is still in flight, quarantined by the driver (a command
// that timed out), or leaked: memory the device may still write. These checks run at the end
// of a test, after it has polled everything.

/// Teardown check that all DMA memory a test allocated after this point was given back: when
/// dropped (declare it right after opening the controllers, so that the test's queue pairs and
/// buffers, declared later, are dropped before it), the IOVA allocator's free ranges must be
/// what they were at [`DmaReturnCheck::new`], so every region, buffer piece, queue pair and
/// peer registration made since was unmapped, guard pages included. A buffer leaked in a
/// completion nobody dropped, or kept by a queue pair, stays mapped and fails the test. In
/// no-IOMMU mode there is no IOVA space to account for, and the check finds nothing.
pub struct DmaReturnCheck {
    dma: vfpoll_dma::DmaContext,
    before: Vec<std::ops::RangeInclusive<u64>>,
}

impl DmaReturnCheck {
    /// Notes the IOVA space of `dma` as it is now.
    pub fn new(dma: &vfpoll_dma::DmaContext) -> Self {
        DmaReturnCheck {
            dma: dma.clone(),
            before: dma.iova_free_ranges(),
        }
    }

    /// The check itself (also run on drop).
    #[track_caller]
    pub fn assert_returned(&self) {
        let now = self.dma.iova_free_ranges();
        let lost =
            |r: &[std::ops::RangeInclusive<u64>]| r.iter().map(|r| r.end() - r.start() + 1).sum::<u64>();
        assert!(
            now == self.before,
            "{:#x} bytes of IOVA space still mapped at teardown: a DMA buffer, region or \
             registration the test made was never given back (kept by a queue pair, held by a \
             completion nobody dropped, or leaked); free ranges before {:x?}, now {:x?}",
            lost(&self.before).saturating_sub(lost(&now)),
            self.before,
            now
        );
    }
}

impl Drop for DmaReturnCheck {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_returned();
        }
    }
}

/// Teardown check: the queue pair has no request in flight.
#[track_caller]
pub fn assert_idle<B: vfpoll_nvme::IoBuffer>(qp: &vfpoll_nvme::QueuePair<B>, what: &str) {
    assert_eq!(
        qp.outstanding(),
        0,
        "{what}: queue pair {} still holds requests ({:?})",
        qp.qid(),
        qp.stats()
    );
}

/// Teardown check: every packet buffer is back in the pool (after the ports using it closed).
#[track_caller]
pub fn assert_pool_whole(pool: &vfpoll_nic::Mempool, what: &str) {
    assert_eq!(
        pool.available(),
        pool.capacity(),
        "{what}: {} packet buffer(s) never came back to the pool",
        pool.capacity() - pool.available()
    );
}

/// NVMe controller C: controller 0 of the test bed's NVM subsystem (serial `vfpoll-s`).
pub const NVME_C: &str = "0000:00:08.0";
/// NVMe controller D: controller 1 of the same subsystem; namespace 1 is shared by C and D.
pub const NVME_D: &str = "0000:00:09.0";

// NVMe over TCP: modules, loopback, the kernel's target (nvmet-tcp) and initiator.
pub mod nvmf;
pub use nvmf::*;

// QMP through the `out` share (device_del/device_add of hot-pluggable controller R).
pub mod qmp;

// The store's big-namespace controllers and an independent decoder of its on-disk format.
pub mod store;

/// The Rust examples of README.md and docs/*.md, compiled (and, unless `no_run` or `ignore`,
/// run) as this crate's doctests by `cargo test`. `cargo xtask test`'s docs check fails when a
/// page with Rust examples is missing here.
#[cfg(doctest)]
pub mod docs {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
}
