//! Run events: the envelope every event shares (docs/events.md) and the Redis event bus that stores and announces them.
//!
//! Each event's `id` is the length of the run's list after the append. One Lua script computes
//! it, appends and publishes atomically, so ids are gap-free whatever the number of writers, and
//! it refuses writers whose fencing token is older than the newest one seen for the run: a worker
//! that lost its lease cannot slip events into a stream another worker now owns.
//!
//! Every call goes over one shared connection per process ([`redis_connection`]): a multiplexed
//! connection pipelines the commands of all tasks, so an append is one round trip, and it is
//! re-made in the background when it breaks. Each call is bounded by `redis.timeout_ms`.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    RunQueued,
    RunStarted,
    IterationStarted,
    MessageDelta,
    MessageCompleted,
    ToolStarted,
    ToolCompleted,
    InputRequired,
    ConfirmationRequired,
    RunResumed,
    RunRecovered,
    RunCompleted,
    RunFailed,
    RunCancelled,
    /// First event of a stream rebuilt from Postgres after Redis lost the run's list.
    StreamRebuilt,
    /// The history sent to the model was compacted to fit its context budget.
    ContextCompacted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::RunQueued => "run_queued",
            EventType::RunStarted => "run_started",
            EventType::IterationStarted => "iteration_started",
            EventType::MessageDelta => "message_delta",
            EventType::MessageCompleted => "message_completed",
            EventType::ToolStarted => "tool_started",
            EventType::ToolCompleted => "tool_completed",
            EventType::InputRequired => "input_required",
            EventType::ConfirmationRequired => "confirmation_required",
            EventType::RunResumed => "run_resumed",
            EventType::RunRecovered => "run_recovered",
            EventType::RunCompleted => "run_completed",
            EventType::RunFailed => "run_failed",
            EventType::RunCancelled => "run_cancelled",
            EventType::StreamRebuilt => "stream_rebuilt",
            EventType::ContextCompacted => "context_compacted",
        }
    }

    /// The run is over: nothing ever follows.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
        )
    }

    /// After a pausing or terminal event nothing follows until the run is resumed.
    pub fn ends_stream(self) -> bool {
        matches!(
            self,
            EventType::InputRequired
                | EventType::ConfirmationRequired
                | EventType::RunCompleted
                | EventType::RunFailed
                | EventType::RunCancelled
        )
    }
}

/// An event as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub id: u64,
    pub run_id: Uuid,
    pub thread_id: Uuid,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub at: String,
    pub data: Value,
}

/// The envelope without its id: the id is assigned inside Redis.
#[derive(Serialize)]
pub(crate) struct Unnumbered<'a> {
    pub run_id: Uuid,
    pub thread_id: Uuid,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub at: String,
    pub data: &'a Value,
}

pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

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
/// envelope may have been appended by an attempt whose answer was lost).
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
redis.call('PUBLISH', ARGV[3], ev)
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

/// KEYS: list, base. ARGV: first id, last id (`-1`: to the end). Returns the base and the
/// elements, read in one atomic step (an append that re-creates the list cannot interleave).
const READ_LUA: &str = r#"
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local first = tonumber(ARGV[1]) - base - 1
if first < 0 then first = 0 end
local last = -1
if ARGV[2] ~= '-1' then
  last = tonumber(ARGV[2]) - base - 1
  if last < 0 then return {base, {}} end
end
return {base, redis.call('LRANGE', KEYS[1], first, last)}
"#;

/// The placeholder a reader gets for ids a lost list had handed out (`id` is the last of them).
pub fn lost_placeholder(id: u64) -> String {
    format!(r#"{{"id":{id},"type":"lost"}}"#)
}

/// Data sent on a Redis connection and unacknowledged this long means the peer is gone (a
/// failed-over host, a NAT that forgot the connection), not slow: a stalled server's kernel
/// still acknowledges. The kernel then drops the connection, and the shared one is re-made;
/// without it a half-open connection would only time out command after command.
#[cfg(target_os = "linux")]
const DEAD_CONNECTION_AFTER: Duration = Duration::from_secs(10);

/// The client for `redis.url`. `TCP_NODELAY`: many tasks' small commands share one
/// connection, and none should wait for the acknowledgement of another's.
pub fn redis_client(settings: &crate::config::RedisSettings) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = settings.url.as_str().into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    #[cfg(target_os = "linux")]
    let tcp = tcp.set_user_timeout(DEAD_CONNECTION_AFTER);
    redis::Client::open(info.set_tcp_settings(tcp))
}

/// The per-command bounds of `settings` for a connection made outside the shared one.
pub fn connection_config(settings: &crate::config::RedisSettings) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(
            settings.connect_timeout_ms.get(),
        )))
        .set_response_timeout(Some(Duration::from_millis(
            settings.response_timeout_ms.get(),
        )))
}

/// The process's shared connection to Redis: one multiplexed connection, connected on first
/// use. When it breaks, the call that finds out fails, and the connection is re-made in the
/// background: `redis.reconnect_retries` attempts, backing off from
/// `redis.reconnect_backoff_ms`; calls made meanwhile wait for it (within `redis.timeout_ms`).
pub fn redis_connection(
    settings: &crate::config::RedisSettings,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(
            settings.connect_timeout_ms.get(),
        )))
        .set_response_timeout(Some(Duration::from_millis(
            settings.response_timeout_ms.get(),
        )))
        .set_number_of_retries(settings.reconnect_retries)
        .set_min_delay(Duration::from_millis(settings.reconnect_backoff_ms))
        .set_max_delay(crate::config::RedisSettings::RECONNECT_MAX_BACKOFF);
    ConnectionManager::new_lazy_with_config(redis_client(settings)?, config)
}

/// Whether a failed command is worth sending again: when the connection broke or could not be
/// made (the manager is re-making it, and a second attempt waits for the new one; a server
/// that is back after a restart answers it). Not after a time-out: the server may still be
/// executing the first attempt. The command must be safe to repeat (see `again` in
/// `APPEND_LUA`).
fn worth_retrying(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
}

/// Names of a run's Redis keys and channels.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }
    pub fn events(&self, run: Uuid) -> String {
        self.of_run(run, "events")
    }
    pub fn live(&self, run: Uuid) -> String {
        self.of_run(run, "live")
    }
    pub fn control(&self, run: Uuid) -> String {
        self.of_run(run, "control")
    }
    pub fn fence(&self, run: Uuid) -> String {
        self.of_run(run, "fence")
    }
    /// The id offset of a list rebuilt after a loss (absent: 0).
    pub fn base(&self, run: Uuid) -> String {
        self.of_run(run, "base")
    }
    /// `{prefix}:run:{run}:{name}`, built without `format!`: every append names four of these,
    /// and through the formatting machinery (a `Uuid`'s `Display` included) they cost about
    /// 2,000 instructions each, 6 % of a worker's instructions per run (callgrind).
    fn of_run(&self, run: Uuid, name: &str) -> String {
        let mut id = Uuid::encode_buffer();
        let id = run.hyphenated().encode_lower(&mut id);
        let mut key = String::with_capacity(self.prefix.len() + 6 + id.len() + name.len());
        key.push_str(&self.prefix);
        key.push_str(":run:");
        key.push_str(id);
        key.push(':');
        key.push_str(name);
        key
    }
    /// Pattern matching every run's live channel, for the API's single subscription.
    pub fn live_pattern(&self) -> String {
        format!("{}:run:*:live", self.prefix)
    }
    pub fn control_pattern(&self) -> String {
        format!("{}:run:*:control", self.prefix)
    }
    /// Extracts the run id from a live or control channel name.
    pub fn run_of_channel(&self, channel: &str) -> Option<Uuid> {
        let rest = channel.strip_prefix(&self.prefix)?.strip_prefix(":run:")?;
        let id = rest.split(':').next()?;
        Uuid::parse_str(id).ok()
    }
}

/// The event bus over the process's shared Redis connection.
#[derive(Clone)]
pub struct EventBus {
    conn: ConnectionManager,
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

#[derive(Clone, Copy)]
pub struct NewEvent<'a> {
    pub run_id: Uuid,
    pub thread_id: Uuid,
    pub kind: EventType,
    pub data: &'a Value,
}

impl EventBus {
    pub fn new(conn: ConnectionManager, prefix: &str, retention_secs: u64) -> EventBus {
        EventBus {
            conn,
            timeout: DEFAULT_TIMEOUT,
            keys: Keys::new(prefix),
            retention_secs,
            lost_id_margin: DEFAULT_LOST_ID_MARGIN,
            compact_header: crate::config::CompactHeader::default(),
            script: std::sync::Arc::new(redis::Script::new(APPEND_LUA)),
            read_script: std::sync::Arc::new(redis::Script::new(READ_LUA)),
        }
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
        F: Fn(ConnectionManager, bool) -> Fut,
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
        Self::outcome(&event, reply, at)
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

    /// One pipeline of append invocations. It is sent without the script first (Redis
    /// nearly always has it cached); from the first invocation that finds the cache empty
    /// (a restarted or flushed Redis: nothing from that one on ran), the rest is sent again
    /// behind a `SCRIPT LOAD`.
    async fn pipeline(
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
            .arg(if args.again { "1" } else { "0" });
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
        let (base, mut items): (u64, Vec<String>) = self
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

/// The event's JSON envelope without its id (the script numbers it), and its time.
fn envelope(event: &NewEvent<'_>) -> (String, DateTime<Utc>) {
    let at = Utc::now();
    let body = serde_json::to_string(&Unnumbered {
        run_id: event.run_id,
        thread_id: event.thread_id,
        kind: event.kind,
        at: timestamp(at),
        data: event.data,
    })
    .expect("event serializes");
    (body, at)
}

/// Reads the `id` and `type` of a stored event without parsing all of it.
pub fn peek(raw: &str) -> Option<(u64, String)> {
    #[derive(Deserialize)]
    struct Head {
        id: u64,
        #[serde(rename = "type")]
        kind: String,
    }
    let head: Head = serde_json::from_str(raw).ok()?;
    Some((head.id, head.kind))
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

/// The pausing event for a run's pending item. Built in one place so the API can append it on
/// a worker's behalf (if the worker died between its commit and its append) identically.
pub fn pending_event(pending: &Value) -> (EventType, Value) {
    let kind = pending.get("kind").and_then(Value::as_str);
    if kind == Some("budget") {
        // A budget pause is answered like a question (`{"input": ...}`), so it is announced as
        // one; `kind` and the absent `tool_call_id` tell it from the agent's `ask`.
        let data = serde_json::json!({
            "kind": "budget",
            "tool_call_id": null,
            "budget": pending.get("budget"),
            "used": pending.get("used"),
            "limit": pending.get("limit"),
            "question": pending.get("question"),
            "attachments": [],
        });
        (EventType::InputRequired, data)
    } else if kind == Some("input") {
        let data = serde_json::json!({
            "tool_call_id": pending.get("tool_call_id"),
            "question": pending.get("question"),
            "attachments": pending.get("attachments"),
        });
        (EventType::InputRequired, data)
    } else {
        let data = serde_json::json!({"tool_calls": pending.get("tool_calls")});
        (EventType::ConfirmationRequired, data)
    }
}

/// `run_cancelled`'s data, built in one place so that the event the API restores from Postgres
/// (Redis lost it, or its append failed) says what the live one said: the status the run was
/// cancelled from (unknown for runs cancelled before migration 0024 recorded it) and, when a
/// newer message interrupted the run, the `code` and `message` of its `error`.
pub fn cancelled_data(previous: Option<crate::domain::RunStatus>, error: Option<&Value>) -> Value {
    let mut data = serde_json::Map::new();
    if let Some(previous) = previous {
        data.insert("previous_status".into(), Value::from(previous.as_str()));
    }
    if let Some(Value::Object(error)) = error {
        for key in ["code", "message"] {
            if let Some(v) = error.get(key) {
                data.insert(key.into(), v.clone());
            }
        }
    }
    Value::Object(data)
}

#[cfg(test)]
mod tests {
    use redis::AsyncCommands;
    use serde_json::json;

    use super::*;

    #[test]
    fn run_cancelled_says_where_from_and_why_when_it_is_known() {
        use crate::domain::RunStatus;
        assert_eq!(
            cancelled_data(Some(RunStatus::WaitingForInput), None),
            json!({"previous_status": "waiting_for_input"})
        );
        assert_eq!(
            cancelled_data(
                Some(RunStatus::Running),
                Some(&json!({"code": "interrupted", "message": "m", "other": 1}))
            ),
            json!({"previous_status": "running", "code": "interrupted", "message": "m"})
        );
        // A run cancelled before the status was recorded, with no error.
        assert_eq!(cancelled_data(None, None), json!({}));
        assert_eq!(cancelled_data(None, Some(&Value::Null)), json!({}));
    }

    #[test]
    fn run_keys_are_named_as_documented_and_read_back() {
        let keys = Keys::new("af_x");
        let run = Uuid::parse_str("0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B").unwrap();
        let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(keys.events(run), format!("af_x:run:{id}:events"));
        assert_eq!(keys.live(run), format!("af_x:run:{id}:live"));
        assert_eq!(keys.control(run), format!("af_x:run:{id}:control"));
        assert_eq!(keys.fence(run), format!("af_x:run:{id}:fence"));
        assert_eq!(keys.base(run), format!("af_x:run:{id}:base"));
        assert_eq!(keys.run_of_channel(&keys.live(run)), Some(run));
        assert_eq!(keys.run_of_channel(&keys.control(run)), Some(run));
    }

    #[test]
    fn a_budget_pause_is_announced_as_input_required_with_its_figures() {
        let pending = serde_json::json!({"kind": "budget", "budget": "tenant", "used": 160,
            "limit": 100, "question": "raise it"});
        let (kind, data) = pending_event(&pending);
        assert_eq!(kind, EventType::InputRequired);
        assert_eq!(data["kind"], "budget");
        assert!(data["tool_call_id"].is_null());
        assert_eq!(
            (&data["used"], &data["limit"]),
            (&pending["used"], &pending["limit"])
        );
        assert_eq!(data["question"], "raise it");
        let ask = serde_json::json!({"kind": "input", "tool_call_id": "c1", "question": "q"});
        let (kind, data) = pending_event(&ask);
        assert_eq!(kind, EventType::InputRequired);
        assert!(
            data.get("kind").is_none(),
            "an ask's event is unchanged: {data}"
        );
    }

    #[test]
    fn keys_follow_the_design_names() {
        let k = Keys::new("agentfleet");
        let id = Uuid::nil();
        assert_eq!(k.events(id), format!("agentfleet:run:{id}:events"));
        assert_eq!(k.live(id), format!("agentfleet:run:{id}:live"));
        assert_eq!(k.control(id), format!("agentfleet:run:{id}:control"));
        assert_eq!(k.run_of_channel(&k.live(id)), Some(id));
        assert_eq!(k.run_of_channel("other:run:x:live"), None);
    }

    fn bus_at(url: String, timeout_ms: u64) -> EventBus {
        let settings = crate::config::Settings::load_with(
            None,
            [
                ("redis.url".to_owned(), url),
                ("redis.timeout_ms".to_owned(), timeout_ms.to_string()),
            ],
            false,
        )
        .unwrap();
        let conn = redis_connection(&settings.redis).unwrap();
        EventBus::new(conn, "t", 60).with_timeout(settings.redis.timeout())
    }

    async fn append_one(bus: &EventBus) -> Result<Appended, AppendError> {
        let data = serde_json::json!({});
        let event = NewEvent {
            run_id: Uuid::new_v4(),
            thread_id: Uuid::new_v4(),
            kind: EventType::RunStarted,
            data: &data,
        };
        bus.append(event, 2, Floor::Exact(0), Expiry::Keep).await
    }

    /// A holder's events sent as one pipeline get consecutive ids in order, each with its
    /// expiry, also right after Redis lost its script cache (the pipeline is sent without
    /// the script first, then again from the first invocation that found none).
    #[tokio::test]
    async fn events_of_one_run_appended_together_keep_their_order_after_a_script_flush() {
        let bus = bus_at("redis://127.0.0.1:6379".to_owned(), 2_000);
        let mut conn = bus.conn.clone();
        let (run_id, thread_id) = (Uuid::new_v4(), Uuid::new_v4());
        let data = [json!({"n": 1}), json!({"n": 2}), json!({"n": 3})];
        let kinds = [
            EventType::RunStarted,
            EventType::IterationStarted,
            EventType::RunCompleted,
        ];
        let expiries = [Expiry::Persist, Expiry::Keep, Expiry::Expire];
        let events: Vec<(NewEvent<'_>, Expiry)> = (0..3)
            .map(|i| {
                let event = NewEvent {
                    run_id,
                    thread_id,
                    kind: kinds[i],
                    data: &data[i],
                };
                (event, expiries[i])
            })
            .collect();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        let outcomes = bus
            .append_run(&events[..2], 2, Floor::Exact(0))
            .await
            .unwrap();
        let ids: Vec<u64> = outcomes.into_iter().map(|o| o.unwrap().id).collect();
        assert_eq!(ids, [1, 2]);
        let ttl: i64 = conn.ttl(bus.keys.events(run_id)).await.unwrap();
        assert_eq!(ttl, -1, "kept: no expiry before the end");
        let outcomes = bus
            .append_run(&events[2..], 2, Floor::Exact(2))
            .await
            .unwrap();
        assert_eq!(outcomes[0].as_ref().unwrap().id, 3);
        let ttl: i64 = conn.ttl(bus.keys.events(run_id)).await.unwrap();
        assert!(ttl > 0 && ttl <= 60, "the end sets the retention: {ttl}");
        let listed = bus.read_after(run_id, 0).await.unwrap();
        let seen: Vec<(u64, String)> = listed.iter().filter_map(|raw| peek(raw)).collect();
        assert_eq!(
            seen,
            [
                (1, "run_started".to_owned()),
                (2, "iteration_started".to_owned()),
                (3, "run_completed".to_owned())
            ]
        );
        let fenced = bus
            .append_run(&events[1..2], 1, Floor::Exact(3))
            .await
            .unwrap();
        assert!(
            matches!(fenced[0], Err(AppendError::Fenced { .. })),
            "an older fence is refused"
        );
        let _: () = conn
            .del(&[
                bus.keys.events(run_id),
                bus.keys.fence(run_id),
                bus.keys.base(run_id),
            ])
            .await
            .unwrap();
    }

    /// Appends are best-effort: with nobody listening, an append fails (as unavailable), and
    /// soon, however the reconnect policy goes.
    #[tokio::test]
    async fn an_append_to_a_closed_port_fails_within_the_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let bus = bus_at(format!("redis://127.0.0.1:{port}"), 400);
        for _ in 0..3 {
            let began = std::time::Instant::now();
            let err = append_one(&bus).await.unwrap_err();
            assert!(err.is_unavailable(), "{err}");
            assert!(
                began.elapsed() < Duration::from_millis(900),
                "{:?}",
                began.elapsed()
            );
        }
    }

    /// A server that accepts and never answers (a stalled Redis) holds an append for at most
    /// `redis.timeout_ms`.
    #[tokio::test]
    async fn an_append_to_a_silent_server_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let bus = bus_at(format!("redis://127.0.0.1:{port}"), 300);
        let began = std::time::Instant::now();
        let err = append_one(&bus).await.unwrap_err();
        assert!(matches!(err, AppendError::Timeout(_)), "{err}");
        assert!(err.is_unavailable());
        assert!(
            began.elapsed() < Duration::from_millis(800),
            "{:?}",
            began.elapsed()
        );
        held.abort();
    }

    #[test]
    fn peek_reads_id_and_type() {
        assert_eq!(
            peek(r#"{"id":3,"type":"run_started","data":{}}"#),
            Some((3, "run_started".into()))
        );
    }
}
