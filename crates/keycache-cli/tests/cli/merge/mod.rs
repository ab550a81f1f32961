//! Snapshots and merges between masters.

mod model;
mod safety;
mod snapshot_consistency;
mod snapshot_damage;
mod tree;
mod unknown_cluster;
