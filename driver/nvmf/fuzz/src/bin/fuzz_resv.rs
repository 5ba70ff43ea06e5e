//! The `resv` fuzz target ([`vfpoll_nvmf_fuzz::resv`]). With the `libfuzzer` feature (and the
//! coverage flags `cargo xtask fuzz` passes) a libFuzzer binary; without it, it replays the
//! files and directories given as arguments, e.g. a crash libFuzzer saved:
//! `cargo run -p vfpoll-nvmf-fuzz --bin fuzz_resv -- target/fuzz/artifacts/resv/crash-...`.

#![cfg_attr(feature = "libfuzzer", no_main)]
#![cfg_attr(not(feature = "libfuzzer"), forbid(unsafe_code))]

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(
    init: vfpoll_nvmf_fuzz::write_seeds_from_env(&vfpoll_nvmf_fuzz::RESV),
    |data: &[u8]| (vfpoll_nvmf_fuzz::RESV.check)(data)
);

/// Replays the inputs named on the command line (or, with none, the seeds); `--seeds DIR`
/// writes the seeds into DIR instead. A failing input panics with the property it breaks.
#[cfg(not(feature = "libfuzzer"))]
fn main() -> std::process::ExitCode {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let result = vfpoll_nvmf_fuzz::replay(&vfpoll_nvmf_fuzz::RESV, &args, |path| {
        eprintln!("fuzz_resv: {}", path.display());
    });
    match result {
        Ok(summary) => {
            eprintln!("fuzz_resv: {summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fuzz_resv: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
