//! Monitoring: `keycache stats --prometheus` (the gauges node_exporter's
//! textfile collector serves), the alert rules of `dist/keycache.rules.yml`
//! (checked and unit-tested by the real `promtool`), and a real Prometheus
//! server scraping a real replicator and the textfile as
//! `dist/keycache-stats.service` writes it, with those rules loaded.
//!
//! Prometheus and promtool come from `KEYCACHE_PROMETHEUS_ROOT` (the
//! directory `tools/fetch-prometheus-debian.sh` prints: its `usr/bin` holds
//! them; or a directory holding them). Unset, the tests that need them say
//! SKIP, except in CI (`CI=true`, or `KEYCACHE_NO_SKIPS=1`), where that
//! fails.
//!
//! The parts: [`exposition`] (the text format, parsed and checked),
//! [`rules`] (what the alert rules hold), [`server`] (driving a Prometheus
//! server), [`textfile`] (node_exporter's textfile collector, for the test);
//! the tests are here.

mod exposition;
mod rules;
mod server;
mod textfile;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keycache_testkit::cmd::TestCommand;
use keycache_testkit::etcd::{free_port, Cluster};
use serde_json::Value;

use crate::common::{kc, repo, s, sample_pki, sample_store_dir, BIN};

use exposition::{check_exposition, parse_exposition, sample, STATES};
use rules::{rule_blocks, rule_metrics};
use server::{http_get, prometheus_bin, query, single, wait_until, Paused, Proc};
use textfile::Textfile;

/// A master config in `<t>/etc/master` naming the store `pki` (no etcd):
/// the config directory.
fn config_for(t: &Path, pki: &Path, extra: &str) -> PathBuf {
    let conf = t.join("etc");
    std::fs::create_dir_all(&conf).expect("etc");
    std::fs::write(
        conf.join("master"),
        format!(
            "pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: keycache\n{extra}",
            pki.display()
        ),
    )
    .expect("master config");
    conf
}

#[test]
fn stats_prometheus_has_the_counts_and_bank_figures_of_stats_json() {
    let (t, st) = sample_store_dir();
    let conf = config_for(t.path(), &st, "");
    let list = kc().args(["list", "-c", s(&conf), "--json"]).json();
    // Keys in every state, and not the sample's own counts: one more
    // accepted, one more rejected, one more denied, fewer pending.
    let pending: Vec<String> = list["minions_pre"]
        .as_array()
        .expect("pending")
        .iter()
        .map(|v| v.as_str().expect("id").to_owned())
        .collect();
    assert!(pending.len() >= 3, "{list}");
    kc().args(["accept", "-c", s(&conf), &pending[0]]).ok();
    kc().args(["reject", "-c", s(&conf), &pending[1]]).ok();
    kc().args(["deny", "-c", s(&conf), &pending[2]]).ok();
    let text = check_exposition(&conf);
    for (state, listed) in STATES {
        assert!(
            list[listed].as_array().is_some_and(|a| !a.is_empty()),
            "the sample has {state} keys"
        );
    }
    // The store directory as the argument: the same.
    assert_eq!(
        kc().args(["stats", s(&st), "--prometheus", "--size", "1009"])
            .ok(),
        text
    );
    // The HELP and TYPE lines, one each per gauge.
    for name in [
        "keycache_keys",
        "keycache_bank_load_factor",
        "keycache_bank_longest_probe",
        "keycache_bank_heap_bytes",
        "keycache_bank_slots",
    ] {
        assert_eq!(
            text.matches(&format!("# TYPE {name} gauge\n")).count(),
            1,
            "{text}"
        );
    }
    // Not with --json: refused by the argument parser, exit 2, no output.
    let out = kc()
        .args(["stats", "-c", s(&conf), "--prometheus", "--json"])
        .fails_output(2);
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--prometheus") && err.contains("--json"),
        "{err}"
    );
}

#[test]
fn stats_prometheus_of_an_empty_store() {
    let t = tempfile::tempdir().expect("scratch");
    let pki = t.path().join("pki");
    std::fs::create_dir(&pki).expect("pki");
    // An empty tree migrated: both banks, no key.
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir(pki.join(d)).expect("tree");
    }
    kc().args(["migrate", s(&pki), "--size", "1009"]).ok();
    let conf = config_for(t.path(), &pki, "");
    let text = check_exposition(&conf);
    let samples = parse_exposition(&text);
    for (state, _) in STATES {
        assert_eq!(sample(&samples, "keycache_keys", "state", state), 0.0);
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dist = repo().join("dist");
    let rules = std::fs::read_to_string(dist.join("keycache.rules.yml")).expect("rules");
    let tests = std::fs::read_to_string(dist.join("keycache.rules.test.yml")).expect("tests");
    // What every rule carries, and that each has a firing and a quiet case.
    let blocks = rule_blocks(&rules);
    assert!(blocks.len() >= 7, "{blocks:?}");
    for (name, text) in &blocks {
        for key in ["expr:", "severity:", "summary:", "description:"] {
            assert!(text.contains(key), "rule {name} has no {key}\n{text}");
        }
        let lines: Vec<&str> = tests.lines().map(str::trim).collect();
        let cases: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == format!("alertname: {name}"))
            .map(|w| w[1])
            .collect();
        assert!(
            cases.contains(&"exp_alerts: []") && cases.contains(&"exp_alerts:"),
            "{name}: keycache.rules.test.yml must test it firing and not firing: {cases:?}"
        );
    }
    for m in [
        "keycache_replica_stale",
        "keycache_replica_ready",
        "keycache_replica_lag_revisions",
        "keycache_relists_total",
        "keycache_consistency_checks_total",
        "keycache_bank_load_factor",
        "up",
    ] {
        assert!(rule_metrics(&rules).contains(m), "no rule reads {m}");
    }

    let Some(bin) =
        prometheus_bin("prometheus::the_alert_rules_pass_promtool_and_their_unit_tests")
    else {
        return;
    };
    let promtool = bin.join("promtool");
    let out = TestCommand::new(&promtool)
        .args(["check", "rules"])
        .arg(dist.join("keycache.rules.yml"))
        .ok();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", blocks.len())),
        "{out}"
    );
    TestCommand::new(&promtool)
        .args(["test", "rules"])
        .arg(dist.join("keycache.rules.test.yml"))
        .ok();
    // The textfile passes promtool's own parser and linter.
    let (t, st) = sample_store_dir();
    let conf = config_for(t.path(), &st, "");
    let text = kc().args(["stats", "-c", s(&conf), "--prometheus"]).ok();
    TestCommand::new(&promtool)
        .args(["check", "metrics"])
        .stdin(text)
        .ok();
}

/// A real Prometheus server (KEYCACHE_PROMETHEUS_ROOT) with the rules of
/// dist/ scraping, every second, a real `keycache replicate` (its
/// `keycache_etcd.metrics` endpoint, job `keycache`) and the textfile as
/// the stats unit writes it (job `node`): the replica is current (stale 0,
/// ready), `keycache_keys{state="accepted"}` is the store's count, every
/// metric the rules read is there; then the etcd member is paused (SIGSTOP)
/// past `stale_after`: the query of `keycache_replica_stale` answers 1, the
/// replicator's /readyz 503, and the stale rule goes pending; resumed
/// (SIGCONT), the replica is current again.
#[test]
fn a_real_prometheus_scrapes_a_replicator_and_sees_it_go_stale() {
    let Some(bin) =
        prometheus_bin("prometheus::a_real_prometheus_scrapes_a_replicator_and_sees_it_go_stale")
    else {
        return;
    };
    let limit = Duration::from_secs(60);
    let c = Cluster::start(1);
    let t = tempfile::tempdir().expect("scratch");
    let pki = t.path().join("pki");
    std::fs::create_dir(&pki).expect("pki");
    let metrics = free_port();
    let conf = config_for(
        t.path(),
        &pki,
        &format!(
            "keycache_etcd:\n  endpoints: [{}]\n  prefix: /keycache/prometheus/\n  write_timeout: 3\n  \
             stale_after: 2\n  metrics: 127.0.0.1:{metrics}\n",
            c.endpoints().join(", ")
        ),
    );
    kc().args(["etcd", "seed", "-c", s(&conf), "--from"])
        .arg(sample_pki())
        .ok();
    let mut replicate = Proc::spawn(
        Command::new(BIN).args(["replicate", "-c", s(&conf)]),
        t.path().join("replicate.log"),
    );
    // Ready: the first list applied.
    wait_until("the replicator's /readyz answers 200", limit, || {
        replicate.alive("keycache replicate");
        Ok(http_get(metrics, "/readyz")?.0.eq(&200).then_some(()))
    });
    // A change through etcd, applied by the replicator.
    let list = kc().args(["list", "-c", s(&conf), "--json"]).json();
    let id = list["minions_pre"][0]
        .as_str()
        .expect("a pending id")
        .to_owned();
    kc().args(["accept", "-c", s(&conf), &id]).ok();
    let accepted = wait_until("the accept in the replica", limit, || {
        let l = kc().args(["list", "-c", s(&conf), "--json"]).json();
        let a = l["minions"].as_array().expect("accepted");
        Ok(a.iter().any(|x| x == id.as_str()).then_some(a.len() as f64))
    });

    let textfile_dir = t.path().join("node-exporter");
    std::fs::create_dir(&textfile_dir).expect("textfile directory");
    let textfile = Textfile::start(&conf, &textfile_dir);
    let prom_port = free_port();
    let prom_conf = t.path().join("prometheus.yml");
    std::fs::write(
        &prom_conf,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             scrape_configs:\n\
             \x20 - job_name: keycache\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]\n\
             \x20 - job_name: node\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
            repo().join("dist/keycache.rules.yml").display(),
            textfile.port
        ),
    )
    .expect("prometheus.yml");
    let mut prometheus = Proc::spawn(
        Command::new(bin.join("prometheus")).args([
            &format!("--config.file={}", prom_conf.display()),
            &format!("--storage.tsdb.path={}", t.path().join("tsdb").display()),
            &format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ]),
        t.path().join("prometheus.log"),
    );
    let mut alive = |what: &str| {
        prometheus.alive(&format!("prometheus ({what})"));
        replicate.alive(&format!("keycache replicate ({what})"));
    };

    // The rules are loaded, and healthy.
    wait_until("the rules of dist/keycache.rules.yml loaded", limit, || {
        alive("rules");
        let (status, body) = http_get(prom_port, "/api/v1/rules")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status} {e}: {body}"))?;
        let rules: Vec<&Value> = v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if rules.is_empty() {
            return Ok(None);
        }
        for r in &rules {
            if r["health"] == "err" {
                return Err(format!("a rule fails: {r}"));
            }
        }
        Ok(Some(()))
    });
    wait_until("keycache_replica_stale 0, scraped", limit, || {
        alive("current");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 0.0))
    });
    assert_eq!(
        wait_until("keycache_replica_ready, scraped", limit, || single(
            prom_port,
            "keycache_replica_ready{job=\"keycache\"}"
        )),
        1.0
    );
    wait_until(
        "keycache_keys{state=\"accepted\"} the store's count",
        limit,
        || {
            alive("keys");
            Ok(
                single(prom_port, "keycache_keys{job=\"node\",state=\"accepted\"}")?
                    .filter(|v| *v == accepted),
            )
        },
    );
    // Every metric the rules read is scraped.
    let rules = std::fs::read_to_string(repo().join("dist/keycache.rules.yml")).expect("rules");
    let want = rule_metrics(&rules);
    assert!(want.len() >= 7, "{want:?}");
    wait_until("every metric the rules read, scraped", limit, || {
        alive("names");
        let (_, body) = http_get(prom_port, "/api/v1/label/__name__/values")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let names: BTreeSet<String> = v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect();
        let missing: Vec<_> = want.difference(&names).collect();
        if missing.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("not scraped: {missing:?}"))
        }
    });
    assert_eq!(
        http_get(metrics, "/readyz").expect("/readyz").0,
        200,
        "ready while etcd answers"
    );

    // etcd paused (SIGSTOP, by its pid) past stale_after: stale, not ready.
    let pid = c.members[0].pid().expect("the member runs");
    assert!(pid > 0);
    c.pause_member(0);
    let paused = Paused(&c);
    wait_until("keycache_replica_stale 1 with etcd paused", limit, || {
        alive("stale");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 1.0))
    });
    wait_until("/readyz 503 with etcd paused", limit, || {
        Ok(http_get(metrics, "/readyz")?.0.eq(&503).then_some(()))
    });
    wait_until("KeycacheReplicaStale pending", limit, || {
        alive("alert");
        single(
            prom_port,
            "ALERTS{alertname=\"KeycacheReplicaStale\",alertstate=\"pending\",job=\"keycache\"}",
        )
    });
    assert!(
        query(prom_port, "ALERTS{alertname=\"KeycacheScrapeDown\"}")
            .expect("ALERTS")
            .is_empty(),
        "the replicator is still scraped while etcd is paused"
    );

    // Resumed: current again.
    drop(paused);
    wait_until("keycache_replica_stale 0 with etcd resumed", limit, || {
        alive("resumed");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 0.0))
    });
    wait_until("/readyz 200 with etcd resumed", limit, || {
        Ok(http_get(metrics, "/readyz")?.0.eq(&200).then_some(()))
    });
    drop(prometheus);
    drop(replicate);
    drop(textfile);
}
