//! Cron Triggers' expressions as Cloudflare reads them — five fields in UTC; `* , - /`; `L`
//! and `W` in the day of the month; month names; the day of the week 1–7 with **1 = Sunday**
//! (Quartz numbering) or SUN–SAT, with `L` and `#` — parsed by Cloudflare's own parser
//! (`saffron`, the one its production uses), and the minutes each fires at.

use chrono::{DateTime, TimeZone, Utc};

use crate::error::{Result, WorkersError};

/// One parsed schedule, with its text exactly as configured (a handler's `controller.cron`).
#[derive(Debug, Clone)]
pub struct Schedule {
    text: String,
    cron: saffron::Cron,
}

impl Schedule {
    /// Parses `text`; refuses what Cloudflare refuses, and a schedule that can never fire
    /// (`* * 31 11 *`).
    pub fn parse(text: &str) -> Result<Schedule> {
        let cron: saffron::Cron = text
            .parse()
            .map_err(|e| WorkersError::InvalidCron(format!("'{text}' is not a valid cron expression: {e}")))?;
        if !cron.any() {
            return Err(WorkersError::InvalidCron(format!("'{text}' never fires: no date has all it asks for")));
        }
        Ok(Schedule { text: text.to_owned(), cron })
    }

    /// The expression, as configured.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether it fires at the minute holding `ms` (Unix milliseconds, UTC).
    pub fn fires_at(&self, ms: i64) -> bool {
        utc(ms).is_some_and(|t| self.cron.contains(t))
    }

    /// The first minute it fires at after `ms` (Unix milliseconds), in milliseconds.
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        self.cron.next_after(utc(ms)?).map(|t| t.timestamp_millis())
    }
}

fn utc(ms: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of a UTC time written `YYYY-MM-DDTHH:MM`.
    fn at(text: &str) -> i64 {
        chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M").unwrap().and_utc().timestamp_millis()
    }

    fn next(cron: &str, after: &str) -> String {
        let ms = Schedule::parse(cron).unwrap().next_after(at(after)).unwrap();
        utc(ms).unwrap().format("%Y-%m-%dT%H:%M %a").to_string()
    }

    /// Each construct, from a Monday (2026-12-07 10:02 UTC), against the next time Cloudflare's
    /// documentation gives it.
    #[test]
    fn each_construct_fires_when_cloudflare_says() {
        let from = "2026-12-07T10:02";
        let table = [
            // Every minute; every fifth; a list; a range with a step.
            ("* * * * *", "2026-12-07T10:03 Mon"),
            ("*/5 * * * *", "2026-12-07T10:05 Mon"),
            ("0,30 * * * *", "2026-12-07T10:30 Mon"),
            ("10-40/15 9-12 * * *", "2026-12-07T10:10 Mon"),
            // The documented examples: `0 17 * * sun` is `0 17 * * 1` (1 = Sunday, Quartz).
            ("0 17 * * sun", "2026-12-13T17:00 Sun"),
            ("0 17 * * 1", "2026-12-13T17:00 Sun"),
            ("0 17 * * SUN", "2026-12-13T17:00 Sun"),
            // `mon-fri` is `2-6`.
            ("0 8 * * mon-fri", "2026-12-08T08:00 Tue"),
            ("0 8 * * 2-6", "2026-12-08T08:00 Tue"),
            // The last Friday of the month: `6L` = `friL`.
            ("0 0 * * 6L", "2026-12-25T00:00 Fri"),
            ("0 0 * * FRIL", "2026-12-25T00:00 Fri"),
            // The first Monday: `2#1` (the 7th has passed at midnight, so January's).
            ("0 0 * * 2#1", "2027-01-04T00:00 Mon"),
            // The last day of the month, and the weekday nearest the 15th, and to the 19th (a
            // Saturday: the Friday before).
            ("0 0 L * *", "2026-12-31T00:00 Thu"),
            ("0 0 15W * *", "2026-12-15T00:00 Tue"),
            ("0 0 19W * *", "2026-12-18T00:00 Fri"),
            // Month names and numbers.
            ("0 0 1 JAN *", "2027-01-01T00:00 Fri"),
            ("0 0 1 1 *", "2027-01-01T00:00 Fri"),
            ("0 12 29 2 *", "2028-02-29T12:00 Tue"),
        ];
        for (cron, expected) in table {
            assert_eq!(next(cron, from), expected, "{cron}");
        }
    }

    #[test]
    fn it_fires_in_its_minutes_only() {
        let every_five = Schedule::parse("*/5 * * * *").unwrap();
        assert!(every_five.fires_at(at("2026-12-07T10:05")));
        assert!(every_five.fires_at(at("2026-12-07T10:05") + 59_999), "the whole minute");
        assert!(!every_five.fires_at(at("2026-12-07T10:06")));
        assert_eq!(every_five.text(), "*/5 * * * *");
    }

    #[test]
    fn what_cloudflare_refuses_is_refused() {
        for bad in [
            "",
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 32 * *",
            "* * * 13 *",
            "* * * * 8",
            "nonsense",
        ] {
            assert!(matches!(Schedule::parse(bad), Err(WorkersError::InvalidCron(_))), "{bad:?}");
        }
        let never = Schedule::parse("* * 31 11 *").unwrap_err();
        assert!(never.to_string().contains("never fires"), "{never}");
    }
}
