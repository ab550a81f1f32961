//! The workspace's one seeded pseudo-random generator, for the tests, the
//! fuzz replay and the benches (`keycache-bench`'s data and the comparison
//! tool's shuffles): deterministic data without a dependency.
//!
//! xorshift64 over a seed scrambled once with splitmix64, so any seed (0 and
//! small neighbouring seeds such as thread numbers included) starts a
//! well-mixed, distinct sequence. Not for anything but tests and benches.

/// A seeded xorshift64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// One splitmix64 step: a bijective scramble of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Rng {
        // xorshift's one fixed point is 0; splitmix64 maps exactly one seed
        // there.
        Rng(match splitmix64(seed) {
            0 => 0x2545_f491_4f6c_dd1d,
            s => s,
        })
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (`n` > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next() % n
    }

    /// A number in `lo..hi` (`lo` < `hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A random element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn same_seed_same_sequence_and_zero_is_a_seed() {
        let (mut a, mut b) = (Rng::new(0), Rng::new(0));
        let xs: Vec<u64> = (0..8).map(|_| a.next()).collect();
        assert_eq!(xs, (0..8).map(|_| b.next()).collect::<Vec<_>>());
        assert!(xs.iter().all(|&x| x != 0));
        assert_ne!(Rng::new(1).next(), Rng::new(2).next());
    }

    #[test]
    fn shuffle_permutes() {
        let mut v: Vec<u32> = (0..100).collect();
        Rng::new(3).shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn below_and_range_stay_in_bounds() {
        let mut r = Rng::new(7);
        for n in 1..200 {
            assert!(r.below(n) < n);
            let x = r.range(n, 2 * n);
            assert!((n..2 * n).contains(&x));
        }
    }
}
