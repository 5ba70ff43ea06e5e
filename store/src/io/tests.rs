//! The engine's tests: batches over several members, copy threads, failures.

use super::*;
use crate::device::MemDevice;
use crate::format::crc32c;

fn engine(members: usize, copy_threads: usize) -> Io {
    let devs: Vec<Box<dyn Device>> = (0..members)
        .map(|_| Box::new(MemDevice::new(8 << 20, 512, true)) as Box<dyn Device>)
        .collect();
    let geo = Geometry {
        members: members as u32,
        chunk_pages: 16,
        chunks_per_member: 40,
    };
    let mut io = Io::new(devs, geo, 3, Duration::from_secs(10)).unwrap();
    io.copy_threads = copy_threads;
    io
}

/// Writes and reads jobs of odd lengths that cross chunks and members, with and without
/// copy threads: the bytes come back, and each job's crc is the crc32c of its bytes.
#[test]
fn run_moves_bytes_and_computes_crcs() {
    for copy_threads in [0, 1, 3] {
        let mut io = engine(2, copy_threads);
        // Over 1 MiB in all, so that the copy threads take part.
        let lens = [
            1usize,
            4096,
            70_000,
            1_100_000,
            200_000,
            65_536 * 3 + 5,
            0,
            12_345,
        ];
        let mut page = 0u64;
        let mut at = Vec::new();
        let data: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + i * 13) as u8).collect())
            .collect();
        for &n in &lens {
            at.push(page);
            page += n.div_ceil(PAGE) as u64 + 3;
        }
        let mut jobs: Vec<Job<'_>> = data
            .iter()
            .zip(&at)
            .map(|(d, &page)| Job::Write { page, data: d })
            .collect();
        let w = io.run_crc(&mut jobs).unwrap();
        let want: Vec<u32> = data.iter().map(|d| crc32c(d)).collect();
        assert_eq!(w, want, "write crcs, {copy_threads} copy threads");
        let mut back: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n]).collect();
        let mut jobs: Vec<Job<'_>> = back
            .iter_mut()
            .zip(&at)
            .map(|(d, &page)| Job::Read { page, dst: d })
            .collect();
        let r = io.run_crc(&mut jobs).unwrap();
        drop(jobs);
        assert_eq!(r, want, "read crcs, {copy_threads} copy threads");
        assert_eq!(back, data);
        // Every buffer is back.
        assert!(io.members.iter().all(|m| m.bufs.len() == 3));
    }
}

/// A device that fails in the middle of a large batch (a power cut: every request from
/// then on fails): the batch returns the error, with and without copy threads, and every
/// buffer comes back (none is lost to a copy thread or a failed request).
#[test]
fn a_failure_mid_batch_is_an_error_and_returns_every_buffer() {
    for copy_threads in [0, 2] {
        let devs: Vec<MemDevice> = (0..2).map(|_| MemDevice::new(8 << 20, 512, true)).collect();
        let handles: Vec<_> = devs.iter().map(MemDevice::handle).collect();
        let devs = devs.into_iter().map(|d| Box::new(d) as Box<dyn Device>).collect();
        let geo = Geometry {
            members: 2,
            chunk_pages: 16,
            chunks_per_member: 40,
        };
        let mut io = Io::new(devs, geo, 3, Duration::from_secs(10)).unwrap();
        io.copy_threads = copy_threads;
        let data = vec![5u8; 2 << 20];
        handles[1].arm_cut(4, 1);
        let e = io
            .run_crc(&mut [Job::Write { page: 0, data: &data }])
            .unwrap_err();
        assert!(e.to_string().contains("power lost"), "{e}");
        assert!(io.members.iter().all(|m| m.bufs.len() == 3));
        let mut back = vec![0u8; 2 << 20];
        assert!(io
            .run_crc(&mut [Job::Read {
                page: 0,
                dst: &mut back
            }])
            .is_err());
        assert!(io.members.iter().all(|m| m.bufs.len() == 3));
    }
}

/// A batch that runs past the store is refused before any I/O.
#[test]
fn run_refuses_io_past_the_end() {
    let mut io = engine(1, 1);
    let end = io.geo.pages();
    let d = [0u8; 8192];
    assert!(io
        .run(&mut [Job::Write {
            page: end - 1,
            data: &d
        }])
        .is_err());
}

/// Channels: each its own engine (the ones after the first with the buffers asked for); a
/// thread takes the first whenever it is idle, whatever order they came back in; a thread
/// that finds none idle waits until one is given back.
#[test]
fn channels_hand_out_the_first_when_idle_and_wake_a_waiting_thread() {
    let ch = Channels::open(engine(2, 0), 3, 2);
    assert_eq!(ch.count(), 3);
    let a = ch.take();
    let b = ch.take();
    let c = ch.take();
    assert_eq!(a.channel, 0);
    assert!(a.members.iter().all(|m| m.bufs.len() == 3));
    assert!(b.members.iter().all(|m| m.bufs.len() == 2));
    let b_channel = b.channel;
    assert!(b_channel != 0 && c.channel != 0 && b_channel != c.channel);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ch.take().channel);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "no channel is idle");
        drop(b);
        assert_eq!(waiter.join().unwrap(), b_channel);
    });
    drop(a);
    drop(c);
    assert_eq!(ch.take().channel, 0);
    // One asked for: one, no other opened.
    let one = Channels::open(engine(1, 0), 1, 2);
    assert_eq!(one.count(), 1);
}
