//! NIC tests in the test bed (`cargo xtask test --filter nic`, both IOMMU modes).
//!
//! The two e1000e share one QEMU hub and nothing else. NIC 0 (00:05.0) is claimed by vfpoll;
//! NIC 1 (00:06.0) stays on the guest kernel's e1000e driver with a link-local address and is
//! the other end of every exchange: an AF_PACKET socket on it sends and counts frames, and
//! `ping` runs from it. QEMU's hub and e1000e drop frames silently when a sender outruns the
//! receiver, so every exchange is paced by flow control: a burst, then wait until the other end
//! has counted all of it, then the next burst. Counts are then exact, and the order is checked
//! through sequence numbers in the payload.

use std::io;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vfpoll_nic::e1000e::E1000e;
use vfpoll_nic::{
    free_bulk, CompletionMode, MacAddr, Mempool, NicControl, NicError, Packet, Port, PortOptions,
};
use vfpoll_pci::bind::{self, BindOptions};
use vfpoll_pci::vfio::Container;
use vfpoll_pci::{sysfs, Host};
use vfpoll_tests::*;

/// IEEE 802 local experimental EtherType: nothing else in the guest sends it.
const ETHERTYPE: u16 = 0x88b5;
/// The kernel side's address (link-local only).
const KERNEL_IP: &str = "169.254.77.1";
/// The address `vfpoll responder` answers for.
const VFPOLL_IP: &str = "169.254.77.2";
/// NIC 0's MAC (QEMU `-device e1000e,mac=...`).
const NIC_0_MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
/// The virtio-net port's MAC (QEMU `-device virtio-net-pci,mac=...`).
const VIRTIO_MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 3]);

// ---- the kernel side -----------------------------------------------------------------------

/// NIC 1 on the kernel's e1000e, up, with [`KERNEL_IP`]; returns its name and MAC.
fn kernel_side() -> (String, MacAddr) {
    let host = Host::default();
    let dev = sysfs::device(&host, bdf(NIC_1)).unwrap();
    if dev.driver.as_deref() != Some("e1000e") {
        bind::unbind_to_kernel(&host, bdf(NIC_1), &BindOptions::default()).expect("NIC 1 back to e1000e");
    }
    let ifname = netdev(NIC_1);
    run("ip", &["link", "set", &ifname, "up"]);
    let addrs = String::from_utf8(run("ip", &["-4", "addr", "show", "dev", &ifname]).stdout).unwrap();
    if !addrs.contains(KERNEL_IP) {
        run("ip", &["addr", "add", &format!("{KERNEL_IP}/16"), "dev", &ifname]);
    }
    let mac = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The kernel's link comes up after its own auto-negotiation.
    let start = Instant::now();
    let carrier =
        || std::fs::read_to_string(format!("/sys/class/net/{ifname}/carrier")).is_ok_and(|s| s.trim() == "1");
    while !carrier() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{ifname} has no carrier"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (ifname, mac)
}

fn kernel_counter(ifname: &str, name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// An AF_PACKET socket bound to one interface and [`ETHERTYPE`].
struct RawSocket {
    fd: i32,
}

impl RawSocket {
    fn open(ifname: &str) -> Self {
        let proto = (ETHERTYPE.to_be()) as i32;
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
        assert!(fd >= 0, "socket(AF_PACKET): {}", io::Error::last_os_error());
        let s = RawSocket { fd };
        let name = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(index, 0, "{ifname}: {}", io::Error::last_os_error());
        // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETHERTYPE.to_be();
        sa.sll_ifindex = index as i32;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        let sap = (&sa as *const libc::sockaddr_ll).cast::<libc::sockaddr>();
        // SAFETY: `sap` points at a live sockaddr_ll of `len` bytes.
        let r = unsafe { libc::bind(fd, sap, len) };
        assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
        s.setsockopt(libc::SO_RCVBUFFORCE, 8 << 20);
        s.setsockopt(libc::SO_SNDBUFFORCE, 8 << 20);
        s
    }

    fn setsockopt(&self, opt: i32, v: i32) {
        let p = (&v as *const i32).cast::<libc::c_void>();
        // SAFETY: `p` points at an i32 that outlives the call, with its size given.
        let r = unsafe { libc::setsockopt(self.fd, libc::SOL_SOCKET, opt, p, 4) };
        assert_eq!(r, 0, "setsockopt {opt}: {}", io::Error::last_os_error());
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: `frame` is a live slice of the length given.
        let n = unsafe { libc::send(self.fd, frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(n, frame.len() as isize, "send: {}", io::Error::last_os_error());
    }

    /// The next frame, or `None` after `timeout`.
    fn recv(&self, buf: &mut [u8], timeout: Duration) -> Option<usize> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        if r <= 0 {
            return None;
        }
        // SAFETY: `buf` is a live, writable slice of the length given.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert!(n >= 0, "recv: {}", io::Error::last_os_error());
        Some(n as usize)
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

// ---- frames --------------------------------------------------------------------------------

/// A test frame: Ethernet header with [`ETHERTYPE`], a 32-bit sequence number, then a pattern
/// from the boot's seed.
fn frame(dst: MacAddr, src: MacAddr, seq: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&Pattern::new(seed(), seq as u64).bytes(len - f.len()));
    f
}

/// Frame lengths cycle through the range a 1500-byte MTU allows (without FCS).
fn len_of(seq: u32) -> usize {
    60 + (seq as usize * 37) % (1514 - 60 + 1)
}

fn is_ours(f: &[u8]) -> bool {
    f.len() >= 18 && f[12..14] == ETHERTYPE.to_be_bytes()
}

fn seq_of(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[14..18].try_into().unwrap())
}

// ---- the vfpoll side -----------------------------------------------------------------------

fn vfpoll_port(opts: &PortOptions) -> (Port, Mempool) {
    vfpoll_port_on(NIC_0, opts)
}

fn vfpoll_port_on(dev: &str, opts: &PortOptions) -> (Port, Mempool) {
    bind_all(&[dev]);
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    let (mut ports, pool) = Port::open_all(&c, &[bdf(dev)], 2048, opts).expect("open the port");
    (ports.remove(0), pool)
}

/// Receives until `n` frames of ours addressed to `to` arrived or 10 s pass. Others (the
/// kernel's broadcasts; on a port that does not filter, such as QEMU's virtio-net without a
/// control queue, the hub's other traffic) are skipped.
fn rx_ours_to(port: &mut Port, to: MacAddr, n: usize, out: &mut Vec<Vec<u8>>) {
    let mut pkts: Vec<Packet> = Vec::with_capacity(32);
    let start = Instant::now();
    let mut got = 0;
    while got < n {
        if port.rx_burst(&mut pkts, 32) == 0 && port.completion_mode().interrupts() {
            port.wait(Some(Duration::from_secs(1)))
                .expect("wait for the receive interrupt");
        }
        for p in &pkts {
            if is_ours(p.data()) && p.data()[..6] == to.0 {
                out.push(p.to_vec());
                got += 1;
            }
        }
        free_bulk(&mut pkts);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "only {got} of {n} frames arrived at vfpoll"
        );
    }
}

/// `n` frames (a multiple of 32) each way between `port` and the kernel's interface `ifname`
/// (MAC `kmac`), in bursts of 32: each burst is sent, then waited for at the other end, where
/// every frame is checked in order and byte for byte; the queues' and the kernel's counters
/// must agree. Frames to the port are addressed to its MAC (a port that does not filter also
/// sees the hub's other traffic: only those count). The link must be up first.
fn exchange_with_kernel(port: &mut Port, pool: &Mempool, ifname: &str, kmac: MacAddr, n: u32) {
    const BURST: u32 = 32;
    let link = port.control().link();
    assert!(link.up, "{link}");
    println!(
        "{}: {} {}, link {link}",
        port.info().name,
        port.info().driver,
        port.mac()
    );
    let me = port.mac();
    let sock = RawSocket::open(ifname);

    // Kernel -> vfpoll.
    let k_tx0 = kernel_counter(ifname, "tx_packets");
    let mut got = Vec::new();
    for b in 0..n / BURST {
        for s in b * BURST..(b + 1) * BURST {
            sock.send(&frame(me, kmac, s, len_of(s)));
        }
        rx_ours_to(port, me, BURST as usize, &mut got);
    }
    assert_eq!(got.len(), n as usize);
    for (i, f) in got.iter().enumerate() {
        let s = i as u32;
        assert_eq!(seq_of(f), s, "in order");
        assert!(f == &frame(me, kmac, s, len_of(s)), "frame {s} intact");
    }
    let rxq = port.rx().stats();
    println!("rx queue: {rxq:?}");
    assert!(
        rxq.packets >= n as u64 && rxq.errors == 0 && rxq.no_buffer == 0,
        "{rxq:?}"
    );
    assert!(kernel_counter(ifname, "tx_packets") - k_tx0 >= n as u64);

    // vfpoll -> kernel.
    let k_rx0 = kernel_counter(ifname, "rx_packets");
    let mut buf = vec![0u8; 2048];
    let mut pkts = Vec::with_capacity(BURST as usize);
    for b in 0..n / BURST {
        pool.alloc_exact(&mut pkts, BURST as usize).unwrap();
        for (i, p) in pkts.iter_mut().enumerate() {
            let s = b * BURST + i as u32;
            p.fill(&frame(kmac, me, s, len_of(s))).unwrap();
        }
        while !pkts.is_empty() {
            port.tx_burst(&mut pkts);
        }
        for i in 0..BURST {
            let s = b * BURST + i;
            let len = sock
                .recv(&mut buf, Duration::from_secs(10))
                .unwrap_or_else(|| panic!("frame {s} did not reach the kernel"));
            assert_eq!(seq_of(&buf[..len]), s, "in order");
            assert!(
                buf[..len] == frame(kmac, me, s, len_of(s))[..],
                "frame {s} intact"
            );
        }
    }
    port.tx().flush(Duration::from_secs(5)).unwrap();
    let txq = port.tx().stats();
    println!("tx queue: {txq:?}");
    assert_eq!((txq.packets, txq.reclaimed), (n as u64, n as u64), "{txq:?}");
    assert!(txq.doorbells <= txq.bursts);
    assert!(kernel_counter(ifname, "rx_packets") - k_rx0 >= n as u64);
}

#[test]
#[ignore = "test bed"]
fn guest_nic_frames_both_ways_counted_in_order() {
    let (ifname, kmac) = kernel_side();
    let (mut port, pool) = vfpoll_port(&PortOptions::default());
    assert_eq!(port.mac(), NIC_0_MAC, "MAC from RAL0/RAH0");
    const N: u32 = 1024;
    exchange_with_kernel(&mut port, &pool, &ifname, kmac, N);
    // The NIC's own counters agree (read-to-clear, accumulated).
    let hw = port.control().stats();
    println!("hw counters: {hw}");
    assert_eq!(hw.tx_packets, N as u64, "{hw}");
    assert!(hw.rx_packets >= N as u64, "{hw}");
    let bytes: u64 = (0..N).map(|s| len_of(s) as u64).sum();
    // The datasheet's GOTC counts the FCS; QEMU 7.2's e1000e leaves it out (its GORC has it).
    assert!(
        hw.tx_bytes == bytes || hw.tx_bytes == bytes + 4 * N as u64,
        "{hw}"
    );
    assert!(hw.rx_bytes >= bytes + 4 * N as u64, "GORC counts the FCS: {hw}");
    assert_eq!(
        port.control().stats().tx_packets,
        N as u64,
        "accumulated, not double counted"
    );
    drop(port);
    assert_eq!(pool.available(), pool.capacity(), "every buffer back after close");
}

#[test]
#[ignore = "test bed"]
fn guest_nic_errors_say_what_to_do() {
    let host = Host::default();
    // An address with no device, and a device that is not a NIC.
    let e = vfpoll_nic::probe(&host, bdf("0000:00:1e.0")).unwrap_err();
    assert!(
        matches!(e, NicError::NoSuchDevice { .. }) && e.to_string().contains("vfpoll status"),
        "{e}"
    );
    let e = vfpoll_nic::probe(&host, bdf(NVME_A)).unwrap_err().to_string();
    assert!(
        e.contains("NVMe") && e.contains("1b36:0010") && e.contains("8086:10d3"),
        "{e}"
    );
    assert_eq!(
        vfpoll_nic::probe(&host, bdf(NIC_1)).unwrap(),
        vfpoll_nic::e1000e::DRIVER
    );

    // A pool smaller than the receive ring.
    bind_all(&[NIC_0]);
    reserve_hugepages(64);
    let c = Container::open(mode()).unwrap();
    let dev = c.device(bdf(NIC_0)).unwrap();
    let dma = vfpoll_dma::DmaContext::new(c.clone());
    let _dma_back = DmaReturnCheck::new(&dma);
    let small = Mempool::new(&dma, 256, vfpoll_dma::PageSize::Huge2M).unwrap();
    let e = Port::open(dev, &dma, &small, &PortOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            NicError::PoolExhausted {
                need: 512,
                available: 256,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("make the pool larger"), "{e}");
    assert_pool_whole(&small, "the refused bring-up");

    // Link down: restarting auto-negotiation drops QEMU's link for 500 ms.
    let dev = c.device(bdf(NIC_0)).unwrap();
    let pool = Mempool::new(&dma, 1024, vfpoll_dma::PageSize::Huge2M).unwrap();
    let (ctrl, _rx, _tx) = E1000e::open(dev, &dma, &pool, &PortOptions::default()).unwrap();
    ctrl.restart_autoneg().unwrap();
    let e = ctrl.wait_link(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e, NicError::LinkDown { .. }), "{e}");
    assert!(e.to_string().contains("link is down after waiting"), "{e}");
    let l = ctrl
        .wait_link(Duration::from_secs(5))
        .expect("the link comes back");
    println!("link back: {l}");
    drop((ctrl, _rx, _tx));
    assert_pool_whole(&pool, "the closed port");
}

// ---- the vfpoll binary ---------------------------------------------------------------------

/// `vfpoll ARGS` with `--noiommu` in no-IOMMU mode.
fn vfpoll(args: &[&str]) -> Command {
    let mut c = Command::new("vfpoll");
    c.args(args);
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        c.arg("--noiommu");
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The number after `key` in `s` (e.g. `"sent "` in `"sent 1000 packets"`).
fn number_after(s: &str, key: &str) -> u64 {
    let at = s.find(key).unwrap_or_else(|| panic!("no `{key}` in:\n{s}")) + key.len();
    s[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("no number after `{key}` in:\n{s}"))
}

/// Sends SIGTERM to a child and collects its output.
fn terminate(child: Child) -> Output {
    // SAFETY: kill(2) on our own child's pid.
    let r = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(r, 0, "kill: {}", io::Error::last_os_error());
    child.wait_with_output().unwrap()
}

/// Starts `vfpoll responder` on `dev` for [`VFPOLL_IP`], waits for its ready line, sends it
/// `count` pings 10 ms apart from the kernel's `ifname` (as fast as TCG allows; the neighbour
/// cache flushed first, so the kernel asks for the port's MAC), then stops it with SIGTERM.
/// Returns ping's output and the responder's.
fn ping_responder(dev: &str, ifname: &str, count: u32, extra: &[&str]) -> (String, Output) {
    bind_all(&[dev]);
    reserve_hugepages(64);
    let ip = format!("{VFPOLL_IP}/16");
    let mut args = vec!["responder", "--device", dev, "--ip", &ip];
    args.extend_from_slice(extra);
    let mut child = vfpoll(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vfpoll on PATH");
    // Wait for its ready line.
    let mut out = child.stdout.take().unwrap();
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    while !first.ends_with(b"\n") {
        use std::io::Read;
        if out.read(&mut byte).unwrap() == 0 {
            let o = child.wait_with_output().unwrap();
            panic!(
                "responder exited: {}{}",
                String::from_utf8_lossy(&first),
                text(&o)
            );
        }
        first.push(byte[0]);
    }
    let first = String::from_utf8(first).unwrap();
    assert!(
        first.contains("answering ARP and ICMP echo for 169.254.77.2/16"),
        "{first}"
    );
    // The kernel may still have another port's MAC cached for this address from another test.
    let _ = Command::new("ip")
        .args(["neigh", "flush", "dev", ifname])
        .output();
    let ping = Command::new("busybox")
        .args([
            "ping",
            "-c",
            &count.to_string(),
            "-i",
            "0.01",
            "-W",
            "5",
            "-I",
            ifname,
            VFPOLL_IP,
        ])
        .output()
        .unwrap();
    child.stdout = Some(out);
    let resp = terminate(child);
    let p = text(&ping);
    println!("{p}\n{}", text(&resp));
    (p, resp)
}

#[test]
#[ignore = "test bed"]
fn guest_nic_responder_answers_ping() {
    let (ifname, _) = kernel_side();
    let (p, resp) = ping_responder(NIC_0, &ifname, 100, &[]);
    let r = text(&resp);
    assert!(p.contains("100 packets transmitted, 100 packets received"), "{p}");
    assert!(resp.status.success(), "responder exits cleanly on SIGTERM: {r}");
    assert!(r.contains("stopped by signal"), "{r}");
    assert_eq!(number_after(&r, "ICMP echo requests "), 100, "{r}");
    assert!(
        number_after(&r, "ARP requests ") >= 1,
        "the kernel asked for our MAC first: {r}"
    );
    assert!(number_after(&r, "replies ") >= 101, "{r}");
    assert_eq!(number_after(&r, "replies dropped "), 0, "{r}");
}

#[test]
#[ignore = "test bed"]
fn guest_nic_pktgen_frames_all_counted_by_the_kernel() {
    let (ifname, kmac) = kernel_side();
    bind_all(&[NIC_0]);
    reserve_hugepages(64);
    let sock = RawSocket::open(&ifname);
    const N: u64 = 1000;
    let k_rx0 = kernel_counter(&ifname, "rx_packets");
    // Paced well below what the kernel side takes under TCG, so the hub drops nothing.
    let child = vfpoll(&[
        "pktgen",
        "--device",
        NIC_0,
        "--count",
        &N.to_string(),
        "--rate",
        "1000",
        "--size",
        "128",
        "--dst-mac",
        &kmac.to_string(),
        "--ethertype",
        "0x88b5",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("vfpoll on PATH");
    let mut buf = vec![0u8; 2048];
    let mut next = 0u32;
    while (next as u64) < N {
        let Some(n) = sock.recv(&mut buf, Duration::from_secs(20)) else {
            let o = child.wait_with_output().unwrap();
            panic!("the kernel counted {next} of {N} frames\n{}", text(&o));
        };
        assert_eq!(n, 128);
        assert_eq!(seq_of(&buf[..n]), next, "in order");
        assert_eq!(&buf[6..12], &NIC_0_MAC.0);
        next += 1;
    }
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success(), "{t}");
    assert_eq!(number_after(&t, "sent "), N, "{t}");
    let hw = t
        .lines()
        .find(|l| l.contains("hw: rx"))
        .expect("hardware counters");
    assert_eq!(number_after(hw, "; tx "), N, "GPTC: {t}");
    assert!(kernel_counter(&ifname, "rx_packets") - k_rx0 >= N);
    assert!(
        sock.recv(&mut buf, Duration::from_millis(200)).is_none(),
        "no more than {N}"
    );
}

#[test]
#[ignore = "test bed"]
fn guest_nic_fwd_between_the_two_ports() {
    // Both NICs on vfpoll: they sit on one hub, so what one port sends the other receives, and
    // with --tx-first the frames go round: A -> hub -> B -> fwd -> A -> hub -> B ...
    if sysfs::device(&Host::default(), bdf(NIC_1))
        .unwrap()
        .driver
        .as_deref()
        == Some("e1000e")
    {
        run("ip", &["link", "set", &netdev(NIC_1), "down"]);
    }
    bind_all(&[NIC_0, NIC_1]);
    reserve_hugepages(64);
    let o = vfpoll(&[
        "fwd",
        "--device",
        NIC_0,
        "--device",
        NIC_1,
        "--tx-first",
        "--burst",
        "8",
        "--count",
        "2000",
    ])
    .output()
    .unwrap();
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success(), "{t}");
    assert!(t.contains("tx-first: 8 frames out of 0000:00:05.0"), "{t}");
    let line = t
        .lines()
        .find(|l| l.contains("packets forwarded in"))
        .expect("a total");
    let total = number_after(line, "fwd: ");
    assert!(total >= 2000, "{t}");
    for dir in [
        "0000:00:05.0 -> 0000:00:06.0: received ",
        "0000:00:06.0 -> 0000:00:05.0: received ",
    ] {
        assert!(number_after(&t, dir) >= 500, "both directions carry traffic: {t}");
    }
    // A signal ends it cleanly too.
    let child = vfpoll(&["fwd", "--device", NIC_0, "--device", NIC_1])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let o = terminate(child);
    assert!(
        o.status.success() && text(&o).contains("stopped by signal"),
        "{}",
        text(&o)
    );
    bind::unbind_to_kernel(&Host::default(), bdf(NIC_1), &BindOptions::default()).unwrap();
}

#[test]
#[ignore = "test bed"]
fn guest_nic_cli_errors_say_what_to_do() {
    bind_all(&[NIC_0]);
    reserve_hugepages(64);
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["pktgen", "--device", "0000:00:1e.0", "--count", "1"],
            &["no such PCI device", "vfpoll status"],
        ),
        (
            &["pktgen", "--device", NVME_A, "--count", "1"],
            &["1b36:0010", "NVMe", "not a NIC vfpoll drives", "8086:10d3"],
        ),
        (
            &["responder", "--device", NIC_0, "--ip", VFPOLL_IP],
            &["ADDR/PREFIX"],
        ),
        (
            &["pktgen", "--device", NIC_0, "--count", "1", "--pool", "100"],
            &["packet pool exhausted", "512 buffers needed", "raise --pool"],
        ),
        (&["fwd", "--device", NIC_0], &["give --device twice"]),
        (
            &["pktgen", "--device", NIC_0, "--dst-mac", "nope"],
            &["six hex octets"],
        ),
    ];
    for (args, want) in cases {
        let o = vfpoll(args).output().unwrap();
        let t = text(&o);
        println!("vfpoll {}: {t}", args.join(" "));
        assert!(!o.status.success(), "{args:?} succeeded: {t}");
        for w in *want {
            assert!(t.contains(w), "{args:?}: `{w}` missing from: {t}");
        }
    }
    // A device on its kernel driver: the VFIO error names the fix.
    let (_, _) = kernel_side();
    let o = vfpoll(&["pktgen", "--device", NIC_1, "--count", "1"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("vfpoll bind 0000:00:06.0"),
        "{t}"
    );
}

// ---- virtio-net ----------------------------------------------------------------------------

#[test]
#[ignore = "test bed"]
fn guest_nic_virtio_frames_both_ways_counted_in_order() {
    let (ifname, kmac) = kernel_side();
    let host = Host::default();
    assert_eq!(
        vfpoll_nic::probe(&host, bdf(VIRTIO_NET)).unwrap(),
        vfpoll_nic::virtio::DRIVER
    );
    let (mut port, pool) = vfpoll_port_on(VIRTIO_NET, &PortOptions::default());
    assert_eq!(port.mac(), VIRTIO_MAC, "MAC from the device configuration");
    exchange_with_kernel(&mut port, &pool, &ifname, kmac, 1024);
    drop(port);
    assert_eq!(pool.available(), pool.capacity(), "every buffer back after close");
    // The pool holds the container (and so the IOMMU group) open.
    drop(pool);
    // Opened again after the reset at close: the device comes back.
    let (port, pool) = vfpoll_port_on(VIRTIO_NET, &PortOptions::default());
    assert!(port.control().link().up);
    drop(port);
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
#[ignore = "test bed"]
fn guest_nic_virtio_responder_answers_ping() {
    let (ifname, _) = kernel_side();
    let (p, resp) = ping_responder(VIRTIO_NET, &ifname, 20, &[]);
    let r = text(&resp);
    assert!(p.contains("20 packets transmitted, 20 packets received"), "{p}");
    assert!(resp.status.success(), "responder exits cleanly on SIGTERM: {r}");
    assert_eq!(number_after(&r, "ICMP echo requests "), 20, "{r}");
    assert_eq!(number_after(&r, "replies dropped "), 0, "{r}");
    // Leave no neighbour entry naming this port for the tests that answer on NIC 0.
    let _ = Command::new("ip")
        .args(["neigh", "flush", "dev", &ifname])
        .output();
}

// ---- interrupt mode (issue 13, part 4) ------------------------------------------------------

/// User + system CPU time of this process.
fn process_cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the valid, exclusively borrowed buffer.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    assert_eq!(r, 0, "getrusage");
    // SAFETY: getrusage succeeded and filled it (and zeroed memory is a valid rusage anyway).
    let u = unsafe { u.assume_init() };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    d(u.ru_utime) + d(u.ru_stime)
}

fn irq_opts() -> PortOptions {
    PortOptions {
        completion: CompletionMode::Irq,
        ..PortOptions::default()
    }
}

/// Drains the receive ring; returns how many frames were ours (addressed to `me`).
fn drain_ours(port: &mut Port, me: MacAddr) -> usize {
    let mut pkts: Vec<Packet> = Vec::with_capacity(32);
    let mut ours = 0;
    while port.rx_burst(&mut pkts, 32) != 0 {
        ours += pkts
            .iter()
            .filter(|p| is_ours(p.data()) && p.data()[..6] == me.0)
            .count();
        free_bulk(&mut pkts);
    }
    ours
}

/// Interrupt mode on `dev`: frames both ways with the kernel (the receive side sleeping in
/// `Port::wait` whenever its ring is empty), a sleeping queue woken by one frame the kernel
/// sends 300 ms later (well before the 5-s timeout: only the interrupt ends the sleep that
/// early), and an idle queue sleeping for 3 s at under 1 % of a core.
fn irq_port_exchanges_and_sleeps(dev: &str) {
    let (ifname, kmac) = kernel_side();
    let (mut port, pool) = vfpoll_port_on(dev, &irq_opts());
    assert_eq!(port.completion_mode(), CompletionMode::Irq);
    use std::os::fd::AsRawFd;
    assert!(port.as_raw_fd() >= 0);
    exchange_with_kernel(&mut port, &pool, &ifname, kmac, 256);
    let me = port.mac();

    // Woken by a frame.
    drain_ours(&mut port, me);
    let t = Instant::now();
    let (woke, ours) = std::thread::scope(|s| {
        let ifname = &ifname;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            RawSocket::open(ifname).send(&frame(me, kmac, 7, 60));
        });
        let mut ours = 0;
        let mut woke = 0;
        while ours == 0 && t.elapsed() < Duration::from_secs(5) {
            if port
                .wait(Some(
                    Duration::from_secs(5) - t.elapsed().min(Duration::from_secs(5)),
                ))
                .unwrap()
            {
                woke += 1;
            }
            ours += drain_ours(&mut port, me);
        }
        (woke, ours)
    });
    let took = t.elapsed();
    println!(
        "{dev} ({}): woken {woke} time(s), our frame after {took:?}",
        mode_name()
    );
    assert_eq!(ours, 1, "the frame arrived");
    assert!(woke >= 1 && took < Duration::from_secs(4), "{took:?}");

    // Idle: 3 s asleep (waking only for whatever else the hub carries) cost under 1 %.
    let (cpu, t) = (process_cpu(), Instant::now());
    let (mut wakes, mut frames) = (0, 0usize);
    while t.elapsed() < Duration::from_secs(3) {
        let left = Duration::from_secs(3).saturating_sub(t.elapsed());
        if port.wait(Some(left)).unwrap() {
            wakes += 1;
            let mut pkts: Vec<Packet> = Vec::with_capacity(32);
            while port.rx_burst(&mut pkts, 32) != 0 {
                frames += pkts.len();
                free_bulk(&mut pkts);
            }
        }
    }
    let (used, slept) = (process_cpu() - cpu, t.elapsed());
    let pct = 100.0 * used.as_secs_f64() / slept.as_secs_f64();
    println!(
        "{dev} ({}): idle interrupt-mode receive queue: {used:?} of CPU in {slept:?} = {pct:.3}% of a core ({wakes} wakeups, {frames} other frames)",
        mode_name()
    );
    assert!(pct < 1.0, "{pct:.3}% of a core while idle");
    drop(port);
    assert_pool_whole(&pool, "after an interrupt-mode port");
}

#[test]
#[ignore = "test bed"]
fn guest_nic_irq_e1000e_exchanges_and_sleeps() {
    irq_port_exchanges_and_sleeps(NIC_0);
}

#[test]
#[ignore = "test bed"]
fn guest_nic_irq_virtio_exchanges_and_sleeps() {
    irq_port_exchanges_and_sleeps(VIRTIO_NET);
}

/// The `% of one core` figure of the responder's `cpu:` line.
fn cpu_percent(out: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("cpu: "))
        .unwrap_or_else(|| panic!("no cpu: line in:\n{out}"));
    let at = line.find("% of one core").expect("% of one core");
    let start = line[..at].rfind('(').expect("(") + 1;
    line[start..at].parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
#[ignore = "test bed"]
fn guest_nic_irq_responder_answers_ping_and_sleeps() {
    let (ifname, _) = kernel_side();
    for dev in [NIC_0, VIRTIO_NET] {
        let (p, resp) = ping_responder(dev, &ifname, 20, &["--completion", "irq"]);
        let r = text(&resp);
        assert!(
            p.contains("20 packets transmitted, 20 packets received"),
            "{dev}: {p}"
        );
        assert!(resp.status.success(), "{r}");
        assert!(r.contains("completion irq"), "{r}");
        assert_eq!(number_after(&r, "ICMP echo requests "), 20, "{r}");
        assert_eq!(number_after(&r, "replies dropped "), 0, "{r}");
        assert!(number_after(&r, "irq, ") >= 1, "it slept: {r}");
        let _ = Command::new("ip")
            .args(["neigh", "flush", "dev", &ifname])
            .output();
        // Idle for 3 s: it sleeps.
        let o = vfpoll(&[
            "responder",
            "--device",
            dev,
            "--ip",
            &format!("{VFPOLL_IP}/16"),
            "--completion",
            "irq",
            "--time",
            "3",
        ])
        .output()
        .unwrap();
        let t = text(&o);
        println!("{t}");
        assert!(o.status.success(), "{t}");
        let pct = cpu_percent(&t);
        assert!(
            pct < 1.0,
            "{dev}: idle irq-mode responder at {pct}% of a core: {t}"
        );
    }
    // Hybrid: spins 200 µs after each frame, then sleeps; answers all the same.
    let (p, resp) = ping_responder(
        NIC_0,
        &ifname,
        20,
        &["--completion", "hybrid", "--hybrid-spin-us", "200"],
    );
    let r = text(&resp);
    assert!(p.contains("20 packets transmitted, 20 packets received"), "{p}");
    assert!(r.contains("completion hybrid"), "{r}");
    assert_eq!(number_after(&r, "ICMP echo requests "), 20, "{r}");
    assert!(number_after(&r, "hybrid, ") >= 1, "it slept: {r}");
    let _ = Command::new("ip")
        .args(["neigh", "flush", "dev", &ifname])
        .output();
}

/// An ICMP echo request from the kernel side (`kmac`, [`KERNEL_IP`]) to `dst` at [`VFPOLL_IP`].
fn echo_request(dst: MacAddr, kmac: MacAddr, seq: u16) -> Vec<u8> {
    fn csum(d: &[u8]) -> u16 {
        let mut s: u32 = d
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
            .sum();
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }
    let ip = |s: &str| -> [u8; 4] { s.parse::<std::net::Ipv4Addr>().unwrap().octets() };
    let mut f = dst.0.to_vec();
    f.extend_from_slice(&kmac.0);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut h = vec![0x45, 0, 0, 84, 0, 0, 0x40, 0, 64, 1, 0, 0];
    h.extend_from_slice(&ip(KERNEL_IP));
    h.extend_from_slice(&ip(VFPOLL_IP));
    let c = csum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&h);
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34];
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend((0..56u8).map(|i| i ^ seq as u8));
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&icmp);
    f
}

/// The `vfpoll` to measure: the release build beside the debug one on the guest's PATH when
/// there is one (figures), else the first on the PATH.
fn vfpoll_for_figures() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .filter(|d| d.ends_with("target/release"))
        .map(|d| format!("{d}/vfpoll"))
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| "vfpoll".into())
}

/// Figures for BENCHMARKS.md: process CPU of `vfpoll responder` idle (4 s) and under an echo
/// request flood (4 s of AF_PACKET sends from the kernel side, as fast as the guest goes), in
/// poll and irq mode, on both NICs. Checks only that every mode answered; prints the table.
#[test]
#[ignore = "test bed"]
fn guest_nic_irq_responder_cpu_figures() {
    let (ifname, kmac) = kernel_side();
    let bin = vfpoll_for_figures();
    println!("binary: {bin} ({})", mode_name());
    for dev in [NIC_0, VIRTIO_NET] {
        let mac = if dev == NIC_0 { NIC_0_MAC } else { VIRTIO_MAC };
        for completion in ["poll", "irq"] {
            for flood in [false, true] {
                bind_all(&[dev]);
                reserve_hugepages(64);
                let mut c = Command::new(&bin);
                c.args(["responder", "--device", dev, "--ip", &format!("{VFPOLL_IP}/16")])
                    .args(["--completion", completion, "--time", "5"]);
                if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
                    c.arg("--noiommu");
                }
                let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
                // Bring-up, then 4 s of flood (or quiet) inside the 5-s run.
                std::thread::sleep(Duration::from_millis(700));
                let mut sent = 0u32;
                if flood {
                    let sock = RawSocket::open(&ifname);
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_secs(4) {
                        sock.send(&echo_request(mac, kmac, sent as u16));
                        sent += 1;
                    }
                }
                let o = child.wait_with_output().unwrap();
                let t = text(&o);
                assert!(o.status.success(), "{t}");
                let pct = cpu_percent(&t);
                let echo = number_after(&t, "ICMP echo requests ");
                println!(
                    "figure: {dev} {} completion {completion} {}: {pct:.1}% of a core, {echo} echo requests answered of {sent} sent",
                    mode_name(),
                    if flood { "flood" } else { "idle" }
                );
                if flood {
                    assert!(echo > 0, "{t}");
                }
            }
        }
    }
}
