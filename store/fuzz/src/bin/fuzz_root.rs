//! The `root` fuzz target ([`vfpoll_store_fuzz::ROOT`]). With the `libfuzzer` feature (and the
//! coverage flags `cargo xtask fuzz` passes) a libFuzzer binary; without it, it replays the
//! files and directories given as arguments, e.g. a crash libFuzzer saved:
//! `cargo run -p vfpoll-store-fuzz --bin fuzz_root -- target/fuzz/artifacts/root/crash-...`.

#![cfg_attr(feature = "libfuzzer", no_main)]
#![cfg_attr(not(feature = "libfuzzer"), forbid(unsafe_code))]

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(
    init: vfpoll_store_fuzz::write_seeds_from_env(&vfpoll_store_fuzz::ROOT),
    |data: &[u8]| (vfpoll_store_fuzz::ROOT.check)(data)
);

/// Replays the inputs named on the command line (or, with none, the seeds); `--seeds DIR`
/// writes the seeds into DIR instead. A failing input panics with the property it breaks.
#[cfg(not(feature = "libfuzzer"))]
fn main() -> std::process::ExitCode {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let result = vfpoll_store_fuzz::replay(&vfpoll_store_fuzz::ROOT, &args, |path| {
        eprintln!("fuzz_root: {}", path.display());
    });
    match result {
        Ok(summary) => {
            eprintln!("fuzz_root: {summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fuzz_root: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
