use super::console::{is_iommu_fault, ConsoleFilter, IOMMU_FAULT_MESSAGES};
use super::qemu::{mem_mib, numa_and_huge_1g};
use super::*;
use std::process::Command;

fn filter(verbose: bool, chunks: &[&[u8]]) -> (String, Vec<String>) {
    let mut f = ConsoleFilter::new(verbose);
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for c in chunks {
        f.feed(c, &mut out, |l| {
            lines.push(String::from_utf8_lossy(l).into_owned())
        });
    }
    f.finish(&mut out);
    (String::from_utf8(out).unwrap(), lines)
}

#[test]
fn init_lines_are_hidden_unless_verbose() {
    let input: &[&[u8]] = &[
        b"vm: init\r\nhello\r\nv",
        b"m: job start\r\nvm: error: x\r\nbye\r\n",
        b"\x1evm: job exit 0\r\n[ 5.6] reboot: Power down\r\n",
    ];
    let (out, lines) = filter(false, input);
    assert_eq!(out, "hello\nvm: error: x\nbye\n");
    assert_eq!(lines[..4], ["vm: init", "hello", "vm: job start", "vm: error: x"]);
    let (out, _) = filter(true, input);
    assert_eq!(
        out,
        "vm: init\nhello\nvm: job start\nvm: error: x\nbye\nvm: job exit 0\n[ 5.6] reboot: Power down\n"
    );
}

#[test]
fn partial_lines_stream_and_lone_cr_stays() {
    let mut f = ConsoleFilter::new(false);
    let mut out = Vec::new();
    f.feed(b"test a ... ", &mut out, |_| {});
    assert_eq!(out, b"test a ... ");
    f.feed(b"ok\r", &mut out, |_| {});
    f.feed(b"\n50%\r60%\r\n", &mut out, |_| {});
    assert_eq!(out, b"test a ... ok\n50%\r60%\n");
    // "vm" alone could still become an init line: held back.
    let mut out = Vec::new();
    f.feed(b"vm", &mut out, |_| {});
    assert!(out.is_empty());
    f.feed(b"x\n", &mut out, |_| {});
    assert_eq!(out, b"vmx\n");
    // An init line after an unterminated line ends it.
    let mut out = Vec::new();
    let mut lines = Vec::new();
    f.feed(b"no newline\x1evm: job exit 0\r\n", &mut out, |l| {
        lines.push(l.to_vec())
    });
    assert_eq!(out, b"no newline\n");
    assert_eq!(lines, [b"no newline".to_vec(), b"vm: job exit 0".to_vec()]);
}

/// The lines as QEMU 7.2.22 prints them: `error_report` puts the program name first, then
/// the format strings of hw/i386/intel_iommu.c and hw/virtio/virtio.c with their
/// arguments filled in (`%s` is `__func__`; PCI_NO_PASID prints as 0xffffffff).
const QEMU_FAULT_LINES: &[&str] = &[
    "qemu-system-x86_64: vtd_iommu_translate: detected translation failure (dev=00:04:00, iova=0x4000000000)",
    "qemu-system-x86_64: vtd_iova_to_slpte: detected IOVA overflow (iova=0x8000000000,pasid=0xffffffff)",
    "qemu-system-x86_64: vtd_iova_to_slpte: detected read error on DMAR slpte (iova=0x1000, pasid=0xffffffff)",
    "qemu-system-x86_64: vtd_iova_to_slpte: detected slpte permission error (iova=0x4000000000, level=0x3, slpte=0x0, write=1, pasid=0xffffffff)",
    "qemu-system-x86_64: vtd_iova_to_slpte: detected splte reserve non-zero iova=0x1000, level=0x1slpte=0x800000000000f003, pasid=0xFFFFFFFF)",
    "qemu-system-x86_64: vtd_iova_to_slpte: xlat address is in interrupt range (iova=0x200000, level=0x2, slpte=0xfee00083, write=1, xlat=0xfee00000, size=0x200000, pasid=0xffffffff)",
    "qemu-system-x86_64: vtd_root_entry_rsvd_bits_check: invalid root entry: hi=0x0, lo=0x1",
    "qemu-system-x86_64: vtd_context_entry_rsvd_bits_check: invalid context entry: hi=f0, lo=1 (reserved nonzero)",
    "qemu-system-x86_64: vtd_dev_to_context_entry: invalid context entry: hi=4, lo=1 (level 4 not supported)",
    "qemu-system-x86_64: vtd_ce_type_check: DT specified but not supported",
    "qemu-system-x86_64: vtd_ce_type_check: PT specified but not supported",
    "qemu-system-x86_64: vtd_ce_type_check: unknown ce type: 3",
    "qemu-system-x86_64: New fault is not recorded due to Primary Fault Overflow",
    "qemu-system-x86_64: New fault is not recorded due to compression of faults",
    "qemu-system-x86_64: Next Fault Recording Reg is used, new fault is not recorded, set PFO field",
    "qemu-system-x86_64: There are pending faults already, fault event is not generated",
    "qemu-system-x86_64: There are previous interrupt conditions to be serviced by software, fault event is not generated",
    "qemu-system-x86_64: Interrupt Mask set, irq is not generated",
    "qemu-system-x86_64: vtd_irte_get: detected non-present IRTE (index=3, high=0x0, low=0x0)",
    "qemu-system-x86_64: vtd_interrupt_remap_msi: invalid IR MSI (sid=32, address=0xfee00010, data=0x0)",
    "qemu-system-x86_64: virtio: bogus descriptor or out of resources",
    "qemu-system-x86_64: virtio: error trying to map MMIO memory",
    "qemu-system-x86_64: Cannot map desc",
    "qemu-system-x86_64: Cannot map used",
    "qemu-system-x86_64: Cannot map avail",
    "qemu-system-x86_64: Cannot map descriptor ring",
    "qemu-system-x86_64: Cannot map indirect buffer",
];

#[test]
fn every_qemu_fault_message_is_recognised() {
    for line in QEMU_FAULT_LINES {
        assert!(is_iommu_fault(line), "not recognised: {line}");
    }
    // Every entry of the table is needed by at least one line above (no dead entries).
    for m in IOMMU_FAULT_MESSAGES {
        assert!(
            QEMU_FAULT_LINES.iter().any(|l| l.contains(m)),
            "no test line for {m:?}"
        );
    }
}

/// QEMU 10.0.2 (`--qemu 10`) prints the same messages (read from its binary's format
/// strings); one changed its wording after the part the table matches (`pte=`, was `slpte=`).
#[test]
fn qemu_10_fault_lines_are_recognised() {
    for line in [
        "qemu-system-x86_64: vtd_iommu_translate: detected translation failure (dev=00:03:00, iova=0x4000000000)",
        "qemu-system-x86_64: vtd_iova_to_slpte: detected slpte permission error (iova=0x4000000000, level=0x3, slpte=0x0, write=1, pasid=0xffffffff)",
        "qemu-system-x86_64: vtd_iova_to_slpte: xlat address is in interrupt range (iova=0x200000, level=0x2, pte=0xfee00083, write=1, xlat=0xfee00000, size=0x200000, pasid=0xffffffff)",
    ] {
        assert!(is_iommu_fault(line), "not recognised: {line}");
    }
}

#[test]
fn other_qemu_lines_are_no_faults() {
    for line in [
        "qemu-system-x86_64: warning: hub 0 is not connected to host network",
        "qemu-system-x86_64: terminating on signal 15 from pid 4242 (cargo)",
        // The guest kernel's invalidation programming, no DMA.
        "qemu-system-x86_64: vtd_iotlb_flush: invalid granularity: 0x0",
        "qemu-system-x86_64: vtd_fetch_inv_desc: detected invalid QI tail (tail=0x10, size=0x8)",
        "qemu-system-x86_64: -device nvme,id=nvmea: warning: ...",
        "",
    ] {
        assert!(!is_iommu_fault(line), "taken for a fault: {line}");
    }
}

#[test]
fn stderr_filter_collects_faults_and_drops_the_hub_warning() {
    let stderr = format!(
        "qemu-system-x86_64: warning: hub 0 is not connected to host network\n{}\nsomething else\n{}",
        QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]
    );
    let mut copied = Vec::new();
    let seen = filter_stderr(io::Cursor::new(stderr), &mut copied);
    let faults = seen.faults;
    assert_eq!(faults, [QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]]);
    assert_eq!(seen.last.as_deref(), Some("something else"));
    assert_eq!(
        String::from_utf8(copied).unwrap(),
        format!(
            "{}\nsomething else\n{}\n",
            QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]
        )
    );
    let only = filter_stderr(io::Cursor::new("just a warning\n\n"), io::sink());
    assert!(only.faults.is_empty());
    assert_eq!(only.last.as_deref(), Some("just a warning"));
    let r = fault_report(&faults, Path::new("/r/iommu-faults.txt"));
    assert!(r.contains("(2 line(s))") && r.contains("never mapped"), "{r}");
    assert!(
        r.contains(QEMU_FAULT_LINES[0]) && r.contains("/r/iommu-faults.txt"),
        "{r}"
    );
}

#[test]
fn job_script_quotes_and_sets_env() {
    let ws = Workspace {
        root: "/w".into(),
        target: "/w/target".into(),
    };
    let b = Boot {
        mode: Mode::NoIommu,
        timeout: Duration::from_secs(1),
        mem: "2G".into(),
        smp: 2,
        modules: vec![],
        hugepages: 4,
        run_dir: "/r".into(),
        keep_run_dir: false,
        verbose: false,
        cwd: "/w/my dir".into(),
        env: vec![("VFPOLL_SEED".into(), "42".into())],
        command: vec!["sh".into(), "-c".into(), "echo 'hi'; exit 3".into()],
        hotplug: false,
        machine: Machine::default(),
    };
    let s = String::from_utf8(job_script(&ws, &b)).unwrap();
    assert!(s.contains("export PATH=/w/target/debug:/w/target/release:/usr/local/sbin:"));
    assert!(s.contains("export VFPOLL_SEED=42\n"));
    assert!(s.contains("export VFPOLL_TESTBED=noiommu\n"));
    assert!(s.contains("echo 4 > /proc/sys/vm/nr_hugepages\n"));
    assert!(s.contains("cd '/w/my dir' || exit 125\n"));
    assert!(s.ends_with("exec sh -c 'echo '\\''hi'\\''; exit 3'\n"));
}

#[test]
fn numa_nodes_and_1g_pages() {
    assert_eq!(mem_mib("8G"), 8192);
    assert_eq!(mem_mib("3000M"), 3000);
    assert_eq!(mem_mib("4096"), 4096);
    let mut b = Boot {
        mode: Mode::Iommu,
        timeout: Duration::from_secs(1),
        mem: "3000M".into(),
        smp: 3,
        modules: vec![],
        hugepages: 0,
        run_dir: "/r".into(),
        keep_run_dir: false,
        verbose: false,
        cwd: "/".into(),
        env: vec![],
        command: vec![],
        hotplug: false,
        machine: Machine {
            hugepages_1g: 4,
            numa_nodes: 2,
            ..Machine::default()
        },
    };
    let args = |b: &Boot| {
        let (mut q, mut append) = (Command::new("q"), String::new());
        numa_and_huge_1g(&mut q, &mut append, b);
        let args: Vec<String> = q.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        (args.join(" "), append)
    };
    let (q, append) = args(&b);
    assert_eq!(append, " hugepagesz=1G hugepages=4");
    assert_eq!(
        q,
        "-object memory-backend-ram,id=ram-node0,size=1500M -numa node,nodeid=0,cpus=0,memdev=ram-node0 \
         -object memory-backend-ram,id=ram-node1,size=1500M -numa node,nodeid=1,cpus=1-2,memdev=ram-node1"
    );
    // One node: nothing declared.
    b.machine = Machine::default();
    assert_eq!(args(&b), (String::new(), String::new()));
}

#[test]
fn iommufd_mode_loads_iommufd_and_needs_dev_iommu() {
    let ws = Workspace {
        root: "/w".into(),
        target: "/w/target".into(),
    };
    let mut b = Boot {
        mode: Mode::Iommufd,
        timeout: Duration::from_secs(1),
        mem: "2G".into(),
        smp: 2,
        modules: vec!["nvme".into(), "vfio-pci".into()],
        hugepages: 0,
        run_dir: "/r".into(),
        keep_run_dir: false,
        verbose: false,
        cwd: "/".into(),
        env: vec![],
        command: vec!["true".into()],
        hotplug: false,
        machine: Machine::default(),
    };
    assert_eq!(boot_modules(&b), ["iommufd", "nvme", "vfio-pci"]);
    let s = String::from_utf8(job_script(&ws, &b)).unwrap();
    assert!(s.contains("export VFPOLL_TESTBED=iommufd\n"));
    let check = s.find("[ -c /dev/iommu ] || ").expect("no /dev/iommu check");
    assert!(check < s.find("exec true").unwrap(), "{s}");
    assert!(Mode::Iommufd.viommu() && Mode::Iommu.viommu() && !Mode::NoIommu.viommu());
    // Named already: not loaded twice; other modes load what they are told.
    b.modules = vec!["iommufd".into()];
    assert_eq!(boot_modules(&b), ["iommufd"]);
    b.mode = Mode::Iommu;
    b.modules = vec![];
    assert!(boot_modules(&b).is_empty());
    let s = String::from_utf8(job_script(&ws, &b)).unwrap();
    assert!(!s.contains("/dev/iommu"), "{s}");
    for m in [Mode::Iommu, Mode::NoIommu, Mode::Iommufd] {
        assert_eq!(Mode::from_name(m.name()), Some(m));
    }
}
