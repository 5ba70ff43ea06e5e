//! What the NIC subcommands (`pktgen`, `fwd`, `responder`) share: the port options, opening
//! ports, when to stop (count, time, SIGINT/SIGTERM) and printing counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::units::parse_page_size;
use anyhow::Context as _;
use clap::Args as ClapArgs;
use vfpoll_dma::PageSize;
use vfpoll_nic::{CompletionMode, Mempool, Port, PortOptions};
use vfpoll_pci::vfio::Backend;
use vfpoll_pci::Bdf;

/// Options every NIC subcommand takes.
#[derive(Debug, Clone, ClapArgs)]
pub struct NicArgs {
    /// Use VFIO's no-IOMMU mode (the device sees physical addresses; needs root and
    /// enable_unsafe_noiommu_mode): the same as --iommu-backend noiommu. Without it, vfpoll uses
    /// the IOMMU.
    #[arg(long)]
    pub noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP)]
    pub iommu_backend: Backend,
    /// Packet buffers in the pool (2 KiB each, on hugepages); every port's receive ring holds
    /// --ring of them all the time.
    #[arg(long, default_value_t = 4096, value_name = "BUFFERS")]
    pub pool: usize,
    /// Descriptors per receive and transmit ring (a multiple of 8, 8 to 4096).
    #[arg(long, default_value_t = 512, value_name = "ENTRIES")]
    pub ring: u16,
    /// Packets per burst (rx_burst / tx_burst).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub burst: u16,
    /// How long to wait for the link at start, in seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub link_timeout: f64,
    /// Page size of the packet pool and the rings: 2M (hugepages, the default), 1G, or 4K (only
    /// behind an IOMMU; no hugepages needed).
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    pub page_size: PageSize,
}

impl NicArgs {
    /// Opens `bdfs` (checked to be supported NICs first), one pool for all, and brings them up
    /// with polled receive queues.
    pub fn open(&self, bdfs: &[Bdf], promiscuous: bool) -> anyhow::Result<(Vec<Port>, Mempool)> {
        self.open_with(bdfs, promiscuous, CompletionMode::Poll)
    }

    /// [`NicArgs::open`] with the receive queues in `completion` mode.
    pub fn open_with(
        &self,
        bdfs: &[Bdf],
        promiscuous: bool,
        completion: CompletionMode,
    ) -> anyhow::Result<(Vec<Port>, Mempool)> {
        if !(0.0..=3600.0).contains(&self.link_timeout) {
            anyhow::bail!(
                "--link-timeout {} is not a number of seconds from 0 to 3600",
                self.link_timeout
            );
        }
        let (container, _) = crate::iommu_backend::open(self.noiommu, self.iommu_backend, bdfs)?;
        let opts = PortOptions {
            rx_entries: self.ring,
            tx_entries: self.ring,
            page_size: self.page_size,
            promiscuous,
            link_timeout: Duration::from_secs_f64(self.link_timeout),
            completion,
        };
        let names: Vec<String> = bdfs.iter().map(Bdf::to_string).collect();
        Port::open_all(&container, bdfs, self.pool, &opts)
            .map_err(|e| match e {
                vfpoll_nic::NicError::PoolExhausted { .. } => anyhow::Error::new(e)
                    .context("the packet pool is too small (raise --pool or lower --ring)"),
                e => anyhow::Error::new(e),
            })
            .with_context(|| format!("bringing up {}", names.join(" and ")))
    }
}

/// When a run ends: a signal (SIGINT, SIGTERM), a time limit, or a count the caller checks.
pub struct Stop {
    signalled: Arc<AtomicBool>,
    deadline: Option<Instant>,
    checks: u32,
}

impl Stop {
    /// Installs the signal handlers (a flag set from the handler; nothing else runs there).
    pub fn new(time: Option<f64>) -> anyhow::Result<Self> {
        let signalled = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, Arc::clone(&signalled))
                .context("installing a signal handler")?;
        }
        let deadline = match time {
            Some(t) if !(0.0..=1e7).contains(&t) => anyhow::bail!("--time {t} is not a number of seconds"),
            Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
            None => None,
        };
        Ok(Stop {
            signalled,
            deadline,
            checks: 0,
        })
    }

    /// Whether to stop now. Cheap: reads the clock every 1024 calls.
    #[inline]
    pub fn now(&mut self) -> bool {
        if self.signalled.load(Ordering::Relaxed) {
            return true;
        }
        self.checks = self.checks.wrapping_add(1);
        if self.checks.is_multiple_of(1024) {
            if let Some(d) = self.deadline {
                return Instant::now() >= d;
            }
        }
        false
    }

    /// Time left before the --time limit (`None`: none; zero once it passed). Exact, unlike
    /// [`Stop::now`]'s clock check every 1024 calls: for loops that sleep.
    pub fn left(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether a signal ended the run.
    pub fn by_signal(&self) -> bool {
        self.signalled.load(Ordering::Relaxed)
    }
}

/// Prints a port's queue and hardware counters, indented.
pub fn print_port(port: &mut Port) {
    let rx = port.rx().stats();
    let tx = port.tx().stats();
    let hw = port.control().stats();
    println!("  {} ({}, {})", port.info().name, port.info().driver, port.mac());
    println!(
        "    rx queue: {} packets, {} bytes, {} bursts, {} tail writes, {} no-buffer stalls, {} dropped",
        rx.packets, rx.bytes, rx.bursts, rx.doorbells, rx.no_buffer, rx.errors
    );
    println!(
        "    tx queue: {} packets, {} bytes, {} bursts, {} tail writes, {} reclaimed in {} batches, {} ring-full",
        tx.packets, tx.bytes, tx.bursts, tx.doorbells, tx.reclaimed, tx.reclaim_batches, tx.ring_full
    );
    println!("    hw: {hw}");
}

/// Rate in millions per second.
pub fn mega_per_sec(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9) / 1e6
}
