//! The master key banks: kept with Salt's own, through their lifecycle.

mod bank;
mod lifecycle;
