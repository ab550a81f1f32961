//! Writes on a peer's banks, as Salt makes them (a minion's key, an
//! operator's accept, rejection or deletion, a denied key), and their
//! record with the bounds of their stamps.

use keycache::KeyState;

use crate::model::{mid, pem, Action, Op, Value, IDS};
use crate::sim::{trace, Sim};

impl Sim {
    /// Records a write of peer `p` that changed (`bank`, `id`), with the
    /// bounds of its stamp (see `check_kept`).
    pub(crate) fn record(
        &mut self,
        p: usize,
        bank: u8,
        id: usize,
        op: Op,
        at: u64,
        value: Option<Value>,
    ) {
        let dir = &self.peers[p];
        let last = self.seen.get(dir).map_or(0, |o| o.last);
        let begun = last > 0;
        let (lo, hi) = match op {
            // At the last observation; in a store without a history yet,
            // at the first stamp (its first observation's "last" is 0).
            Op::Accept => (last, Some(if begun { at } else { 1 })),
            // A key of an id the store knew nothing of: the first stamp.
            Op::Pending => (0, None),
            // No tombstone where the store keeps no removal log yet.
            Op::Delete if !begun => (0, None),
            _ => (at, None),
        };
        let a = self.acts.len();
        self.acts.push(Action {
            bank,
            id,
            op,
            by: format!("peer {p}"),
            at,
            value,
            lo,
            hi,
        });
        self.know[p].acts.insert(a);
        if hi.is_none() {
            self.seen.entry(dir.clone()).or_default().unstamped.push(a);
        }
    }

    /// One random action on peer `p`, on the banks (as Salt writes them),
    /// and some of the time the timer's snapshot of `p` right after.
    pub(crate) fn act(&mut self, p: usize) {
        let i = self.rng.below(IDS.len() as u64) as usize;
        let op = match self.rng.below(7) {
            0 | 1 => Op::Pending,
            2 | 3 => Op::Accept,
            4 => Op::Reject,
            5 => Op::Delete,
            _ => Op::Deny,
        };
        self.apply(p, i, op);
        if self.rng.one_in(3) {
            self.snap_of(&self.peers[p].clone());
        }
    }

    /// An operator's accept, rejection or deletion of a random id on
    /// peer `p`, and some of the time the timer's snapshot right after.
    pub(crate) fn operate(&mut self, p: usize) {
        let i = self.rng.below(IDS.len() as u64) as usize;
        let op = [Op::Accept, Op::Accept, Op::Reject, Op::Delete][self.rng.below(4) as usize];
        self.apply(p, i, op);
        if self.rng.one_in(3) {
            self.snap_of(&self.peers[p].clone());
        }
    }

    /// `op` of id `i` on peer `p`'s banks, as Salt writes it.
    pub(crate) fn apply(&mut self, p: usize, i: usize, op: Op) {
        let st = self.store(&self.peers[p].clone());
        let id = mid(i);
        let now = self.tick();
        if trace() {
            eprintln!("act peer {p} id {} {op:?} t={now}", IDS[i]);
        }
        match op {
            // A minion presents a (new) key: pending.
            Op::Pending => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.put(&id, KeyState::Pending, &k).expect("put");
                self.record(p, 0, i, op, now, Some((Some(KeyState::Pending), k)));
            }
            // salt-key -a on a pending key.
            Op::Accept => {
                if let Some(e) = st.get(&id).expect("get") {
                    if e.state == KeyState::Pending {
                        st.set_state(&id, KeyState::Accepted).expect("accept");
                        self.events
                            .accepts
                            .entry((i, e.public_key.clone()))
                            .or_default()
                            .push(now);
                        let v = (Some(KeyState::Accepted), e.public_key);
                        self.record(p, 0, i, op, now, Some(v));
                    }
                }
            }
            // salt-key -r (a revocation when it changes the state: a
            // rejected key rejected again changes nothing, in the store or
            // in what an operator revoked).
            Op::Reject => {
                let was = st.get(&id).expect("get");
                if st.set_state(&id, KeyState::Rejected).expect("reject") {
                    if let Some(e) = was.filter(|e| e.state != KeyState::Rejected) {
                        self.know[p].revoked.insert(i, now);
                        let v = (Some(KeyState::Rejected), e.public_key);
                        self.record(p, 0, i, op, now, Some(v));
                    }
                }
            }
            // salt-key -d (a revocation when the id had a key), in a store
            // that has a history: an entry that came and went between two
            // observations is in the removal log, which the next
            // observation turns into a tombstone. A store that never took
            // part in a snapshot or merge keeps no log: what it deleted
            // before it joined is not a revocation of the cluster's.
            Op::Delete => {
                let joined = self.peers[p].join(keycache::format::IDENTITY_FILE).exists();
                if st.remove_denied(&id).expect("delete denied") {
                    self.record(p, 1, i, op, now, None);
                }
                if st.remove(&id).expect("delete") {
                    if joined {
                        self.know[p].revoked.insert(i, now);
                    }
                    self.record(p, 0, i, op, now, None);
                }
            }
            // A key denied (a minion presented another key for an id).
            Op::Deny => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.deny(&id, &k).expect("deny");
                self.know[p].denied.insert((i, k.clone()), now);
                self.record(p, 1, i, op, now, Some((None, k)));
            }
        }
    }
}
