//! The targets: keycache beside its floor, round by round, and their table.

use super::*;

/// A target: keycache's figure over its floor, each measured in the same
/// round; `limit` the ratio it should not pass (none: for information).
pub(crate) struct Target {
    what: String,
    limit: Option<f64>,
    pub(crate) rounds: Vec<(Duration, Duration)>,
}

impl Target {
    pub(crate) fn new(what: String, limit: Option<f64>) -> Target {
        Target {
            what,
            limit,
            rounds: Vec::new(),
        }
    }

    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|(k, f)| k.as_secs_f64() / f.as_secs_f64())
            .collect()
    }
}

/// The middle value (of an even count, the mean of the two middle ones).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Seconds past one, else milliseconds.
pub(crate) fn time(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.2} s")
    } else {
        format!("{:.1} ms", secs * 1e3)
    }
}

/// The targets' table: the medians of each round's times (keycache's, the
/// floor's) and of each round's ratio (not the ratio of the medians).
pub(crate) fn print_targets(targets: &[Target]) {
    let rounds = targets.iter().map(|t| t.rounds.len()).max().unwrap_or(0);
    println!();
    println!(
        "targets, over {rounds} round(s): keycache and floor are the medians of each round's \
         times; the ratio is the median of each round's ratio (each round's in brackets)"
    );
    println!(
        "{:<60} {:>10} {:>10} {:>7}  {:<22} {:>6}  result",
        "target (keycache / floor)", "keycache", "floor", "ratio", "(rounds)", "limit"
    );
    for t in targets {
        let ratios = t.ratios();
        let each = ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        let ratio = median(ratios);
        let secs = |f: fn(&(Duration, Duration)) -> Duration| {
            median(t.rounds.iter().map(|r| f(r).as_secs_f64()).collect())
        };
        println!(
            "{:<60} {:>10} {:>10} {:>6.2}x  {:<22} {:>6}  {}",
            t.what,
            time(secs(|r| r.0)),
            time(secs(|r| r.1)),
            ratio,
            format!("({each})"),
            t.limit.map_or("-".into(), |l| format!("{l:.1}x")),
            match t.limit {
                None => "information",
                Some(l) if ratio <= l => "met",
                Some(_) => "not met",
            }
        );
    }
}
