//! The Salt master config as the source of the arguments.

mod args;
mod driver;
