//! CPU cores: parsing core lists and pinning the calling thread (`sched_setaffinity`).

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::EngineError;

/// Parses a core list as `taskset -c` takes it: `0`, `0,2`, `0-3`, `0-3,8,10-11`. The result is
/// in the order given, without duplicates.
pub fn parse_cores(s: &str) -> Result<Vec<usize>, EngineError> {
    let bad = |why: String| EngineError::Invalid(format!("core list {s:?}: {why}"));
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(bad("empty entry".into()));
        }
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("{t:?} is not a core number")))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(bad(format!("range {part} runs backwards")));
        }
        if hi >= CpuSet::count() {
            return Err(bad(format!(
                "core {hi} is beyond the {} this system can address",
                CpuSet::count()
            )));
        }
        for c in lo..=hi {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// The cores this thread may run on now (its affinity mask), ascending.
pub fn allowed_cores() -> Result<Vec<usize>, EngineError> {
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(EngineError::AffinityQuery)?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Pins the calling thread to `core`. Fails (never silently) when the core does not exist, is
/// offline, or is outside the process's cpuset.
pub fn pin_current(core: usize) -> Result<(), EngineError> {
    let mut set = CpuSet::new();
    set.set(core)
        .map_err(|source| EngineError::Affinity { core, source })?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|source| EngineError::Affinity { core, source })
}

/// Lets the calling thread run on any of `cores` (to restore a mask, or to keep a control
/// thread off the workers' cores).
pub fn set_current(cores: &[usize]) -> Result<(), EngineError> {
    let mut set = CpuSet::new();
    for &core in cores {
        set.set(core)
            .map_err(|source| EngineError::Affinity { core, source })?;
    }
    let core = cores.first().copied().unwrap_or(0);
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|source| EngineError::Affinity { core, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists() {
        assert_eq!(parse_cores("0").unwrap(), [0]);
        assert_eq!(parse_cores("1,0").unwrap(), [1, 0]);
        assert_eq!(parse_cores("0-3,2,8").unwrap(), [0, 1, 2, 3, 8]);
        assert_eq!(parse_cores(" 4 - 5 ").unwrap(), [4, 5]);
        for bad in ["", "a", "1,", "3-1", "1-x", "100000"] {
            assert!(parse_cores(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pinning_to_an_allowed_core_works_and_a_missing_one_fails() {
        let cores = allowed_cores().unwrap();
        assert!(!cores.is_empty());
        std::thread::spawn(move || {
            pin_current(cores[0]).unwrap();
            assert_eq!(allowed_cores().unwrap(), [cores[0]]);
            let e = pin_current(CpuSet::count() - 1).unwrap_err();
            assert!(e.to_string().contains("core"), "{e}");
        })
        .join()
        .unwrap();
    }
}
