//! The in-process NVMe model behind `--model` and `model:SIZE`. Builds with the cargo feature
//! `model` (on by default) link `vfpoll-nvme-model`; without it no model can exist, and asking
//! for one is an error that says how to get it.

#[cfg(feature = "model")]
pub use vfpoll_nvme_model::{ModelConfig, NamespaceConfig, NvmeModel};

/// Without the `model` feature no model exists: a type without values, so that a field that
/// keeps a model alive is always `None`.
#[cfg(not(feature = "model"))]
#[derive(Debug)]
pub enum NvmeModel {}

/// Commands the model failed with an error status (its statistics).
pub fn errors(model: &NvmeModel) -> u64 {
    #[cfg(feature = "model")]
    return model.stats().errors;
    #[cfg(not(feature = "model"))]
    match *model {}
}

/// The error of asking for the model (`what`: the option or spec that did) in a build without
/// it.
#[cfg(not(feature = "model"))]
pub fn unavailable(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: this vfpoll was built without the NVMe model; rebuild with --features model")
}
