//! Damaged store files: never a panic, a hang or a wrong answer; repairs.

mod corruption;
mod repair;
