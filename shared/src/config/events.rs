//! `[events]`: a run's event list in Redis and the event streams the API serves from it.

use std::num::NonZeroUsize;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// Expiry of a run's event list once it pauses or ends.
    pub retention_secs: u64,
    /// `message_delta` events are flushed after this long...
    pub delta_flush_ms: u64,
    /// ...or once this many bytes of text are buffered.
    pub delta_flush_bytes: usize,
    /// Rewrite a finished message's deltas in Redis as one small header (see
    /// `compaction.rs`); replays are unchanged, the list shrinks several-fold.
    pub compact_deltas: bool,
    /// How a worker writes a compaction header: `packed` (two or three bytes a delta) or
    /// `arrays` (about six), the only form an API from before 2026-11-26 reads. Set `arrays`
    /// while such an API still serves streams (a rolling upgrade from it); every API since
    /// reads both.
    pub compact_header: CompactHeader,
    pub keepalive_secs: u64,
    pub sse_retry_ms: u64,
    /// Events buffered per SSE client before a slow client is disconnected.
    pub client_buffer: NonZeroUsize,
    /// How long a stream waits for the last event of a run Postgres already shows as ended,
    /// before serving that event from Postgres.
    pub final_event_grace_ms: u64,
    /// How often an idle thread stream looks in Postgres for a new run of its thread anyway. A
    /// new run is noticed from its `run_queued` (or `run_started`) event at once; this only
    /// bounds how late one is noticed whose event never reached Redis.
    pub thread_recheck_ms: u64,
    /// How often a run's stream with nothing to send looks in Postgres anyway: an end whose
    /// event never reached Redis (its worker died between the commit and the append) is
    /// noticed then, and served from Postgres after `final_event_grace_ms`.
    pub idle_recheck_ms: u64,
    /// How long the API keeps its subscription to every run's live events after the last
    /// stream it served closed (it subscribes again, at once, for the next stream).
    pub hub_linger_ms: u64,
    /// How often that subscription checks its connection with a PING: without an answer
    /// before the next one is due the API reconnects and every stream resyncs. A subscriber
    /// only listens: a connection that died without a reset would otherwise look open for
    /// ever.
    pub hub_ping_ms: u64,
    /// When Redis has lost a run's list, its ids continue this far past the last id recorded
    /// in Postgres, so an id a client saw is never handed out again (docs/events.md).
    pub lost_id_margin: u64,
}

/// The stored form of a compaction header (`events.compact_header`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactHeader {
    #[default]
    Packed,
    Arrays,
}

impl EventSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.lost_id_margin < 1000 {
            return Err(invalid(
                "events.lost_id_margin",
                "must be at least 1000 (it must exceed the events appended between two records)",
            ));
        }
        for (name, ms) in [
            ("events.hub_linger_ms", self.hub_linger_ms),
            ("events.hub_ping_ms", self.hub_ping_ms),
            ("events.idle_recheck_ms", self.idle_recheck_ms),
            ("events.thread_recheck_ms", self.thread_recheck_ms),
        ] {
            if !(100..=3_600_000).contains(&ms) {
                return Err(invalid(name, "must be within 100..=3600000"));
            }
        }
        Ok(())
    }
}
