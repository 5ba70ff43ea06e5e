//! `vfpoll gpu` end to end, with the CPU stand-in for the GPU (`--cpu`): the in-process NVMe
//! model (or, built without the `model` feature, its refusal), a file and hugepage-resident data
//! as sources; and the error without a GPU.

use std::process::{Command, Output};

fn vfpoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vfpoll"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const SMALL: &[&str] = &["--page-size", "4K", "--slot-size", "1m", "--slots", "3", "--cpu"];

#[cfg(feature = "model")]
#[test]
fn load_and_save_through_the_model_verify() {
    for op in ["load", "save"] {
        let mut args = vec!["gpu", op, "--model", "--offset", "8k", "--len", "5m", "--verify"];
        args.extend(SMALL);
        let o = vfpoll(&args);
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        assert!(s.contains("NVMe model namespace 1"), "{s}");
        assert!(s.contains("path: staged"), "{s}");
        assert!(s.contains("run 1: 5242880 bytes in"), "{s}");
        assert!(s.contains("GB/s; CPU"), "{s}");
        assert!(s.contains("verify: 5242880 bytes match"), "{s}");
    }
}

/// A build without the `model` feature (`cargo test -p vfpoll --no-default-features`) refuses
/// `--model` with the way to get it.
#[cfg(not(feature = "model"))]
#[test]
fn without_the_model_feature_model_runs_say_how_to_get_it() {
    let mut args = vec!["gpu", "load", "--model", "--len", "1m"];
    args.extend(SMALL);
    let o = vfpoll(&args);
    let s = text(&o);
    assert!(!o.status.success(), "{s}");
    assert!(
        s.contains("--model: this vfpoll was built without the NVMe model; rebuild with --features model"),
        "{s}"
    );
}

#[test]
fn file_and_hugepages_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let p = path.to_str().unwrap();
    let mut args = vec![
        "gpu", "save", "--file", p, "--len", "3000000", "--verify", "--json",
    ];
    args.extend(SMALL);
    let o = vfpoll(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 3_000_000);
    let mut args = vec![
        "gpu", "load", "--file", p, "--len", "3000000", "--verify", "--json", "--repeat", "2",
    ];
    args.extend(SMALL);
    let o = vfpoll(&args);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["operation"], "load");
    assert_eq!(j["path"], "staged");
    assert_eq!(j["runs"].as_array().unwrap().len(), 2);
    assert_eq!(j["runs"][0]["bytes"], 3_000_000);
    assert_eq!(j["verify"]["ok"], true);

    let mut args = vec!["gpu", "load", "--hugepages", "--len", "7m", "--verify"];
    args.extend(SMALL);
    let o = vfpoll(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("hugepage-resident data"), "{}", text(&o));
}

#[test]
fn bad_requests_are_clear_errors() {
    // Past the end of the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small");
    std::fs::write(&path, [1u8; 4096]).unwrap();
    let mut args = vec!["gpu", "load", "--file", path.to_str().unwrap(), "--len", "8k"];
    args.extend(SMALL);
    let o = vfpoll(&args);
    assert!(!o.status.success());
    assert!(text(&o).contains("outside"), "{}", text(&o));
    // No source named.
    let o = vfpoll(&["gpu", "load", "--len", "1m", "--cpu"]);
    assert!(!o.status.success());
    // Verify with one slot.
    let o = vfpoll(&[
        "gpu",
        "load",
        "--hugepages",
        "--len",
        "1m",
        "--cpu",
        "--slots",
        "1",
        "--verify",
        "--page-size",
        "4K",
    ]);
    assert!(text(&o).contains("two slots"), "{}", text(&o));
}

#[test]
fn without_a_gpu_the_error_says_what_is_missing() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a machine with a GPU: nothing is missing
    }
    let o = vfpoll(&["gpu", "load", "--hugepages", "--len", "1m", "--page-size", "4K"]);
    assert!(!o.status.success());
    let s = text(&o);
    assert!(
        s.contains("rebuild with the `cuda` feature") || s.contains("cannot load the CUDA driver library"),
        "{s}"
    );
    let o = vfpoll(&["gpu", "info"]);
    assert!(!o.status.success());
    let s = text(&o);
    assert!(s.contains("peer-to-peer DMA from NVMe into GPU memory"), "{s}");
    assert!(s.contains("MISSING  vfpoll NVMe buffers in GPU memory"), "{s}");
}
