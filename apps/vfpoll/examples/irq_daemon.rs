//! A daemon that serves reads on demand and sleeps while idle: an interrupt-mode queue pair
//! (`CompletionMode::Irq`) whose eventfd a tokio `AsyncFd` waits on, beside stdin.
//!
//! ```text
//! cargo run -p vfpoll --example irq_daemon -- --model            # the in-process NVMe model
//! cargo run -p vfpoll --example irq_daemon -- 0000:00:03.0 [--noiommu]
//! ```
//! Commands on stdin, one per line: an LBA (reads block `LBA` of namespace 1 and prints its
//! first 16 bytes), `cpu` (prints the process CPU time so far), end of input (drains and exits).
//! Between commands the process sleeps in epoll: the queue pair costs no CPU while idle.
//!
//! The protocol of an event loop around an interrupt-mode queue pair: after every wakeup (the
//! eventfd, or new work), poll until `arm()` says nothing more is there; `arm` clears the
//! eventfd, rings the doorbells and checks the completion queue once more, so an interrupt that
//! comes after it makes the fd readable again and none is lost (see vfpoll-nvme's `qpair/wait.rs`).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, BufReader};
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_nvme::{CompletionMode, Controller, ControllerOptions, QpairOptions, QueuePair, RegionBuf};
use vfpoll_nvme_model::{ModelConfig, NamespaceConfig, NvmeModel};
use vfpoll_pci::vfio::{Container, IommuMode};

/// Reads in flight at most.
const SLOTS: usize = 16;

fn process_cpu() -> anyhow::Result<Duration> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let d = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Ok(d(u.user_time()) + d(u.system_time()))
}

/// Opens the controller: the model (with an MSI-X table) or a device through VFIO.
fn open(args: &[String]) -> anyhow::Result<(Controller, Option<NvmeModel>, PageSize)> {
    if args.iter().any(|a| a == "--model") {
        let mapper = Arc::new(FakeMapper::new());
        let cfg = ModelConfig {
            namespaces: vec![NamespaceConfig::new(1, 512, 1 << 16)],
            // The model's own thread backs off to sleeps soon after the last command.
            idle_spin: Duration::from_millis(1),
            ..Default::default()
        };
        let model = NvmeModel::start(cfg, mapper.clone())?;
        let opts = ControllerOptions {
            page_size: PageSize::Base4K,
            io_queues: 4,
            ..Default::default()
        };
        let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts)?;
        ctrl.use_interrupts(model.msix(5)?)?;
        return Ok((ctrl, Some(model), PageSize::Base4K));
    }
    let Some(bdf) = args.iter().find(|a| !a.starts_with("--")) else {
        bail!("usage: irq_daemon (--model | BDF [--noiommu])");
    };
    let mode = if args.iter().any(|a| a == "--noiommu") {
        IommuMode::NoIommu
    } else {
        IommuMode::Type1
    };
    let container = Container::open(mode)?;
    let (ctrl, _dma) = Controller::open_first(&container, bdf.parse()?, ControllerOptions::default())
        .with_context(|| format!("opening {bdf} (bound to vfio-pci? `vfpoll bind {bdf}`)"))?;
    Ok((ctrl, None, PageSize::Huge2M))
}

/// Delivers every completion there is, until `arm` finds the queue empty and armed.
fn drain(qp: &mut QueuePair<RegionBuf>, free: &mut Vec<RegionBuf>) -> anyhow::Result<()> {
    loop {
        qp.poll(SLOTS, |d| {
            let buf = d.buf.expect("the buffer comes back");
            match d.result {
                Ok(_) => {
                    let mut head = [0u8; 16];
                    let _ = buf.read(0, &mut head);
                    let hex: String = head.iter().map(|b| format!("{b:02x}")).collect();
                    println!("lba {}: {hex}", d.tag);
                }
                Err(e) => println!("lba {}: error: {e}", d.tag),
            }
            free.push(buf);
        });
        if !qp.arm()? {
            return Ok(());
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ctrl, _model, page) = open(&args)?;
    let lba_size = ctrl.namespace(1)?.lba_size;
    let opts = QpairOptions {
        entries: 64,
        completion: CompletionMode::Irq,
        ..Default::default()
    };
    let mut qp = ctrl.create_qpair::<RegionBuf>(&opts)?;
    let mut free = Vec::new();
    for _ in 0..SLOTS {
        let region = ctrl.dma().alloc_region(lba_size, page)?;
        free.push(RegionBuf::new(region, 0, lba_size)?);
    }
    // tokio's reactor gets its own descriptor of the queue pair's eventfd.
    let fd: OwnedFd = qp
        .event_fd()
        .context("an interrupt-mode queue pair")?
        .try_clone_to_owned()?;
    // SAFETY: `fd` is an open descriptor that the AsyncFd owns from here on: nothing else
    // closes it or makes its number refer to another file while the AsyncFd lives.
    let irq = unsafe { AsyncFd::register(fd) }?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    eprintln!(
        "irq_daemon: namespace 1, {lba_size}-byte blocks, vector {:?}; LBAs on stdin",
        qp.vector()
    );
    let mut open_input = true;
    while open_input || qp.outstanding() != 0 {
        tokio::select! {
            line = lines.next_line(), if open_input => match line? {
                None => open_input = false,
                Some(l) if l.trim() == "cpu" => println!("cpu {:.6}", process_cpu()?.as_secs_f64()),
                Some(l) => match l.trim().parse::<u64>() {
                    Ok(lba) => match free.pop() {
                        Some(buf) => {
                            if let Err(r) = qp.read(1, lba, buf, lba) {
                                println!("lba {lba}: refused: {}", r.error);
                                free.push(r.buf);
                            }
                        }
                        None => println!("lba {lba}: busy ({SLOTS} reads in flight)"),
                    },
                    Err(_) => println!("?: a line is an LBA, or `cpu`"),
                },
            },
            ready = irq.readable() => ready?.clear_ready(),
        }
        drain(&mut qp, &mut free)?;
    }
    Ok(())
}
