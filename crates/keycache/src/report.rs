//! Reports of a whole store for the command line and for tools: the
//! statistics `keycache stats` prints ([`stats`]) and the compaction of a
//! store with its before/after numbers ([`compact_report`]).

use std::path::Path;

use crate::error::{Error, Result};
use crate::format::Params;
use crate::store::{Counts, Store};
use crate::table::{OpenOptions, Table, TableStats};
use crate::verify::{self, ProbeStats};

/// The statistics of one bank: its table's numbers, probe lengths and heap
/// garbage.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BankStats {
    /// Data slots.
    pub capacity: u64,
    /// Header: occupied slots.
    pub occupied: u64,
    /// Header: deleted slots (tombstones still on probe chains).
    pub deleted: u64,
    /// `(occupied + deleted) / capacity`.
    pub load_factor: f64,
    /// Header: highest data slot ever written.
    pub high_water: u64,
    /// Slots a lookup of a live id visits.
    pub probe_length: ProbeStats,
    /// Bytes of heap records that live entries point at.
    pub heap_live_bytes: u64,
    /// Bytes of all heap segments.
    pub heap_total_bytes: u64,
    /// Share of the heap that no live entry points at (0 for an empty heap).
    pub garbage_ratio: f64,
    /// Number of heap segments.
    pub segments: u64,
}

impl BankStats {
    /// The statistics of bank `t`.
    pub fn of(t: &Table) -> Result<BankStats> {
        Ok(BankStats::new(&t.stats()?, verify::probe_stats(t)?))
    }

    /// Puts a table's numbers and its probe lengths together.
    pub fn new(s: &TableStats, probe_length: ProbeStats) -> BankStats {
        BankStats {
            capacity: s.capacity,
            occupied: s.occupied,
            deleted: s.deleted,
            load_factor: s.load_factor,
            high_water: s.high_water,
            probe_length,
            heap_live_bytes: s.heap_live_bytes,
            heap_total_bytes: s.heap_total_bytes,
            garbage_ratio: if s.heap_total_bytes > 0 {
                1.0 - s.heap_live_bytes as f64 / s.heap_total_bytes as f64
            } else {
                0.0
            },
            segments: s.segments,
        }
    }
}

/// What `keycache stats` shows of a store ([`stats`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StatsReport {
    /// Keys per state.
    pub counts: Counts,
    /// The layout (of the `keys` bank; both banks share it).
    pub params: Params,
    /// The `keys` bank.
    pub keys: BankStats,
    /// The `denied_keys` bank.
    pub denied_keys: BankStats,
}

/// The counts, layout and per-bank statistics of `store`.
pub fn stats(store: &Store) -> Result<StatsReport> {
    let counts = store.counts()?;
    let s = store.stats()?;
    let pk = verify::probe_stats(store.keys_table())?;
    let pd = verify::probe_stats(store.denied_table())?;
    Ok(StatsReport {
        counts,
        params: *store.keys_table().params(),
        keys: BankStats::new(&s.keys, pk),
        denied_keys: BankStats::new(&s.denied_keys, pd),
    })
}

/// Heap bytes and deleted slots of both banks together, before or after a
/// compaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapNumbers {
    /// Bytes of all heap segments.
    pub heap_total_bytes: u64,
    /// Deleted slots.
    pub deleted: u64,
}

impl HeapNumbers {
    fn of(store: &Store) -> Result<HeapNumbers> {
        let s = store.stats()?;
        Ok(HeapNumbers {
            heap_total_bytes: s.keys.heap_total_bytes + s.denied_keys.heap_total_bytes,
            deleted: s.keys.deleted + s.denied_keys.deleted,
        })
    }
}

/// What a compaction ([`compact_report`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CompactReport {
    /// The table size now.
    pub size: u64,
    /// Both banks before.
    pub before: HeapNumbers,
    /// Both banks after.
    pub after: HeapNumbers,
    /// The Salt master config line for the table size now.
    pub config: String,
    /// Whether the directory's `master_keys` bank was rebuilt with the key
    /// banks (into the same size).
    pub master_keys: bool,
}

/// Refuses a compaction into a table of `size` slots that the live entries
/// of a bank (`keys`, `denied_keys`, or the `master_keys` bank, which moves
/// with them) would fill past [`crate::migrate::MAX_LOAD_FACTOR`], as a
/// migration refuses it ([`Error::Overfull`], which names a size that fits:
/// [`crate::migrate::suggest_size`]).
pub fn check_compact_size(store: &Store, size: u64) -> Result<()> {
    let params = Params {
        size,
        ..*store.keys_table().params()
    };
    params.validate()?;
    let s = store.stats()?;
    let master = crate::master_keys::bank_beside(store.keys_table())?;
    let mut banks = vec![
        (store.keys_table(), s.keys.occupied),
        (store.denied_table(), s.denied_keys.occupied),
    ];
    if let Some(m) = &master {
        banks.push((m, m.stats()?.occupied));
    }
    for (t, occupied) in banks {
        let load = occupied as f64 / params.capacity() as f64;
        if load > crate::migrate::MAX_LOAD_FACTOR {
            return Err(Error::Overfull {
                path: t.path().to_path_buf(),
                entries: occupied,
                size,
                load,
                max_load: crate::migrate::MAX_LOAD_FACTOR,
                suggested: crate::migrate::suggest_size(occupied),
            });
        }
    }
    Ok(())
}

/// Opens the store in `dir` with `opts`, checks that `opts.params` is the
/// layout of its files ([`Store::check_layout`]) and, with `to_size`, that
/// the entries fit a table of that size ([`check_compact_size`]); then
/// rebuilds both banks (and the `master_keys` bank, into the same size)
/// without garbage and tombstones ([`Store::compact`]),
/// into a table of `to_size` slots when given, and reports the heap before
/// and after (the numbers after read from the store opened anew with the
/// new size, and without `opts.ownership`). A refusal writes nothing.
pub fn compact_report(
    dir: &Path,
    opts: &OpenOptions,
    to_size: Option<u64>,
) -> Result<CompactReport> {
    let store = Store::open_with(dir, opts)?;
    store.check_layout()?;
    if let Some(size) = to_size {
        check_compact_size(&store, size)?;
    }
    let before = HeapNumbers::of(&store)?;
    let master_keys = crate::master_keys::bank_beside(store.keys_table())?.is_some();
    store.compact(to_size)?;
    let size = to_size.unwrap_or(store.keys_table().params().size);
    let reopened = OpenOptions {
        params: Params {
            size,
            ..opts.params
        },
        ownership: None,
        ..opts.clone()
    };
    let after = HeapNumbers::of(&Store::open_with(dir, &reopened)?)?;
    Ok(CompactReport {
        size,
        before,
        after,
        config: format!("mmap_key_size: {size}"),
        master_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyState, MinionId};

    const PEM: &[u8] = b"-----BEGIN PUBLIC KEY-----\nk\n-----END PUBLIC KEY-----\n";

    fn opts(size: u64) -> OpenOptions {
        OpenOptions {
            params: Params {
                size,
                ..Params::default()
            },
            ..OpenOptions::default()
        }
    }

    /// A store of size 1009 in a new directory with `n` pending keys,
    /// `m0`, `m1`, ...
    fn pending_store(n: usize) -> Result<(tempfile::TempDir, Store)> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(dir.path(), &opts(1009))?;
        for n in 0..n {
            store.put(&MinionId::new(format!("m{n}"))?, KeyState::Pending, PEM)?;
        }
        Ok((dir, store))
    }

    #[test]
    fn stats_and_compact_report_the_garbage() -> Result<()> {
        let (dir, store) = pending_store(4)?;
        store.remove(&MinionId::new("m0")?)?;
        store.deny(&MinionId::new("m1")?, PEM)?;
        let s = stats(&store)?;
        assert_eq!((s.counts.pending, s.counts.denied), (3, 1));
        assert_eq!(s.params, opts(1009).params);
        assert_eq!((s.keys.occupied, s.keys.deleted), (3, 1));
        assert!(s.keys.garbage_ratio > 0.2 && s.keys.garbage_ratio < 0.3);
        assert_eq!(s.denied_keys.garbage_ratio, 0.0);
        assert_eq!(s.keys.probe_length.max, 1);
        drop(store);

        let r = compact_report(dir.path(), &opts(1009), Some(2003))?;
        assert_eq!(r.size, 2003);
        assert_eq!(r.config, "mmap_key_size: 2003");
        assert_eq!(r.before.deleted, 1);
        assert_eq!(r.after.deleted, 0);
        assert!(r.after.heap_total_bytes < r.before.heap_total_bytes);
        let again = Store::open_with(dir.path(), &opts(2003))?;
        assert_eq!(stats(&again)?.keys.garbage_ratio, 0.0);
        Ok(())
    }

    #[test]
    fn compact_refuses_a_table_past_the_migration_limit_and_writes_nothing() -> Result<()> {
        let (dir, store) = pending_store(17)?;
        drop(store);
        let idx = std::fs::read(dir.path().join(crate::format::KEYS_INDEX)).unwrap();
        // 17 entries in 18 data slots: 94% full.
        match compact_report(dir.path(), &opts(1009), Some(19)) {
            Err(Error::Overfull {
                entries,
                size,
                suggested,
                ..
            }) => {
                assert_eq!((entries, size), (17, 19));
                assert!(suggested as f64 * crate::migrate::MAX_LOAD_FACTOR > 17.0);
            }
            other => panic!("expected Overfull, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(dir.path().join(crate::format::KEYS_INDEX)).unwrap(),
            idx
        );
        // 17 in 22 data slots (77%) is allowed.
        assert_eq!(compact_report(dir.path(), &opts(1009), Some(23))?.size, 23);
        Ok(())
    }
}
