//! QMP from a guest test: asks `cargo xtask vm`'s QMP agent (xtask's `qmp` module) for QEMU
//! commands through files in `/out/qmp/`, since the guest cannot reach the host's socket.
//!
//! A request is `/out/qmp/<name>.req` (written under a temporary name, then renamed): the
//! command's JSON on the first line, optionally `wait <EVENT> <ms>` on the second. The agent
//! answers in `<name>.resp`: `return <reply>` or `error <why>`, then `event <line>` and
//! `event_ms <ms>` (host clock, from the command to the event) or `event-timeout ...`.
//!
//! Boots of test binaries that xtask lists in its `HOTPLUG_BINS` have NVMe controller R
//! ([`NVME_R`], QEMU id [`NVME_R_ID`]) behind a PCIe root port, for `device_del`/`device_add`.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::out_dir;

/// Hot-pluggable NVMe controller R (serial `vfpoll-r`, one 64 MiB namespace of 512 B blocks),
/// behind root port `rp1` (00:0c.0).
pub const NVME_R: &str = "0000:01:00.0";
/// R's QEMU device id.
pub const NVME_R_ID: &str = "nvmer";
/// R's image file in the run dir.
pub const NVME_R_IMAGE: &str = "nvme-r-ns1.img";

/// The `device_add` arguments that plug R (back) in: the same device on the same root port,
/// over the same block node (which an unplug does not delete).
pub fn nvme_r_device() -> Value {
    serde_json::json!({
        "driver": "nvme", "id": NVME_R_ID, "bus": "rp1", "serial": "vfpoll-r", "drive": "nvmer1",
    })
}

/// What the agent answered.
#[derive(Debug, Clone)]
pub struct QmpReply {
    /// QEMU's reply (`{"return": ...}`), when the command was accepted.
    pub ret: Option<Value>,
    /// Why it failed (QEMU refused it, or the agent could not send it).
    pub error: Option<String>,
    /// The event waited for, when it came.
    pub event: Option<Value>,
    /// Host milliseconds from sending the command to the event.
    pub event_ms: Option<f64>,
    /// The response file as it was.
    pub text: String,
}

/// A request sent and not yet answered.
#[derive(Debug)]
pub struct Pending {
    resp: PathBuf,
    /// When it was written (guest clock).
    pub sent: Instant,
}

/// Sends `command` (a QMP command object); with `wait`, the agent also waits up to the given
/// time for that event after sending it.
pub fn request(command: &Value, wait: Option<(&str, Duration)>) -> Pending {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = out_dir().join("qmp");
    fs::create_dir_all(&dir).expect("/out/qmp");
    let name = format!(
        "{}-{:04}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let mut text = serde_json::to_string(command).expect("JSON") + "\n";
    if let Some((event, limit)) = wait {
        text.push_str(&format!("wait {event} {}\n", limit.as_millis()));
    }
    let tmp = dir.join(format!("{name}.tmp"));
    fs::write(&tmp, text).expect("write a QMP request");
    let sent = Instant::now();
    fs::rename(&tmp, dir.join(format!("{name}.req"))).expect("publish a QMP request");
    Pending {
        resp: dir.join(format!("{name}.resp")),
        sent,
    }
}

impl Pending {
    /// The answer, if it came.
    pub fn try_reply(&self) -> Option<QmpReply> {
        let text = fs::read_to_string(&self.resp).ok()?;
        let mut r = QmpReply {
            ret: None,
            error: None,
            event: None,
            event_ms: None,
            text: text.clone(),
        };
        for line in text.lines() {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            match k {
                "return" => r.ret = serde_json::from_str(v).ok(),
                "error" => r.error = Some(v.to_string()),
                "event" => r.event = serde_json::from_str(v).ok(),
                "event_ms" => r.event_ms = v.parse().ok(),
                _ => {}
            }
        }
        Some(r)
    }

    /// Waits for the answer; panics after `limit` (the agent runs only under `cargo xtask vm`).
    pub fn wait(self, limit: Duration) -> QmpReply {
        loop {
            if let Some(r) = self.try_reply() {
                return r;
            }
            assert!(
                self.sent.elapsed() < limit,
                "no answer to the QMP request {} within {limit:?}: is this running under `cargo xtask vm`/`test` (its QMP agent serves /out/qmp)?",
                self.resp.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Sends `command` and waits for QEMU's reply; panics when it is refused.
pub fn execute(command: &Value) -> QmpReply {
    let r = request(command, None).wait(Duration::from_secs(30));
    assert!(r.error.is_none(), "QMP {command}: {}", r.text);
    r
}

/// `device_del` of `id`, waiting (on the host) up to `limit` for `DEVICE_DELETED`.
pub fn device_del(id: &str, limit: Duration) -> Pending {
    request(
        &serde_json::json!({"execute": "device_del", "arguments": {"id": id}}),
        Some(("DEVICE_DELETED", limit)),
    )
}

/// `device_add` with `args`.
pub fn device_add(args: Value) -> QmpReply {
    execute(&serde_json::json!({"execute": "device_add", "arguments": args}))
}
