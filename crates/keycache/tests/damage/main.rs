//! Damaged store files: never a panic, a hang or a wrong answer.
//!
//! [`corruption`]: every file of both banks truncated, extended, zeroed,
//! bit-flipped or removed, files shrinking under an open store, absurd
//! header counters, and bank files that are not regular files, all through
//! the library. The `keycache` binary's tests check its commands on such
//! files, and `keycache verify --repair`.

mod corruption;
