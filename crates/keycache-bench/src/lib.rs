//! keycache's measuring code, in one crate: the lookup-throughput loop
//! ([`measure`]) that `keycache bench`, the comparison tool
//! (`examples/compare/`), the criterion benches and the etcd replica's
//! bench (`examples/etcd_bench/`) all measure with, so that their figures
//! are made the same way; and, with the feature `kit` (on by default), the
//! data they measure on and the contenders' maps and LMDB environments
//! ([`kit`]). The `keycache` command depends on this crate without `kit`.

pub mod measure;

#[cfg(feature = "kit")]
pub mod kit;
#[cfg(feature = "kit")]
pub use kit::*;
