//! `vfpoll perf --reset-every SECS`: a thread resets every controller of the run that often
//! while the workers run (`Controller::reset`, from a thread that is not theirs), so that
//! recovery can be measured and checked under load: each reset's time, and (from the workers)
//! the longest gap between completions. Workers issue the I/Os a reset interrupted again, so
//! `--verify` still holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_nvme::Controller;

/// The resetting thread.
pub(super) struct ResetEvery {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Resets>,
}

/// What the resets did.
#[derive(Debug, Default)]
pub(super) struct Resets {
    /// Each successful reset: the device and how long it took.
    pub done: Vec<(String, Duration, bool)>,
    /// Failed ones, with the error.
    pub failed: Vec<(String, String)>,
}

impl ResetEvery {
    /// Starts resetting each of `ctrls` every `every` (the first after `every`).
    pub(super) fn start(ctrls: &[(Controller, String)], every: Duration) -> Self {
        let ctrls = ctrls.to_vec();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut out = Resets::default();
            let mut next = Instant::now() + every;
            while !s.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(10)));
                    continue;
                }
                next += every;
                for (c, dev) in &ctrls {
                    if s.load(Ordering::Acquire) {
                        break;
                    }
                    match c.reset() {
                        Ok(r) => out.done.push((dev.clone(), r.took, r.function_reset)),
                        Err(e) => out.failed.push((dev.clone(), e.to_string())),
                    }
                }
            }
            out
        });
        ResetEvery { stop, thread }
    }

    /// Stops (after a reset in progress) and says what was done.
    pub(super) fn stop(self) -> Resets {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

impl Resets {
    /// min / mean / max of the reset times.
    pub(super) fn times(&self) -> Option<(Duration, Duration, Duration)> {
        let t: Vec<Duration> = self.done.iter().map(|d| d.1).collect();
        let (min, max) = (t.iter().min()?, t.iter().max()?);
        let mean = t.iter().sum::<Duration>() / t.len() as u32;
        Some((*min, mean, *max))
    }

    pub(super) fn json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        serde_json::json!({
            "done": self.done.len(),
            "function_resets": self.done.iter().filter(|d| d.2).count(),
            "failed": self.failed.iter().map(|(d, e)| format!("{d}: {e}")).collect::<Vec<_>>(),
            "took_ms": self.done.iter().map(|d| ms(d.1)).collect::<Vec<_>>(),
            "min_ms": self.times().map(|t| ms(t.0)),
            "mean_ms": self.times().map(|t| ms(t.1)),
            "max_ms": self.times().map(|t| ms(t.2)),
        })
    }
}
