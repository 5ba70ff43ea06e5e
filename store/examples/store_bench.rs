//! A quick figure of the store against its devices' raw rate, for development (the user-facing
//! benchmark is `vfpoll store bench`).
//!
//! `cargo run --release -p vfpoll-store --example store_bench -- SPEC... [--mib N] [--lock-dir D]`
//!
//! Formats a store on the specs (e.g. `file:/var/tmp/a.img?size=2G`), then measures:
//! raw sequential writes and reads of N MiB over the namespaces (the store's own engine,
//! 1-chunk requests, all namespaces at once: the ceiling); a checkpoint of N MiB in 64 MiB
//! tensors (save with commit, load with crc checks, load without); KV 64 KiB blocks (get at
//! depth 1: p50/p99, hit and miss; batches of 32).

use std::time::{Duration, Instant};

use vfpoll_store::{FormatOptions, ReadOptions, Store};

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut specs = Vec::new();
    let mut mib = 512u64;
    let mut lock_dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mib" => mib = args.next().ok_or("--mib N")?.parse()?,
            "--lock-dir" => lock_dir = Some(args.next().ok_or("--lock-dir DIR")?.into()),
            _ => specs.push(a),
        }
    }
    if specs.is_empty() {
        return Err("usage: store_bench SPEC... [--mib N] [--lock-dir DIR]".into());
    }
    let mut f = FormatOptions {
        force: true,
        ..Default::default()
    };
    f.store.lock_dir = lock_dir;
    f.store.io_buffers = 64;
    let store = Store::format(&specs, &f)?;
    let info = store.info();
    println!(
        "store on {} namespaces ({}), chunk {} KiB",
        info.members.len(),
        info.members
            .iter()
            .map(|m| m.device.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        info.chunk_size >> 10
    );
    let bytes = mib << 20;
    let tensor = 64usize << 20;
    let data: Vec<u8> = (0..tensor)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();

    // The ceiling: the same engine writing and reading raw pages (no metadata, no crc).
    let raw_w = store.bench_raw(bytes, true)?;
    let raw_r = store.bench_raw(bytes, false)?;
    println!(
        "raw pages       write {:6.2} GB/s   read {:6.2} GB/s",
        gbps(bytes, raw_w),
        gbps(bytes, raw_r)
    );

    let n = (bytes as usize).div_ceil(tensor);
    let cpu0 = cpu();
    let t = Instant::now();
    let mut tx = store.begin("bench")?;
    for i in 0..n {
        tx.put(&format!("t{i}"), b"", &data)?;
    }
    let staged = t.elapsed();
    tx.commit()?;
    let save = t.elapsed();
    let save_cpu = cpu() - cpu0;
    let total = (n * tensor) as u64;
    let r = store.open_version("bench", None)?;
    let mut buf = vec![0u8; tensor];
    let mut load = [Duration::ZERO; 2];
    for (k, verify) in [true, false].into_iter().enumerate() {
        let t = Instant::now();
        for i in 0..n {
            r.read_range(&format!("t{i}"), 0, &mut buf, &ReadOptions { verify })?;
        }
        load[k] = t.elapsed();
    }
    assert_eq!(buf, data);
    println!(
        "checkpoint      save {:6.2} GB/s (staged {:.2} GB/s, {:.2} CPU s/GB)   load {:6.2} GB/s with crc, {:6.2} GB/s without",
        gbps(total, save),
        gbps(total, staged),
        save_cpu.as_secs_f64() / (total as f64 / 1e9),
        gbps(total, load[0]),
        gbps(total, load[1])
    );
    drop(r);
    store.delete_checkpoint("bench")?;

    let bs = 64usize << 10;
    let slots = 2048u64.min(bytes / bs as u64);
    let pool = store.create_pool("bench", bs as u32, slots)?;
    let block = vec![0x5au8; bs];
    for k in (0..slots as u128).collect::<Vec<_>>().chunks(32) {
        let refs: Vec<&[u8]> = k.iter().map(|_| block.as_slice()).collect();
        pool.put_many(k, &refs)?;
    }
    let mut out = vec![0u8; bs];
    let (mut hit, mut miss) = (Vec::new(), Vec::new());
    for i in 0..2000u128 {
        let t = Instant::now();
        pool.get_many(&[i % slots as u128], &mut [&mut out[..]])?;
        hit.push(t.elapsed());
        let t = Instant::now();
        pool.get_many(&[u128::MAX - i], &mut [&mut out[..]])?;
        miss.push(t.elapsed());
    }
    let mut outs = vec![vec![0u8; bs]; 32];
    let t = Instant::now();
    let rounds = 200u64;
    for r in 0..rounds {
        let keys: Vec<u128> = (0..32).map(|j| ((r * 32 + j) % slots) as u128).collect();
        let mut bufs: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        pool.get_many(&keys, &mut bufs)?;
    }
    let batch = t.elapsed();
    println!(
        "KV 64 KiB       get QD1 hit p50 {:?} p99 {:?}, miss p50 {:?}; batches of 32: {:.2} GB/s",
        pct(&mut hit, 0.5),
        pct(&mut hit, 0.99),
        pct(&mut miss, 0.5),
        gbps(rounds * 32 * bs as u64, batch)
    );
    Ok(())
}

fn cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(u.user_time()) + tv(u.system_time())
}
