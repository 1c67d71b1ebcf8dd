//! Per-tenant request rate on `/v1`: a token bucket (GCRA) per tenant, shared by every API
//! replica through Redis, with an in-process `governor` limiter beside it.
//!
//! # How a request is decided
//! Only tenants whose effective `requests_per_second` is above 0 are checked at all; for the
//! others this layer costs nothing (no map, no Redis).
//!
//! 1. **Local pre-filter.** Each replica keeps a `governor` limiter per tenant at the tenant's
//!    *full* rate and burst. If it refuses, this replica alone has seen more than the tenant's
//!    whole budget over that window, so the tenant is over its limit wherever the rest of its
//!    requests went: the request is refused without asking Redis. A tenant flooding the API
//!    therefore costs Redis nothing beyond its allowed rate.
//! 2. **Shared bucket.** Otherwise one `EVALSHA` of [`GCRA_LUA`] on the process's shared,
//!    multiplexed Redis connection (the event bus's; concurrent requests are pipelined on it)
//!    decides atomically against `{redis.prefix}:ratelimit:{tenant}`, which holds the bucket's
//!    theoretical arrival time and expires when the bucket is full again. The clock is
//!    Redis's own (`TIME`), so replicas with skewed clocks share one exact budget.
//! 3. **Redis unreachable** (an error, or no answer within `rate_limit.redis_timeout_ms`):
//!    the request is decided by the local limiter alone (it already passed it), logged once and
//!    counted in `agentfleet_rate_limit_fallbacks_total`; for `rate_limit.local_only_ms` the
//!    replica does not ask Redis again. Fail open, never closed: a Redis blip must not turn
//!    into an outage for every limited tenant.
//!
//! # Trade-offs
//! - Exact across replicas while Redis answers, at the price of one Redis round trip per
//!   request of a limited tenant. That round trip is pipelined with every other command of the
//!   process, and the script is a handful of O(1) commands: `redis-benchmark` on the 2-core
//!   development machine ran it at ~36,000/s unpipelined from 20 clients (p50 0.2 ms; plain
//!   `GET` ~52,000/s), so the API's creates (>5,000/s) would take a fraction of one Redis
//!   core. A local lease (taking tokens from Redis in chunks) would save round trips but
//!   over-admit by up to a chunk per replica, and is not needed at these rates.
//! - The pre-filter counts requests Redis then refused, so a tenant sending well over its rate
//!   to one replica may be held slightly below its rate there until it slows down. It never
//!   admits more than the shared bucket.
//! - While Redis is unreachable each replica admits the tenant's full rate: up to N times the
//!   limit with N replicas, for as long as the outage lasts.
//!
//! # What counts
//! Every authenticated `/v1` request of the tenant, refused or not by the handler, including
//! event-stream (re)connections made with the API key. A stream opened with a browser stream
//! token is not counted: the token's issue (`POST /v1/runs/{id}/stream-token`) was.
//!
//! # Headers
//! The IETF draft's `RateLimit-Limit` (the burst: requests the bucket holds),
//! `RateLimit-Remaining` (requests left right now) and `RateLimit-Reset` (seconds until the
//! bucket is full again) on every `/v1` response of a limited tenant; a refusal is 429
//! `rate_limited` with `Retry-After` (whole seconds, at least 1) as well.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter as Governor};
use uuid::Uuid;

use agentfleet_shared::config::{RateLimitSettings, Settings};
use agentfleet_shared::domain::Limits;
use agentfleet_shared::events::RedisConnection;
use agentfleet_shared::store::tenants::Principal;

use crate::error::ApiError;

/// KEYS: the tenant's bucket. ARGV: emission interval (µs per request, may be fractional),
/// burst (requests the bucket holds). Returns {allowed (0/1), remaining, wait µs (until a
/// request would be allowed; 0 when allowed), reset µs (until the bucket is full again)}.
///
/// GCRA: the key holds the theoretical arrival time (TAT) in µs of Redis's clock. A request is
/// allowed when the TAT it would push forward stays within `burst` intervals of now. The TAT
/// is written with `%.0f`: Lua would print a number of 16 digits in exponent form.
pub const GCRA_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval
if new_tat - now > tolerance then
  return {0, 0, math.ceil(new_tat - tolerance - now), math.ceil(tat - now)}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
return {1, math.floor((tolerance - (new_tat - now)) / interval), 0, math.ceil(new_tat - now)}
"#;

/// A tenant's bucket: refill rate and size. `None` from [`Bucket::of`] means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub rate: u32,
    pub burst: u32,
}

impl Bucket {
    /// The bucket of effective limits: none when `requests_per_second` is 0; a burst of 0
    /// means one second's worth.
    pub fn of(limits: &Limits) -> Option<Bucket> {
        let rate = limits.requests_per_second;
        let burst = match limits.request_burst {
            0 => rate,
            burst => burst,
        };
        (rate > 0).then_some(Bucket { rate, burst })
    }

    /// Microseconds between two requests at the steady rate.
    fn interval_us(self) -> f64 {
        1_000_000.0 / f64::from(self.rate)
    }
}

/// The `RateLimit-*` values of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    pub limit: u32,
    pub remaining: u32,
    /// Whole seconds until the bucket is full again (rounded up).
    pub reset_secs: u64,
}

impl RateHeaders {
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(LIMIT, HeaderValue::from(self.limit));
        headers.insert(REMAINING, HeaderValue::from(self.remaining));
        headers.insert(RESET, HeaderValue::from(self.reset_secs));
    }
}

pub const LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub const REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub const RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed(RateHeaders),
    Limited {
        headers: RateHeaders,
        /// Whole seconds, at least 1.
        retry_after_secs: u64,
    },
}

/// Whole seconds from microseconds, rounded up.
fn secs_up(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

/// The decision of the shared bucket's answer `[allowed, remaining, wait µs, reset µs]`.
pub fn decision_of(bucket: Bucket, answer: [i64; 4]) -> Decision {
    let [allowed, remaining, wait_us, reset_us] = answer.map(|v| v.max(0) as u64);
    let headers = RateHeaders {
        limit: bucket.burst,
        remaining: remaining.min(u64::from(bucket.burst)) as u32,
        reset_secs: secs_up(reset_us),
    };
    if allowed == 1 {
        Decision::Allowed(headers)
    } else {
        Decision::Limited {
            headers: RateHeaders {
                remaining: 0,
                ..headers
            },
            retry_after_secs: secs_up(wait_us).max(1),
        }
    }
}

type Local = Governor<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// One tenant's local limiter, with the bucket it was made for (a changed limit makes anew).
struct LocalBucket {
    bucket: Bucket,
    limiter: Local,
}

/// The per-process limiter: the shared bucket in Redis and the local limiters.
pub struct RateLimiter {
    conn: RedisConnection,
    script: redis::Script,
    prefix: String,
    settings: RateLimitSettings,
    clock: DefaultClock,
    local: Mutex<HashMap<Uuid, Arc<LocalBucket>>>,
    /// Until when (ms since `started`) Redis is not asked, after a failed check.
    local_only_until_ms: AtomicU64,
    started: Instant,
}

/// The Redis key of `tenant`'s shared bucket (the only key of a tenant's own in Redis besides
/// its runs': a tenant's erasure deletes it, `crate::erasure`).
pub fn bucket_key(prefix: &str, tenant: Uuid) -> String {
    format!("{prefix}:ratelimit:{tenant}")
}

impl RateLimiter {
    pub fn new(conn: RedisConnection, prefix: &str, settings: RateLimitSettings) -> Self {
        RateLimiter {
            conn,
            script: redis::Script::new(GCRA_LUA),
            prefix: prefix.to_owned(),
            settings,
            clock: DefaultClock::default(),
            local: Mutex::new(HashMap::new()),
            local_only_until_ms: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    pub fn key(&self, tenant: Uuid) -> String {
        bucket_key(&self.prefix, tenant)
    }

    /// Decides one request of `tenant` under `bucket`.
    pub async fn check(&self, tenant: Uuid, bucket: Bucket) -> Decision {
        let local = self.local_decision(tenant, bucket);
        if matches!(local, Decision::Limited { .. }) || self.local_only() {
            if matches!(local, Decision::Allowed(_)) {
                metrics::counter!("agentfleet_rate_limit_fallbacks_total").increment(1);
            }
            return local;
        }
        let timeout = Duration::from_millis(self.settings.redis_timeout_ms.get());
        let mut conn = self.conn.clone();
        let mut invocation = self.script.key(self.key(tenant));
        invocation.arg(bucket.interval_us()).arg(bucket.burst);
        match tokio::time::timeout(timeout, invocation.invoke_async::<Vec<i64>>(&mut conn)).await {
            Ok(Ok(answer)) => match <[i64; 4]>::try_from(answer) {
                Ok(answer) => decision_of(bucket, answer),
                Err(other) => self.fall_back(local, &format!("unexpected answer {other:?}")),
            },
            Ok(Err(e)) => self.fall_back(local, &e.to_string()),
            Err(_) => self.fall_back(local, &format!("no answer within {timeout:?}")),
        }
    }

    fn local_only(&self) -> bool {
        self.now_ms() < self.local_only_until_ms.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Redis could not decide: the local decision stands, and Redis is left alone for a while.
    fn fall_back(&self, local: Decision, error: &str) -> Decision {
        let until = self.now_ms() + self.settings.local_only_ms;
        let before = self.local_only_until_ms.swap(until, Ordering::Relaxed);
        if before <= self.now_ms() {
            // Once per outage period, not per request.
            tracing::warn!(
                error,
                local_only_ms = self.settings.local_only_ms,
                "rate limit: Redis unavailable, deciding by this replica's local limiter"
            );
        }
        metrics::counter!("agentfleet_rate_limit_fallbacks_total").increment(1);
        local
    }

    fn local_decision(&self, tenant: Uuid, bucket: Bucket) -> Decision {
        let local = self.local_bucket(tenant, bucket);
        let headers = |remaining, reset_secs| RateHeaders {
            limit: bucket.burst,
            remaining,
            reset_secs,
        };
        match local.limiter.check() {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity().min(bucket.burst);
                // Full again once the used cells have dripped out at the steady rate.
                let used = u64::from(bucket.burst - remaining);
                let reset_us = (used as f64 * bucket.interval_us()).ceil() as u64;
                Decision::Allowed(headers(remaining, secs_up(reset_us)))
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let reset_us = (f64::from(bucket.burst) * bucket.interval_us()) as u64;
                Decision::Limited {
                    headers: headers(0, secs_up(reset_us)),
                    retry_after_secs: secs_up(wait.as_micros() as u64).max(1),
                }
            }
        }
    }

    fn local_bucket(&self, tenant: Uuid, bucket: Bucket) -> Arc<LocalBucket> {
        let mut map = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = map.get(&tenant).filter(|l| l.bucket == bucket) {
            return found.clone();
        }
        if map.len() >= self.settings.local_max_tenants.get() {
            // Rare (more limited tenants than configured): start afresh rather than track
            // recency; a forgotten tenant's next requests are still decided by Redis.
            map.clear();
        }
        let rate = NonZeroU32::new(bucket.rate).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(bucket.burst).unwrap_or(NonZeroU32::MIN);
        let limiter = Governor::direct(Quota::per_second(rate).allow_burst(burst))
            .with_middleware::<StateInformationMiddleware>();
        let made = Arc::new(LocalBucket { bucket, limiter });
        map.insert(tenant, made.clone());
        made
    }
}

/// What [`limit_requests`] needs: the limiter and the configured default limits.
pub type LayerState = (Arc<RateLimiter>, Arc<Settings>);

/// Middleware of `/v1`, inside authentication: limits the request's tenant (the principal
/// `auth` left in the extensions; requests without one are not counted).
pub async fn limit_requests(
    State((limiter, settings)): State<LayerState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(principal) = req.extensions().get::<Principal>().copied() else {
        return next.run(req).await;
    };
    let Some(bucket) = Bucket::of(&principal.limits.over(&settings.limits)) else {
        return next.run(req).await;
    };
    match limiter.check(principal.tenant_id, bucket).await {
        Decision::Allowed(headers) => {
            let mut response = next.run(req).await;
            headers.apply(response.headers_mut());
            response
        }
        Decision::Limited {
            headers,
            retry_after_secs,
        } => {
            metrics::counter!("agentfleet_requests_limited_total", "reason" => "rate").increment(1);
            let mut response = ApiError {
                retry_after_secs: Some(retry_after_secs),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "this tenant is limited to {} requests per second (bursts of {}); retry in {retry_after_secs} s",
                        bucket.rate, bucket.burst
                    ),
                )
            }
            .into_response();
            headers.apply(response.headers_mut());
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: u32, burst: u32) -> Limits {
        Limits {
            requests_per_second: rate,
            request_burst: burst,
            max_active_runs: 0,
            max_running_runs: 0,
            max_batch_size: 0,
            tokens_per_day: 0,
        }
    }

    #[test]
    fn no_rate_is_no_bucket_and_no_burst_is_one_seconds_worth() {
        assert_eq!(Bucket::of(&limits(0, 0)), None);
        assert_eq!(
            Bucket::of(&limits(10, 0)),
            Some(Bucket {
                rate: 10,
                burst: 10
            })
        );
        assert_eq!(
            Bucket::of(&limits(10, 50)),
            Some(Bucket {
                rate: 10,
                burst: 50
            })
        );
    }

    #[test]
    fn a_refusal_waits_whole_seconds_at_least_one() {
        let bucket = Bucket { rate: 5, burst: 10 };
        // 200 ms to the next token: Retry-After rounds up to 1, never 0.
        assert_eq!(
            decision_of(bucket, [0, 0, 200_000, 1_800_000]),
            Decision::Limited {
                headers: RateHeaders {
                    limit: 10,
                    remaining: 0,
                    reset_secs: 2
                },
                retry_after_secs: 1
            }
        );
        let slow = Bucket { rate: 1, burst: 3 };
        assert_eq!(
            decision_of(slow, [0, 0, 2_000_001, 3_000_000]),
            Decision::Limited {
                headers: RateHeaders {
                    limit: 3,
                    remaining: 0,
                    reset_secs: 3
                },
                retry_after_secs: 3
            }
        );
    }

    #[test]
    fn an_admission_reports_what_is_left() {
        let bucket = Bucket { rate: 2, burst: 4 };
        assert_eq!(
            decision_of(bucket, [1, 3, 0, 500_000]),
            Decision::Allowed(RateHeaders {
                limit: 4,
                remaining: 3,
                reset_secs: 1
            })
        );
        // A full bucket resets now.
        assert_eq!(
            decision_of(bucket, [1, 4, 0, 0]),
            Decision::Allowed(RateHeaders {
                limit: 4,
                remaining: 4,
                reset_secs: 0
            })
        );
    }

    #[test]
    fn headers_use_the_ratelimit_family() {
        let mut headers = HeaderMap::new();
        RateHeaders {
            limit: 7,
            remaining: 2,
            reset_secs: 5,
        }
        .apply(&mut headers);
        assert_eq!(headers["ratelimit-limit"], "7");
        assert_eq!(headers["ratelimit-remaining"], "2");
        assert_eq!(headers["ratelimit-reset"], "5");
    }

    #[tokio::test]
    async fn the_local_limiter_holds_the_burst_then_refuses_with_a_wait() {
        // A connection that is never used: only the local decision is looked at.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let conn = RedisConnection::Single(
            redis::aio::ConnectionManager::new_lazy_with_config(
                client,
                redis::aio::ConnectionManagerConfig::new(),
            )
            .unwrap(),
        );
        let limiter = RateLimiter::new(
            conn,
            "t",
            RateLimitSettings {
                redis_timeout_ms: std::num::NonZeroU64::new(10).unwrap(),
                local_only_ms: 10,
                local_max_tenants: std::num::NonZeroUsize::new(2).unwrap(),
            },
        );
        let tenant = Uuid::now_v7();
        let bucket = Bucket { rate: 1, burst: 3 };
        let remaining: Vec<u32> = (0..3)
            .map(|_| match limiter.local_decision(tenant, bucket) {
                Decision::Allowed(h) => h.remaining,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(remaining, [2, 1, 0]);
        match limiter.local_decision(tenant, bucket) {
            Decision::Limited {
                retry_after_secs, ..
            } => assert_eq!(retry_after_secs, 1),
            other => panic!("{other:?}"),
        }
        // A changed limit starts a new bucket.
        let bigger = Bucket { rate: 1, burst: 5 };
        assert!(matches!(
            limiter.local_decision(tenant, bigger),
            Decision::Allowed(_)
        ));
    }
}
