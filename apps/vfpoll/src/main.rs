//! The `vfpoll` command-line tool (being written).
#![forbid(unsafe_code)]
fn main() {}
