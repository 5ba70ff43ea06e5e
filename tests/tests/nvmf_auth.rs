//! In-band authentication (DH-HMAC-CHAP, issue 25 item 1) with the guest kernel's initiator
//! and nvme-cli: `vfpoll target --dhchap-secret NQN=FILE [--dhchap-ctrl-secret NQN=FILE]`
//! with secrets from `nvme gen-dhchap-key`.
//!
//! On a kernel whose initiator authenticates (6.12: CONFIG_NVME_HOST_AUTH), each case runs
//! against vfpoll and then, in the same boot, against the kernel's nvmet given the same
//! secrets over configfs (`hosts/<nqn>/dhchap_key`, `dhchap_ctrl_key`, `dhchap_dhgroup`),
//! which must agree:
//!
//! | case | expected |
//! | --- | --- |
//! | right host secret | connects; I/O through two authenticated I/O queues reads back |
//! | right host and controller secrets | connects (bidirectional) |
//! | wrong host secret | refused |
//! | right host secret, wrong controller secret | refused (the host refuses the target) |
//! | no secret where one is required | refused |
//!
//! and vfpoll counts the two failures in `vfpoll_nvmf_authentication_failures_total`, lets a
//! host without a secret in as before, and lets the right secret in again once the failures'
//! back-off has passed. On a kernel without host authentication (6.1), a host with a secret
//! configured is refused (it cannot authenticate), and another host connects and does I/O.
//!
//! Run: `cargo xtask test --filter nvmf_auth --mode both --kernel 6.12`.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vfpoll_tests::*;

const NQN: &str = "nqn.2024-01.io.vfpoll:auth";
const METRICS: &str = "127.0.0.1:9465";
/// A host that has no secret configured.
const OTHER_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b3f6a1e-4c55-4e8b-9a61-757468657273";
const OTHER_ID: &str = "6b3f6a1e-4c55-4e8b-9a61-757468657273";
const NS_TIMEOUT: Duration = Duration::from_secs(30);

/// `nvme gen-dhchap-key` with these options: the secret's text.
fn gen_key(args: &[&str]) -> String {
    let mut a = vec!["gen-dhchap-key"];
    a.extend_from_slice(args);
    let out = run("nvme", &a);
    assert!(out.status.success(), "nvme {a:?}: {out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("DHHC-1:"), "{key}");
    key
}

/// A file only its owner reads, holding `text`.
fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn scrape() -> String {
    let mut s = std::net::TcpStream::connect(METRICS).expect("the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn auth_failures(page: &str) -> f64 {
    let key = format!("vfpoll_nvmf_authentication_failures_total{{subsystem=\"{NQN}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or_else(|| panic!("no {key}in\n{page}"), |v| v.trim().parse().unwrap())
}

/// `nvme connect` as the test host with these DH-HMAC-CHAP options.
fn connect_args<'a>(nqn: &'a str, extra: &'a [&'a str]) -> NvmeConnect<'a> {
    NvmeConnect {
        nr_io_queues: Some(2),
        extra,
        ..NvmeConnect::loopback(nqn)
    }
}

/// The secrets of one run.
struct Keys {
    host: String,
    ctrl: String,
    wrong: String,
}

/// The five cases against whatever serves `nqn` on 127.0.0.1:4420 with `keys`; `io` checks a
/// namespace's I/O after the first; `between` runs after each failure (vfpoll's back-off).
fn cases(nqn: &str, keys: &Keys, io: bool, between: &dyn Fn(u32)) {
    let (h, c, w) = (keys.host.as_str(), keys.ctrl.as_str(), keys.wrong.as_str());
    // Right host secret: both I/O queues authenticate, I/O reads back.
    let ctrl = FabricController::connect(&connect_args(nqn, &["--dhchap-secret", h]));
    assert_eq!(ctrl.attr("state"), "live");
    if io {
        let dev = ctrl.wait_namespace(1, NS_TIMEOUT);
        let data = Pattern::new(seed(), 2525).bytes(64 << 10);
        dd_write_direct(&dev, 1 << 20, &data);
        assert!(
            dd_read_direct(&dev, 1 << 20, data.len()) == data,
            "read back differs"
        );
    }
    ctrl.disconnect();
    // Bidirectional.
    let ctrl = FabricController::connect(&connect_args(
        nqn,
        &["--dhchap-secret", h, "--dhchap-ctrl-secret", c],
    ));
    assert_eq!(ctrl.attr("state"), "live");
    ctrl.disconnect();
    // Wrong host secret.
    let said = nvme_connect_refused(&connect_args(nqn, &["--dhchap-secret", w]));
    between(1);
    // The target does not know the controller secret the host holds: the host refuses it.
    let said2 = nvme_connect_refused(&connect_args(
        nqn,
        &["--dhchap-secret", h, "--dhchap-ctrl-secret", w],
    ));
    between(2);
    // No secret where one is required.
    let said3 = nvme_connect_refused(&connect_args(nqn, &[]));
    eprintln!("refusals: {said:?} / {said2:?} / {said3:?}");
}

#[test]
#[ignore = "test bed"]
fn guest_nvmf_auth_dhchap_with_the_kernel_initiator_and_nvmet() {
    load_modules(NVME_TCP_MODULES);
    loopback_up();
    reserve_hugepages(16);
    let host_auth = std::process::Command::new("busybox")
        .args(["modprobe", "nvme-auth"])
        .status()
        .is_ok_and(|s| s.success())
        && Path::new("/sys/module/nvme_auth").exists();
    let dir = std::env::temp_dir().join("vfpoll-auth");
    std::fs::create_dir_all(&dir).unwrap();
    let keys = Keys {
        host: gen_key(&["--hmac=1", "--nqn", HOST_NQN]),
        ctrl: gen_key(&["--hmac=2", "--key-length=48", "--nqn", NQN]),
        wrong: gen_key(&["--hmac=1", "--nqn", HOST_NQN]),
    };
    let host_file = private_file(&dir, "host.key", &keys.host);
    let ctrl_file = private_file(&dir, "ctrl.key", &keys.ctrl);
    // A secret file others can read is refused, with the fix.
    let open = dir.join("open.key");
    std::fs::write(&open, &keys.host).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new("vfpoll")
        .args(["target", "--malloc", "16M", "--dhchap-secret"])
        .arg(format!("{HOST_NQN}={}", open.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("chmod 600"), "{err}");

    let hs = format!("{HOST_NQN}={}", host_file.display());
    let cs = format!("{HOST_NQN}={}", ctrl_file.display());
    let mut target = VfpollTarget::start(
        NQN,
        &[
            "--malloc",
            "16M",
            "--dhchap-secret",
            &hs,
            "--dhchap-ctrl-secret",
            &cs,
            "--metrics",
            METRICS,
        ],
    );
    let line = target.next_line();
    assert!(line.contains("metrics at"), "{line}");

    // A host without a secret configured connects as before, and does I/O.
    let other = FabricController::connect(&NvmeConnect {
        host_nqn: OTHER_NQN,
        host_id: OTHER_ID,
        nr_io_queues: Some(1),
        ..NvmeConnect::loopback(NQN)
    });
    let dev = other.wait_namespace(1, NS_TIMEOUT);
    let data = Pattern::new(seed(), 2526).bytes(16 << 10);
    dd_write_direct(&dev, 0, &data);
    assert!(dd_read_direct(&dev, 0, data.len()) == data);
    other.disconnect();

    if !host_auth {
        // This kernel's initiator cannot authenticate: the host with a secret gets no
        // controller.
        let said = nvme_connect_refused(&NvmeConnect::loopback(NQN));
        eprintln!("refused without host authentication: {said}");
        assert_eq!(auth_failures(&scrape()), 0.0);
        return;
    }

    cases(NQN, &keys, true, &|n| {
        assert_eq!(auth_failures(&scrape()), n as f64, "failures counted");
        // The back-off after n failures in a row: 2^(n-1) s.
        std::thread::sleep(Duration::from_millis((1000 << (n - 1)) + 300));
    });
    // The right secret works again after the back-off.
    let ctrl = FabricController::connect(&connect_args(NQN, &["--dhchap-secret", &keys.host]));
    ctrl.disconnect();
    assert_eq!(auth_failures(&scrape()), 2.0);
    drop(target);

    // The kernel's target, the same secrets, the same cases.
    let nvmet = KernelTarget::start(&KernelTargetConfig {
        allowed_hosts: &[HOST_NQN],
        ..KernelTargetConfig::loopback(NQN, &[])
    });
    let host = Path::new(CONFIGFS).join("nvmet/hosts").join(HOST_NQN);
    for (attr, value) in [
        ("dhchap_key", keys.host.as_str()),
        ("dhchap_ctrl_key", keys.ctrl.as_str()),
        ("dhchap_hash", "hmac(sha256)"),
        ("dhchap_dhgroup", "ffdhe2048"),
    ] {
        std::fs::write(host.join(attr), value)
            .unwrap_or_else(|e| panic!("{attr}: {e}\n{}", kernel_log_tail(5)));
    }
    cases(NQN, &keys, false, &|_| {});
    nvmet.stop();
}
