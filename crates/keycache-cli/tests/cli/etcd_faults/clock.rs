//! A replicator whose wall clock is wrong (libfaketime preloaded into it,
//! and into nothing else): `etcd status`, run with the real clock, must
//! still say stale once the replicator is gone, and must not say stale
//! while it runs.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keycache_testkit::etcd::Cluster;
use keycache_testkit::skip::skip;

use super::{poll, Master, BOUND};

/// libfaketime's library, where this machine has it.
fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/lib64/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The environment that runs a process `offset` (`+1h`, `-1h`) off the
/// real clock, checked with `date +%s` (which must read within a minute of
/// `expect_s` seconds off); `None`, reported as a skip of `what`, where
/// libfaketime is missing or does not work here.
fn faked(what: &str, offset: &str, expect_s: i64) -> Option<Vec<(String, String)>> {
    let Some(lib) = libfaketime() else {
        skip(
            what,
            "libfaketime is not installed (Debian: apt-get install faketime)",
        );
        return None;
    };
    let env = vec![
        ("LD_PRELOAD".to_owned(), lib.display().to_string()),
        ("FAKETIME".to_owned(), offset.to_owned()),
        // The offset only: tokio's timers keep the real monotonic clock.
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ("FAKETIME_DONT_RESET".to_owned(), "1".to_owned()),
    ];
    let out = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output();
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let seen = out.ok().and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<i64>()
            .ok()
    });
    match seen {
        Some(t) if (t - real - expect_s).abs() < 60 => Some(env),
        other => {
            skip(
                what,
                &format!(
                    "libfaketime ({}) does not move `date` by {offset} here (it read {other:?}, \
                     the real clock {real})",
                    lib.display()
                ),
            );
            None
        }
    }
}

/// A replicator whose clock runs an hour ahead, killed with SIGKILL:
/// within `stale_after` + 3 s, `keycache etcd status -c A` (real clock)
/// exits 1.
#[test]
fn a_killed_replicator_whose_clock_runs_ahead_goes_stale() {
    let what = "etcd_faults::clock::a_killed_replicator_whose_clock_runs_ahead_goes_stale";
    let Some(env) = faked(what, "+1h", 3600) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let c = Cluster::start(1);
    let a = Master::new("a", &c);
    let seeded = a.seed_from_sample();
    let mut r = a.replicate_env(&env);
    a.wait_for(seeded);
    // A progress tick or two with the fake clock.
    std::thread::sleep(Duration::from_millis(1500));
    r.kill();
    let killed = Instant::now();
    let mut last = (None, String::new());
    let stale = poll(BOUND, Duration::from_millis(100), || {
        last = a.status();
        (last.0 == Some(1)).then_some(())
    });
    assert!(
        stale.is_some(),
        "`keycache etcd status -c A` still exits {:?}, not 1, {:.1} s after A's replicator \
         (clock +1h) was killed (bound {BOUND:?}):\n{}\n{}",
        last.0,
        killed.elapsed().as_secs_f64(),
        last.1,
        a.logs()
    );
}

/// A replicator whose clock runs an hour behind, healthy: `keycache etcd
/// status -c A` (real clock) exits 0, each of a few times (no false alarm).
#[test]
fn a_running_replicator_whose_clock_runs_behind_is_not_stale() {
    let what = "etcd_faults::clock::a_running_replicator_whose_clock_runs_behind_is_not_stale";
    let Some(env) = faked(what, "-1h", -3600) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let c = Cluster::start(1);
    let a = Master::new("a", &c);
    let seeded = a.seed_from_sample();
    let _r = a.replicate_env(&env);
    a.wait_for(seeded);
    std::thread::sleep(Duration::from_millis(1500));
    for n in 0..6 {
        let (code, out) = a.status();
        assert_eq!(
            code,
            Some(0),
            "status #{n} of a healthy replica whose replicator's clock is 1 h behind:\n{out}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
