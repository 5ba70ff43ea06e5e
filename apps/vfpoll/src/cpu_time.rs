//! The process's CPU time, which `perf` and `responder` print with their results (how much CPU
//! polling, sleeping or a hybrid of both cost).

use std::time::Duration;

use anyhow::Context as _;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;

/// User and system CPU time of the whole process so far (every thread: workers, the control
/// thread, and the model's controller thread with --model).
pub fn process_cpu() -> anyhow::Result<Duration> {
    let u = getrusage(UsageWho::RUSAGE_SELF).context("getrusage")?;
    let d = |t: TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Ok(d(u.user_time()) + d(u.system_time()))
}
