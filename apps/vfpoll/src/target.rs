//! `vfpoll target`: serve a vfpoll NVMe namespace (or RAM) to NVMe/TCP initiators such as
//! Linux's `nvme connect -t tcp`, until SIGINT or SIGTERM.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_engine::affinity::{parse_cores, pin_current};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_nvmf::backend::{Backend, MallocBackend, NvmeBackend};
use vfpoll_nvmf::fabrics::{validate_nqn, Listener, NamespaceInfo, Subsystem, Target, TargetOptions};
use vfpoll_nvmf::server::{NamespaceBackend, Server, ServerConfig, WorkerConfig};
use vfpoll_pci::vfio::{Container, IommuMode};
use vfpoll_pci::Bdf;

use crate::ctx::Ctx;
use crate::units::{parse_nonzero_bytes, parse_page_size};

/// Options of `vfpoll target`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Address and TCP port to listen on (4420 is the NVMe/TCP port).
    #[arg(long, default_value = "127.0.0.1:4420", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// The subsystem's NQN, which hosts name in `nvme connect -n`.
    #[arg(long, default_value = "nqn.2024-01.io.vfpoll:target", value_name = "NQN")]
    nqn: String,
    /// Serve namespace NSID of the NVMe controller at BDF (bound to vfio-pci), as NSID 1.
    #[arg(long, value_name = "BDF/NSID", conflicts_with = "malloc")]
    ns: Option<String>,
    /// Serve a RAM namespace of SIZE bytes (e.g. 64M) instead.
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_bytes)]
    malloc: Option<u64>,
    /// Block size of the RAM namespace: 512 or 4096.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Allow only these host NQNs (repeat for more); without it every host may connect.
    #[arg(long, value_name = "NQN")]
    allow_host: Vec<String>,
    /// Use VFIO's no-IOMMU mode for --ns (needs root and enable_unsafe_noiommu_mode).
    #[arg(long)]
    noiommu: bool,
    /// Page size of the data buffers: 2M or 1G (hugepages). A buffer lies in one page and a
    /// command moves up to 128 KiB.
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    page_size: PageSize,
    /// Cores to run workers on, one pinned worker each (e.g. `2-3` or `1,3`); each new connection
    /// goes to the worker with the fewest. Without it one unpinned worker serves all.
    #[arg(long, value_name = "LIST")]
    cores: Option<String>,
    /// Print one JSON line per second on stdout: I/O commands per second, bytes read and
    /// written, connections and protocol errors of the served subsystem (connections count
    /// discovery connections too), and connections per worker.
    #[arg(long)]
    stats_json: bool,
}

/// A controller kept open while its namespace is served.
struct Device {
    _ctrl: Controller,
    _container: Arc<Container>,
}

/// Runs the target.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    validate_nqn(&a.nqn).map_err(|e| anyhow::anyhow!("--nqn: {e}"))?;
    for h in &a.allow_host {
        validate_nqn(h).map_err(|e| anyhow::anyhow!("--allow-host: {e}"))?;
    }
    let page_size = a.page_size;
    if page_size == PageSize::Base4K {
        // MDTS counts in 4 KiB pages as a power of two with 0 meaning "no limit": the smallest
        // limit a controller can state is 8 KiB, more than one 4 KiB page holds.
        bail!("--page-size 4K: a command's data must fit one buffer page and MDTS cannot say 4 KiB; use 2M (reserve hugepages with `vfpoll setup`)");
    }
    let max_transfer = (page_size.bytes() as u32).min(128 << 10);
    let cores: Vec<Option<usize>> = match &a.cores {
        Some(list) => parse_cores(list)
            .map_err(|e| anyhow::anyhow!("--cores {list}: {e}"))?
            .into_iter()
            .map(Some)
            .collect(),
        None => vec![None],
    };
    let mut sub = Subsystem::new(&a.nqn);
    if !a.allow_host.is_empty() {
        sub.allowed_hosts = Some(a.allow_host.clone());
    }
    // One backend per worker: its own queue pair for an NVMe namespace, shared storage for RAM.
    let (backends, dma, device): (Vec<Box<dyn Backend>>, DmaContext, Option<Device>) = match (&a.ns, a.malloc)
    {
        (Some(spec), _) => {
            let (bdf, nsid) = parse_ns(spec)?;
            let mode = if a.noiommu {
                IommuMode::NoIommu
            } else {
                IommuMode::Type1
            };
            let container = Container::open(mode).context("opening the VFIO container")?;
            let opts = ControllerOptions {
                page_size,
                ..Default::default()
            };
            let (ctrl, dma) = Controller::open_first(&container, bdf, opts)
                .with_context(|| format!("bringing up the NVMe controller {bdf}"))?;
            let ns = ctrl
                .namespace(nsid)
                .with_context(|| format!("namespace {nsid} of {bdf}"))?;
            let format = ns
                .format
                .map_err(|e| anyhow::anyhow!("namespace {nsid} of {bdf}: {e}"))?;
            let name = format!("nvme:{bdf}/{nsid}");
            let info = NamespaceInfo::from_format(&a.nqn, 1, &name, &format, ns.blocks)?;
            let vwc = ctrl.identify().vwc & 1 == 1;
            let mut backends: Vec<Box<dyn Backend>> = Vec::new();
            for w in 0..cores.len() {
                let qp = ctrl
                    .create_qpair(&QpairOptions::default())
                    .with_context(|| format!("creating worker {w}'s I/O queue pair on {bdf}"))?;
                backends.push(Box::new(NvmeBackend::new(qp, nsid, ns.lba_size, ns.blocks, vwc)));
            }
            sub.namespaces.push(info);
            let device = Device {
                _ctrl: ctrl,
                _container: container,
            };
            (backends, dma, Some(device))
        }
        (None, Some(size)) => {
            if a.block_size != 512 && a.block_size != 4096 {
                bail!("--block-size {} : use 512 or 4096", a.block_size);
            }
            let bytes = usize::try_from(size).context("--malloc is larger than this machine's memory")?;
            let blocks = (bytes / a.block_size as usize) as u64;
            if blocks == 0 {
                bail!("--malloc {size} holds no block of {} bytes", a.block_size);
            }
            let mut info = NamespaceInfo::new(&a.nqn, 1, "malloc", a.block_size, blocks);
            info.write_zeroes = true;
            info.deallocate = true;
            sub.namespaces.push(info);
            let storage = MallocBackend::storage(blocks as usize * a.block_size as usize);
            let backends = (0..cores.len())
                .map(|_| {
                    Box::new(MallocBackend::new(storage.clone(), a.block_size as usize)) as Box<dyn Backend>
                })
                .collect();
            // RAM namespaces are copied through the buffers by the CPU: no device maps them.
            let dma = DmaContext::new(Arc::new(FakeMapper::new()));
            (backends, dma, None)
        }
        (None, None) => bail!("nothing to serve: give --ns BDF/NSID or --malloc SIZE"),
    };
    let opts = TargetOptions {
        max_transfer,
        ..TargetOptions::default()
    };
    let target = Target::new(opts, vec![Listener::tcp(1, a.listen)], vec![sub])?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The first signal stops the target cleanly (connections closed, backends drained, the
        // controller shut down); a second one, while that hangs, exits at once with status 1.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop))
            .context("installing a signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing a signal handler")?;
    }
    let server = Server::start(ServerConfig {
        target,
        workers: backends
            .into_iter()
            .zip(&cores)
            .map(|(backend, &core)| WorkerConfig {
                namespaces: vec![NamespaceBackend {
                    subsystem_nqn: a.nqn.clone(),
                    nsid: 1,
                    backend,
                }],
                on_start: core.map(|c| {
                    Box::new(move || pin_current(c).map_err(|e| format!("pinning to core {c}: {e}")))
                        as vfpoll_nvmf::server::WorkerStart
                }),
            })
            .collect(),
        dma,
        page_size,
        buffers: 256,
        maxh2cdata: max_transfer,
    })
    .context("starting the target")?;
    println!(
        "vfpoll target: {} on {}, {} worker(s){} (nvme connect -t tcp -a {} -s {} -n {})",
        a.nqn,
        server.local_addrs()[0],
        server.workers(),
        a.cores
            .as_ref()
            .map(|c| format!(" on cores {c}"))
            .unwrap_or_default(),
        server.local_addrs()[0].ip(),
        server.local_addrs()[0].port(),
        a.nqn
    );
    drop(std::io::stdout().flush());
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last = (Instant::now(), server.stats());
    while !stop.load(Ordering::Relaxed) && server.is_running() {
        std::thread::sleep(Duration::from_millis(100));
        if (!tty && !a.stats_json) || last.0.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let now = (Instant::now(), server.stats());
        let secs = now.0.duration_since(last.0).as_secs_f64();
        let rate = |b: u64, a: u64| (b - a) as f64 / secs;
        let iops = rate(now.1.io_commands, last.1.io_commands);
        let (rd, wr) = (
            rate(now.1.read_bytes, last.1.read_bytes),
            rate(now.1.written_bytes, last.1.written_bytes),
        );
        if tty {
            eprint!(
                "\r{} connections, {iops:.0} IOPS, read {:.1} MB/s, written {:.1} MB/s, {} errors   ",
                now.1.active,
                rd / 1e6,
                wr / 1e6,
                now.1.protocol_errors
            );
        }
        if a.stats_json {
            let line = serde_json::json!({
                "time_s": now.0.duration_since(started).as_secs_f64(),
                "subsystems": [{
                    "nqn": a.nqn,
                    "iops": iops,
                    "read_bytes_per_s": rd,
                    "written_bytes_per_s": wr,
                    "read_bytes": now.1.read_bytes,
                    "written_bytes": now.1.written_bytes,
                    "io_commands": now.1.io_commands,
                    "connections": now.1.active,
                    "connections_accepted": now.1.accepted,
                    "protocol_errors": now.1.protocol_errors,
                }],
                "worker_connections": server.worker_connections(),
            });
            let mut out = std::io::stdout().lock();
            // A closed stdout (the reader went away) must not stop the target.
            drop(writeln!(out, "{line}").and_then(|()| out.flush()));
        }
        last = now;
    }
    let st = server.stats();
    server.stop();
    drop(device);
    if tty {
        eprintln!();
    }
    println!(
        "vfpoll target: stopped; {} connections, {} commands, {} protocol errors",
        st.accepted, st.commands, st.protocol_errors
    );
    Ok(ExitCode::SUCCESS)
}

/// `0000:00:03.0/1` → the BDF and NSID.
fn parse_ns(s: &str) -> anyhow::Result<(Bdf, u32)> {
    let Some((bdf, nsid)) = s.rsplit_once('/') else {
        bail!("--ns {s}: write BDF/NSID, e.g. 0000:00:03.0/1");
    };
    let bdf: Bdf = bdf
        .parse()
        .map_err(|e| anyhow::anyhow!("--ns {s}: {bdf} is not a PCI address: {e}"))?;
    let nsid: u32 = nsid
        .parse()
        .ok()
        .filter(|&n| n != 0)
        .with_context(|| format!("--ns {s}: {nsid} is not a namespace ID (1 and up)"))?;
    Ok((bdf, nsid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_specs_parse() {
        let (bdf, nsid) = parse_ns("0000:00:03.0/2").unwrap();
        assert_eq!((bdf.to_string().as_str(), nsid), ("0000:00:03.0", 2));
        assert!(parse_ns("0000:00:03.0").is_err());
        assert!(parse_ns("0000:00:03.0/0").is_err());
        assert!(parse_ns("nonsense/1").is_err());
    }
}
