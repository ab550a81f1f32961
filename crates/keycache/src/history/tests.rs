//! History tests.
