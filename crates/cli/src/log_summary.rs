//! Summarising repeated log lines. While a region is down or cut off, every
//! surviving node retries it, and each retry logged an ERROR line (openraft's
//! replication and vote errors: 6-11k lines a second per node), which drowned
//! the lines an operator needs and filled disks. This layer lets a WARN or
//! ERROR line from one place in the code through once per
//! `LOG_REPEAT_INTERVAL_MS`, counts the repeats, and a background thread
//! writes one `repeated log lines summarised` line per place at the end of
//! each interval with the count and the first message. INFO and below pass
//! untouched: they are not emitted by retry loops.

use crate::limits::{LOG_REPEAT_INTERVAL_MS, LOG_REPEAT_PLACES_MAX, LOG_SUMMARY_MESSAGE_BYTES_MAX};
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The summary lines' own target: they are never summarised themselves.
const SUMMARY_TARGET: &str = "keyhold::log_summary";

/// One place in the code whose lines are being counted.
struct Place {
    /// When the line last written from here was let through.
    written_at: Instant,
    /// Repeats held back since then.
    repeats: u64,
    level: Level,
    target: &'static str,
    /// The message of the first line held back, cut to
    /// `LOG_SUMMARY_MESSAGE_BYTES_MAX`.
    message: String,
}

/// What the summary line of one place says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub level: Level,
    pub target: &'static str,
    pub repeats: u64,
    pub message: String,
}

/// The counts of every place (a callsite `K`), shared by the layer and the
/// summary thread.
pub struct Repeats<K = Identifier> {
    places: Arc<Mutex<HashMap<K, Place>>>,
}

impl<K> Clone for Repeats<K> {
    fn clone(&self) -> Self {
        Repeats {
            places: self.places.clone(),
        }
    }
}

impl<K> Default for Repeats<K> {
    fn default() -> Self {
        Repeats {
            places: Arc::default(),
        }
    }
}

impl<K: Hash + Eq + Send + 'static> Repeats<K> {
    /// Whether a line from `place` is written now (true) or held back and
    /// counted. `now` is an input so the rule can be tested without waiting.
    pub fn admit(
        &self,
        place: K,
        level: Level,
        target: &'static str,
        message: impl FnOnce() -> String,
        now: Instant,
    ) -> bool {
        let interval = Duration::from_millis(LOG_REPEAT_INTERVAL_MS);
        let mut places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        let full = places.len() >= LOG_REPEAT_PLACES_MAX;
        match places.get_mut(&place) {
            Some(p) if now.duration_since(p.written_at) < interval => {
                if p.repeats == 0 {
                    p.message = message();
                }
                p.repeats += 1;
                false
            }
            Some(p) => {
                // A new interval: written again. Repeats not summarised yet
                // stay counted for the next summary.
                p.written_at = now;
                true
            }
            None if full => true,
            None => {
                places.insert(
                    place,
                    Place {
                        written_at: now,
                        repeats: 0,
                        level,
                        target,
                        message: String::new(),
                    },
                );
                true
            }
        }
    }

    /// Takes the counts held back so far: one summary per place with repeats.
    pub fn take(&self) -> Vec<Summary> {
        let mut places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for p in places.values_mut().filter(|p| p.repeats > 0) {
            out.push(Summary {
                level: p.level,
                target: p.target,
                repeats: std::mem::take(&mut p.repeats),
                message: std::mem::take(&mut p.message),
            });
        }
        out
    }

    /// Writes the summaries every interval, on a thread of its own (a line
    /// logged from inside the subscriber would be dropped).
    pub fn spawn_summaries(&self) {
        let repeats = self.clone();
        let spawned = std::thread::Builder::new()
            .name("log-summary".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(LOG_REPEAT_INTERVAL_MS));
                for s in repeats.take() {
                    tracing::warn!(
                        target: SUMMARY_TARGET,
                        level = %s.level,
                        from = s.target,
                        repeats = s.repeats,
                        interval_s = LOG_REPEAT_INTERVAL_MS / 1_000,
                        first = %s.message,
                        "repeated log lines summarised"
                    );
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the log summary thread; repeats are dropped");
        }
    }
}

/// The layer: lets WARN and ERROR lines through per [`Repeats::admit`].
pub struct SummaryLayer {
    pub repeats: Repeats,
}

impl<S: Subscriber> Layer<S> for SummaryLayer {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || meta.target() == SUMMARY_TARGET {
            return true;
        }
        self.repeats.admit(
            meta.callsite(),
            *meta.level(),
            meta.target(),
            || message_of(event),
            Instant::now(),
        )
    }
}

/// An event's message and fields as one line, cut to
/// `LOG_SUMMARY_MESSAGE_BYTES_MAX` bytes.
fn message_of(event: &Event<'_>) -> String {
    struct Text(String);
    impl Visit for Text {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = if field.name() == "message" {
                write!(self.0, "{value:?}")
            } else {
                write!(self.0, "{}={value:?}", field.name())
            };
        }
    }
    let mut text = Text(String::new());
    event.record(&mut text);
    let mut s = text.0;
    if s.len() > LOG_SUMMARY_MESSAGE_BYTES_MAX {
        let mut cut = LOG_SUMMARY_MESSAGE_BYTES_MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line a place per interval; the repeats counted, summarised once
    /// with the first held-back message, and the place written again in the
    /// next interval.
    #[test]
    fn a_place_is_written_once_an_interval_and_its_repeats_summarised() {
        let r: Repeats<u32> = Repeats::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let admit = |place, at, m: &str| r.admit(place, Level::ERROR, "t", || m.to_owned(), at);
        assert!(admit(1, t0, "first"));
        assert!(!admit(1, t0 + ms(1), "second"));
        assert!(!admit(1, t0 + ms(2), "third"));
        // Another place is not held back by the first.
        assert!(admit(2, t0 + ms(3), "other"));
        assert_eq!(
            r.take(),
            vec![Summary {
                level: Level::ERROR,
                target: "t",
                repeats: 2,
                message: "second".into()
            }]
        );
        assert!(r.take().is_empty(), "each repeat is summarised once");
        let next = t0 + ms(LOG_REPEAT_INTERVAL_MS);
        assert!(admit(1, next, "again"));
        assert!(!admit(1, next + ms(1), "held"));
        assert_eq!(r.take()[0].repeats, 1);
    }
}
