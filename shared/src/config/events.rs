//! `[events]`: a run's event list in Redis and the event streams the API serves from it.

use std::num::NonZeroUsize;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// A paused or finished run's event list expires this long after it paused or ended (streams
    /// are replayable until then).
    pub retention_secs: u64,
    /// A worker coalesces a streamed answer's text into `message_delta` events: one is sent after
    /// this long…
    pub delta_flush_ms: u64,
    /// …or once this many bytes of text are buffered, whichever comes first.
    pub delta_flush_bytes: usize,
    /// Store a finished message's deltas in Redis as one small header (`event_compaction`); replays
    /// are served unchanged (docs/events.md), the list shrinks several-fold.
    pub compact_deltas: bool,
    /// How a worker writes a compaction header. Set `arrays` while an API from before 2026-11-26
    /// still serves streams (a rolling upgrade from it, until every API pod is new); every API
    /// since reads both.
    pub compact_header: CompactHeader,
    /// A worker packs the list of a run it ended, if it holds at most this many events: the
    /// events but the last are deflated into its first element (`events::pack`), about a quarter
    /// of their bytes for the retention period; replays are served unchanged. 0 never packs; set
    /// 0 while an API from before 2026-11-29 still serves streams (a rolling upgrade from it),
    /// which would not unpack them. At most 1000000.
    pub pack_max_events: u64,
    /// How often an event stream with nothing to send writes a keep-alive comment (proxies close
    /// idle connections); 0 counts as 1.
    pub keepalive_secs: u64,
    /// The reconnection delay an event stream tells its client (the SSE `retry:` field), sent first
    /// on every stream.
    pub sse_retry_ms: u64,
    /// Events buffered per stream client before a slow client is disconnected (it reconnects with
    /// `Last-Event-ID` and misses nothing).
    pub client_buffer: NonZeroUsize,
    /// How long a stream waits for the last event of a run Postgres already shows as ended, before
    /// serving that event from Postgres.
    pub final_event_grace_ms: u64,
    /// How often an idle `GET /v1/threads/{id}/events` looks in Postgres for a new run of its
    /// thread anyway. A new run is noticed from its `run_queued` (or `run_started`) event at once;
    /// this only bounds how late one is noticed whose event never reached Redis. 100–3600000.
    pub thread_recheck_ms: u64,
    /// How often a run's stream with nothing to send looks in Postgres anyway: an end whose event
    /// never reached Redis (its worker died between the commit and the append) is noticed then, and
    /// served from Postgres after `events.final_event_grace_ms`. 100–3600000.
    pub idle_recheck_ms: u64,
    /// An API process subscribes to a run's live events while it serves a stream of the run, and
    /// this long after the run's last stream there closed (a client reconnecting at a pause finds
    /// the subscription held; an API that only takes submissions subscribes to nothing).
    /// 100–3600000.
    pub hub_linger_ms: u64,
    /// How often, while it holds any subscription, the API checks that connection with a PING:
    /// without an answer before the next one is due it reconnects and every stream resyncs from the
    /// list. A subscriber only listens: a connection that died without a reset would otherwise look
    /// open for ever and stall every stream. 100–3600000.
    pub hub_ping_ms: u64,
    /// When Redis has lost a run's list, its ids continue this far past the last id recorded in
    /// Postgres, so an id a client saw is never handed out again (docs/events.md). At least 1000
    /// (it must exceed the events appended between two records).
    pub lost_id_margin: u64,
}

/// The stored form of a compaction header (`events.compact_header`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactHeader {
    /// Two or three bytes a delta.
    #[default]
    Packed,
    /// About six bytes a delta; the only form an API from before 2026-11-26 reads.
    Arrays,
}

impl EventSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.pack_max_events > 1_000_000 {
            return Err(invalid(
                "events.pack_max_events",
                "must be at most 1000000 (a worker reads the whole list to pack it)",
            ));
        }
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
