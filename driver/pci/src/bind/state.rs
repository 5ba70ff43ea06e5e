//! The record of the driver each device had before vfpoll bound it: one file per device,
//! `<state_dir>/bound/<BDF>`, holding `driver=<name>` (empty for none). `/run` is a tmpfs, so the
//! records go away at reboot, as the bindings do.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::BindError;
use crate::bdf::Bdf;

/// A device vfpoll bound, and the driver it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The device.
    pub bdf: Bdf,
    /// Its driver before the bind; `None` when it had none.
    pub original: Option<String>,
}

fn path(state_dir: &Path, bdf: Bdf) -> PathBuf {
    state_dir.join("bound").join(bdf.to_string())
}

fn parse(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("driver="))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
}

/// The driver `bdf` had before vfpoll bound it: `None` when there is no record,
/// `Some(None)` when it had no driver.
pub fn recorded_driver(state_dir: &Path, bdf: Bdf) -> Result<Option<Option<String>>, BindError> {
    let p = path(state_dir, bdf);
    match fs::read_to_string(&p) {
        Ok(t) => Ok(Some(parse(&t))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BindError::State { bdf, path: p, source }),
    }
}

/// Every device vfpoll bound, sorted; an absent state folder means none.
pub fn recorded(state_dir: &Path) -> Vec<Record> {
    let mut v: Vec<Record> = fs::read_dir(state_dir.join("bound"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let bdf = e.file_name().to_string_lossy().parse().ok()?;
                    let original = parse(&fs::read_to_string(e.path()).ok()?);
                    Some(Record { bdf, original })
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|r| r.bdf);
    v
}

/// Records `driver` as the original driver of `bdf`. An earlier record that names a driver is
/// kept when the device has none now (a bind that failed half-way).
pub(super) fn record(state_dir: &Path, bdf: Bdf, driver: Option<&str>) -> Result<(), BindError> {
    let p = path(state_dir, bdf);
    if driver.is_none() && matches!(recorded_driver(state_dir, bdf)?, Some(Some(_))) {
        return Ok(());
    }
    let err = |source| BindError::State {
        bdf,
        path: p.clone(),
        source,
    };
    fs::create_dir_all(p.parent().unwrap_or(state_dir)).map_err(err)?;
    fs::write(&p, format!("driver={}\n", driver.unwrap_or(""))).map_err(err)
}

/// Drops the record of `bdf`, if any.
pub(super) fn forget(state_dir: &Path, bdf: Bdf) -> Result<(), BindError> {
    let p = path(state_dir, bdf);
    match fs::remove_file(&p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(BindError::State {
            bdf,
            path: p,
            source: e,
        }),
        _ => Ok(()),
    }
}
