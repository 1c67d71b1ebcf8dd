//! The event bus: appends (numbered, fenced, published) and reads of a run's events.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::connection::{RedisConnection, worth_retrying};
use super::envelope::{EventType, NewEvent, envelope};
use super::keys::Keys;

/// Fencing token of writers that must win over every worker (a cancel from the API).
/// Kept below 2^53 so Lua's doubles represent it exactly.
pub const FINAL_FENCE: i64 = 1 << 50;

/// The last id a client may have seen, as the appending writer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// The writer appended it itself and nobody else appends meanwhile (a worker holding
    /// the run): after a loss, ids continue right after it.
    Exact(u64),
    /// Read from Postgres, which may lag what was appended: after a loss, ids continue
    /// `events.lost_id_margin` past it.
    Recorded(u64),
}

/// What to do with the list's expiry in the same atomic step as the append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Keep,
    /// The run paused or ended: keep its stream for the retention period.
    Expire,
    /// The run is active again: the list must not expire under it.
    Persist,
}

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("event refused: a newer holder (fence {current}) owns run {run_id}'s stream")]
    Fenced { run_id: Uuid, current: i64 },
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis: no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
}

impl AppendError {
    /// Redis could not be reached or did not answer in time (as opposed to refusing the
    /// command): what a caller reports as a dependency being unavailable.
    pub fn is_unavailable(&self) -> bool {
        match self {
            AppendError::Fenced { .. } => false,
            AppendError::Timeout(_) => true,
            AppendError::Redis(e) => e.is_io_error() || e.is_timeout(),
        }
    }
}

/// KEYS: list, fence, base. ARGV: token, envelope-without-id (starting after its `{`), channel,
/// expiry mode (0 keep, 1 expire, 2 persist), ttl seconds, floor, margin, unless-ended (`1`:
/// decline, returning -2, when the list ends with a terminal event), again (`1`: this very
/// envelope may have been appended by an attempt whose answer was lost), the publish command
/// (`PUBLISH` on one server; `SPUBLISH` on a cluster, where the run's channel is in the slot of
/// its keys), the thread's channel (non-empty for an event that begins a run) and what to
/// publish there (the run's id; by a plain `PUBLISH`, which names no key and so may leave the
/// slot: a thread's wake-ups are two a run, and only the replicas watching it subscribe).
///
/// An event's id is `base + its position` (1-based); `base` is 0 until Redis loses a list.
/// `floor` is the last id a client may have seen, as far as the writer knows (its own last
/// append, or what Postgres recorded). When the list is gone while ids up to `floor` were
/// handed out, the stream continues at `floor + margin + 1`: the margin covers events appended
/// after `floor` was recorded, so no id is ever handed out twice, and readers see one `lost`
/// placeholder for everything before (`EventBus::read_after`). A list that exists but is
/// shorter than `floor` is padded with `lost` placeholders instead (a small gap).
const APPEND_LUA: &str = r#"
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < fence then return {-1, fence} end
if ARGV[9] == '1' then
  -- A retry after the connection broke: the first attempt may have landed, followed at most
  -- by the run's other appends of the moment (parallel tool calls; other writers fence the
  -- holder out; 512 is far more than that). Then it must not be appended twice: its id is the
  -- answer. (Envelopes differ in type, data or millisecond; two deltas of the same text in
  -- one millisecond could be mistaken for each other, losing one, as a failed append would.)
  local first = tonumber(redis.call('GET', KEYS[3]) or '0') + redis.call('LLEN', KEYS[1])
  local recent = redis.call('LRANGE', KEYS[1], -512, -1)
  first = first - #recent
  for i = #recent, 1, -1 do
    if recent[i] == '{"id":' .. (first + i) .. ',' .. ARGV[2] then return {first + i, fence} end
  end
end
if ARGV[8] == '1' then
  local tail = redis.call('LINDEX', KEYS[1], -1)
  if tail and (string.find(tail, '"type":"run_completed"', 1, true)
      or string.find(tail, '"type":"run_failed"', 1, true)
      or string.find(tail, '"type":"run_cancelled"', 1, true)) then
    return {-2, fence}
  end
end
if token > fence then redis.call('SET', KEYS[2], ARGV[1]) end
local base = tonumber(redis.call('GET', KEYS[3]) or '0')
local len = redis.call('LLEN', KEYS[1])
local floor = tonumber(ARGV[6])
local margin = tonumber(ARGV[7])
local lost = false
if len == 0 then
  -- Gone: an exact floor continues right after itself; a recorded one (which may lag what was
  -- handed out, and may be 0 before anything was recorded) jumps the margin.
  lost = (margin > 0) or (floor > base)
elseif base + len < floor and (margin > 0 or floor - base - len > 1000) then
  -- Shorter than a recorded floor (an older copy of the list came back): treated as lost.
  redis.call('DEL', KEYS[1])
  len = 0
  lost = true
end
if lost then
  if floor < base then floor = base end
  base = floor + margin
  redis.call('SET', KEYS[3], base)
end
local last = base + len
while last < floor do
  last = last + 1
  redis.call('RPUSH', KEYS[1], '{"id":' .. last .. ',"type":"lost"}')
end
local n = last + 1
local ev = '{"id":' .. n .. ',' .. ARGV[2]
redis.call('RPUSH', KEYS[1], ev)
redis.call(ARGV[10], ARGV[3], ev)
if ARGV[11] ~= '' then redis.call('PUBLISH', ARGV[11], ARGV[12]) end
local mode = ARGV[4]
if mode == '1' then
  redis.call('EXPIRE', KEYS[1], ARGV[5]); redis.call('EXPIRE', KEYS[2], ARGV[5])
  if base > 0 then redis.call('EXPIRE', KEYS[3], ARGV[5]) end
elseif mode == '2' then
  redis.call('PERSIST', KEYS[1]); redis.call('PERSIST', KEYS[2])
  if base > 0 then redis.call('PERSIST', KEYS[3]) end
end
return {n, fence}
"#;

/// KEYS: list, base. ARGV: first id, last id (`-1`: to the end). Returns the base, the
/// elements, and the list's first element if it is a pack (`events::pack`; else nil), read in
/// one atomic step (an append that re-creates the list cannot interleave).
const READ_LUA: &str = r#"
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local first = tonumber(ARGV[1]) - base - 1
if first < 0 then first = 0 end
local last = -1
if ARGV[2] ~= '-1' then
  last = tonumber(ARGV[2]) - base - 1
  if last < 0 then return {base, {}, false} end
end
local items = redis.call('LRANGE', KEYS[1], first, last)
local head = false
if #items > 0 then
  head = redis.call('LINDEX', KEYS[1], 0)
  if string.sub(head, 1, 3) ~= '~z:' then head = false end
end
return {base, items, head}
"#;

/// The placeholder a reader gets for ids a lost list had handed out (`id` is the last of them).
pub fn lost_placeholder(id: u64) -> String {
    format!(r#"{{"id":{id},"type":"lost"}}"#)
}

/// The event bus over the process's shared Redis connection.
#[derive(Clone)]
pub struct EventBus {
    pub(super) conn: RedisConnection,
    /// Bound of one call, reconnecting and retrying included (`redis.timeout_ms`).
    timeout: Duration,
    keys: Keys,
    retention_secs: u64,
    /// How far ids jump past the last recorded one when a list is found lost.
    lost_id_margin: u64,
    /// The form compaction headers are written in (`events.compact_header`).
    compact_header: crate::config::CompactHeader,
    script: std::sync::Arc<redis::Script>,
    read_script: std::sync::Arc<redis::Script>,
    /// Finished lists of at most this many events are packed (`events.pack_max_events`; 0:
    /// never).
    pack_max_events: u64,
    /// On a cluster, how long an append that took a run's stream from an earlier holder waits
    /// for a replica to have the new fence (`redis.fence_replication_ms`; zero: not at all).
    fence_replication: Duration,
}

/// Default of `events.lost_id_margin`.
pub const DEFAULT_LOST_ID_MARGIN: u64 = 100_000;

/// Default of `redis.timeout_ms`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// An appended event: its id and the JSON as stored.
#[derive(Debug, Clone)]
pub struct Appended {
    pub id: u64,
    /// The envelope's `at`, in Unix milliseconds.
    pub at_ms: i64,
}

impl EventBus {
    pub fn new(conn: RedisConnection, prefix: &str, retention_secs: u64) -> EventBus {
        EventBus {
            conn,
            timeout: DEFAULT_TIMEOUT,
            keys: Keys::new(prefix),
            retention_secs,
            lost_id_margin: DEFAULT_LOST_ID_MARGIN,
            compact_header: crate::config::CompactHeader::default(),
            script: std::sync::Arc::new(redis::Script::new(APPEND_LUA)),
            read_script: std::sync::Arc::new(redis::Script::new(READ_LUA)),
            pack_max_events: 0,
            fence_replication: Duration::ZERO,
        }
    }

    /// Sets `redis.fence_replication_ms`.
    pub fn with_fence_replication(mut self, wait: Duration) -> EventBus {
        self.fence_replication = wait;
        self
    }

    /// Sets `events.pack_max_events` (for the holders that end runs).
    pub fn with_pack_max_events(mut self, max: u64) -> EventBus {
        self.pack_max_events = max;
        self
    }

    pub(super) fn pack_max_events(&self) -> u64 {
        self.pack_max_events
    }

    /// Sets `events.compact_header`.
    pub fn with_compact_header(mut self, form: crate::config::CompactHeader) -> EventBus {
        self.compact_header = form;
        self
    }

    /// The form compaction headers are written in.
    pub fn compact_header(&self) -> crate::config::CompactHeader {
        self.compact_header
    }

    /// Sets `events.lost_id_margin`.
    pub fn with_lost_id_margin(mut self, margin: u64) -> EventBus {
        self.lost_id_margin = margin;
        self
    }

    /// Sets `redis.timeout_ms`.
    pub fn with_timeout(mut self, timeout: Duration) -> EventBus {
        self.timeout = timeout;
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Runs `command` on the shared connection within the bus's time-out; once more, on a
    /// fresh connection, if the connection broke under the first attempt (`command` is told
    /// whether it is that second attempt, and must be safe to repeat).
    pub(crate) async fn call<T, F, Fut>(&self, command: F) -> Result<T, AppendError>
    where
        F: Fn(RedisConnection, bool) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let attempts = async {
            match command(self.conn.clone(), false).await {
                Err(e) if worth_retrying(&e) => {
                    tracing::debug!(error = %e, "the Redis connection broke; trying once more");
                    command(self.conn.clone(), true).await
                }
                done => done,
            }
        };
        match tokio::time::timeout(self.timeout, attempts).await {
            Ok(done) => Ok(done?),
            Err(_) => Err(AppendError::Timeout(self.timeout)),
        }
    }

    /// Whether Redis answers on the shared connection (readiness).
    pub async fn ping(&self) -> Result<(), AppendError> {
        self.call(
            |mut conn, _| async move { redis::cmd("PING").query_async::<String>(&mut conn).await },
        )
        .await
        .map(|_| ())
    }

    /// Appends one event with fencing token `fence`; `floor` is the last id a client may have
    /// seen, as far as the caller knows (see `APPEND_LUA` for what happens when the list is gone).
    pub async fn append(
        &self,
        event: NewEvent<'_>,
        fence: i64,
        floor: Floor,
        expiry: Expiry,
    ) -> Result<Appended, AppendError> {
        let run_id = event.run_id;
        // Without `unless_ended` the script never declines.
        self.append_inner(event, fence, floor, expiry, false)
            .await?
            .ok_or(AppendError::Fenced { run_id, current: 0 })
    }

    /// Appends a terminal event unless the list already ends with one (`None` then): restoring
    /// a finished run's end, which several readers may attempt at the same moment.
    pub async fn append_terminal_once(
        &self,
        event: NewEvent<'_>,
        fence: i64,
        floor: Floor,
    ) -> Result<Option<Appended>, AppendError> {
        debug_assert!(event.kind.is_terminal());
        self.append_inner(event, fence, floor, Expiry::Expire, true)
            .await
    }

    async fn append_inner(
        &self,
        event: NewEvent<'_>,
        fence: i64,
        floor: Floor,
        expiry: Expiry,
        unless_ended: bool,
    ) -> Result<Option<Appended>, AppendError> {
        // Serialized once: a repeat after a broken connection must carry the same envelope,
        // so the script can recognise an append that did land (ARGV[9]).
        let (body, at) = envelope(&event);
        let reply: (i64, i64) = self
            .call(|mut conn, again| {
                let invocation = self.invocation(
                    &event,
                    &body,
                    Args {
                        fence,
                        floor,
                        expiry,
                        unless_ended,
                        again,
                    },
                );
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        if Self::took_over(fence, reply) {
            self.replicate_fence(event.run_id).await;
        }
        Self::outcome(&event, reply, at)
    }

    /// Whether an append's reply `(id, fence before)` says it raised the run's fence over an
    /// earlier holder's (not from nothing: a run's first holder keeps no one out).
    fn took_over(fence: i64, (id, before): (i64, i64)) -> bool {
        id > 0 && before > 0 && before < fence
    }

    /// After an append that raised a run's fence over an earlier holder's, on a cluster: waits
    /// until a replica of the run's node has it (`WAIT 1`), at most `redis.fence_replication_ms`.
    /// Replication is asynchronous: without this, a failover to a replica that missed the new
    /// fence would let the earlier holder (a worker that lost its lease and has not noticed yet,
    /// or a paused attempt's late append) append again until the new holder's next append. The
    /// `WAIT` goes on the connection that wrote, to the run's node, and holds that connection
    /// for its replica's acknowledgement (well under a millisecond on a healthy cluster); it
    /// happens only at a take-over or a resume. Without a replica in time, the append stands
    /// and the shortfall is logged and counted.
    async fn replicate_fence(&self, run: Uuid) {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let RedisConnection::Cluster(conn) = &self.conn else {
            return;
        };
        if self.fence_replication.is_zero() {
            return;
        }
        let route = Route::with_key(self.keys.fence(run), SlotAddr::Master);
        let mut wait = redis::cmd("WAIT");
        wait.arg(1).arg(self.fence_replication.as_millis() as u64);
        let mut conn = conn.clone();
        let routed = conn.route_command(
            wait,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        );
        // The command's own bound is the WAIT's, plus the round trip.
        let limit = self.fence_replication + self.timeout;
        let acked = match tokio::time::timeout(limit, routed).await {
            Ok(Ok(redis::Value::Int(n))) => n,
            _ => 0,
        };
        if acked < 1 {
            metrics::counter!("agentfleet_fence_unreplicated_total").increment(1);
            tracing::warn!(run_id = %run, "a run's new stream fence reached no replica in time; a failover now could let its earlier holder append again");
        }
    }

    /// Appends one event to each of many runs in one round trip: a pipeline of the same
    /// fenced script `append` runs, one invocation per event, so each event gets exactly the
    /// id, shape and list side effects `append` would give it. Returns one outcome per event,
    /// in order; the outer error means the round trip itself failed.
    pub async fn append_many(
        &self,
        events: &[NewEvent<'_>],
        fence: i64,
        floor: Floor,
        expiry: Expiry,
    ) -> Result<Vec<Result<Appended, AppendError>>, AppendError> {
        let events: Vec<(NewEvent<'_>, Expiry)> = events.iter().map(|e| (*e, expiry)).collect();
        self.pipeline(&events, fence, floor).await
    }

    /// Appends several events of one run, in order, in one round trip (each with its own
    /// expiry): what a holder announced back to back costs one wake-up of Redis and of the
    /// worker instead of one each. Outcomes as [`EventBus::append_many`]'s.
    pub async fn append_run(
        &self,
        events: &[(NewEvent<'_>, Expiry)],
        fence: i64,
        floor: Floor,
    ) -> Result<Vec<Result<Appended, AppendError>>, AppendError> {
        debug_assert!(events.windows(2).all(|w| w[0].0.run_id == w[1].0.run_id));
        self.pipeline(events, fence, floor).await
    }

    /// Append invocations in as few round trips as the server allows: one pipeline on one
    /// server; on a cluster, where a pipeline goes to one node, one per run (a run's keys share
    /// a slot, different runs' need not), all sent at once.
    async fn pipeline(
        &self,
        events: &[(NewEvent<'_>, Expiry)],
        fence: i64,
        floor: Floor,
    ) -> Result<Vec<Result<Appended, AppendError>>, AppendError> {
        let first_run = events.first().map(|(e, _)| e.run_id);
        if !self.conn.is_cluster() || events.iter().all(|(e, _)| Some(e.run_id) == first_run) {
            return self.pipeline_one(events, fence, floor).await;
        }
        // Grouped by run, in order within each; the outcomes are put back in the callers' order.
        let mut groups: Vec<(Uuid, Vec<usize>)> = Vec::new();
        for (i, (event, _)) in events.iter().enumerate() {
            match groups.iter_mut().find(|(run, _)| *run == event.run_id) {
                Some((_, members)) => members.push(i),
                None => groups.push((event.run_id, vec![i])),
            }
        }
        let sends = groups.iter().map(|(_, members)| {
            let group: Vec<(NewEvent<'_>, Expiry)> = members.iter().map(|&i| events[i]).collect();
            async move { self.pipeline_one(&group, fence, floor).await }
        });
        let replies = futures_util::future::join_all(sends).await;
        let mut outcomes: Vec<Option<Result<Appended, AppendError>>> =
            (0..events.len()).map(|_| None).collect();
        for ((_, members), reply) in groups.iter().zip(replies) {
            for (&i, outcome) in members.iter().zip(reply?) {
                outcomes[i] = Some(outcome);
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every event belongs to one group"))
            .collect())
    }

    /// One pipeline of append invocations, to one server. It is sent without the script first
    /// (Redis nearly always has it cached); from the first invocation that finds the cache
    /// empty (a restarted or flushed Redis: nothing from that one on ran), the rest is sent
    /// again behind a `SCRIPT LOAD` (in the same pipeline, so on the same node).
    async fn pipeline_one(
        &self,
        events: &[(NewEvent<'_>, Expiry)],
        fence: i64,
        floor: Floor,
    ) -> Result<Vec<Result<Appended, AppendError>>, AppendError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let envelopes: Vec<(String, DateTime<Utc>)> =
            events.iter().map(|(e, _)| envelope(e)).collect();
        let bodies = &envelopes;
        let send = |from: usize, load: bool| {
            self.call(move |mut conn, again| {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                if load {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(APPEND_LUA).ignore();
                }
                for ((event, expiry), (body, _)) in events[from..].iter().zip(&bodies[from..]) {
                    let args = Args {
                        fence,
                        floor,
                        expiry: *expiry,
                        unless_ended: false,
                        again,
                    };
                    pipe.invoke_script(&self.invocation(event, body, args));
                }
                async move {
                    pipe.query_async::<Vec<redis::RedisResult<(i64, i64)>>>(&mut conn)
                        .await
                }
            })
        };
        let mut replies = send(0, false).await?;
        let unloaded = replies.iter().position(|r| {
            matches!(r, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
        });
        if let Some(from) = unloaded {
            replies.truncate(from);
            replies.extend(send(from, true).await?);
        }
        if replies.len() != events.len() {
            return Err(AppendError::Redis(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "pipeline answered a different number of replies",
            ))));
        }
        // One run per pipeline on a cluster (see `pipeline`): one wait covers the pipeline.
        let took_over = replies
            .iter()
            .any(|r| matches!(r, Ok(reply) if Self::took_over(fence, *reply)));
        if took_over {
            self.replicate_fence(events[0].0.run_id).await;
        }
        Ok(events
            .iter()
            .zip(replies)
            .zip(envelopes)
            .map(|(((event, _), reply), (_, at))| {
                let run_id = event.run_id;
                match Self::outcome(event, reply?, at) {
                    Ok(Some(appended)) => Ok(appended),
                    Ok(None) => Err(AppendError::Fenced { run_id, current: 0 }),
                    Err(e) => Err(e),
                }
            })
            .collect())
    }

    /// The append script's invocation for `event` with its serialized envelope `body` (see
    /// `APPEND_LUA` for its keys and arguments).
    fn invocation(
        &self,
        event: &NewEvent<'_>,
        body: &str,
        args: Args,
    ) -> redis::ScriptInvocation<'_> {
        let (floor, margin) = match args.floor {
            Floor::Exact(id) => (id, 0),
            Floor::Recorded(id) => (id, self.lost_id_margin),
        };
        let mode = match args.expiry {
            Expiry::Keep => "0",
            Expiry::Expire => "1",
            Expiry::Persist => "2",
        };
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.keys.events(event.run_id))
            .key(self.keys.fence(event.run_id))
            .key(self.keys.base(event.run_id))
            .arg(args.fence)
            .arg(&body[1..])
            .arg(self.keys.live(event.run_id))
            .arg(mode)
            .arg(self.retention_secs)
            .arg(floor)
            .arg(margin)
            .arg(if args.unless_ended { "1" } else { "0" })
            .arg(if args.again { "1" } else { "0" })
            .arg(if self.conn.is_cluster() {
                "SPUBLISH"
            } else {
                "PUBLISH"
            });
        if matches!(event.kind, EventType::RunQueued | EventType::RunStarted) {
            let mut id = Uuid::encode_buffer();
            invocation
                .arg(self.keys.thread_live(event.thread_id))
                .arg(&*event.run_id.hyphenated().encode_lower(&mut id));
        } else {
            invocation.arg("").arg("");
        }
        invocation
    }

    /// What the script's reply `(id, current fence)` means: appended, declined (`None`, the
    /// list already ended), or refused by a newer fence.
    fn outcome(
        event: &NewEvent<'_>,
        (id, current): (i64, i64),
        at: DateTime<Utc>,
    ) -> Result<Option<Appended>, AppendError> {
        if id == -2 {
            return Ok(None);
        }
        metrics::counter!("agentfleet_events_published_total", "type" => event.kind.as_str())
            .increment(1);
        if id < 0 {
            return Err(AppendError::Fenced {
                run_id: event.run_id,
                current,
            });
        }
        Ok(Some(Appended {
            id: id as u64,
            at_ms: at.timestamp_millis(),
        }))
    }

    /// Events with id > `after`, in order (raw JSON as stored). Ids a lost list had handed out
    /// come as one `lost` placeholder carrying the last of them.
    pub async fn read_after(&self, run: Uuid, after: u64) -> Result<Vec<String>, AppendError> {
        self.read_range(run, after.saturating_add(1), u64::MAX)
            .await
    }

    /// Elements with ids `from_id..=to_id` (`u64::MAX`: to the end), as stored.
    pub async fn read_range(
        &self,
        run: Uuid,
        from_id: u64,
        to_id: u64,
    ) -> Result<Vec<String>, AppendError> {
        // Lua numbers are doubles: ids stay far below 2^53, anything above is "the end".
        let clamp = |id: u64| id.min(1 << 53);
        let to = if to_id == u64::MAX {
            "-1".to_owned()
        } else {
            clamp(to_id).to_string()
        };
        let (events, base) = (self.keys.events(run), self.keys.base(run));
        let (base, raw, pack): (u64, Vec<Vec<u8>>, Option<Vec<u8>>) = self
            .call(|mut conn, _| {
                let mut invocation = self.read_script.prepare_invoke();
                invocation
                    .key(&events)
                    .key(&base)
                    .arg(clamp(from_id))
                    .arg(&to);
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        // The position of the first element read, as the script computed it.
        let first = clamp(from_id).saturating_sub(base + 1) as usize;
        let packed = pack.as_deref().and_then(super::pack::unpack);
        if pack.is_some() && packed.is_none() {
            tracing::warn!(run_id = %run, "a packed event list does not unpack; served as lost");
        }
        let mut items: Vec<String> = raw
            .into_iter()
            .enumerate()
            .map(|(i, element)| match &packed {
                Some(events) if first + i < events.len() => events[first + i].clone(),
                // A pack that does not unpack: its events are lost, as a list lost whole.
                _ if pack.is_some() && (element.is_empty() || super::pack::is_pack(&element)) => {
                    lost_placeholder(base + (first + i) as u64 + 1)
                }
                _ => String::from_utf8(element)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            })
            .collect();
        if base > 0 && from_id <= base && base <= to_id {
            items.insert(0, lost_placeholder(base));
        }
        Ok(items)
    }

    /// The last id handed out for the run (0 when the list is gone).
    pub async fn len(&self, run: Uuid) -> Result<u64, AppendError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .get(self.keys.base(run))
            .llen(self.keys.events(run));
        let (base, n): (Option<u64>, u64) = self
            .call(|mut conn, _| {
                let pipe = &pipe;
                async move { pipe.query_async(&mut conn).await }
            })
            .await?;
        // A base without a list: the list is gone again; only the base survived.
        Ok(if n == 0 { 0 } else { base.unwrap_or(0) + n })
    }

    /// Hints the worker that owns the run (the decision itself is in Postgres).
    pub async fn send_control(&self, run: Uuid, message: &str) -> Result<(), AppendError> {
        // A hint repeated after a broken connection is harmless: stopping is idempotent.
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(self.keys.control(run)).arg(message);
        self.call(|mut conn, _| {
            let publish = &publish;
            async move { publish.query_async::<i64>(&mut conn).await }
        })
        .await
        .map(|_| ())
    }
}

/// The arguments of one append besides the event itself.
#[derive(Clone, Copy)]
struct Args {
    fence: i64,
    floor: Floor,
    expiry: Expiry,
    unless_ended: bool,
    /// A repeat after a broken connection: the script first looks for this very envelope.
    again: bool,
}

/// A worker's fencing token for its attempt. Worker tokens are even and the API's resume
/// appends use the odd token just above the paused attempt's, so a paused holder's late
/// append can never land after `run_resumed`, while the next attempt's events still pass.
pub fn worker_fence(attempt: i32) -> i64 {
    attempt as i64 * 2
}

/// The token the API appends `run_resumed` with, after attempt `attempt` paused.
pub fn resume_fence(attempt: i32) -> i64 {
    attempt as i64 * 2 + 1
}
