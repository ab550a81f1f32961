//! keycache's test kit (not published): helpers shared by the integration
//! tests of every crate, the fuzz bodies, and the real Salt 3008.5 driver.
#![allow(missing_docs)]
pub mod common;
pub mod fuzzing;
