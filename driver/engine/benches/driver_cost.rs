//! Driver cost benchmark (see below).
fn main() {}
