//! `vfpoll`: prepares a Linux machine for vfpoll's user-space NVMe and NIC drivers (hugepages,
//! hugetlbfs, `vfio-pci` bindings), shows its state and checks it, and drives the devices
//! (`identify`, `hello`, `format`, `perf`, `pktgen`, `fwd`, `responder`, `gpu`).
//!
//! This file only parses the command line and dispatches: each subcommand is a module with an
//! `Args` struct and a `run(&Ctx, Args) -> anyhow::Result<ExitCode>`. Add a subcommand by adding
//! a module and one line to [`Cmd`] and to the `match` in `main`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bind;
mod cpu_time;
mod ctx;
mod doctor;
mod format;
mod fwd;
mod gpu;
mod hello;
mod identify;
mod iommu_backend;
mod model;
mod nic_common;
mod nvme_open;
mod perf;
mod pktgen;
mod responder;
mod setup;
mod status;
mod store;
mod table;
mod target;
mod unbind;
mod units;

#[cfg(test)]
use vfpoll_pci::testing as fake;

use ctx::Ctx;

/// vfpoll: user-space, polled NVMe and NIC drivers over VFIO. Set up and check a machine, then
/// drive its devices: identify, I/O checks and benchmarks, packet tools, loading GPU memory.
#[derive(Debug, Parser)]
#[command(name = "vfpoll", version, propagate_version = true)]
struct Cli {
    /// Log more on stderr: -v info, -vv debug, -vvv trace (RUST_LOG, when set, wins).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Use DIR/sys, DIR/proc, DIR/dev and DIR/run/vfpoll instead of the machine's: for tests on
    /// fake trees. Loads no module and mounts nothing.
    #[arg(long, global = true, hide = true, value_name = "DIR")]
    root: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Reserve hugepages, mount hugetlbfs, load vfio-pci and bind devices to it.
    ///
    /// One printed line per action: make the hugepage pools hold at least --hugepages MiB (spread
    /// evenly over the NUMA nodes unless --node), mount hugetlbfs on --mount unless one is there,
    /// load vfio-pci when a device is to be bound, and bind the devices of --bind (default: every
    /// NVMe controller the kernel does not use). The driver each device had is recorded under
    /// /run/vfpoll for `vfpoll reset`. A failed step does not stop the others; the exit code is 1
    /// if any failed.
    ///
    /// With --user NAME (or a numeric user ID), also gives that user what a run without root
    /// needs: the VFIO nodes of the devices (/dev/vfio/N, and /dev/vfio/devices/vfioN and
    /// /dev/iommu where the kernel has them) and the hugetlbfs mount, chowned to it and recorded
    /// for `vfpoll reset`; prints the memlock limit its runs need (the --hugepages reservation:
    /// VFIO charges pinned memory to RLIMIT_MEMLOCK) and how to set it, and raises it for the
    /// running processes of --pid. Refused with --noiommu: no-IOMMU mode needs root.
    Setup(setup::Args),
    /// Bind devices to vfio-pci, recording their kernel drivers.
    ///
    /// Refuses a device the kernel uses (a mounted file system, swap or dm/md/LVM on an NVMe
    /// namespace; a network interface that is up) unless --force, and a device whose IOMMU group
    /// holds devices on other kernel drivers. Loads vfio-pci when needed, then waits for the
    /// device's /dev/vfio node. The driver each device had is recorded under /run/vfpoll, so
    /// `vfpoll reset` can give it back. Binding a device already on vfio-pci changes nothing.
    Bind(bind::Args),
    /// Give devices back to their original kernel drivers.
    ///
    /// Clears driver_override, unbinds vfio-pci and lets the kernel probe the device again; if
    /// the driver recorded at bind time does not take it, loads that driver's module and probes
    /// once more. Without arguments, or with `all`, acts on every device vfpoll bound (recorded
    /// under /run/vfpoll); devices put on vfio-pci by something else (a VM, say) are left alone
    /// unless named. Also gives back what `setup --user` gave a user (ownership of the VFIO
    /// nodes, /dev/iommu and the hugetlbfs mount): all of it, or the named devices' nodes.
    #[command(visible_alias = "unbind")]
    Reset(unbind::Args),
    /// Show NVMe and NIC devices, IOMMU groups, hugepages, mounts and limits.
    ///
    /// The IOMMU state (IOMMU units, vfio's no-IOMMU switch); the IOMMU backend a run would
    /// use (--iommu-backend, auto by default: iommufd where /dev/iommu exists and every device on
    /// vfio-pci has a VFIO cdev, the type1 container otherwise) and why; the devices: NVMe controllers,
    /// NICs, and anything else on vfio-pci or bound by vfpoll, with their driver (and the one they
    /// had before vfpoll bound them), NUMA node, IOMMU group, the other members of the group with
    /// their drivers, and how the kernel uses them; the hugepage pools per size and NUMA node;
    /// hugetlbfs mounts; and the memlock limit of this process. --json prints the same as JSON.
    Status(status::Args),
    /// Check everything a run needs, with the fix for each problem; exits 1 on any FAIL.
    ///
    /// Checks the IOMMU (or, with --noiommu, vfio's no-IOMMU mode); the vfio, vfio-pci and
    /// vfio_iommu_type1 modules; /dev/vfio/vfio; each device (--device; default: every device on
    /// vfio-pci): on vfio-pci, IOMMU group viable, group node read-write; free hugepages against
    /// --hugepages; a hugetlbfs mount; the memlock limit. Run by a user other than root, also
    /// what only a user lacks (a hugetlbfs mount it may write to; no-IOMMU mode, which needs
    /// root), and the fix of a node or memlock finding becomes `sudo vfpoll setup --user NAME`
    /// with its options. Prints OK, WARN or FAIL per finding, with the command that fixes it.
    Doctor(doctor::Args),
    /// Measure NVMe I/O through vfpoll's driver (IOPS, bandwidth, latency), or verify data.
    ///
    /// One pinned worker per core of --cores, each with one queue pair per --device, driving the
    /// namespaces of --nsid with --workload at --queue-depth for --time or --ios; prints IOPS,
    /// MB/s and latency (min/mean/max, p50/p90/p99/p99.9/p99.99), and a live line per second on
    /// a terminal. --json gives fio-like fields (iops, bw_bytes, lat_ns.{mean,p50,p99,p999}).
    /// --verify writes a seeded, LBA-tagged pattern and reads it back; a mismatch exits 1.
    /// --model runs against vfpoll's in-process NVMe model (no device needed).
    Perf(perf::Args),
    /// Identify an NVMe controller and its namespaces (like `nvme id-ctrl` / `id-ns`).
    ///
    /// Opens the controller through VFIO (bound to vfio-pci: `vfpoll bind`), brings it up and
    /// prints what Identify Controller and Identify Namespace report, with the registers that
    /// matter (CAP) and what vfpoll negotiated (I/O queues, shadow doorbells). --json for scripts:
    /// serial, model, firmware, mdts_bytes, namespaces [{nsid, lba_size, blocks}], and more.
    Identify(identify::Args),
    /// Write a block to an NVMe namespace, read it back, compare, restore the original content.
    ///
    /// Any namespace format: metadata in the block or in a separate buffer, protection
    /// information (generated and checked by the controller). On a zoned namespace the block is
    /// appended to the first zone with room and read back.
    Hello(hello::Args),
    /// Format NVM a namespace: LBA format, metadata placement and protection information.
    ///
    /// Erases every block of the namespace (--yes confirms). `vfpoll identify` lists the LBA
    /// formats a namespace offers; the new geometry is printed after the format.
    Format(format::Args),
    /// Transmit generated frames on a NIC as fast as possible or at --rate (like DPDK's
    /// testpmd txonly, or the kernel's pktgen).
    ///
    /// Frames of --size bytes (without FCS) to --dst-mac: IPv4/UDP 198.18.0.1:9 -> 198.18.0.2:9
    /// with a sequence number first in the payload, or raw frames of --ethertype with the
    /// sequence number right after the Ethernet header. Stops after --count packets, after
    /// --time seconds, or at SIGINT/SIGTERM; prints packets and bytes sent, Mpps, Gb/s, and the
    /// queue and hardware counters.
    Pktgen(pktgen::Args),
    /// Forward frames between two NIC ports, both ways, on one core (zero-copy).
    ///
    /// Every frame received on one --device is sent out of the other unchanged (what the
    /// transmit ring cannot take is dropped and counted). Ports are promiscuous unless
    /// --no-promisc; --tx-first sends one burst out of each port first. Stops after --count
    /// packets, --time seconds, or at SIGINT/SIGTERM, and prints the counts per direction.
    Fwd(fwd::Args),
    /// Answer ARP and ICMP echo requests for --ip on a NIC, and count what arrives.
    ///
    /// Replies are the received buffers rewritten in place. Prints a line when it is ready, then
    /// runs until --count requests were answered, --time seconds passed, or SIGINT/SIGTERM,
    /// and prints what it saw (frames, ARP and ICMP requests, replies, other traffic) with the
    /// queue and hardware counters.
    Responder(responder::Args),
    /// Load GPU memory from NVMe (or a file) and save it back, through hugepage slots with no
    /// CPU copy; show what GPU peer-to-peer DMA needs here.
    ///
    /// `load`: the source is read into hugepage slots while earlier slots are copied to the GPU;
    /// prints the path the data took, GB/s and the CPU time. `save`: the reverse. `info`: the
    /// GPUs, a dma-buf export of GPU memory, and the peer-to-peer prerequisites of this machine.
    /// The GPU needs a build with the `cuda` feature (the CUDA driver is loaded at run time);
    /// --cpu runs the pipeline into ordinary memory instead.
    Gpu(gpu::Args),
    /// Serve an NVMe namespace (--ns BDF/NSID) or RAM (--malloc SIZE) over NVMe/TCP.
    ///
    /// Listens on --listen (default 127.0.0.1:4420) for Linux's `nvme discover`/`nvme connect
    /// -t tcp` and other initiators, with the subsystem --nqn; --allow-host limits the hosts.
    /// Runs until SIGINT/SIGTERM, with a line of counters every second on a terminal.
    Target(target::Args),
    /// Checkpoints and KV-cache blocks on raw namespaces: format, info, ls, put, get, rm, fsck,
    /// bench.
    ///
    /// A store spans one or more namespaces (vfio:BDF/NSID through vfpoll's driver, file:PATH,
    /// blk:/dev/X, model:SIZE, mem:SIZE), striped in chunks, with crash-safe commits and a
    /// crc32c per extent (store/FORMAT.md). Name every namespace of the store, in any order.
    /// Long work shows progress on stderr (on a terminal); --json prints JSON only.
    Store(store::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `cargo xtask test`'s docs check (xtask/src/docs.rs) runs every `vfpoll` command line of
    // README.md and docs/ through this parser: with this variable set, nothing else runs.
    if std::env::var_os("VFPOLL_PARSE_ONLY").is_some() {
        return ExitCode::SUCCESS;
    }
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    // A process killed by a signal still shuts its NVMe controllers down cleanly. The NIC
    // commands open no NVMe controller and stop on SIGINT/SIGTERM themselves (a flag their loop
    // polls), printing their counters: the NVMe handler, which ends the process, would be
    // chained after theirs.
    let nic_cmd = matches!(
        cli.cmd,
        Cmd::Pktgen(_) | Cmd::Fwd(_) | Cmd::Responder(_) | Cmd::Target(_)
    );
    if !nic_cmd {
        if let Err(e) = vfpoll_nvme::shutdown_on_signals() {
            log::warn!("cannot install the signal handlers: {e}");
        }
    }
    let ctx = Ctx::new(cli.root);
    let result = match cli.cmd {
        Cmd::Setup(a) => setup::run(&ctx, a),
        Cmd::Bind(a) => bind::run(&ctx, a),
        Cmd::Reset(a) => unbind::run(&ctx, a),
        Cmd::Status(a) => status::run(&ctx, a),
        Cmd::Doctor(a) => doctor::run(&ctx, a),
        Cmd::Perf(a) => perf::run(&ctx, a),
        Cmd::Identify(a) => identify::run(&ctx, a),
        Cmd::Hello(a) => hello::run(&ctx, a),
        Cmd::Format(a) => format::run(&ctx, a),
        Cmd::Pktgen(a) => pktgen::run(&ctx, a),
        Cmd::Fwd(a) => fwd::run(&ctx, a),
        Cmd::Responder(a) => responder::run(&ctx, a),
        Cmd::Gpu(a) => gpu::run(&ctx, a),
        Cmd::Target(a) => target::run(&ctx, a),
        Cmd::Store(a) => store::run(&ctx, a),
    };
    result.unwrap_or_else(|e| {
        eprintln!("vfpoll: error: {e:#}");
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
