//! Layouts: the layout flags, and opening with a layout that is not the files'.

mod flags;
mod open;
