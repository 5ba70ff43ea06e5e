use super::results::{fio_result, median, vfpoll_result, Result3};
use super::*;

#[test]
fn options() {
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let Some(a) = parse(&args(&[
        "--time=3",
        "--engines",
        "vfpoll,libaio",
        "--no-build",
        "--repeat",
        "2",
    ]))
    .unwrap() else {
        panic!("not bench")
    };
    assert_eq!((a.time, a.no_build, a.repeat), (3, true, 2));
    assert_eq!(a.engines, [Engine::Vfpoll, Engine::Libaio]);
    assert!(parse(&args(&["--time", "0"])).is_err());
    let Some(n) = parse(&args(&["--nvmf", "--time", "6"])).unwrap() else {
        panic!("not bench")
    };
    assert!(n.nvmf && !a.nvmf);
    assert!(parse(&args(&["--nvmf", "--time", "2"])).is_err());
    let Some(b) = parse(&args(&["--vfpoll=/x/vfpoll"])).unwrap() else {
        panic!("not bench")
    };
    assert_eq!(
        (b.vfpoll.as_deref(), b.no_build),
        (Some(Path::new("/x/vfpoll")), true)
    );
    assert!(parse(&args(&["--engines", "spdk"])).is_err());
    let Some(c) = parse(&args(&["--cases", "4k-randread-qd1,128k-read-qd32"])).unwrap() else {
        panic!("not bench")
    };
    let ids: Vec<&str> = c.cases().iter().map(|c| c.id).collect();
    assert_eq!(ids, ["4k-randread-qd1", "128k-read-qd32"]);
    assert_eq!(b.cases().len(), 3, "the default cases");
    assert!(b.cases().iter().all(|c| c.default));
    assert!(parse(&args(&["--cases", "4k-randread-qd64"])).is_err());
    let Some(d) = parse(&args(&["--cases", "4k-randread-qd16,4k-randread-qd1", "--plot"])).unwrap() else {
        panic!("not bench")
    };
    let ids: Vec<&str> = d.cases().iter().map(|c| c.id).collect();
    assert_eq!(
        (ids, d.plot, b.plot),
        (vec!["4k-randread-qd1", "4k-randread-qd16"], Plot::After, Plot::No)
    );
    assert!(parse(&args(&["--nvmf", "--time", "6", "--plot"])).is_err());
    let Some(w) = parse(&args(&["--warmup", "0"])).unwrap() else {
        panic!("not bench")
    };
    assert_eq!((w.warmup, b.warmup), (0, 1));
    assert!(parse(&args(&["--warmup", "-1"])).is_err());
    assert!(parse(&args(&["-h"])).unwrap().is_none());
}

#[test]
fn script_runs_every_engine_on_the_same_case() {
    let a = BenchArgs {
        time: 7,
        warmup: 1,
        repeat: 2,
        engines: Engine::ALL.to_vec(),
        cases: Vec::new(),
        no_build: true,
        verbose: false,
        nvmf: false,
        vfpoll: None,
        target_args: Vec::new(),
        plot: Plot::No,
    };
    let s = job_script(
        &a,
        Path::new("/t/release/vfpoll"),
        Path::new("/t/release/libvfpoll_fio.so"),
    );
    for want in [
        "fio_run io_uring-4k-randread-qd32-r$1 --ioengine=io_uring --rw=randread --bs=4k --iodepth=32",
        "fio_run libaio-128k-read-qd32-r$1 --ioengine=libaio --rw=read --bs=128k --iodepth=32",
        "fio_run io_uring-hipri-4k-randread-qd1-r$1 --ioengine=io_uring --hipri --rw=randread --bs=4k --iodepth=1",
        "--runtime=7",
        "--cpus_allowed=1",
        "for rep in $(seq 2); do",
        "perf --device $BDF --nsid 1 --cores 1 --time 7 --warmup 1 --workload randread --io-size 4k \
         --queue-depth 1 --json > /out/vfpoll-4k-randread-qd1-r$1.json",
        "--runtime=7 --ramp_time=1",
        "control k-r$1",
        "control v-r$1",
        "--queue-depth 32 --no-shadow-doorbell --json > /out/vfpoll-mmio-db-4k-randread-qd32-r$1.json",
        "--queue-depth 32 --cmb-sq --json > /out/vfpoll-cmb-sq-128k-read-qd32-r$1.json",
        "fio --name=fio-vfpoll-4k-randread-qd32-r$1 --thread --ioengine=external:/t/release/libvfpoll_fio.so \
         --filename=0000.00.03.0/1 --size=64M --time_based --runtime=7 --ramp_time=1 --cpus_allowed=1",
        "--output=/out/fio-vfpoll-4k-randread-qd32-r$1.json --rw=randread --bs=4k --iodepth=32",
    ] {
        assert!(s.contains(want), "no {want:?} in\n{s}");
    }
    assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(vec![4.0, 1.0]), 2.5);
}

#[test]
fn tables_compare_vfpoll_with_the_kernel_and_its_options_with_its_defaults() {
    let dir = std::env::temp_dir().join(format!("xtask-bench-table-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let ours = |iops: u32, p99: u32| format!(r#"{{"iops":{iops},"lat_ns":{{"p50":1000,"p99":{p99}}}}}"#);
    let fio = |iops: u32, p99: u32| {
        format!(
            r#"{{"jobs":[{{"read":{{"iops":{iops},"lat_ns":{{"percentile":{{"50.000000":9000,"99.000000":{p99}}}}}}}}}]}}"#
        )
    };
    for c in CASES.iter().filter(|c| c.default) {
        for rep in 1..=2 {
            let w = |e: &str, text: String| {
                fs::write(dir.join(format!("{e}-{}-r{rep}.json", c.id)), text).unwrap()
            };
            w("vfpoll", ours(1000, 50_000));
            w("io_uring", fio(100, 500_000));
            w("vfpoll-mmio-db", ours(1500, 40_000));
            // No vfpoll-cmb-sq results: its row shows dashes.
        }
    }
    let all: Vec<&Case> = CASES.iter().filter(|c| c.default).collect();
    let t = table(&dir, &all, &Engine::ALL, 2);
    fs::remove_dir_all(&dir).unwrap();
    let row = |engine: &str| {
        // Table rows only: the engine's name followed by its IOPS (or a dash).
        t.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| {
                w.windows(2)
                    .any(|p| p[0] == engine && (p[1] == "-" || p[1].parse::<f64>().is_ok()))
            })
            .collect::<Vec<_>>()
    };
    let uring = row("io_uring");
    assert_eq!(uring.len(), 3, "{t}");
    assert!(uring.iter().all(|r| r.ends_with(&["10.00x", "0.10x"])), "{t}");
    let mmio = row("vfpoll-mmio-db");
    assert!(mmio.iter().all(|r| r.ends_with(&["1.50x", "0.80x"])), "{t}");
    assert!(row("vfpoll-cmb-sq").iter().all(|r| r.contains(&"-")), "{t}");
    assert!(
        row("libaio").iter().all(|r| !r.iter().any(|w| w.ends_with('x'))),
        "{t}"
    );
}

#[test]
fn the_build_of_the_binary_is_named() {
    let p = Path::new("/t/release/vfpoll");
    assert_eq!(
        build_note(p, Some("release")),
        "/t/release/vfpoll (release build)"
    );
    assert!(build_note(p, Some("debug")).contains("is a DEBUG build"));
    assert!(build_note(p, None).contains("build not known"));
    let missing = describe_binary(Path::new("/nonexistent/vfpoll"));
    assert!(missing.contains("build not known"), "{missing}");
}

#[test]
fn both_json_shapes_are_read() {
    let fio = json::parse(
        r#"{"jobs":[{"read":{"iops":7688.5,"lat_ns":{"mean":4.1e6,"percentile":{"50.000000":3900000,"99.000000":9000000}}}}]}"#,
    )
    .unwrap();
    assert_eq!(
        fio_result(&fio),
        Some(Result3 {
            iops: 7688.5,
            p50_us: 3900.0,
            p99_us: 9000.0
        })
    );
    let ours = json::parse(r#"{"iops":60000,"lat_ns":{"p50":236000,"p99":4775000}}"#).unwrap();
    assert_eq!(vfpoll_result(&ours).unwrap().p99_us, 4775.0);
}
