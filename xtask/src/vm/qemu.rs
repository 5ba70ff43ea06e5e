//! The QEMU command line of a boot: machine, vIOMMU, devices, NUMA, kernel and initramfs.

use std::path::Path;
use std::process::Command;

use super::{Boot, BIG_NS, GPUBAR, HOTPLUG_ID, HOTPLUG_NODE, HOTPLUG_PORT, IMAGES, NUMA_NVME_SERIAL};
use crate::mode::Mode;
use crate::setup::{module_name, Assets};
use crate::util::Result;

/// A path inside a QEMU `key=value,...` option (commas doubled).
fn opt_path(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The QEMU command line of a boot. PCI slots are fixed (see the crate docs). An error for
/// mode `iommufd` on a kernel without it.
pub fn qemu_command(assets: &Assets, b: &Boot) -> Result<Command> {
    let run = &b.run_dir;
    let mut q = b.machine.qemu.command();
    q.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max"])
        .args(["-m", &b.mem, "-smp", &b.smp.to_string()])
        // `-nographic` would also make SeaBIOS print (and reset the terminal) on the serial
        // port; this is the same minus that, and without a monitor reading our stdin.
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .args(["-no-reboot", "-vga", "none"])
        // Thread names ("CPU 1/TCG", ...) so that a bench can see where the host runs each.
        .args(["-name", "vfpoll,debug-threads=on"])
        .args([
            "-qmp",
            &format!(
                "unix:{},server=on,wait=off",
                opt_path(&crate::qmp::socket_path(run))
            ),
        ]);
    // norandmaps: under TCG an exec at fresh random addresses is retranslated, 2.5-3x slower.
    // mitigations=off: the guest is a test bed, and the barriers cost ~0.3 s of every boot.
    // no_timer_check: on a loaded host the emulated CPU can miss the kernel's early check that
    // the timer interrupt arrives through the (interrupt-remapped) IO-APIC, and the kernel
    // panics ("timer doesn't work through Interrupt-remapped IO-APIC") before the job starts.
    let mut append = format!(
        "console=ttyS0 panic=-1 norandmaps mitigations=off no_timer_check {} vfpoll.mods={}",
        if b.verbose {
            "loglevel=5"
        } else {
            "quiet loglevel=1"
        },
        boot_modules(b).join(",")
    );
    numa_and_huge_1g(&mut q, &mut append, b);
    let initrd = assets.boot_files(b.mode)?.0;
    if b.mode.viommu() {
        // Must come before the PCI devices it translates for.
        q.args(["-device", "intel-iommu,intremap=on,caching-mode=on"]);
        append.push_str(" intel_iommu=on");
    } else {
        append.push_str(" vfio.enable_unsafe_noiommu_mode=1");
    }
    q.arg("-kernel")
        .arg(&assets.vmlinux)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append]);
    let fsdev = |id: &str, path: &str, extra: &str, addr: u8| {
        [
            "-fsdev".to_string(),
            format!("local,id={id},path={path},security_model=none,multidevs=remap{extra}"),
            "-device".to_string(),
            format!("virtio-9p-pci,fsdev={id},mount_tag={id},addr={addr}"),
        ]
    };
    q.args(fsdev("hostroot", "/", ",readonly=on", 1));
    q.args(fsdev("out", &opt_path(&run.join("out")), "", 2));
    let drive = |id: &str, file: &str| {
        [
            "-drive".to_string(),
            format!(
                "file={},if=none,id={id},format=raw,discard=unmap,{}",
                opt_path(&run.join(file)),
                assets.drive_options
            ),
        ]
    };
    q.args(["-device", "nvme,id=nvmea,serial=vfpoll-a,cmb_size_mb=16,addr=3"]);
    q.args(drive("nvmea1", IMAGES[0].0));
    q.args(["-device", "nvme-ns,drive=nvmea1,bus=nvmea,nsid=1"]);
    q.args(drive("nvmea2", IMAGES[1].0));
    q.args([
        "-device",
        "nvme-ns,drive=nvmea2,bus=nvmea,nsid=2,logical_block_size=4096,physical_block_size=4096",
    ]);
    // B allows 4 MiB transfers (MDTS 10): one command needs chained PRP list pages.
    q.args([
        "-device",
        "nvme,id=nvmeb,serial=vfpoll-b,mdts=10,cmb_size_mb=16,addr=4",
    ]);
    q.args(drive("nvmeb1", IMAGES[2].0));
    q.args(["-device", "nvme-ns,drive=nvmeb1,bus=nvmeb,nsid=1"]);
    // An NVM subsystem with two controllers (same serial, as QEMU requires) sharing namespace 1:
    // several controllers of one subsystem, as multi-path devices have.
    q.args([
        "-device",
        "nvme-subsys,id=subsys0,nqn=nqn.2026-11.io.vfpoll:subsys0",
    ]);
    q.args(["-device", "nvme,id=nvmec,serial=vfpoll-s,subsys=subsys0,addr=8"]);
    q.args(["-device", "nvme,id=nvmed,serial=vfpoll-s,subsys=subsys0,addr=9"]);
    q.args(drive("nvmes1", IMAGES[3].0));
    q.args(["-device", "nvme-ns,drive=nvmes1,nsid=1,shared=on"]);
    // Controller F: the namespace formats the driver must handle or refuse: 1 extended LBA
    // (512+8), 2 separate metadata (512+8), 3 PI type 1 (512+8), 4 4096+64 separate metadata
    // with PI type 1 in the first bytes, 5 PI with a 64-bit guard, 6 zoned (4 KiB blocks,
    // 1 MiB zones of 768 KiB capacity, 4 open / 6 active, ZASL 5), 7 plain 512 B (Format NVM).
    q.args(["-device", "nvme,id=nvmef,serial=vfpoll-f,zoned.zasl=5,addr=0xb"]);
    for (i, format) in [
        "ms=8,mset=1",
        "ms=8,mset=0",
        "ms=8,mset=1,pi=1",
        "logical_block_size=4096,physical_block_size=4096,ms=64,mset=0,pi=1,pil=1",
        "ms=16,pi=1,pif=2",
        "logical_block_size=4096,physical_block_size=4096,zoned=on,zoned.zone_size=1M,\
         zoned.zone_capacity=768K,zoned.max_open=4,zoned.max_active=6",
        "",
    ]
    .iter()
    .enumerate()
    {
        let nsid = i + 1;
        q.args(drive(&format!("nvmef{nsid}"), IMAGES[4 + i].0));
        let sep = if format.is_empty() { "" } else { "," };
        q.args([
            "-device",
            &format!("nvme-ns,drive=nvmef{nsid},bus=nvmef,nsid={nsid}{sep}{format}"),
        ]);
    }
    // Two NICs on one QEMU hub: frames go from one to the other and nowhere else.
    // romfile= skips their iPXE option ROMs, which SeaBIOS would otherwise run at every boot.
    for (i, addr) in [(0, 5), (1, 6)] {
        q.args(["-netdev", &format!("hubport,id=hp{i},hubid=0")]);
        q.args([
            "-device",
            &format!(
                "e1000e,netdev=hp{i},mac=52:54:00:00:00:0{},addr={addr},romfile=",
                i + 1
            ),
        ]);
    }
    // A third port on the same hub: virtio-net, modern only (1af4:1041). In IOMMU mode it must
    // translate its DMA through the vIOMMU (VIRTIO_F_ACCESS_PLATFORM), as VFIO maps IOVAs.
    q.args(["-netdev", "hubport,id=hp2,hubid=0"]);
    q.args([
        "-device",
        &format!(
            "virtio-net-pci,netdev=hp2,mac=52:54:00:00:00:03,disable-legacy=on,addr=0xa,romfile={}",
            if b.mode.viommu() { ",iommu_platform=on" } else { "" }
        ),
    ]);
    q.args([
        "-object",
        &format!(
            "memory-backend-file,id=gpubar,mem-path={},size={}M,share=on",
            opt_path(&run.join(GPUBAR.0)),
            GPUBAR.1
        ),
    ]);
    q.args(["-device", "ivshmem-plain,memdev=gpubar,addr=7"]);
    if b.hotplug {
        // R behind a root port: hot-pluggable (q35 handles it with ACPI PCI hotplug). Its
        // namespace is a -blockdev, so an unplug does not delete it and R can be plugged back
        // with device_add (see HOTPLUG_NODE).
        q.args([
            "-device",
            &format!("pcie-root-port,id={HOTPLUG_PORT},chassis=1,slot=1,addr=0xc"),
        ]);
        let img = IMAGES
            .iter()
            .find(|(f, _)| f.starts_with("nvme-r-"))
            .expect("R's image")
            .0;
        let cache = if assets.drive_options.contains("cache=none") {
            ",cache.direct=on"
        } else {
            ""
        };
        q.args([
            "-blockdev",
            &format!(
                "driver=raw,node-name={HOTPLUG_NODE},discard=unmap,file.driver=file,file.filename={}{cache}",
                opt_path(&run.join(img))
            ),
        ]);
        q.args([
            "-device",
            &format!("nvme,id={HOTPLUG_ID},bus={HOTPLUG_PORT},serial=vfpoll-r,drive={HOTPLUG_NODE}"),
        ]);
    }
    if b.machine.numa_nodes >= 2 {
        numa_nvme(&mut q, b, &drive("nvmen1", "nvme-n-ns1.img"));
    }
    if b.machine.big_ns_mib > 0 {
        for (id, serial, addr, img, ns) in BIG_NS {
            q.args([
                "-device",
                &format!("nvme,id={id},serial={serial},mdts=9,addr={addr:#x}"),
            ]);
            q.args(drive(&format!("{id}1"), img));
            q.args(["-device", &format!("nvme-ns,drive={id}1,bus={id},nsid=1{ns}")]);
        }
    }
    Ok(q)
}

/// The modules the guest init loads: [`Boot::modules`], and `iommufd` first in mode
/// `iommufd` (`/dev/iommu`), whatever `--modules` said.
pub(super) fn boot_modules(b: &Boot) -> Vec<String> {
    let mut m = b.modules.clone();
    if b.mode == Mode::Iommufd && !m.iter().any(|x| module_name(x) == "iommufd") {
        m.insert(0, "iommufd".into());
    }
    m
}

/// Guest NUMA nodes (memory backends, CPUs) and 1 GiB pages on the kernel command line
/// ([`super::Machine`]).
pub(super) fn numa_and_huge_1g(q: &mut Command, append: &mut String, b: &Boot) {
    let m = &b.machine;
    if m.hugepages_1g > 0 {
        append.push_str(&format!(" hugepagesz=1G hugepages={}", m.hugepages_1g));
    }
    if m.numa_nodes < 2 {
        return;
    }
    let nodes = u64::from(m.numa_nodes);
    // `-m` as MiB; each node gets an equal share, the last one the rest.
    let total = mem_mib(&b.mem);
    let smp = u64::from(b.smp);
    for n in 0..nodes {
        let mib = if n + 1 == nodes {
            total - total / nodes * (nodes - 1)
        } else {
            total / nodes
        };
        q.args([
            "-object",
            &format!("memory-backend-ram,id=ram-node{n},size={mib}M"),
        ]);
        // CPUs split as evenly as they go; a node may have none when -smp < nodes.
        let (first, last) = (n * smp / nodes, (n + 1) * smp / nodes);
        let cpus = match last - first {
            0 => String::new(),
            1 => format!(",cpus={first}"),
            _ => format!(",cpus={first}-{}", last - 1),
        };
        q.args(["-numa", &format!("node,nodeid={n}{cpus},memdev=ram-node{n}")]);
    }
}

/// NVMe controller N on the last NUMA node (see [`NUMA_NVME_SERIAL`]); `drive` is its
/// namespace's `-drive` option pair.
fn numa_nvme(q: &mut Command, b: &Boot, drive: &[String; 2]) {
    let node = b.machine.numa_nodes - 1;
    q.args([
        "-device",
        &format!("pxb-pcie,id=pxbn,bus_nr=128,numa_node={node},bus=pcie.0,addr=0xd"),
    ]);
    q.args(["-device", "pcie-root-port,id=rpn,bus=pxbn,chassis=2,slot=0"]);
    q.args([
        "-device",
        &format!("nvme,id=nvmen,bus=rpn,serial={NUMA_NVME_SERIAL}"),
    ]);
    q.args(drive);
    q.args(["-device", "nvme-ns,drive=nvmen1,bus=nvmen,nsid=1"]);
}

/// QEMU's `-m` size as MiB (`2G`, `4096M`, `4096`: MiB without a suffix); 2 GiB when it cannot
/// be read (QEMU then refuses the value itself).
pub(super) fn mem_mib(mem: &str) -> u64 {
    let m = mem.trim();
    let (num, unit) = m.split_at(m.find(|c: char| !c.is_ascii_digit()).unwrap_or(m.len()));
    let n: u64 = num.parse().unwrap_or(2048);
    match unit.to_ascii_uppercase().as_str() {
        "G" | "GB" | "GIB" => n << 10,
        "T" | "TB" | "TIB" => n << 20,
        "K" | "KB" | "KIB" => n >> 10,
        _ => n,
    }
}
