//! vfpoll developer tasks (being written).
#![forbid(unsafe_code)]
fn main() {}
