//! GPU memory to a store and back through CUDA (feature `cuda`), checked byte for byte, with
//! rates next to the devices' raw rate through the same engine.
//!
//! `cargo run --release -p vfpoll-store --features cuda --example store_gpu -- SPEC... [--mib N]`
//!
//! A host tensor of N MiB is saved, loaded into GPU memory (`load_device`), saved again from
//! the GPU (`put_device`, with and without the background writer), and the two versions are
//! compared on the host.
//!
//! With `--bounce FILE` (a file on the same disk as the store), the same bytes also go the way
//! most users' code goes today: `cudaMemcpy` to a pageable buffer, `write()`, `fsync`, and
//! back with `read()` and `cudaMemcpy`, in chunks of `--bounce-chunk-mib` (default 64).

mod bounce;

use std::time::Instant;

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_gpu::cuda::{CudaEngine, DeviceMemory, Gpu};
use vfpoll_gpu::Slots;
use vfpoll_store::{FormatOptions, ReadOptions, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut specs = Vec::new();
    let mut mib = 1024usize;
    let mut bounce_file: Option<std::path::PathBuf> = None;
    let mut bounce_chunk = 64usize << 20;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mib" => mib = args.next().ok_or("--mib N")?.parse()?,
            "--bounce" => bounce_file = Some(args.next().ok_or("--bounce FILE")?.into()),
            "--bounce-chunk-mib" => {
                bounce_chunk = args.next().ok_or("--bounce-chunk-mib N")?.parse::<usize>()? << 20
            }
            _ => specs.push(a),
        }
    }
    let len = mib << 20;
    let mut f = FormatOptions {
        force: true,
        ..Default::default()
    };
    f.store.lock_dir = Some(std::env::temp_dir());
    f.store.io_buffers = 64;
    f.store.allow_buffered_io = true;
    let store = Store::format(&specs, &f)?;
    let info = store.info();
    println!(
        "store on {:?}",
        info.members.iter().map(|m| &m.device).collect::<Vec<_>>()
    );
    let gpu = Gpu::open(0)?;
    println!("GPU: {}", gpu.name());
    let dma = DmaContext::for_testing();
    let page = if dma.alloc_region(2 << 20, PageSize::Huge2M).is_ok() {
        PageSize::Huge2M
    } else {
        PageSize::Base4K
    };
    let mut slots = Slots::alloc(&dma, 8, 4 << 20, page)?;
    let mut engine = CudaEngine::new(DeviceMemory::alloc(&gpu, len)?, &slots, 4)?;

    let host: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
        .collect();
    let raw_w = store.bench_raw(len as u64, true)?;
    let raw_r = store.bench_raw(len as u64, false)?;
    let gb = len as f64 / 1e9;
    println!(
        "raw through the store's engine: write {:.2} GB/s, read {:.2} GB/s",
        gb / raw_w.as_secs_f64(),
        gb / raw_r.as_secs_f64()
    );
    let mut tx = store.begin("host")?;
    tx.put("t", b"", &host)?;
    tx.commit()?;
    let r = store.open_version("host", None)?;
    let t = Instant::now();
    r.load_device(
        "t",
        0,
        len as u64,
        &mut engine,
        &mut slots,
        0,
        &ReadOptions::default(),
    )?;
    println!(
        "load_device (crc checked): {:.2} GB/s",
        gb / t.elapsed().as_secs_f64()
    );
    for background in [false, true] {
        let t = Instant::now();
        let mut tx = store.begin("gpu")?;
        if background {
            tx.background(len as u64)?;
        }
        tx.put_device("t", b"", &mut engine, &mut slots, 0, len as u64)?;
        let staged = t.elapsed();
        let c = tx.commit()?;
        let durable = t.elapsed();
        println!(
            "put_device{}: staged after {:.3} s ({:.2} GB/s), durable after {:.3} s ({:.2} GB/s)",
            if background { " (background)" } else { "" },
            staged.as_secs_f64(),
            gb / staged.as_secs_f64(),
            durable.as_secs_f64(),
            gb / durable.as_secs_f64()
        );
        let back = store.open_version("gpu", Some(c.version))?.read_to_vec("t")?;
        assert!(back == host, "the bytes that went through the GPU differ");
    }
    println!("ok: {mib} MiB host → store → GPU → store → host, identical");
    if let Some(path) = bounce_file {
        let b = bounce::run(&gpu, &host, &path, bounce_chunk)?;
        println!(
            "bounce ({} MiB chunks, {}): save (cudaMemcpy + write + fsync) {:.2} GB/s, load (read + cudaMemcpy, cold cache) {:.2} GB/s, identical",
            bounce_chunk >> 20,
            path.display(),
            gb / b.save.as_secs_f64(),
            gb / b.load.as_secs_f64()
        );
    }
    Ok(())
}
