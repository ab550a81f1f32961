//! Crash safety: writers, compactions, migrations, merges and tree
//! writers killed at random moments, at system calls, or losing power.

mod journal;
mod kill;
mod merge;
mod ownership;
mod power_loss;
mod syscall;
mod tree;
