//! A minority partition: the member a replicator watches cut off from its
//! peers (iptables inside its own network namespace drops the peer
//! traffic) while its clients still reach it. Every member runs in a
//! namespace of its own, the masters and etcdctl in a hub namespace whose
//! bridge joins them; nothing of it is on the host's network.

use std::time::Duration;

use keycache_testkit::etcd::{Cluster, MemberSpec};
use keycache_testkit::skip::skip;

use super::guards::{run, Net};
use super::Watched;

const CLIENT: u16 = 2379;
const PEER: u16 = 2380;

/// A watches member X; X is cut off from the other two (which keep a
/// quorum) and K is revoked through B, whose config names the other two:
/// within the bound A drops K or says it is stale. Healed, every replica
/// equals etcd.
#[test]
fn a_member_cut_off_from_its_peers_does_not_keep_a_revoked_key_on_its_watchers() {
    let what = "etcd_faults::partition::a_member_cut_off_from_its_peers_does_not_keep_a_revoked_key_on_its_watchers";
    if !keycache_testkit::skip::needs_root(what) {
        return;
    }
    if let Err(why) = run("iptables", &["--version"]) {
        skip(what, &format!("no iptables: {why}"));
        return;
    }
    let net = match Net::new(3) {
        Ok(n) => n,
        Err(why) => {
            skip(what, &format!("cannot make network namespaces: {why}"));
            return;
        }
    };
    let specs = (0..3)
        .map(|i| MemberSpec {
            host: Net::address(i),
            client: CLIENT,
            peer: PEER,
            data: None,
            wrap: Net::exec(&net.member(i)),
        })
        .collect();
    let hub = Net::exec(&net.hub());
    let c = Cluster::start_members(specs, hub.clone());
    let w = Watched::start(&c, hub);
    net.cut(w.x, PEER).unwrap_or_else(|e| panic!("{e}"));
    w.revoke_across_fault(
        &c,
        Duration::from_secs(2),
        || net.heal(w.x).unwrap_or_else(|e| panic!("{e}")),
        Duration::from_secs(20),
    );
}
