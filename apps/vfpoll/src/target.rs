//! `vfpoll target`: serve vfpoll NVMe namespaces (or RAM) to NVMe/TCP initiators such as
//! Linux's `nvme connect -t tcp`, until SIGINT or SIGTERM. One subsystem from the command line,
//! or any number of subsystems and listeners from a TOML file (`--config`), which SIGHUP
//! reloads.

mod devices;
mod metrics;
mod plan;
mod reload;
mod secrets;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args as ClapArgs;
use vfpoll_dma::PageSize;
use vfpoll_engine::affinity::pin_current;
use vfpoll_nvmf::fabrics::resv::ResvStore;
use vfpoll_nvmf::fabrics::{Target, TargetOptions};
use vfpoll_nvmf::server::{NamespaceBackend, Server, ServerConfig, StatsSnapshot, WorkerConfig};

use crate::ctx::Ctx;
use crate::units::{parse_nonzero_bytes, parse_page_size};
use devices::Devices;
use plan::{Plan, Settings, DEFAULT_NQN};

/// `--config`'s long help: every key of the file (docs/target.md explains them; a test checks
/// that this names each one the parser knows).
const CONFIG_HELP: &str = "Serve what this TOML file describes; SIGHUP reloads it (listeners, \
subsystems, namespaces, allowed hosts and rate limits change on the running target; the rest \
needs a restart). docs/target.md explains every key; docs/target-example.toml has them all. \
The keys:

cores = \"1-2\" (one pinned worker per core); page_size = \"2M\" | \"1G\" | \"4K\"; noiommu = \
false; spin_us = 100; nvme_completion = \"irq\" | \"poll\"; metrics = \"ADDR:PORT\" \
(Prometheus text at /metrics); state_dir = \"DIR\" (reservations that persist through \
power loss, relative to this file). The command line's flags of the same names win.

[[listener]]: address = \"IP:PORT\"; port_id = N (default: its place, from 1); ana_state = \
\"optimized\" | \"non-optimized\" | \"inaccessible\" | \"persistent-loss\" | \"change\"; tls \
(reserved: NVMe/TCP TLS is not built, refused).

[[subsystem]]: nqn = \"NQN\"; serial = \"...\" (default: derived from the NQN); model = \
\"...\" (default \"vfpoll\"); allow_hosts = [\"NQN\", ...] (default: any host).

[[subsystem.namespace]]: nsid = N (default: the next); nvme = \"BDF/NSID\" or malloc = \
\"SIZE\"; block_size = 512 | 4096 (malloc only); ana_group = 1..128; max_iops = N; \
max_bytes_per_s = \"SIZE\" (limits over all hosts).

[[subsystem.host]]: nqn = \"NQN\" or \"hostid:UUID\"; max_iops = N; max_bytes_per_s = \
\"SIZE\" (that host's limits over the subsystem); dhchap_secret = \"DHHC-1:..\" (the host \
must authenticate with DH-HMAC-CHAP, as `nvme connect --dhchap-secret`; the file must then be \
chmod 600); dhchap_ctrl_secret = \"DHHC-1:..\" (the controller's secret, for hosts that \
authenticate it: --dhchap-ctrl-secret); dhchap_hashes = [\"sha256\", \"sha384\", \"sha512\"] \
and dhchap_dhgroups = [\"ffdhe2048\", \"ffdhe3072\", \"ffdhe4096\", \"ffdhe6144\", \
\"ffdhe8192\", \"null\"] (allowed, in order of preference; these are the defaults).";

/// Options of `vfpoll target`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Address and TCP port to listen on (4420 is the NVMe/TCP port); repeat for more
    /// listeners (port IDs 1, 2, ... in order: paths for the host's multipath). Default
    /// 127.0.0.1:4420.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "config")]
    listen: Vec<SocketAddr>,
    /// The subsystem's NQN, which hosts name in `nvme connect -n`.
    #[arg(long, default_value = DEFAULT_NQN, value_name = "NQN", conflicts_with = "config")]
    nqn: String,
    /// Serve namespace NSID of the NVMe controller at BDF (bound to vfio-pci); repeat for
    /// more. They get NSIDs 1, 2, ... in order, then the --malloc ones.
    #[arg(long, value_name = "BDF/NSID", conflicts_with = "config")]
    ns: Vec<String>,
    /// Serve a RAM namespace of SIZE bytes (e.g. 64M); repeat for more.
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_bytes, conflicts_with = "config")]
    malloc: Vec<u64>,
    /// Block size of the RAM namespaces: 512 or 4096.
    #[arg(long, default_value_t = 512, conflicts_with = "config")]
    block_size: u32,
    /// Allow only these host NQNs (repeat for more); without it every host may connect.
    #[arg(long, value_name = "NQN", conflicts_with = "config")]
    allow_host: Vec<String>,
    /// Host NQN must authenticate with DH-HMAC-CHAP (in-band authentication) using the
    /// secret in FILE (`nvme gen-dhchap-key` output; chmod 600); repeat for more hosts.
    #[arg(long, value_name = "NQN=FILE", conflicts_with = "config")]
    dhchap_secret: Vec<String>,
    /// The controller's secret for host NQN (in FILE, chmod 600), which hosts connecting
    /// with --dhchap-ctrl-secret use to authenticate the target.
    #[arg(long, value_name = "NQN=FILE", conflicts_with = "config")]
    dhchap_ctrl_secret: Vec<String>,
    /// Serve what this TOML file describes; SIGHUP reloads it (`--help` lists the keys).
    #[arg(long, value_name = "FILE", long_help = CONFIG_HELP)]
    config: Option<PathBuf>,
    /// Use VFIO's no-IOMMU mode for NVMe namespaces (needs root and
    /// enable_unsafe_noiommu_mode).
    #[arg(long)]
    noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP)]
    iommu_backend: vfpoll_pci::vfio::Backend,
    /// Page size of the data buffers: 2M or 1G (hugepages), or 4K behind an IOMMU (a 128 KiB
    /// buffer then spans pages at one IOVA range; refused with --noiommu). A command moves up
    /// to 128 KiB. Default 2M.
    #[arg(long, value_parser = parse_page_size)]
    page_size: Option<PageSize>,
    /// Cores to run workers on, one pinned worker each (e.g. `2-3` or `1,3`); each new connection
    /// goes to the worker with the fewest. Without it one unpinned worker serves all.
    #[arg(long, value_name = "LIST")]
    cores: Option<String>,
    /// How long a worker keeps polling after its last work before it sleeps until a host
    /// sends something (epoll): longer answers hosts that pause between commands without a
    /// wake-up, shorter leaves the core idle sooner. Default 100.
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// How NVMe completions reach a worker past its spin time: irq (its queue pairs interrupt
    /// through MSI-X, the worker sleeps until one comes) or poll (no interrupts; it naps and
    /// polls). Default irq.
    #[arg(long, value_name = "MODE", value_parser = plan::parse_completion)]
    nvme_completion: Option<bool>,
    /// Print one JSON line per second on stdout: per subsystem I/O commands per second, bytes
    /// read and written, connections (queues), I/O errors and protocol errors; for the whole
    /// target connections (discovery ones too) and connections per worker.
    #[arg(long)]
    stats_json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464; port 0 picks one,
    /// printed at start): per subsystem, namespace and host I/O commands, bytes, errors,
    /// latency histograms, throttled commands and reservation conflicts; connections per
    /// host; refused Connects and authentication failures per subsystem. Served from a
    /// thread of its own; the workers only bump their own counters.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Keep the reservations of namespaces whose hosts asked them to persist through power
    /// loss (PTPL: `nvme resv-register --cptpl=3`) in DIR/reservations.state, so that they
    /// survive a restart (DIR is made if missing). Without it, reservations work but last as
    /// long as the process, and PTPL is refused.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

/// Runs the target.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let settings = Settings {
        cores: a.cores.clone(),
        page_size: a.page_size,
        noiommu: a.noiommu,
        spin_us: a.spin_us,
        nvme_irq: a.nvme_completion,
        metrics: a.metrics,
        state_dir: a.state_dir.clone(),
    };
    let mut plan = match &a.config {
        Some(path) => Plan::from_file(path, &settings)?,
        None => Plan::from_args(
            settings.clone(),
            &a.listen,
            &a.nqn,
            &a.ns,
            &a.malloc,
            a.block_size,
            &a.allow_host,
        )
        .and_then(|mut p| {
            p.subsystems[0].host_auth = secrets::from_args(&a.dhchap_secret, &a.dhchap_ctrl_secret)?;
            p.check()?;
            Ok(p)
        })?,
    };
    let page_size = plan.page_size;
    // Buffers larger than a page span pages behind an IOMMU; without one the plan refused 4 KiB
    // pages (2 MiB and 1 GiB pages hold a whole buffer).
    let max_transfer = 128 << 10;
    let workers = plan.cores.len();
    let backend = crate::iommu_backend::requested(plan.noiommu, a.iommu_backend)?;
    let mut devices = Devices::new(plan.has_nvme(), backend, page_size, plan.nvme_irq)?;
    // One backend per worker and namespace: its own queue pair for an NVMe namespace, shared
    // storage for RAM.
    let mut subsystems = Vec::new();
    let mut per_worker: Vec<Vec<NamespaceBackend>> = (0..workers).map(|_| Vec::new()).collect();
    for s in &plan.subsystems {
        let (sub, backends) = reload::build_subsystem(&mut devices, s, workers)?;
        for (nsid, list) in backends {
            for (w, backend) in list.into_iter().enumerate() {
                per_worker[w].push(NamespaceBackend {
                    subsystem_nqn: s.nqn.clone(),
                    nsid,
                    backend,
                });
            }
        }
        subsystems.push(sub);
    }
    let opts = TargetOptions {
        max_transfer,
        ..TargetOptions::default()
    };
    let mut target = Target::new(opts, plan.listeners.clone(), subsystems)?;
    if let Some(dir) = &plan.state_dir {
        target.set_reservation_store(ResvStore::open(dir)?)?;
        let pending = target.reservations_not_served();
        if !pending.is_empty() {
            eprintln!(
                "vfpoll target: {}: reservations kept for namespaces not served: {}",
                dir.display(),
                pending.join(", ")
            );
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The first signal stops the target cleanly (connections closed, backends drained, the
        // controller shut down); a second one, while that hangs, exits at once with status 1.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop))
            .context("installing a signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing a signal handler")?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))
        .context("installing a signal handler")?;
    // The main thread sleeps until a signal or the next stats line: it shares the workers'
    // cores (an operator may pin the whole process), so it must not wake them up for nothing.
    let (mut sig_rx, sig_tx) = std::os::unix::net::UnixStream::pair().context("making a signal pipe")?;
    sig_tx.set_nonblocking(true).context("making a signal pipe")?;
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::low_level::pipe::register(sig, sig_tx.try_clone().context("making a signal pipe")?)
            .context("installing a signal handler")?;
    }
    let server = Server::start(ServerConfig {
        target,
        workers: per_worker
            .into_iter()
            .zip(&plan.cores)
            .map(|(namespaces, &core)| WorkerConfig {
                namespaces,
                on_start: core.map(|c| {
                    Box::new(move || pin_current(c).map_err(|e| format!("pinning to core {c}: {e}")))
                        as vfpoll_nvmf::server::WorkerStart
                }),
            })
            .collect(),
        dma: devices.dma().clone(),
        page_size,
        buffers: 256,
        maxh2cdata: max_transfer,
        spin: plan.spin,
    })
    .context("starting the target")?;
    let metrics = match plan.metrics {
        Some(addr) => {
            let source = server.metrics_handle();
            Some(metrics::Endpoint::start(addr, move || {
                source.metrics().to_prometheus()
            })?)
        }
        None => None,
    };
    let first = server.local_addrs()[0];
    for s in &plan.subsystems {
        println!(
            "vfpoll target: {} ({} namespace(s)) on {}, {} worker(s){} (nvme connect -t tcp -a {} -s {} -n {})",
            s.nqn,
            s.namespaces.len(),
            server
                .local_addrs()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" and "),
            server.workers(),
            plan.cores_text
                .as_ref()
                .map(|c| format!(" on cores {c}"))
                .unwrap_or_default(),
            first.ip(),
            first.port(),
            s.nqn
        );
    }
    if let Some(ep) = &metrics {
        println!("vfpoll target: metrics at http://{}/metrics", ep.addr());
    }
    drop(std::io::stdout().flush());
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last = (Instant::now(), server.stats(), snapshot_map(&server));
    while !stop.load(Ordering::Relaxed) && server.is_running() {
        // A stats line once a second; without one, a look at the server's threads as often.
        let printing = tty || a.stats_json;
        let wait = match printing {
            true => Duration::from_secs(1).saturating_sub(last.0.elapsed()),
            false => Duration::from_secs(1),
        };
        wait_for_signal(&mut sig_rx, wait.max(Duration::from_millis(1)));
        if hup.swap(false, Ordering::Relaxed) {
            reload(&server, &mut devices, &mut plan, a.config.as_ref(), &settings);
        }
        if !printing || last.0.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let now = (Instant::now(), server.stats(), snapshot_map(&server));
        let secs = now.0.duration_since(last.0).as_secs_f64();
        if tty {
            let rate = |b: u64, a: u64| b.saturating_sub(a) as f64 / secs;
            eprint!(
                "\r{} connections, {:.0} IOPS, read {:.1} MB/s, written {:.1} MB/s, {} errors   ",
                now.1.active,
                rate(now.1.io_commands, last.1.io_commands),
                rate(now.1.read_bytes, last.1.read_bytes) / 1e6,
                rate(now.1.written_bytes, last.1.written_bytes) / 1e6,
                now.1.protocol_errors + now.1.io_errors
            );
        }
        if a.stats_json {
            let line = stats_line(&server, &now, &last, started);
            let mut out = std::io::stdout().lock();
            // A closed stdout (the reader went away) must not stop the target.
            drop(writeln!(out, "{line}").and_then(|()| out.flush()));
        }
        last = now;
    }
    let st = server.stats();
    server.stop();
    drop(devices);
    if tty {
        eprintln!();
    }
    println!(
        "vfpoll target: stopped; {} connections, {} commands, {} protocol errors",
        st.accepted, st.commands, st.protocol_errors
    );
    Ok(ExitCode::SUCCESS)
}

/// Sleeps until a signal handler writes to the pipe or `timeout` passes.
fn wait_for_signal(rx: &mut std::os::unix::net::UnixStream, timeout: Duration) {
    use std::io::Read;
    if rx.set_read_timeout(Some(timeout)).is_err() {
        std::thread::sleep(timeout);
        return;
    }
    let mut buf = [0u8; 64];
    // What woke it is in the flags; the bytes only end the wait.
    drop(rx.read(&mut buf));
}

/// Re-reads `--config` and applies what changed; says what it did on stdout (and the log).
fn reload(
    server: &Server,
    devices: &mut Devices,
    plan: &mut Plan,
    config: Option<&PathBuf>,
    settings: &Settings,
) {
    let Some(path) = config else {
        log::warn!("SIGHUP: nothing to reload (the target runs without --config)");
        return;
    };
    let new = match Plan::from_file(path, settings) {
        Ok(p) => p,
        Err(e) => {
            println!("vfpoll target: reload refused, the target runs on unchanged: {e:#}");
            drop(std::io::stdout().flush());
            return;
        }
    };
    let out = reload::apply(server, devices, plan, &new);
    if out.applied.is_empty() && out.failed.is_empty() {
        println!("vfpoll target: reloaded {}: nothing changed", path.display());
    }
    for line in &out.applied {
        println!("vfpoll target: reloaded {}: {line}", path.display());
    }
    for line in &out.failed {
        println!("vfpoll target: reload of {}: not done: {line}", path.display());
    }
    drop(std::io::stdout().flush());
}

type Sample = (Instant, StatsSnapshot, HashMap<String, StatsSnapshot>);

fn snapshot_map(server: &Server) -> HashMap<String, StatsSnapshot> {
    server.subsystem_stats().into_iter().collect()
}

/// One `--stats-json` line: rates over the last interval and totals, per subsystem.
fn stats_line(server: &Server, now: &Sample, last: &Sample, started: Instant) -> serde_json::Value {
    let secs = now.0.duration_since(last.0).as_secs_f64();
    let rate = |b: u64, a: u64| b.saturating_sub(a) as f64 / secs;
    let mut subs: Vec<(&String, &StatsSnapshot)> = now.2.iter().collect();
    subs.sort_by(|a, b| a.0.cmp(b.0));
    let subsystems: Vec<serde_json::Value> = subs
        .into_iter()
        .map(|(nqn, s)| {
            let p = last.2.get(nqn).copied().unwrap_or_default();
            serde_json::json!({
                "nqn": nqn,
                "iops": rate(s.io_commands, p.io_commands),
                "read_bytes_per_s": rate(s.read_bytes, p.read_bytes),
                "written_bytes_per_s": rate(s.written_bytes, p.written_bytes),
                "read_bytes": s.read_bytes,
                "written_bytes": s.written_bytes,
                "io_commands": s.io_commands,
                "io_errors": s.io_errors,
                "connections": s.active,
                "connections_accepted": s.accepted,
                "protocol_errors": s.protocol_errors,
            })
        })
        .collect();
    serde_json::json!({
        "time_s": now.0.duration_since(started).as_secs_f64(),
        "subsystems": subsystems,
        "connections": now.1.active,
        "connections_accepted": now.1.accepted,
        "protocol_errors": now.1.protocol_errors,
        "worker_connections": server.worker_connections(),
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::plan::{file_keys, Plan, Settings, Source};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::Args,
    }

    const EXAMPLE: &str = include_str!("../../../docs/target-example.toml");
    const DOCS: &str = include_str!("../../../docs/target.md");

    /// Every key of the file is in `--help`, in docs/target.md's table and in the example
    /// (as a key, or as a comment for the reserved ones), and the example loads.
    #[test]
    fn every_key_is_documented_and_the_example_has_it() {
        let keys = file_keys();
        assert!(keys.len() >= 25, "{keys:?}");
        let help = Cli::command().render_long_help().to_string();
        let example: toml::Value = toml::from_str(EXAMPLE).unwrap();
        let mut used = std::collections::BTreeSet::new();
        fn walk(v: &toml::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
            match v {
                toml::Value::Table(t) => {
                    for (k, v) in t {
                        let path = format!("{prefix}{k}");
                        match v {
                            toml::Value::Array(a) if a.iter().all(toml::Value::is_table) && !a.is_empty() => {
                                for x in a {
                                    walk(x, &format!("{path}."), out);
                                }
                            }
                            _ => {
                                out.insert(path);
                            }
                        }
                    }
                }
                _ => unreachable!("tables only"),
            }
        }
        walk(&example, "", &mut used);
        for k in &keys {
            let name = k.rsplit('.').next().unwrap();
            assert!(help.contains(&format!("{name} ")), "--help does not name {k}");
            assert!(
                DOCS.contains(&format!("| `{k}` |")),
                "docs/target.md's table lacks {k}"
            );
            let reserved = matches!(k.as_str(), "listener.tls");
            if reserved {
                assert!(
                    EXAMPLE.contains(&format!("# {name} = ")),
                    "the example does not show {k}"
                );
            } else {
                assert!(used.contains(k), "the example does not set {k}");
            }
        }
        for k in &used {
            assert!(
                keys.contains(k),
                "the example sets {k}, which the parser does not know"
            );
        }
        let p = Plan::from_toml(EXAMPLE, &Settings::default()).unwrap();
        assert_eq!(p.listeners.len(), 2);
        assert_eq!(p.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        let s = &p.subsystems[0];
        assert_eq!(s.allowed_hosts.as_ref().map(Vec::len), Some(2));
        assert!(matches!(s.namespaces[0].source, Source::Nvme { nsid: 1, .. }));
        assert_eq!(s.limits.namespaces[&1].iops, Some(200_000));
        assert_eq!(s.limits.hosts.len(), 1);
    }

    /// The reserved keys are refused with the reason.
    #[test]
    fn reserved_keys_say_they_are_not_built() {
        let sub = "[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n";
        let tls = format!("[[listener]]\naddress = \"127.0.0.1:1\"\ntls = true\n{sub}");
        let e = format!("{:#}", Plan::from_toml(&tls, &Settings::default()).unwrap_err());
        assert!(e.contains("tlshd") && e.contains("Debian 12"), "{e}");
    }

    /// A file with secrets loads only when no one but its owner can read it; a host with a
    /// secret must be in allow_hosts where there is one.
    #[test]
    fn a_file_with_secrets_must_be_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let host = "nqn.2024-01.io.vfpoll:h";
        let text = format!(
            "[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n[[subsystem.namespace]]\nmalloc = \"1M\"\n[[subsystem.host]]\nnqn = \"{host}\"\ndhchap_secret = \"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\"\n"
        );
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &text).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = format!(
            "{:#}",
            Plan::from_file(f.path(), &Settings::default()).unwrap_err()
        );
        assert!(e.contains("chmod 600") && e.contains("0644"), "{e}");
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = Plan::from_file(f.path(), &Settings::default()).unwrap();
        assert!(p.subsystems[0].host_auth.contains_key(host));
        let listed = text.replace(
            "[[subsystem.namespace]]",
            "allow_hosts = [\"nqn.2024-01.io.vfpoll:other\"]\n[[subsystem.namespace]]",
        );
        let e = format!(
            "{:#}",
            Plan::from_toml(&listed, &Settings::default()).unwrap_err()
        );
        assert!(e.contains("not in allow_hosts"), "{e}");
        let bad = text.replace("KfiaR", "KfiaS");
        let e = format!("{:#}", Plan::from_toml(&bad, &Settings::default()).unwrap_err());
        assert!(e.contains("CRC-32"), "{e}");
    }
}
