//! keycache's test kit (not published): helpers shared by the integration
//! tests of every crate, the fuzz bodies, and the real Salt 3008.5 driver.
//!
//! - [`common`]: the Salt driver, layouts, PEM-like values, dumps;
//! - [`cmd`]: the CLI tests' command builder;
//! - [`peers`]: the snapshot and merge tests' masters, crafted snapshot
//!   files and directory listings (re-exported by [`common`]);
//! - [`rng`]: the one seeded PRNG of the tests and benches;
//! - [`scratch`]: scratch directories (`tempfile`);
//! - [`skip`]: tests that cannot run here say so, visibly and countably;
//! - [`sys`]: the only `unsafe` code of the tests, behind safe functions;
//! - [`tracer`] and [`disk`] (x86_64 Linux): a ptrace tracer and a
//!   power-loss disk simulator;
//! - [`crash`]: the crash tests' op model, writer log and checks;
//! - [`etcd`]: real etcd members on 127.0.0.1 for the replica tests;
//! - [`fuzzing`]: the fuzz target bodies.
#![allow(missing_docs)]
pub mod cmd;
pub mod common;
pub mod crash;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod disk;
pub mod etcd;
pub mod fuzzing;
pub mod peers;
pub mod rng;
pub mod scratch;
pub mod skip;
pub mod sys;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod tracer;
