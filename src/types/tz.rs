//! IANA time zones from the system's database (`/usr/share/zoneinfo`, the `tzdata` package):
//! a reader of TZif files (RFC 8536, versions 1 to 4) and of the POSIX TZ rule in their footer,
//! which gives the offsets after the last listed transition (slim zone files list none after
//! 2007). Nothing is bundled: a zone missing on the system is a clear error, not a wrong time.
//! Leap seconds are ignored, as by every civil clock.

use std::path::Path;

use chrono::{Datelike, NaiveDate};

/// Where the zone files are (the `tzdata` package of Debian, Raspberry Pi OS, Ubuntu, Fedora,
/// Alpine).
pub const ZONEINFO_DIR: &str = "/usr/share/zoneinfo";

/// Largest zone file read (256 KiB; the biggest in tzdata is under 4 KiB).
const MAX_FILE_BYTES: u64 = 256 * 1024;

/// A time zone: offsets from UTC in seconds over time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    /// Transition instants (UTC seconds), ascending, and the offset in force from each.
    transitions: Vec<(i64, i32)>,
    /// The offset before the first transition (or always, when there is none and no rule).
    initial: i32,
    /// The rule after the last transition.
    rule: Option<PosixTz>,
}

/// A POSIX TZ string: `std offset [dst [offset] [,start[/time],end[/time]]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PosixTz {
    /// Standard offset east of UTC, seconds.
    std: i32,
    /// Daylight saving offset and the rule's start and end (local times), if any.
    dst: Option<(i32, RuleDate, i32, RuleDate, i32)>,
}

/// The day of a POSIX rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RuleDate {
    /// `Jn`: day 1..=365, February 29th never counted.
    Julian1(u16),
    /// `n`: day 0..=365, February 29th counted.
    Julian0(u16),
    /// `Mm.w.d`: weekday `d` (0 = Sunday) of week `w` (5 = last) of month `m`.
    Month(u32, u32, u32),
}

/// Why a time zone could not be loaded (the message says which, for the setting's error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    /// The name is not a zone name (`Europe/Berlin`).
    #[error("not a zone name")]
    NotAName,
    /// No file of that name in the zone directory.
    #[error("no file {0}")]
    Missing(String),
    /// Something that is not a zone file is there.
    #[error("{0} is not a zone file")]
    NotAFile(String),
    /// The file could not be read, or is not a TZif file.
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// The TZif data is damaged.
    #[error("{0}")]
    Malformed(&'static str),
    /// The footer's POSIX rule does not parse.
    #[error("bad TZ rule `{0}`")]
    Rule(String),
}

impl Zone {
    /// UTC.
    pub fn utc() -> Self {
        Self {
            transitions: Vec::new(),
            initial: 0,
            rule: None,
        }
    }

    /// Load the zone `name` (`Europe/Berlin`) from [`ZONEINFO_DIR`]; `UTC` needs no file.
    ///
    /// # Errors
    /// A name that is not a zone name, a file that is missing or not a TZif file: the message
    /// says which.
    pub fn load(name: &str) -> Result<Self, ZoneError> {
        if name.eq_ignore_ascii_case("utc") {
            return Ok(Self::utc());
        }
        Self::load_from(Path::new(ZONEINFO_DIR), name)
    }

    /// Load the zone `name` from `dir`.
    ///
    /// # Errors
    /// As [`Zone::load`].
    pub fn load_from(dir: &Path, name: &str) -> Result<Self, ZoneError> {
        let valid = !name.is_empty()
            && !name.starts_with('/')
            && name
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'));
        if !valid {
            return Err(ZoneError::NotAName);
        }
        let path = dir.join(name);
        let io = |e: std::io::Error| ZoneError::Io {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ZoneError::Missing(path.display().to_string()),
            _ => io(e),
        })?;
        if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
            return Err(ZoneError::NotAFile(path.display().to_string()));
        }
        let bytes = std::fs::read(&path).map_err(io)?;
        Self::parse(&bytes).map_err(|e| ZoneError::Io {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// Parse a TZif file.
    ///
    /// # Errors
    /// Not a TZif file, or a truncated one.
    pub fn parse(bytes: &[u8]) -> Result<Self, ZoneError> {
        let ((version, counts), rest) = header(bytes)?;
        if version == 0 {
            return block(rest, counts, 4).map(|(zone, _)| zone);
        }
        // Version 2+: skip the 32-bit block, read the 64-bit one and the footer rule.
        let skip = block_len(counts, 4);
        let rest = rest
            .get(skip..)
            .ok_or(ZoneError::Malformed("truncated version 1 block"))?;
        let ((_, counts2), rest) = header(rest)?;
        let (mut zone, rest) = block(rest, counts2, 8)?;
        let footer = rest
            .strip_prefix(b"\n")
            .and_then(|r| r.iter().position(|b| *b == b'\n').map(|end| &r[..end]))
            .ok_or(ZoneError::Malformed("missing footer"))?;
        if !footer.is_empty() {
            let text = std::str::from_utf8(footer)
                .map_err(|_| ZoneError::Malformed("footer is not text"))?;
            zone.rule =
                Some(PosixTz::parse(text).ok_or_else(|| ZoneError::Rule(text.to_string()))?);
        }
        Ok(zone)
    }

    /// The offset east of UTC, in seconds, in force at the instant `t` (UTC seconds).
    pub fn offset_at(&self, t: i64) -> i32 {
        match self.transitions.partition_point(|(at, _)| *at <= t) {
            0 if self.transitions.is_empty() => {
                self.rule.as_ref().map_or(self.initial, |r| r.offset_at(t))
            }
            0 => self.initial,
            n if n == self.transitions.len() => match &self.rule {
                Some(r) => r.offset_at(t),
                None => self.transitions[n - 1].1,
            },
            n => self.transitions[n - 1].1,
        }
    }

    /// The instants (UTC seconds) whose local time is `local` (local seconds since the epoch):
    /// one, two in a repeated hour (earlier first), none in a skipped one. Assumes at most one
    /// transition within a day of `local`, which holds for every zone.
    pub fn instants(&self, local: i64) -> Vec<i64> {
        let mut out = Vec::with_capacity(2);
        for probe in [local - 86_400, local + 86_400] {
            let offset = self.offset_at(probe - i64::from(self.offset_at(probe)));
            let u = local - i64::from(offset);
            if self.offset_at(u) == offset && !out.contains(&u) {
                out.push(u);
            }
        }
        out.sort_unstable();
        out
    }

    /// The first instant (UTC seconds) whose local time is at or after `local`: for a local
    /// time skipped by a spring-forward, the instant of the jump.
    pub fn first_at_or_after(&self, local: i64) -> i64 {
        // local(u) = u + offset(u) only jumps forward around a gap: bisect on it.
        let (mut lo, mut hi) = (local - 86_400, local + 86_400);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if mid + i64::from(self.offset_at(mid)) >= local {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

type Counts = [usize; 6];

/// The header: version (0 for `\0`, else the digit) and the six counts (isutcnt, isstdcnt,
/// leapcnt, timecnt, typecnt, charcnt).
fn header(b: &[u8]) -> Result<((u8, Counts), &[u8]), ZoneError> {
    if b.len() < 44 || &b[..4] != b"TZif" {
        return Err(ZoneError::Malformed("not a TZif zone file"));
    }
    let version = match b[4] {
        0 => 0,
        v @ b'2'..=b'9' => v - b'0',
        _ => return Err(ZoneError::Malformed("unknown TZif version")),
    };
    let mut counts = [0usize; 6];
    for (i, c) in counts.iter_mut().enumerate() {
        let at = 20 + 4 * i;
        *c = u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    }
    Ok(((version, counts), &b[44..]))
}

fn block_len(c: Counts, time_size: usize) -> usize {
    let [isut, isstd, leap, time, typ, chars] = c;
    time * time_size + time + typ * 6 + chars + leap * (time_size + 4) + isstd + isut
}

/// The transitions and types of a data block; what follows it.
fn block(b: &[u8], c: Counts, time_size: usize) -> Result<(Zone, &[u8]), ZoneError> {
    let [_, _, _, time, typ, _] = c;
    let len = block_len(c, time_size);
    let data = b
        .get(..len)
        .ok_or(ZoneError::Malformed("truncated data block"))?;
    if typ == 0 {
        return Err(ZoneError::Malformed("no local time types"));
    }
    let times = &data[..time * time_size];
    let indices = &data[time * time_size..time * (time_size + 1)];
    let types = &data[time * (time_size + 1)..time * (time_size + 1) + typ * 6];
    let offset_of = |i: usize| -> Result<i32, ZoneError> {
        let t = types
            .get(i * 6..i * 6 + 4)
            .ok_or(ZoneError::Malformed("bad type index"))?;
        Ok(i32::from_be_bytes([t[0], t[1], t[2], t[3]]))
    };
    let mut transitions = Vec::with_capacity(time);
    for i in 0..time {
        let raw = &times[i * time_size..(i + 1) * time_size];
        let at = if time_size == 8 {
            i64::from_be_bytes([
                raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
            ])
        } else {
            i64::from(i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
        };
        transitions.push((at, offset_of(usize::from(indices[i]))?));
    }
    let zone = Zone {
        transitions,
        initial: offset_of(0)?,
        rule: None,
    };
    Ok((zone, &b[len..]))
}

impl PosixTz {
    fn parse(s: &str) -> Option<Self> {
        let mut p = Cursor {
            s: s.as_bytes(),
            i: 0,
        };
        p.name()?;
        let std = -p.offset()?;
        if p.done() {
            return Some(Self { std, dst: None });
        }
        p.name()?;
        let dst_off = if p.peek().is_some_and(|c| c != b',') {
            -p.offset()?
        } else {
            std + 3600
        };
        // No rule: the US rules of POSIX's time; tzdata always writes one.
        if !p.eat(b',') {
            return None;
        }
        let (start, start_time) = p.rule()?;
        if !p.eat(b',') {
            return None;
        }
        let (end, end_time) = p.rule()?;
        p.done().then_some(Self {
            std,
            dst: Some((dst_off, start, start_time, end, end_time)),
        })
    }

    fn offset_at(&self, t: i64) -> i32 {
        let Some((dst, start, start_time, end, end_time)) = self.dst else {
            return self.std;
        };
        let Some(year) =
            chrono::DateTime::from_timestamp(t + i64::from(self.std), 0).map(|d| d.year())
        else {
            return self.std;
        };
        // Start is given in standard time, end in daylight time.
        let begins = start.local_secs(year) + i64::from(start_time) - i64::from(self.std);
        let ends = end.local_secs(year) + i64::from(end_time) - i64::from(dst);
        let in_dst = if begins < ends {
            t >= begins && t < ends
        } else {
            // Southern hemisphere: daylight time spans the new year.
            !(t >= ends && t < begins)
        };
        if in_dst {
            dst
        } else {
            self.std
        }
    }
}

impl RuleDate {
    /// Local midnight of the rule's day in `year`, as local seconds since the epoch.
    fn local_secs(self, year: i32) -> i64 {
        let date = match self {
            RuleDate::Julian1(n) => {
                // Day n of a 365-day year: February 29th is skipped.
                let leap = NaiveDate::from_ymd_opt(year, 2, 29).is_some();
                let ordinal = u32::from(n) + u32::from(leap && n >= 60);
                NaiveDate::from_yo_opt(year, ordinal)
            }
            RuleDate::Julian0(n) => NaiveDate::from_yo_opt(year, u32::from(n) + 1),
            RuleDate::Month(m, w, d) => NaiveDate::from_ymd_opt(year, m, 1).and_then(|first| {
                let shift = (d + 7 - first.weekday().num_days_from_sunday()) % 7;
                let mut day = 1 + shift + 7 * (w - 1);
                let len = days_in_month(year, m);
                while day > len {
                    day -= 7;
                }
                NaiveDate::from_ymd_opt(year, m, day)
            }),
        };
        date.and_then(|d| d.and_hms_opt(0, 0, 0))
            .map_or(0, |d| d.and_utc().timestamp())
    }
}

fn days_in_month(year: i32, month: u32) -> u32 {
    let next = if month == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)
    };
    next.and_then(|n| n.pred_opt()).map_or(28, |d| d.day())
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn done(&self) -> bool {
        self.i == self.s.len()
    }
    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }
    /// `<+03>` or `CET` (at least 3 letters).
    fn name(&mut self) -> Option<()> {
        if self.eat(b'<') {
            while self.peek()? != b'>' {
                self.i += 1;
            }
            self.i += 1;
            return Some(());
        }
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
            self.i += 1;
        }
        (self.i - start >= 3).then_some(())
    }
    fn number(&mut self) -> Option<i32> {
        let start = self.i;
        let mut n: i32 = 0;
        while let Some(c) = self.peek().filter(u8::is_ascii_digit) {
            n = n.checked_mul(10)?.checked_add(i32::from(c - b'0'))?;
            self.i += 1;
        }
        (self.i > start).then_some(n)
    }
    /// `[+-]h[h][:mm[:ss]]` in seconds (POSIX sign: positive is west of UTC).
    fn offset(&mut self) -> Option<i32> {
        let sign = if self.eat(b'-') {
            -1
        } else {
            self.eat(b'+');
            1
        };
        let mut secs = self.number()? * 3600;
        if self.eat(b':') {
            secs += self.number()? * 60;
            if self.eat(b':') {
                secs += self.number()?;
            }
        }
        Some(sign * secs)
    }
    /// `Mm.w.d`, `Jn` or `n`, then `/time` (default 02:00; may be negative or past 24h).
    fn rule(&mut self) -> Option<(RuleDate, i32)> {
        let date = if self.eat(b'M') {
            let m = u32::try_from(self.number()?).ok()?;
            self.eat(b'.').then_some(())?;
            let w = u32::try_from(self.number()?).ok()?;
            self.eat(b'.').then_some(())?;
            let d = u32::try_from(self.number()?).ok()?;
            ((1..=12).contains(&m) && (1..=5).contains(&w) && d <= 6)
                .then_some(RuleDate::Month(m, w, d))?
        } else if self.eat(b'J') {
            let n = u16::try_from(self.number()?).ok()?;
            (1..=365).contains(&n).then_some(RuleDate::Julian1(n))?
        } else {
            let n = u16::try_from(self.number()?).ok()?;
            (n <= 365).then_some(RuleDate::Julian0(n))?
        };
        let time = if self.eat(b'/') { self.offset()? } else { 7200 };
        Some((date, time))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use chrono::TimeZone;

    fn ts(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        chrono::Utc
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .unwrap()
            .timestamp()
    }

    #[test]
    fn the_posix_rule_alone_gives_berlin_offsets() {
        let rule = PosixTz::parse("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let zone = Zone {
            transitions: Vec::new(),
            initial: 3600,
            rule: Some(rule),
        };
        // 2026: CEST from 03-29 01:00 UTC to 10-25 01:00 UTC.
        assert_eq!(zone.offset_at(ts(2026, 3, 29, 0, 59)), 3600);
        assert_eq!(zone.offset_at(ts(2026, 3, 29, 1, 0)), 7200);
        assert_eq!(zone.offset_at(ts(2026, 10, 25, 0, 59)), 7200);
        assert_eq!(zone.offset_at(ts(2026, 10, 25, 1, 0)), 3600);
        // Far future (slim zone files rely on the rule): 2100-03-28 is the last Sunday.
        assert_eq!(zone.offset_at(ts(2100, 3, 28, 0, 59)), 3600);
        assert_eq!(zone.offset_at(ts(2100, 3, 28, 1, 0)), 7200);
    }

    #[test]
    fn southern_and_odd_rules_parse() {
        // Sydney: daylight time across the new year.
        let syd = PosixTz::parse("AEST-10AEDT,M10.1.0,M4.1.0/3").unwrap();
        assert_eq!(syd.offset_at(ts(2026, 1, 15, 0, 0)), 11 * 3600);
        assert_eq!(syd.offset_at(ts(2026, 6, 15, 0, 0)), 10 * 3600);
        // No daylight time, a quoted name.
        assert_eq!(
            PosixTz::parse("<+0530>-5:30").unwrap().offset_at(0),
            5 * 3600 + 1800
        );
        // Negative and past-24h rule times (tzdata v3+).
        assert!(PosixTz::parse("<-02>2<-01>,M3.5.0/-1,M10.5.0/0").is_some());
        assert!(PosixTz::parse("EST5EDT,M3.2.0/2,M11.1.0/25").is_some());
        assert!(PosixTz::parse("XX").is_none());
    }

    #[test]
    fn system_zones_load_and_bad_names_are_refused() {
        let berlin = Zone::load("Europe/Berlin").unwrap();
        assert_eq!(berlin.offset_at(ts(1990, 1, 1, 0, 0)), 3600);
        assert_eq!(berlin.offset_at(ts(2026, 7, 1, 0, 0)), 7200);
        assert_eq!(berlin.offset_at(ts(2080, 7, 1, 0, 0)), 7200);
        assert_eq!(Zone::load("UTC").unwrap(), Zone::utc());
        for bad in ["../etc/passwd", "/etc/passwd", "Europe/../x", "", "a b"] {
            assert_eq!(
                Zone::load(bad).unwrap_err().to_string(),
                "not a zone name",
                "{bad}"
            );
        }
        assert!(Zone::load("Europe/Atlantis")
            .unwrap_err()
            .to_string()
            .contains("no file"));
        assert!(Zone::load("Europe")
            .unwrap_err()
            .to_string()
            .contains("is not a zone file"));
    }

    #[test]
    fn a_missing_database_is_an_error_not_utc() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Zone::load_from(dir.path(), "Europe/Berlin")
            .unwrap_err()
            .to_string()
            .starts_with("no file"));
        std::fs::write(dir.path().join("Bad"), b"not a zone").unwrap();
        assert!(Zone::load_from(dir.path(), "Bad")
            .unwrap_err()
            .to_string()
            .contains("not a TZif"));
    }

    /// Slim zone files (`zic -b slim`, the default of tzdata's own build, Alpine and Arch) list
    /// no transition after 2007: later offsets come from the footer rule alone. Every day from
    /// 1990 to 2037 the slim and the fat (Debian) Berlin and Sydney give the same offsets.
    #[test]
    fn slim_zone_files_agree_with_fat_ones() {
        let slim_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scheduler/testdata/slim");
        for name in ["Europe/Berlin", "Australia/Sydney"] {
            let slim = Zone::load_from(&slim_dir, name).unwrap();
            let fat = Zone::load(name).unwrap();
            assert!(slim.rule.is_some(), "{name}");
            let mut t = ts(1990, 1, 1, 0, 30);
            while t < ts(2037, 12, 31, 0, 0) {
                for probe in [t, t + 3600, t + 7200] {
                    assert_eq!(
                        slim.offset_at(probe),
                        fat.offset_at(probe),
                        "{name} at {probe}"
                    );
                }
                t += 86_400;
            }
        }
    }

    #[test]
    fn local_times_resolve_to_zero_one_or_two_instants() {
        let berlin = Zone::load("Europe/Berlin").unwrap();
        let local = |y, mo, d, h, mi| ts(y, mo, d, h, mi);
        assert_eq!(
            berlin.instants(local(2026, 3, 29, 2, 30)),
            Vec::<i64>::new()
        );
        assert_eq!(
            berlin.first_at_or_after(local(2026, 3, 29, 2, 30)),
            ts(2026, 3, 29, 1, 0)
        );
        assert_eq!(
            berlin.instants(local(2026, 10, 25, 2, 30)),
            vec![ts(2026, 10, 25, 0, 30), ts(2026, 10, 25, 1, 30)]
        );
        assert_eq!(
            berlin.instants(local(2026, 7, 1, 12, 0)),
            vec![ts(2026, 7, 1, 10, 0)]
        );
    }
}
