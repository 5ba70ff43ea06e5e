//! `vfpoll gpu load|save|info`: checkpoint restore and save between an NVMe namespace (or the
//! in-process NVMe model, a file, or hugepage-resident data) and GPU memory through vfpoll's
//! pipelined loader (`vfpoll-gpu`), and what this machine offers for GPU peer-to-peer DMA.
//!
//! The GPU is reached through the CUDA driver, loaded at run time, in builds with the `cuda`
//! feature; `--cpu` runs the same pipeline into ordinary memory instead (no GPU needed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args as ClapArgs, Subcommand};
use serde_json::{json, Value};
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_gpu::p2p::Check;
use vfpoll_gpu::{
    BlockSource, CopyEngine, CpuEngine, DataPath, FileSource, NvmeSource, Options, PatternSource, Report,
    Slots, Transfer,
};
use vfpoll_nvme::{Controller, QpairOptions};
use vfpoll_pci::vfio::Container;
use vfpoll_pci::Bdf;

use crate::ctx::Ctx;
use crate::nvme_open::DeviceArgs;
use crate::units::{parse_bytes, parse_page_size};

/// Arguments of `vfpoll gpu`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: GpuCmd,
}

#[derive(Debug, Subcommand)]
enum GpuCmd {
    /// Load --len bytes from the source at --offset into GPU memory (checkpoint restore).
    ///
    /// The source is read into --slots hugepage slots of --slot-size bytes while earlier slots
    /// are copied to the GPU (registered memory, asynchronous copies: no CPU copy). Prints the
    /// path the data took, GB/s, and the CPU time of the loading thread. --verify copies the
    /// GPU's data back and compares it with the source.
    Load(XferArgs),
    /// Save --len bytes of GPU memory to the sink at --offset (checkpoint save).
    ///
    /// GPU memory is first filled with a seeded pattern (not timed); the timed save copies it
    /// into the slots and writes them out, then flushes the sink. --verify reads the sink back
    /// and compares it with the GPU's memory.
    Save(XferArgs),
    /// Show the GPUs, export GPU memory as a dma-buf, and check what peer-to-peer DMA from an
    /// NVMe controller into GPU memory would need on this machine.
    Info(InfoArgs),
}

#[derive(Debug, ClapArgs)]
struct XferArgs {
    /// NVMe controller (PCI address), bound to vfio-pci (`vfpoll bind`).
    #[arg(long, short = 'd', value_name = "BDF", required_unless_present_any = ["model", "file", "hugepages"],
          conflicts_with_all = ["model", "file", "hugepages"])]
    device: Option<Bdf>,
    /// Namespace.
    #[arg(long, short = 'n', default_value_t = 1)]
    nsid: u32,
    /// Open the controller in VFIO's no-IOMMU mode (the same as --iommu-backend noiommu).
    #[arg(long, requires = "device")]
    noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP)]
    iommu_backend: vfpoll_pci::vfio::Backend,
    /// Use vfpoll's in-process NVMe model (one namespace of 4 KiB blocks, just large enough,
    /// seeded with a pattern) through the real driver: needs no NVMe and no VFIO.
    #[arg(long, conflicts_with_all = ["file", "hugepages"])]
    model: bool,
    /// Use a file (read with pread into the slots; created for a save).
    #[arg(long, value_name = "PATH", conflicts_with = "hugepages")]
    file: Option<PathBuf>,
    /// Open --file with O_DIRECT (4 KiB-aligned offsets).
    #[arg(long, requires = "file")]
    direct: bool,
    /// Hugepage-resident data: the slots hold the data already (a pattern repeated every slot),
    /// reads move nothing and saves discard: measures the hugepage <-> GPU stage alone.
    #[arg(long)]
    hugepages: bool,
    /// Byte offset in the source (a multiple of its block size).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    offset: u64,
    /// Bytes to move: 4096, 512k, 16m, 8g ... (binary units).
    #[arg(long, value_parser = parse_bytes)]
    len: u64,
    /// GPU (CUDA ordinal).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Copy into ordinary memory instead of a GPU (the pipeline's CPU stand-in; no CUDA needed).
    #[arg(long)]
    cpu: bool,
    /// Number of hugepage slots.
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Bytes per slot (a multiple of 4 KiB).
    #[arg(long, default_value = "16m", value_parser = parse_bytes)]
    slot_size: u64,
    /// CUDA streams (slot i copies on stream i % N).
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Page size of the slots: 2M (hugepages, the default), 1G, or 4K.
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    page_size: PageSize,
    /// Never sleep on a GPU copy: poll all the time (lowest latency, one core busy).
    #[arg(long)]
    spin: bool,
    /// Run the timed transfer this many times (each is reported).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Compare the GPU's copy with the source afterwards; a difference exits 1.
    #[arg(long)]
    verify: bool,
    /// Seed of the pattern written to the model (load) or to GPU memory (save).
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Give up when nothing completes for this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, ClapArgs)]
struct InfoArgs {
    /// GPU (CUDA ordinal) whose memory is exported.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Bytes of GPU memory to export as a dma-buf.
    #[arg(long, default_value = "64m", value_parser = parse_bytes)]
    export_len: u64,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `vfpoll gpu`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        GpuCmd::Load(x) => transfer(x, false),
        GpuCmd::Save(x) => transfer(x, true),
        GpuCmd::Info(i) => info(i),
    }
}

/// The source, its slots, and what keeps them alive. Field order is drop order: the source
/// (queue pair) goes first, then the slots, the controller, the model thread.
struct Setup {
    source: Box<dyn BlockSource>,
    slots: Slots,
    _ctrl: Option<Controller>,
    _container: Option<Arc<Container>>,
    model: Option<crate::model::NvmeModel>,
}

impl Setup {
    /// A source that drives no device (a file, or the pattern in hugepages).
    fn without_device(source: Box<dyn BlockSource>, slots: Slots) -> Setup {
        Setup {
            source,
            slots,
            _ctrl: None,
            _container: None,
            model: None,
        }
    }
}

fn slot_geometry(a: &XferArgs) -> anyhow::Result<usize> {
    let ss = usize::try_from(a.slot_size).context("--slot-size is too large")?;
    if a.slots == 0 {
        bail!("--slots must be at least 1");
    }
    if a.verify && a.slots < 2 {
        bail!("--verify needs at least two slots (--slots 2)");
    }
    Ok(ss)
}

fn qpair_options(a: &XferArgs) -> QpairOptions {
    QpairOptions {
        entries: 1024,
        sgl: true,
        timeout: Duration::from_secs(a.timeout),
        ..Default::default()
    }
}

fn open_source(a: &XferArgs, save: bool) -> anyhow::Result<Setup> {
    let ss = slot_geometry(a)?;
    let no_device = || DmaContext::new(Arc::new(FakeMapper::new()));
    if let Some(path) = &a.file {
        let slots = Slots::alloc(&no_device(), a.slots, ss, a.page_size)?;
        let source = FileSource::open(path, save, a.direct)?;
        return Ok(Setup::without_device(Box::new(source), slots));
    }
    if a.hugepages {
        let mut slots = Slots::alloc(&no_device(), a.slots, ss, a.page_size)?;
        let source = PatternSource::resident(&mut slots, a.seed)?;
        return Ok(Setup::without_device(Box::new(source), slots));
    }
    if a.model {
        return open_model(a, ss, save);
    }
    let Some(device) = a.device else {
        bail!("name a source: --device BDF, --model, --file PATH or --hugepages");
    };
    let dev = DeviceArgs {
        device,
        noiommu: a.noiommu,
        iommu_backend: a.iommu_backend,
        page_size: a.page_size,
    };
    let (ctrl, dma, container) = dev.open()?;
    let slots = Slots::alloc(&dma, a.slots, ss, a.page_size)?;
    let source = NvmeSource::new(&ctrl, a.nsid, &slots, &qpair_options(a), &device.to_string())?;
    Ok(Setup {
        source: Box::new(source),
        slots,
        _ctrl: Some(ctrl),
        _container: Some(container),
        model: None,
    })
}

/// The in-process NVMe model (seeded with the pattern for a load) and the driver's controller
/// on it (`--model`).
#[cfg(feature = "model")]
fn open_model(a: &XferArgs, ss: usize, save: bool) -> anyhow::Result<Setup> {
    use crate::model::{ModelConfig, NamespaceConfig, NvmeModel};
    use vfpoll_nvme::ControllerOptions;

    const LBA: u64 = 4096;
    let bytes = (a.offset + a.len).next_multiple_of(ss as u64).max(LBA);
    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, LBA as u32, bytes / LBA)],
        mdts: 0,
        max_queue_entries: 4096,
        // Poll without sleeping for as long as a run may pause between commands.
        idle_spin: Duration::from_secs(2),
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, mapper.clone()).context("starting the NVMe model")?;
    if !save {
        seed_model(&model, a.offset, a.len, a.seed)?;
    }
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 1,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts)
        .context("bringing up the model's controller")?;
    let slots = Slots::alloc(ctrl.dma(), a.slots, ss, a.page_size)?;
    let source = NvmeSource::new(&ctrl, a.nsid, &slots, &qpair_options(a), "model")?;
    Ok(Setup {
        source: Box::new(source),
        slots,
        _ctrl: Some(ctrl),
        _container: None,
        model: Some(model),
    })
}

#[cfg(not(feature = "model"))]
fn open_model(_: &XferArgs, _: usize, _: bool) -> anyhow::Result<Setup> {
    Err(crate::model::unavailable("--model"))
}

/// Writes the pattern of transfer bytes `0..len` at namespace byte `offset` (rounded out to
/// whole blocks: the bytes before `offset` in its block get the pattern too, harmlessly).
#[cfg(feature = "model")]
fn seed_model(model: &crate::model::NvmeModel, offset: u64, len: u64, seed: u64) -> anyhow::Result<()> {
    const LBA: u64 = 4096;
    const CHUNK: u64 = 64 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let end = (offset + len).next_multiple_of(LBA);
    let mut at = offset - offset % LBA;
    while at < end {
        let n = (end - at).min(CHUNK) as usize;
        // The transfer's byte 0 is namespace byte `offset`.
        vfpoll_gpu::pattern(seed, at.wrapping_sub(offset), &mut buf[..n]);
        model.write_ns(1, at / LBA, &buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

fn open_engine(a: &XferArgs, slots: &Slots) -> anyhow::Result<Box<dyn CopyEngine>> {
    let len = usize::try_from(a.len).context("--len is too large for this machine")?;
    if a.cpu {
        return Ok(Box::new(CpuEngine::new(len)));
    }
    #[cfg(feature = "cuda")]
    {
        use vfpoll_gpu::cuda::{CudaEngine, DeviceMemory, Gpu};
        let gpu = Gpu::open(a.gpu).context("opening the GPU")?;
        let mem = DeviceMemory::alloc(&gpu, len)
            .with_context(|| format!("allocating {len} bytes on GPU {}", a.gpu))?;
        let engine = CudaEngine::new(mem, slots, a.streams)
            .context("registering the hugepage slots with CUDA (cuMemHostRegister)")?;
        Ok(Box::new(engine))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = slots;
        vfpoll_gpu::cuda_available()
            .context("no GPU (use --cpu to run the pipeline into ordinary memory)")?;
        bail!("unreachable: CUDA reported available in a build without the `cuda` feature")
    }
}

fn transfer(a: XferArgs, save: bool) -> anyhow::Result<ExitCode> {
    let mut s = open_source(&a, save)?;
    let mut engine = open_engine(&a, &s.slots)?;
    // The pipeline stages through hugepage slots; peer-to-peer needs what the check lists.
    let check = Check::probe(std::path::Path::new("/"), None, kernel_config());
    let path = DataPath::Staged;
    let p2p_note = if a.cpu {
        "the CPU stand-in has no device memory to target".to_string()
    } else if check.possible() {
        "the machine offers what peer-to-peer DMA needs, but vfpoll cannot target GPU memory yet".to_string()
    } else {
        let missing: Vec<&str> = check.missing().map(|m| m.what).collect();
        format!(
            "peer-to-peer not possible here, missing: {} (`vfpoll gpu info` says more)",
            missing.join(", ")
        )
    };
    let o = Options {
        timeout: Duration::from_secs(a.timeout),
        block_when_idle: !a.spin,
    };
    let t = Transfer {
        source_offset: a.offset,
        device_offset: 0,
        len: a.len,
    };
    if save {
        // Fill GPU memory with the pattern through the same slots (not timed).
        let mut fill = PatternSource::generated(&s.slots, a.seed);
        let ft = Transfer {
            source_offset: 0,
            ..t
        };
        vfpoll_gpu::load(&mut fill, engine.as_mut(), &mut s.slots, &ft, &o).context("filling GPU memory")?;
    }
    let mut reports = Vec::new();
    for _ in 0..a.repeat {
        let r = if save {
            vfpoll_gpu::save(s.source.as_mut(), engine.as_mut(), &mut s.slots, &t, &o)
        } else {
            vfpoll_gpu::load(s.source.as_mut(), engine.as_mut(), &mut s.slots, &t, &o)
        };
        reports.push(r.with_context(|| {
            format!(
                "{} {} bytes {} {}",
                if save { "saving" } else { "loading" },
                a.len,
                if save { "to" } else { "from" },
                s.source.describe()
            )
        })?);
    }
    let verified = if !a.verify {
        None
    } else if save && a.hugepages {
        Some(Err(
            "nothing to compare: saves to hugepage-resident data are discarded".to_string(),
        ))
    } else {
        Some(
            vfpoll_gpu::verify(s.source.as_mut(), engine.as_mut(), &mut s.slots, &t, &o)
                .map_err(|e| format!("{:#}", anyhow::Error::from(e))),
        )
    };
    let model_errors = s.model.as_ref().map(crate::model::errors);
    let head = json!({
        "operation": if save { "save" } else { "load" },
        "source": s.source.describe(),
        "device": engine.describe(),
        "path": path_name(path),
        "p2p": p2p_note,
        "slots": a.slots,
        "slot_size": a.slot_size,
        "page_size": a.page_size.to_string(),
        "streams": a.streams,
        "wait": if a.spin { "spin" } else { "sleep on the oldest copy when the source is idle" },
    });
    let failed = matches!(verified, Some(Err(_))) && !(save && a.hugepages);
    if a.json {
        let mut v = head;
        v["runs"] = Value::Array(reports.iter().map(report_json).collect());
        v["verify"] = match &verified {
            None => Value::Null,
            Some(Ok(n)) => json!({ "ok": true, "bytes": n }),
            Some(Err(e)) => json!({ "ok": false, "error": e }),
        };
        if let Some(errors) = model_errors {
            v["model_errors"] = json!(errors);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} {} bytes: {} -> {}",
            if save { "save" } else { "load" },
            a.len,
            if save {
                engine.describe()
            } else {
                s.source.describe()
            },
            if save {
                s.source.describe()
            } else {
                engine.describe()
            },
        );
        println!(
            "path: {path}; {}",
            if a.cpu {
                "CPU stand-in for the GPU".into()
            } else {
                p2p_note.clone()
            }
        );
        println!(
            "slots: {} x {} bytes on {} pages, {} stream(s), {}",
            a.slots,
            a.slot_size,
            a.page_size,
            a.streams,
            head["wait"].as_str().unwrap_or("")
        );
        for (i, r) in reports.iter().enumerate() {
            println!("run {}: {}", i + 1, report_line(r));
        }
        if reports.len() > 1 {
            let best = reports
                .iter()
                .max_by(|x, y| x.gbps().total_cmp(&y.gbps()))
                .expect("at least one run");
            let mean = reports.iter().map(Report::gbps).sum::<f64>() / reports.len() as f64;
            println!(
                "best {:.2} GB/s, mean {mean:.2} GB/s over {} runs",
                best.gbps(),
                reports.len()
            );
        }
        match &verified {
            None => {}
            Some(Ok(n)) => println!("verify: {n} bytes match"),
            Some(Err(e)) => println!("verify: {e}"),
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn path_name(p: DataPath) -> &'static str {
    match p {
        DataPath::Staged => "staged",
        DataPath::PeerToPeer => "p2p",
    }
}

fn report_line(r: &Report) -> String {
    format!(
        "{} bytes in {:.3} s = {:.2} GB/s; CPU {:.3} s on this thread ({:.4} s/GB, {:.0}% of one core), {:.3} s in the process ({:.4} s/GB); {} chunks, {} sleeps",
        r.bytes,
        r.elapsed.as_secs_f64(),
        r.gbps(),
        r.thread_cpu.as_secs_f64(),
        r.thread_cpu_per_gb(),
        100.0 * r.cores_used(),
        r.process_cpu.as_secs_f64(),
        r.process_cpu_per_gb(),
        r.chunks,
        r.blocking_waits
    )
}

fn report_json(r: &Report) -> Value {
    json!({
        "bytes": r.bytes,
        "seconds": r.elapsed.as_secs_f64(),
        "gbps": r.gbps(),
        "path": path_name(r.path),
        "thread_cpu_s": r.thread_cpu.as_secs_f64(),
        "thread_cpu_s_per_gb": r.thread_cpu_per_gb(),
        "cores_used": r.cores_used(),
        "process_cpu_s": r.process_cpu.as_secs_f64(),
        "process_cpu_s_per_gb": r.process_cpu_per_gb(),
        "chunks": r.chunks,
        "sleeps": r.blocking_waits,
    })
}

/// The kernel configuration, where the machine offers it (`/boot/config-*` is read by the check
/// itself; `/proc/config.gz` needs gzip).
fn kernel_config() -> Option<String> {
    if !std::path::Path::new("/proc/config.gz").exists() {
        return None;
    }
    let out = std::process::Command::new("gzip")
        .args(["-dc", "/proc/config.gz"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn info(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let mut out = json!({});
    let mut lines = Vec::new();
    let dmabuf = gpu_info(&a, &mut out, &mut lines);
    let check = Check::probe(std::path::Path::new("/"), Some(dmabuf.clone()), kernel_config());
    lines.push(format!(
        "peer-to-peer DMA from NVMe into GPU memory on kernel {}: {}",
        check.kernel,
        if check.possible() {
            "possible"
        } else {
            "not possible"
        }
    ));
    for i in &check.items {
        lines.push(format!(
            "  {:<8} {}: {}",
            if i.ok { "OK" } else { "MISSING" },
            i.what,
            i.detail
        ));
    }
    lines.push(format!("path a transfer takes here: {}", check.path()));
    out["kernel"] = json!(check.kernel);
    out["p2p_possible"] = json!(check.possible());
    out["path"] = json!(path_name(check.path()));
    out["prerequisites"] = Value::Array(
        check
            .items
            .iter()
            .map(|i| json!({ "what": i.what, "ok": i.ok, "detail": i.detail }))
            .collect(),
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for l in lines {
            println!("{l}");
        }
    }
    Ok(if dmabuf.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Describes the GPUs and exports `a.export_len` bytes of GPU `a.gpu` as a dma-buf; returns
/// what the export gave (for the peer-to-peer check).
#[cfg(feature = "cuda")]
fn gpu_info(a: &InfoArgs, out: &mut Value, lines: &mut Vec<String>) -> Result<String, String> {
    use std::os::fd::AsRawFd;
    use vfpoll_gpu::cuda::{self, ffi::attr, DeviceMemory, Gpu};
    let e = |e: vfpoll_gpu::CopyError| e.to_string();
    let version = cuda::driver_version().map_err(e)?;
    let count = cuda::device_count().map_err(e)?;
    lines.push(format!(
        "CUDA driver {}.{}, {count} GPU(s)",
        version / 1000,
        version % 1000 / 10
    ));
    out["cuda_driver"] = json!(version);
    let mut gpus = Vec::new();
    for i in 0..count {
        let g = Gpu::open(i).map_err(e)?;
        let at = |x| g.attribute(x).unwrap_or(-1);
        let mem = g.total_memory().unwrap_or(0);
        let pci = g.pci_address().unwrap_or_default();
        lines.push(format!(
            "GPU {i}: {} at {pci}, {} GiB, compute {}.{}, copy engines {}, host register {}, GPUDirect RDMA {}, dma-buf {}",
            g.name(),
            mem >> 30,
            at(attr::COMPUTE_CAPABILITY_MAJOR),
            at(attr::COMPUTE_CAPABILITY_MINOR),
            at(attr::ASYNC_ENGINE_COUNT),
            at(attr::HOST_REGISTER_SUPPORTED),
            at(attr::GPU_DIRECT_RDMA_SUPPORTED),
            at(attr::DMA_BUF_SUPPORTED),
        ));
        gpus.push(json!({
            "index": i, "name": g.name(), "pci": pci, "memory": mem,
            "dma_buf_supported": at(attr::DMA_BUF_SUPPORTED),
            "gpu_direct_rdma_supported": at(attr::GPU_DIRECT_RDMA_SUPPORTED),
            "host_register_supported": at(attr::HOST_REGISTER_SUPPORTED),
            "async_engines": at(attr::ASYNC_ENGINE_COUNT),
        }));
    }
    out["gpus"] = Value::Array(gpus);
    let g = Gpu::open(a.gpu).map_err(e)?;
    let len = usize::try_from(a.export_len).map_err(|x| x.to_string())?;
    let mem = DeviceMemory::alloc(&g, len).map_err(e)?;
    let fd = mem.export_dmabuf().map_err(e)?;
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap_or_default();
    let fields: Vec<String> = fdinfo
        .lines()
        .filter(|l| ["size:", "exp_name:", "flags:"].iter().any(|k| l.starts_with(k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let detail = format!(
        "cuMemGetHandleForAddressRange(DMA_BUF_FD) on {len} bytes at GPU address {} -> fd {} ({})",
        mem.device_ptr(),
        fd.as_raw_fd(),
        fields.join(", ")
    );
    lines.push(format!("dma-buf export: {detail}"));
    out["dmabuf"] = json!({ "fd": fd.as_raw_fd(), "len": len, "fdinfo": fields });
    Ok(detail)
}

#[cfg(not(feature = "cuda"))]
fn gpu_info(_: &InfoArgs, _: &mut Value, lines: &mut Vec<String>) -> Result<String, String> {
    let why = vfpoll_gpu::cuda_available()
        .err()
        .map_or_else(|| "unknown".into(), |e| e.to_string());
    lines.push(why.clone());
    Err(why)
}
