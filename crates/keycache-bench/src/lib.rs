//! keycache's measurement kit: what `keycache bench`, the criterion benches
//! (`benches/`) and the comparison tool (`examples/compare.rs`) share.

/// Reads every byte of a found key, as a caller would: sums it as
/// little-endian 8-byte words (vector adds; a byte-at-a-time sum would cost
/// more than the lookup's own work and measure the caller).
#[inline]
pub fn touch(key: &[u8]) -> u64 {
    let mut words = key.chunks_exact(8);
    let mut s = 0u64;
    for w in &mut words {
        s = s.wrapping_add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
    }
    words
        .remainder()
        .iter()
        .fold(s, |s, &b| s.wrapping_add(u64::from(b)))
}
