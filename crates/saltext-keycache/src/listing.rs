//! `list` and `list_all`: a bank walked without the GIL into buffers
//! ([`Walk`]), [`CHUNK`] entries at a time, the Python objects built from
//! each chunk with the GIL.
//!
//! A large bank is walked with a second thread beside the one that builds
//! ([`walk_beside`]): the walk (a random slot of the index per entry, the
//! record copied and its checksum checked) and the building (a `dict` per
//! entry) take about as long as each other. The roster is cut into chunks
//! that either thread claims: the second thread walks, the first builds,
//! and walks the next unclaimed chunk itself rather than wait. So on a
//! machine with a core to spare the listing takes about half the sum of
//! the two, and with none about their sum. The thread lives for the one
//! call (nothing crosses a fork) and touches no Python object; the result
//! is built in roster order.
//!
//! A driver keeps what a listing worked with ([`Kept`]) for its next one:
//! the walk's buffers and the iterator's memory (so a listing allocates
//! no fresh memory for them; a walk beside allocates its thread and
//! channels), and the `str`s it built ([`Strs`]), reused for the same
//! bytes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;

use keycache::table::{Iter, IterScratch, Table};
use keycache::KeyState;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::strs::{Reuse, Strs};
use crate::values::{self, Bank};

/// Entries walked at a time: the walk's buffers stay small (in the CPU's
/// cache while the result is built from them, and little memory kept),
/// and the GIL is released and taken once per chunk.
const CHUNK: usize = 1024;

/// From how many roster entries a bank is walked on a second thread
/// ([`walk_beside`]): below it, starting the thread (tens of microseconds)
/// costs more than the overlap saves.
pub(crate) const BESIDE_FROM: usize = 4 * CHUNK;

/// Roster entries per chunk of a walk shared with a second thread: fewer
/// than [`CHUNK`], so that the building starts soon after the walk, ends
/// soon after it, and the two threads' shares come out even.
const BESIDE_CHUNK: usize = 512;

/// How many buffers a walk on a second thread fills ahead of the building
/// (the walker stops when all are full), and how many chunks ahead the
/// building walks itself.
const BUFFERS: usize = 8;

/// How long the building waits for the walker's next chunk before it lets
/// the GIL go and sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// What a walk keeps of each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The id only (`list`).
    Ids,
    /// `list_all`'s value: the `keys` state (and the key with `data`), or
    /// the denied key; entries Salt's `list_all` leaves out are left out.
    Values { bank: Bank, data: bool },
}

/// Why a listing failed.
pub(crate) enum Failed {
    /// The bank could not be walked.
    Walk(keycache::Error),
    /// Building the result raised.
    Py(PyErr),
}

/// What a driver keeps from one listing to the next (see the module's
/// header): taken whole by a listing, given back when it is done.
#[derive(Default)]
pub(crate) struct Kept {
    scratch: IterScratch,
    beside: Beside,
    keys: Strs,
    denied: Strs,
}

/// The memory of a walk's chunks, kept from one listing to the next.
#[derive(Default)]
struct Beside {
    /// The walk's buffers, emptied.
    spare: Vec<Walk>,
    /// The twin walk of this thread in a walk beside ([`walk_beside`]).
    twin: IterScratch,
    /// One bit per slot built, in a walk beside: a slot listed twice, once
    /// in a chunk of each thread, is built at its first place only.
    yielded: Vec<u64>,
}

impl Kept {
    /// Lists `table`, the bank `bank`, keeping `keep` of each entry: the
    /// list of ids (`Keep::Ids`, `list`'s result) or the dict (`list_all`'s).
    pub(crate) fn list<'py>(
        &mut self,
        py: Python<'py>,
        table: &Table,
        bank: Bank,
        keep: Keep,
    ) -> Result<Bound<'py, PyAny>, Failed> {
        let scratch = std::mem::take(&mut self.scratch);
        let it = py
            .detach(|| table.iter_reusing(scratch))
            .map_err(Failed::Walk)?;
        let strs = match bank {
            Bank::Denied => &mut self.denied,
            _ => &mut self.keys,
        };
        let mut build = Build::new(py, keep, strs.reuse());
        let beside = it.size_hint().1.unwrap_or(0) >= BESIDE_FROM && two_cpus();
        let (built, it) = if beside {
            walk_beside(py, it, keep, &mut self.beside, &mut build)
        } else {
            walk_here(py, it, keep, &mut self.beside.spare, &mut build)
        };
        self.scratch = it.into_scratch();
        built.map_err(Failed::Py)?;
        build.finish().map_err(Failed::Py)
    }
}

/// Whether this process may run on two CPUs at once (its affinity and
/// cgroup quota allow it), asked once for the life of the process (a
/// forked child keeps the answer): on one, a walker beside the building
/// would only take turns with it, and the building's short wait for a
/// chunk ([`SPIN`]) would keep the walker from running.
pub(crate) fn two_cpus() -> bool {
    static TWO: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TWO.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2))
}

/// Walks `it` and builds from it in turn on this thread, a chunk at a time.
fn walk_here<'t>(
    py: Python<'_>,
    mut it: Iter<'t>,
    keep: Keep,
    spare: &mut Vec<Walk>,
    build: &mut Build<'_, '_>,
) -> (PyResult<()>, Iter<'t>) {
    let mut w = spare.pop().unwrap_or_default();
    let built = loop {
        w.clear();
        let more = py.detach(|| w.fill(&mut it, keep, CHUNK));
        if let Err(e) = build.feed(&w, None) {
            break Err(e);
        }
        if !more {
            break Ok(());
        }
    };
    w.clear();
    spare.push(w);
    (built, it)
}

/// The next chunk from the walker if it comes within [`SPIN`]: the walk
/// and the building go at about the same pace, so the wait is short, and
/// a thread put to sleep takes longer than that to wake up.
fn spin_recv<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            match rx.try_recv() {
                Ok(got) => return Some(got),
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
        if start.elapsed() >= SPIN {
            return None;
        }
    }
}

/// The walker thread's stack: the walk needs little (a slot's copy, the
/// read's retries), and a set size spares the thread's start a look at
/// `RUST_MIN_STACK`.
const WALKER_STACK: usize = 512 * 1024;

/// How many listings of this process walked on a second thread (see
/// [`walks_beside`]).
static WALKS_BESIDE: AtomicU64 = AtomicU64::new(0);

/// How many listings of this process walked their bank on a second thread:
/// how tests (and anyone curious) tell that path from the one-thread walk.
pub(crate) fn walks_beside() -> u64 {
    WALKS_BESIDE.load(Ordering::Relaxed)
}

/// Walks `it` with a second thread while this one builds (see the
/// module's header). The roster is cut into chunks of [`BESIDE_CHUNK`]
/// entries, claimed in order from one counter: the walker claims the next
/// one whenever it has an empty buffer, and this thread, when the chunk it
/// is to build next is not claimed yet (the walker is behind, or has not
/// started), claims and walks it itself on a twin of the walk
/// ([`Iter::twin`]), up to [`BUFFERS`] chunks ahead of the one it builds.
/// So neither thread waits while there is work, the walker's start costs
/// nothing, and a walker that gets little CPU leaves this thread most of
/// the walk (it waits only for a chunk the walker has in hand). At most
/// [`BUFFERS`] chunks of each thread are in memory: the walker takes an
/// empty buffer before it claims. A slot listed twice in the roster is built
/// once, at its first place ([`Build::feed`]'s `yielded`), whichever
/// thread walked it. Where no thread can be started (a process limit),
/// the walk happens on this thread ([`walk_here`]).
fn walk_beside<'t>(
    py: Python<'_>,
    it: Iter<'t>,
    keep: Keep,
    kept: &mut Beside,
    build: &mut Build<'_, '_>,
) -> (PyResult<()>, Iter<'t>) {
    let chunks = it.roster_entries().div_ceil(BESIDE_CHUNK);
    let range = |k: usize| (k * BESIDE_CHUNK, (k + 1) * BESIDE_CHUNK);
    let mut mine = it.twin(std::mem::take(&mut kept.twin));
    kept.yielded.clear();
    // The next chunk no thread has claimed.
    let next = AtomicUsize::new(0);
    let next = &next;
    let (start_tx, start_rx) = mpsc::channel::<Iter<'t>>();
    let (empty_tx, empty_rx) = mpsc::channel::<Walk>();
    let (full_tx, mut full_rx) = mpsc::channel::<(usize, Walk)>();
    let (built, it) = std::thread::scope(|s| {
        let walker = std::thread::Builder::new()
            .name("keycache-list".into())
            .stack_size(WALKER_STACK)
            .spawn_scoped(s, move || {
                // The walk comes once the thread runs (when it cannot be
                // started, the caller still holds it).
                let mut it = start_rx.recv().ok()?;
                let mut unused = None;
                while let Ok(mut w) = empty_rx.recv() {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= chunks {
                        unused = Some(w);
                        break;
                    }
                    w.clear();
                    let (start, end) = range(k);
                    it.seek(start, end);
                    w.fill(&mut it, keep, usize::MAX);
                    if full_tx.send((k, w)).is_err() {
                        break;
                    }
                }
                Some((it, empty_rx, unused))
            });
        let Ok(walker) = walker else {
            return walk_here(py, it, keep, &mut kept.spare, build);
        };
        WALKS_BESIDE.fetch_add(1, Ordering::Relaxed);
        // Cannot fail: the walker holds the receivers until it ends, and it
        // waits for the walk first.
        let _ = start_tx.send(it);
        for _ in 0..BUFFERS {
            let _ = empty_tx.send(kept.spare.pop().unwrap_or_default());
        }
        // This thread's buffers (not the walker's: they stay with it).
        let mut own: Vec<Walk> = Vec::new();
        // The chunks walked and not built yet, and by whom (`true`: here).
        let mut pending: Vec<Option<(Walk, bool)>> = Vec::new();
        pending.resize_with(chunks, || None);
        let mut built = Ok(());
        'chunks: for i in 0..chunks {
            let (w, here) = loop {
                while let Ok((k, w)) = full_rx.try_recv() {
                    pending[k] = Some((w, false));
                }
                if let Some(got) = pending[i].take() {
                    break got;
                }
                // Chunk `i` not walked yet: rather than wait, walk the next
                // chunk no thread has claimed (`i` itself, when the walker
                // has not claimed it), up to BUFFERS chunks ahead.
                let n = next.load(Ordering::Relaxed);
                if n < chunks && n < i + BUFFERS {
                    if next
                        .compare_exchange(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
                        .is_err()
                    {
                        continue; // the walker claimed it meanwhile: look again
                    }
                    let mut w = own
                        .pop()
                        .unwrap_or_else(|| kept.spare.pop().unwrap_or_default());
                    w.clear();
                    let (start, end) = range(n);
                    mine.seek(start, end);
                    py.detach(|| w.fill(&mut mine, keep, usize::MAX));
                    pending[n] = Some((w, true));
                    continue;
                }
                // The walker has chunk `i` in hand: it comes next from it.
                // Waiting without the GIL (a `Receiver` is not `Sync`: it
                // goes into the wait and comes back).
                let (got, rx) = match spin_recv(&full_rx) {
                    Some(got) => (Ok(got), full_rx),
                    None => py.detach(move || (full_rx.recv(), full_rx)),
                };
                full_rx = rx;
                match got {
                    Ok((k, w)) => pending[k] = Some((w, false)),
                    // The walker ended with a chunk claimed: it panicked
                    // (joined below).
                    Err(_) => break 'chunks,
                }
            };
            built = build.feed(&w, Some(&mut kept.yielded));
            if here {
                own.push(w);
            } else {
                let _ = empty_tx.send(w);
            }
            if built.is_err() {
                break;
            }
        }
        // A walker still going claims no chunk past the end.
        next.store(chunks, Ordering::Relaxed);
        drop(empty_tx);
        let (it, empty_rx, unused) = match py.detach(|| walker.join()) {
            Ok(Some(ended)) => ended,
            // The walk was sent above, so `None` cannot come back.
            Ok(None) => unreachable!("the walker was given the walk"),
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // Every buffer comes back for the next listing: this thread's own,
        // the ones the walker did not take or did not use, and the ones it
        // filled that were not built.
        let spare = &mut kept.spare;
        spare.extend(own);
        spare.extend(unused);
        spare.extend(empty_rx.try_iter());
        spare.extend(pending.into_iter().flatten().map(|(w, _)| w));
        spare.extend(full_rx.try_iter().map(|(_, w)| w));
        for w in spare.iter_mut() {
            w.clear();
        }
        spare.truncate(2 * BUFFERS);
        (built, it)
    });
    kept.twin = mine.into_scratch();
    (built, it)
}

/// A listing's result as it is built, chunk by chunk.
struct Build<'a, 'py> {
    py: Python<'py>,
    keep: Keep,
    strs: Reuse<'a>,
    ids: Vec<Bound<'py, PyString>>,
    dict: Bound<'py, PyDict>,
    /// `{"state": ...}` per state, copied for each entry (a small dict's
    /// copy is one allocation and a memcpy).
    templates: [Option<Bound<'py, PyDict>>; 3],
}

impl<'a, 'py> Build<'a, 'py> {
    fn new(py: Python<'py>, keep: Keep, strs: Reuse<'a>) -> Self {
        Build {
            py,
            keep,
            strs,
            ids: Vec::new(),
            dict: PyDict::new(py),
            templates: [None, None, None],
        }
    }

    /// Adds the entries of `w`; with `yielded`, only those whose slot it
    /// does not hold yet (and it then holds them).
    fn feed(&mut self, w: &Walk, mut yielded: Option<&mut Vec<u64>>) -> PyResult<()> {
        let py = self.py;
        let mut first = |slot: u64| yielded.as_deref_mut().is_none_or(|y| first_time(y, slot));
        let (bank, data) = match self.keep {
            Keep::Ids => {
                self.ids.reserve(w.entries.len());
                for e in w.iter().filter(|e| first(e.slot)) {
                    self.ids.push(self.strs.id(py, e.id));
                }
                return Ok(());
            }
            Keep::Values { bank, data } => (bank, data),
        };
        for e in w.iter().filter(|e| first(e.slot)) {
            let id = self.strs.id(py, e.id);
            let v = match (bank, KeyState::from_byte(e.state)) {
                (Bank::Keys, Some(s)) => {
                    let at = match s {
                        KeyState::Accepted => 0,
                        KeyState::Pending => 1,
                        KeyState::Rejected => 2,
                    };
                    let t = match &mut self.templates[at] {
                        Some(t) => t,
                        t @ None => t.insert(values::key_dict(py, s, None)?),
                    };
                    let d = t.copy()?;
                    if data {
                        d.set_item(pyo3::intern!(py, "pub"), self.strs.value(py, e.value))?;
                    }
                    d.into_any()
                }
                (Bank::Keys, None) => continue,
                _ => PyList::new(py, [self.strs.value(py, e.value)])?.into_any(),
            };
            self.dict.set_item(id, v)?;
        }
        Ok(())
    }

    /// The result: the list of ids, or the dict.
    fn finish(self) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self.keep {
            Keep::Ids => PyList::new(self.py, self.ids)?.into_any(),
            Keep::Values { .. } => self.dict.into_any(),
        })
    }
}

/// Whether `slot` is not in the bitmap `bits` yet; it is, after.
fn first_time(bits: &mut Vec<u64>, slot: u64) -> bool {
    let (w, b) = ((slot / 64) as usize, slot % 64);
    if w >= bits.len() {
        bits.resize(w + 1, 0);
    }
    let new = bits[w] & (1 << b) == 0;
    bits[w] |= 1 << b;
    new
}

/// Entries of a bank, in roster order, packed into one buffer.
#[derive(Debug, Default)]
struct Walk {
    bytes: Vec<u8>,
    entries: Vec<Packed>,
}

/// One entry of a [`Walk`]: its id and value follow one another in the
/// walk's bytes, the id first.
#[derive(Debug, Clone, Copy)]
struct Packed {
    /// Its slot in the index.
    slot: u64,
    /// Where the id ends in the walk's bytes.
    id_end: usize,
    /// Where the value ends.
    end: usize,
    /// The `keys` state byte (0 elsewhere).
    state: u8,
}

/// One entry of a [`Walk`], as [`Walk::iter`] gives it.
struct Entry<'a> {
    slot: u64,
    id: &'a [u8],
    value: &'a [u8],
    state: u8,
}

impl Walk {
    /// Empties the buffers (their memory kept).
    fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
    }

    /// Appends up to `max` entries of `it`; whether `it` may have more. An
    /// entry that cannot be read back is left out, as Salt leaves out what
    /// it cannot read.
    fn fill(&mut self, it: &mut Iter<'_>, keep: Keep, max: usize) -> bool {
        let (mut id, mut value) = (Vec::new(), Vec::new());
        let mut n = 0;
        while n < max {
            let Some(r) = it.next_into(&mut id, &mut value) else {
                return false;
            };
            let Ok((_, slot)) = r else {
                continue;
            };
            let (state, kept): (u8, &[u8]) = match keep {
                Keep::Ids => (0, &[]),
                Keep::Values { bank, data } => {
                    // Salt's list_items strips trailing NULs, and drops
                    // what is then empty.
                    let raw = values::rstrip_nul(&value);
                    if raw.is_empty() {
                        continue;
                    }
                    match bank {
                        Bank::Keys => match keycache::store::decode_key_value(raw) {
                            Some((s, p)) => (s.byte(), if data { p } else { &[] }),
                            None => continue,
                        },
                        _ => (0, raw),
                    }
                }
            };
            self.bytes.extend_from_slice(&id);
            let id_end = self.bytes.len();
            self.bytes.extend_from_slice(kept);
            self.entries.push(Packed {
                slot,
                id_end,
                end: self.bytes.len(),
                state,
            });
            n += 1;
        }
        true
    }

    /// Each entry, in roster order.
    fn iter(&self) -> impl ExactSizeIterator<Item = Entry<'_>> + '_ {
        (0..self.entries.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.entries[i - 1].end };
            let p = self.entries[i];
            Entry {
                slot: p.slot,
                id: &self.bytes[start..p.id_end],
                value: &self.bytes[p.id_end..p.end],
                state: p.state,
            }
        })
    }
}
