//! The command-line tools on every namespace format of the test bed's controller F (issue 10):
//! `vfpoll hello` and `vfpoll perf --verify` (1 MiB I/Os split into parts of whole blocks, then
//! 4 KiB ones over the start of the same range) on extended-LBA, separate-metadata and PI
//! namespaces and the zoned one, and the refusal of the 64-bit guard namespace. In a boot of
//! its own, with its own host check (`host_check_hello_and_perf_verify_on_every_format`): the
//! images then hold exactly what the tools wrote, data and metadata, and nothing else.

use vfpoll_engine::pattern;
use vfpoll_nvme::format::pi;
use vfpoll_tests::*;

/// NVMe controller F: the namespace formats (see tests/formats.rs).
const NVME_F: &str = "0000:00:0b.0";

/// The two `perf --verify` passes, in order: (I/O size, range, pattern stream). The second
/// rewrites the start of the first one's range with another seed.
const PASSES: &[(&str, &str, u64, u64)] = &[("1m", "8m", 8 << 20, 0xb16), ("4k", "2m", 2 << 20, 0x5a11)];

/// Namespaces of F and their images: (nsid, image, MiB, data size, metadata size).
const F_NS: &[(u32, &str, usize, usize, usize)] = &[
    (1, "nvme-f-ns1.img", 16, 512, 8),
    (2, "nvme-f-ns2.img", 16, 512, 8),
    (3, "nvme-f-ns3.img", 16, 512, 8),
    (4, "nvme-f-ns4.img", 16, 4096, 64),
];

/// The `--seed` of pass `stream`.
fn pass_seed(stream: u64) -> u64 {
    seed() ^ stream
}

#[test]
#[ignore = "test bed"]
fn guest_hello_and_perf_verify_on_every_format() {
    bind_all(&[NVME_F]);
    reserve_hugepages(64);
    let noiommu: &[&str] = if mode_name() == "noiommu" {
        &["--noiommu"]
    } else {
        &[]
    };
    let mut manifest = vec![("mode".to_string(), mode_name().to_string())];
    for ns in ["1", "2", "3", "4", "6"] {
        let mut args = vec!["hello", "--device", NVME_F, "--nsid", ns];
        args.extend(noiommu);
        let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
        assert!(text.contains("data matches"), "namespace {ns}: {text}");
        // "... LBA 32255..32263: wrote ...": where, for the host check.
        let lba = text
            .split_once(" LBA ")
            .and_then(|(_, r)| r.split_once(".."))
            .map(|(l, _)| l.to_string())
            .unwrap_or_else(|| panic!("no LBA in {text}"));
        manifest.push((format!("hello{ns}_lba"), lba));
        // The message written (its last line), which a zoned namespace keeps.
        let message = text.lines().last().unwrap().trim().to_string();
        assert!(message.starts_with("hello from vfpoll"), "{text}");
        manifest.push((format!("hello{ns}_text"), message));
    }
    // 1 MiB I/Os at QD 16 (split into parts of whole blocks, metadata cut for QEMU's quirk),
    // then 4 KiB ones, written with the LBA-tagged pattern and read back into poisoned buffers.
    for (nsid, _, _, ds, _) in F_NS {
        let ns = nsid.to_string();
        for &(io, size, bytes, stream) in PASSES {
            let seed = pass_seed(stream).to_string();
            let mut args = vec![
                "perf",
                "--device",
                NVME_F,
                "--nsid",
                &ns,
                "--workload",
                "randwrite",
                "--verify",
                "--io-size",
                io,
                "--queue-depth",
                "16",
                "--size",
                size,
                "--seed",
                &seed,
            ];
            args.extend(noiommu);
            let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
            assert!(text.contains("verify: OK"), "namespace {ns}, {io} I/Os: {text}");
            let written = text
                .split_once("verify: OK: ")
                .and_then(|(_, r)| r.split_once(" blocks written"))
                .map(|(n, _)| n.parse::<u64>().unwrap())
                .unwrap_or_else(|| panic!("no block count in {text}"));
            assert_eq!(written, bytes / *ds as u64, "namespace {ns}, {io} I/Os: {text}");
            manifest.push((format!("perf{ns}_{io}"), written.to_string()));
        }
    }
    // The refused 64-bit guard namespace: a clear error, no I/O.
    let mut args = vec!["perf", "--device", NVME_F, "--nsid", "5", "--time", "1"];
    args.extend(noiommu);
    let out = std::process::Command::new("vfpoll").args(&args).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("64-bit guard is not supported"), "{err}");
    write_manifest("formats_cli.txt", &manifest);
}

/// Protection information type 1 as the controller generates it (PRACT): CRC-16 T10-DIF guard
/// of the block's data, application tag 0, the LBA's low 32 bits as reference tag.
fn put_pi(t: &mut [u8], data: &[u8], lba: u64) {
    t[0..2].copy_from_slice(&pi::crc16_t10dif(0, data).to_be_bytes());
    t[2..4].copy_from_slice(&0u16.to_be_bytes());
    t[4..8].copy_from_slice(&(lba as u32).to_be_bytes());
}

/// Compares an image with what it should hold; names the first differing byte's block, and
/// for data, what the block holds (the pattern's header: LBA and seed).
fn assert_image(file: &str, got: &[u8], want: &[u8], ds: usize, ms: usize, moff: usize) {
    assert_eq!(got.len(), want.len(), "{file}: size");
    let Some(first) = (0..got.len()).find(|&i| got[i] != want[i]) else {
        return;
    };
    let place = if first >= moff {
        format!("metadata of LBA {}", (first - moff) / ms.max(1))
    } else {
        let b = first / ds * ds;
        let word = |o: usize| u64::from_le_bytes(got[b + o..b + o + 8].try_into().unwrap());
        format!(
            "data of LBA {}, whose header reads LBA {} seed {:#x}",
            first / ds,
            word(0),
            word(8)
        )
    };
    let bad = (0..got.len()).filter(|&i| got[i] != want[i]).count();
    panic!(
        "{file}: byte {first:#x} ({place}) is {:#04x}, expected {:#04x} ({bad} bytes differ)",
        got[first], want[first]
    );
}

#[test]
#[ignore]
fn host_check_hello_and_perf_verify_on_every_format() {
    let m = read_manifest("formats_cli.txt");
    assert_eq!(manifest_get(&m, "mode"), run_mode());
    let num = |k: &str| -> u64 { manifest_get(&m, k).parse().unwrap_or_else(|e| panic!("{k}: {e}")) };
    for &(nsid, file, mib, ds, ms) in F_NS {
        let got = std::fs::read(run_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        // QEMU's layout: the data of all blocks, then the metadata of all blocks.
        let nlbas = (mib << 20) / (ds + ms);
        let moff = nlbas * ds;
        let mut want = vec![0u8; mib << 20];
        // hello put back the zeroes it found; on the PI namespaces the controller generated
        // their protection information (PRACT) when it did.
        let lba = num(&format!("hello{nsid}_lba")) as usize;
        for l in lba..lba + 4096 / ds {
            if nsid >= 3 {
                put_pi(
                    &mut want[moff + l * ms..moff + l * ms + 8],
                    &vec![0; ds],
                    l as u64,
                );
            }
        }
        // perf: the 1 MiB pass, then the 4 KiB pass over the start of its range.
        for &(io, _, _, stream) in PASSES {
            // The pattern's seed is the run's (`--seed`).
            let s = pass_seed(stream);
            for l in 0..num(&format!("perf{nsid}_{io}")) as usize {
                let (d, md) = (l * ds..(l + 1) * ds, moff + l * ms..moff + (l + 1) * ms);
                match nsid {
                    1 => {
                        // Extended LBA: the pattern covers data and metadata of each block.
                        let mut b = vec![0u8; ds + ms];
                        pattern::fill(&mut b, ds + ms, l as u64, nsid, s);
                        want[d].copy_from_slice(&b[..ds]);
                        want[md].copy_from_slice(&b[ds..]);
                    }
                    2 | 4 => {
                        pattern::fill(&mut want[d.clone()], ds, l as u64, nsid, s);
                        pattern::fill_meta(&mut want[md.clone()], ms, l as u64, nsid, s);
                        if nsid == 4 {
                            // PI in the first 8 of the 64 bytes, the rest as written.
                            let data = want[d].to_vec();
                            put_pi(&mut want[md.start..md.start + 8], &data, l as u64);
                        }
                    }
                    3 => {
                        // PI only: the buffers held data, the controller the PI.
                        pattern::fill(&mut want[d.clone()], ds, l as u64, nsid, s);
                        let data = want[d].to_vec();
                        put_pi(&mut want[md], &data, l as u64);
                    }
                    _ => unreachable!(),
                }
            }
        }
        assert_image(file, &got, &want, ds, ms, moff);
    }
    // The 64-bit guard namespace was refused, and namespace 7 is not used: not a byte written.
    for file in ["nvme-f-ns5.img", "nvme-f-ns7.img"] {
        let img = std::fs::read(run_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(img.iter().all(|&b| b == 0), "{file}: written to");
    }
    // The zoned namespace keeps hello's block (appended to empty zone 0), and nothing else.
    let got = std::fs::read(run_dir().join("nvme-f-ns6.img")).unwrap();
    let lba = num("hello6_lba") as usize;
    assert_eq!(
        lba, 0,
        "hello appends to the first zone with room: zone 0 of fresh images"
    );
    let mut want = vec![0u8; 16 << 20];
    let text = format!("{}\n", manifest_get(&m, "hello6_text"));
    for (w, b) in want[..4096].iter_mut().zip(text.bytes().cycle()) {
        *w = b;
    }
    assert_image("nvme-f-ns6.img", &got, &want, 4096, 0, want.len());
}
