//! Merge tests.
