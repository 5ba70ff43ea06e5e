//! The pipeline's logic with the CPU stand-in for the GPU and the in-memory source: ordering,
//! slot reuse, partial last slots, errors from either side, stuck devices.

use std::time::Duration;

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_gpu::fake::{MemSource, SourceFault};
use vfpoll_gpu::{
    load, pattern, save, verify, CopyFault, CpuEngine, Direction, Options, PatternSource, PipelineError,
    Slots, Stage, Transfer,
};

const SLOT: usize = 16 << 10;

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern(seed, 0, &mut v);
    v
}

fn slots(n: usize) -> Slots {
    Slots::alloc(&DmaContext::for_testing(), n, SLOT, PageSize::Base4K).unwrap()
}

/// The error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}

fn quick() -> Options {
    Options {
        timeout: Duration::from_millis(300),
        block_when_idle: true,
    }
}

fn t(source_offset: u64, device_offset: u64, len: u64) -> Transfer {
    Transfer {
        source_offset,
        device_offset,
        len,
    }
}

#[test]
fn load_copies_everything_in_place_whatever_the_timing() {
    let len = 10 * SLOT + 1234; // a partial last slot
    for (slots_n, src_delay, gpu_delay, reversed) in [
        (1, 0, 0, false),
        (2, 3, 0, false),
        (4, 0, 5, true),
        (4, 7, 2, true),
        (8, 1, 9, false),
    ] {
        let mut src = MemSource::new(data(len + 4096, 1), 1).with_delay(src_delay);
        if reversed {
            src = src.reversed();
        }
        let mut gpu = CpuEngine::new(len + 100).with_delay(gpu_delay);
        let mut s = slots(slots_n);
        let r = load(
            &mut src,
            &mut gpu,
            &mut s,
            &t(4096, 100, len as u64),
            &Options::default(),
        )
        .unwrap_or_else(|e| panic!("{slots_n} slots: {e}"));
        assert_eq!(
            (r.bytes, r.chunks, r.direction),
            (len as u64, 11, Direction::Load)
        );
        assert_eq!(
            &gpu.memory()[100..],
            &src.data()[4096..4096 + len],
            "{slots_n} slots"
        );
        assert!(
            gpu.memory()[..100].iter().all(|&b| b == 0),
            "nothing before the target"
        );
        assert!(src.max_outstanding <= slots_n);
        if slots_n > 1 && src_delay > 0 {
            assert!(src.max_outstanding > 1, "reads overlap: {}", src.max_outstanding);
        }
        if slots_n > 1 {
            verify(
                &mut src,
                &mut gpu,
                &mut s,
                &t(4096, 100, len as u64),
                &Options::default(),
            )
            .unwrap();
        }
    }
}

#[test]
fn partial_blocks_are_read_whole_and_copied_exactly() {
    // 512-byte blocks, a length that ends mid-block: the last read is rounded up, the copy not.
    let len = 3 * SLOT + 700;
    let mut src = MemSource::new(data(8 * SLOT, 2), 512);
    let mut gpu = CpuEngine::new(len);
    let mut s = slots(2);
    load(&mut src, &mut gpu, &mut s, &t(1024, 0, len as u64), &quick()).unwrap();
    assert_eq!(gpu.memory(), &src.data()[1024..1024 + len]);
    // An unaligned source offset or a save of part of a block is refused up front.
    let e = load(&mut src, &mut gpu, &mut s, &t(100, 0, 512), &quick()).unwrap_err();
    assert!(matches!(e, PipelineError::Invalid(_)), "{e}");
    let e = save(&mut src, &mut gpu, &mut s, &t(0, 0, 700), &quick()).unwrap_err();
    assert!(chain(&e).contains("whole blocks"), "{e}");
}

#[test]
fn ranges_outside_the_source_or_device_are_refused() {
    let mut src = MemSource::new(data(4 * SLOT, 3), 1);
    let mut gpu = CpuEngine::new(SLOT);
    let mut s = slots(2);
    for (tr, what) in [
        (t(0, 0, 0), "zero"),
        (t(3 * SLOT as u64, 0, SLOT as u64 + 1), "outside memory"),
        (t(0, 1, SLOT as u64), "device bytes"),
        (t(u64::MAX - 10, 0, 100), "outside"),
    ] {
        let e = load(&mut src, &mut gpu, &mut s, &tr, &quick()).unwrap_err();
        assert!(e.to_string().contains(what), "{tr:?}: {e}");
    }
}

#[test]
fn save_writes_the_device_memory_back() {
    let len = 7 * SLOT + 512;
    for (n, src_delay, gpu_delay) in [(1, 0, 0), (3, 4, 1), (5, 1, 6)] {
        let mut src = MemSource::new(vec![0; len + 8192], 512)
            .with_delay(src_delay)
            .reversed();
        let mut gpu = CpuEngine::new(len).with_delay(gpu_delay);
        gpu.memory_mut().copy_from_slice(&data(len, 4));
        let mut s = slots(n);
        let r = save(&mut src, &mut gpu, &mut s, &t(8192, 0, len as u64), &quick()).unwrap();
        assert_eq!((r.bytes, r.chunks, r.direction), (len as u64, 8, Direction::Save));
        assert_eq!(&src.data()[8192..], gpu.memory(), "{n} slots");
        assert!(src.data()[..8192].iter().all(|&b| b == 0));
    }
}

#[test]
fn source_errors_stop_the_load_cleanly() {
    for fault in [SourceFault::Submit, SourceFault::Complete] {
        let mut src = MemSource::new(data(20 * SLOT, 5), 1).with_delay(2);
        src.inject(5, fault);
        let mut gpu = CpuEngine::new(20 * SLOT).with_delay(1);
        let mut s = slots(4);
        let e = load(&mut src, &mut gpu, &mut s, &t(0, 0, 20 * SLOT as u64), &quick()).unwrap_err();
        match e {
            PipelineError::Source {
                stage: Stage::Read,
                offset,
                ..
            } => assert_eq!(offset, 5 * SLOT as u64, "{fault:?}"),
            e => panic!("{fault:?}: {e}"),
        }
        // Nothing is left in flight on either side.
        assert_eq!(vfpoll_gpu::BlockSource::outstanding(&src), 0);
    }
}

#[test]
fn copy_errors_stop_the_load_and_the_save_cleanly() {
    for fault in [CopyFault::Submit, CopyFault::Complete] {
        let mut src = MemSource::new(data(20 * SLOT, 6), 1).with_delay(1);
        let mut gpu = CpuEngine::new(20 * SLOT).with_delay(2);
        gpu.inject(3, fault);
        let mut s = slots(4);
        let e = load(&mut src, &mut gpu, &mut s, &t(0, 0, 20 * SLOT as u64), &quick()).unwrap_err();
        assert!(
            matches!(e, PipelineError::Copy { stage: Stage::HostToDevice, offset, .. } if offset == 3 * SLOT as u64),
            "{fault:?}: {e}"
        );
        assert_eq!(vfpoll_gpu::BlockSource::outstanding(&src), 0);

        let mut gpu = CpuEngine::new(20 * SLOT).with_delay(2);
        gpu.inject(2, fault);
        let e = save(&mut src, &mut gpu, &mut s, &t(0, 0, 20 * SLOT as u64), &quick()).unwrap_err();
        assert!(
            matches!(e, PipelineError::Copy { stage: Stage::DeviceToHost, offset, .. } if offset == 2 * SLOT as u64),
            "{fault:?}: {e}"
        );
    }
    // A sink write error.
    let mut src = MemSource::new(vec![0; 20 * SLOT], 1);
    src.inject(4, SourceFault::Complete);
    let mut gpu = CpuEngine::new(20 * SLOT);
    let mut s = slots(3);
    let e = save(&mut src, &mut gpu, &mut s, &t(0, 0, 20 * SLOT as u64), &quick()).unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::Source {
                stage: Stage::Write,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_stuck_side_times_out_instead_of_hanging() {
    let opts = Options {
        timeout: Duration::from_millis(100),
        block_when_idle: true,
    };
    let mut src = MemSource::new(data(8 * SLOT, 7), 1);
    src.inject(2, SourceFault::Hang);
    let mut gpu = CpuEngine::new(8 * SLOT);
    let mut s = slots(3);
    let e = load(&mut src, &mut gpu, &mut s, &t(0, 0, 8 * SLOT as u64), &opts).unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::Timeout {
                stage: Stage::Read,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("leaked"), "{e}");

    let mut src = MemSource::new(data(8 * SLOT, 7), 1);
    let mut gpu = CpuEngine::new(8 * SLOT);
    gpu.inject(1, CopyFault::Hang);
    let mut s = slots(3);
    let e = load(&mut src, &mut gpu, &mut s, &t(0, 0, 8 * SLOT as u64), &opts).unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::Timeout {
                stage: Stage::HostToDevice,
                ..
            }
        ),
        "{e}"
    );

    // An error, then a hang: the first error is what comes back.
    let mut src = MemSource::new(data(8 * SLOT, 7), 1);
    src.inject(1, SourceFault::Complete);
    let mut gpu = CpuEngine::new(8 * SLOT);
    gpu.inject(0, CopyFault::Hang);
    let mut s = slots(3);
    let e = load(&mut src, &mut gpu, &mut s, &t(0, 0, 8 * SLOT as u64), &opts).unwrap_err();
    assert!(matches!(e, PipelineError::Source { .. }), "{e}");
}

#[test]
fn verify_finds_the_first_difference() {
    let len = 5 * SLOT;
    let mut src = MemSource::new(data(len, 8), 1);
    let mut gpu = CpuEngine::new(len);
    let mut s = slots(2);
    load(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    gpu.memory_mut()[3 * SLOT + 5] ^= 0xff;
    gpu.memory_mut()[4 * SLOT] ^= 1;
    let e = verify(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap_err();
    match e {
        PipelineError::Mismatch {
            first,
            mismatched_bytes,
            ..
        } => assert_eq!((first, mismatched_bytes), ((3 * SLOT + 5) as u64, 2)),
        e => panic!("{e}"),
    }
    let e = verify(&mut src, &mut gpu, &mut slots(1), &t(0, 0, 10), &quick()).unwrap_err();
    assert!(e.to_string().contains("two slots"), "{e}");
}

#[test]
fn resident_pattern_loads_and_verifies_and_survives_a_save() {
    let mut s = slots(3);
    let mut src = PatternSource::resident(&mut s, 9).unwrap();
    let len = 6 * SLOT + 100;
    let mut gpu = CpuEngine::new(len);
    load(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    let mut one = vec![0u8; SLOT];
    pattern(9, 0, &mut one);
    for (i, chunk) in gpu.memory().chunks(SLOT).enumerate() {
        assert_eq!(chunk, &one[..chunk.len()], "chunk {i}");
    }
    verify(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    // A save overwrites slots with other data; reads after it still see the pattern.
    gpu.memory_mut().fill(0x5a);
    save(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    load(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    verify(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    // Resident data is read in whole slots.
    let e = load(&mut src, &mut gpu, &mut s, &t(512, 0, 10), &quick()).unwrap_err();
    assert!(chain(&e).contains("whole slots"), "{}", chain(&e));
}

#[test]
fn generated_pattern_depends_on_the_offset() {
    let mut s = slots(2);
    let mut src = PatternSource::generated(&s, 10);
    let len = 3 * SLOT + 17;
    let mut gpu = CpuEngine::new(len);
    load(&mut src, &mut gpu, &mut s, &t(4096, 0, len as u64), &quick()).unwrap();
    let mut want = vec![0u8; len];
    pattern(10, 4096, &mut want);
    assert_eq!(gpu.memory(), &want[..]);
}

#[test]
fn the_report_adds_up() {
    let len = 64 * SLOT;
    let mut src = MemSource::new(data(len, 11), 1);
    let mut gpu = CpuEngine::new(len);
    let mut s = slots(4);
    let r = load(&mut src, &mut gpu, &mut s, &t(0, 0, len as u64), &quick()).unwrap();
    assert_eq!((r.bytes, r.chunks), (len as u64, 64));
    assert!(r.gbps() > 0.0 && r.elapsed > Duration::ZERO);
    assert_eq!(r.path, vfpoll_gpu::DataPath::Staged);
}
