//! Time: the readers' cheap monotonic clock for their staleness checks,
//! and wall-clock times as the audit trail writes and reads them (RFC 3339
//! in UTC with milliseconds). The peer merge's hybrid logical clock
//! (keycache-merge) stamps in these nanoseconds.

use std::time::{SystemTime, UNIX_EPOCH};

use rustix::time::{clock_gettime, ClockId};

/// A cheap monotonic clock in nanoseconds (CLOCK_MONOTONIC_COARSE, a few
/// milliseconds of resolution, read through the vDSO), for the readers'
/// staleness checks.
#[inline]
pub(crate) fn coarse_now_ns() -> u64 {
    let ts = clock_gettime(ClockId::MonotonicCoarse);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-11-29T04:05:06.789Z`;
/// a time before 1970 as 1970's first).
pub fn rfc3339(t: SystemTime) -> String {
    let ns = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    show_ns(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Unix nanoseconds as a person reads them: UTC, to the millisecond
/// (the hybrid logical clock's stamps are such nanoseconds).
pub fn show_ns(stamp: u64) -> String {
    humanize(stamp)
}

/// The civil date (year, month, day) of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(days: u64) -> (i64, i64, i64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn humanize(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let ms = (ns / 1_000_000) % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let (y, mo, d) = civil_from_days(days);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

/// Milliseconds since the Unix epoch of an RFC 3339 time
/// (`YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`), or of a date alone
/// (`YYYY-MM-DD`, its midnight UTC); None for anything else.
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    let num = |a: usize, b: usize| -> Option<i64> {
        let t = s.get(a..b)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5)? != "-"
        || s.get(7..8)? != "-"
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
    {
        return None;
    }
    let days = days_from_civil(y, m, d);
    if s.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(s.get(10..11)?, "T" | "t" | " ") || s.get(13..14)? != ":" || s.get(16..17)? != ":"
    {
        return None;
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut milli = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let digits = &frac[..n];
        milli = format!("{:0<3}", &digits[..n.min(3)]).parse::<i64>().ok()?;
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let hh: i64 = o.get(1..3)?.parse().ok()?;
            let mm: i64 = o.get(4..6)?.parse().ok()?;
            let v = (hh * 60 + mm) * 60_000;
            if o.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    Some(days * 86_400_000 + ((h * 60 + mi) * 60 + sec) * 1000 + milli - offset)
}

/// Days since 1970-01-01 of a (year, month, day).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_moves_forward_and_counts_nanoseconds() {
        let a = coarse_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = coarse_now_ns();
        assert!(a > 0 && b > a, "{a} {b}");
        // coarse: a few milliseconds of resolution, but nanoseconds as unit
        assert!(b - a >= 10_000_000 && b - a < 10_000_000_000, "{}", b - a);
    }
}
