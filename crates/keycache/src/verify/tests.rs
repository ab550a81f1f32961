//! Unit tests of verify, repair and the lost-entries file.

use super::lost::{lost_line, utc};
use super::*;

fn finding(kind: FindingKind) -> Finding {
    Finding {
        kind,
        file: PathBuf::from("x"),
        slot: None,
        offset: None,
        id: None,
        what: String::new(),
        repairable: kind.repairable(),
    }
}

#[test]
fn passed_means_clean_or_repaired_without_loss() {
    let found = vec![BankFinding {
        bank: "keys",
        finding: finding(FindingKind::HighWater),
    }];
    let repair = |lost: usize, after: usize| BankRepair {
        bank: "keys",
        kept: 1,
        lost: vec![("id".into(), "why".into()); lost],
        removed_segments: Vec::new(),
        lost_file: None,
        findings_after: vec![finding(FindingKind::BadRecord); after],
    };
    let report = |findings: Vec<BankFinding>, repaired| VerifyReport {
        clean: findings.is_empty(),
        findings,
        unconfirmed: 0,
        repaired,
    };
    assert!(report(vec![], vec![]).passed());
    assert!(!report(found.clone(), vec![]).passed());
    assert!(report(found.clone(), vec![repair(0, 0)]).passed());
    assert!(!report(found.clone(), vec![repair(1, 0)]).passed());
    assert!(!report(found, vec![repair(0, 1)]).passed());
}

#[test]
fn lost_entries_round_trip_through_their_file() {
    let e = [
        LostEntry {
            id: Some(b"web 01\nx".to_vec()),
            at: 1_700_000_000,
            why: "slot 3 points into heap segment 2,\nwhich does not exist".into(),
        },
        LostEntry {
            id: None,
            at: 0,
            why: "4 entries: the index file is missing".into(),
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join(".mmap_keys.idx");
    let mut text: String = e.iter().map(lost_line).collect();
    text.push_str("garbage\nlost 12 zz why\n");
    std::fs::write(lost_path(&index), text).unwrap();
    let (got, bad) = read_lost(&index).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].id, e[0].id);
    assert_eq!(
        got[0].why,
        "slot 3 points into heap segment 2, which does not exist"
    );
    assert_eq!(got[1], e[1]);
    assert_eq!(bad, vec![3, 4]);
    assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
}

#[test]
fn kinds_say_what_a_repair_keeps() {
    assert!(FindingKind::Unreachable.repairable());
    assert!(FindingKind::RosterDuplicate.repairable());
    assert!(!FindingKind::BadRecord.repairable());
    assert!(!FindingKind::IndexMissing.repairable());
    assert!(!FindingKind::Lost.repairable());
    assert!(FindingKind::SegmentMissing.repairable());
}
