//! Several processes on one store: readers, writers, the CLI and Salt.

mod multiprocess;
mod retired_readers;
mod verify_live;
