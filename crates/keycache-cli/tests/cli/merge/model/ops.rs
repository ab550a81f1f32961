//! Random operations on a peer: sign-ins, denied keys and accepts through
//! Salt's own writer, then `keycache accept`, `reject` and `delete`.

use keycache::Bank;
use serde_json::{json, Value};

use crate::common::{s, salt, Rng};

use super::peers::{Event, Peers, IDS};
use super::store::{kc, layout, ok, read};

impl Peers {
    /// Random operations on peer `p`: some through Salt's writer (one
    /// driver run), the rest through the CLI, in that order.
    pub(super) fn random_ops(&mut self, rng: &mut Rng, p: usize, n: usize) {
        let mut salt_ops = Vec::new();
        let mut model = self.models[p].clone();
        let mut events = Vec::new();
        // Salt's writer: sign-ins (new pending keys, a key presented under an
        // id that holds another one goes to denied_keys), salt-key -a.
        for _ in 0..n / 2 {
            let id = *rng.pick(&IDS);
            let held = model.get(&(Bank::Keys, id.to_owned())).cloned();
            match (held, rng.below(3)) {
                (None, _) => {
                    let key = self.fresh_key(id);
                    salt_ops.push(json!({"op": "store", "bank": "keys", "id": id, "state": "pending", "pub": key}));
                    events.push((id.to_owned(), Event::Write, Some(("pending", key.clone()))));
                    model.insert((Bank::Keys, id.into()), ("pending", key));
                }
                (Some((_, _)), 0) => {
                    let key = self.fresh_key(id);
                    salt_ops
                        .push(json!({"op": "store", "bank": "denied_keys", "id": id, "pub": key}));
                    model.insert((Bank::Denied, id.into()), ("denied", key));
                }
                (Some(("pending", key)), _) => {
                    salt_ops.push(json!({"op": "store", "bank": "keys", "id": id, "state": "accepted", "pub": key}));
                    events.push((
                        id.to_owned(),
                        Event::Accept(key.clone()),
                        Some(("accepted", key.clone())),
                    ));
                    model.insert((Bank::Keys, id.into()), ("accepted", key));
                }
                _ => {}
            }
        }
        if !salt_ops.is_empty() {
            salt(
                &self.dirs[p],
                &layout(),
                &["apply"],
                Some(&Value::Array(salt_ops)),
            );
        }
        for (id, ev, result) in events {
            self.event(p, &id, ev, result);
        }
        // keycache accept, reject, delete. A revocation is one the store's
        // history can find: in a store that has a history, every one (an
        // id that a sign-in brought and a deletion removed between two
        // observations is in the removal log); in one that has none yet
        // (it never took a snapshot or merged), of an id still there at
        // its first observation.
        let dir = self.dirs[p].clone();
        let mut revokes: Vec<String> = Vec::new();
        for _ in 0..n - n / 2 {
            let id = *rng.pick(&IDS);
            let held = model.get(&(Bank::Keys, id.to_owned())).cloned();
            let op = match (&held, rng.below(4)) {
                (Some(("pending", _)), 0 | 1) => "accept",
                (Some(("pending", _)), 2) => "reject",
                (Some(_), 3) | (None, 3) => "delete",
                (Some(("rejected", _)), _) => "delete",
                _ => continue,
            };
            if op == "delete" && held.is_none() && !model.contains_key(&(Bank::Denied, id.into())) {
                continue;
            }
            ok(
                &kc(&[op, s(&dir), id]),
                &format!("keycache {op} {id} on peer {p}"),
            );
            match op {
                "accept" => {
                    let key = held.map(|h| h.1).unwrap_or_default();
                    let result = Some(("accepted", key.clone()));
                    self.event(p, id, Event::Accept(key.clone()), result);
                    model.insert((Bank::Keys, id.into()), ("accepted", key));
                }
                "reject" => {
                    let key = held.map(|h| h.1).unwrap_or_default();
                    self.event(p, id, Event::Revoke, Some(("rejected", key.clone())));
                    revokes.push(id.to_owned());
                    model.insert((Bank::Keys, id.into()), ("rejected", key));
                }
                _ => {
                    // A revocation when it removes a keys entry (not only a
                    // denied key).
                    if held.is_some() {
                        self.event(p, id, Event::Revoke, None);
                        revokes.push(id.to_owned());
                    }
                    model.remove(&(Bank::Keys, id.into()));
                    model.remove(&(Bank::Denied, id.into()));
                }
            }
        }
        // The revocations the history cannot find are taken back.
        let joined = dir.join(keycache::format::IDENTITY_FILE).exists();
        for id in revokes {
            let found = joined
                || self.known[p].contains(&id)
                || model.contains_key(&(Bank::Keys, id.clone()));
            if !found {
                let at = self
                    .events
                    .iter()
                    .rposition(|(x, e)| *x == id && *e == Event::Revoke)
                    .expect("the revocation");
                self.events.remove(at);
                self.times.remove(at);
            }
        }
        self.models[p] = model;
        assert_eq!(
            read(&self.dirs[p]),
            self.models[p],
            "peer {p} after its operations"
        );
    }
}
