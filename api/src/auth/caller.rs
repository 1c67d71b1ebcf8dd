//! Bearer-key authentication for everything under `/v1`.

use axum::RequestExt;
use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, Query, RawPathParams, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

use agentfleet_shared::store::keys;
use agentfleet_shared::store::tenants::{self, Principal};

use crate::auth::stream_token::TokenError;
use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller. Every resource is looked up within its tenant, so another
/// tenant's resources answer 404. The [`require_key`] layer has authenticated the request
/// before any extractor ran; without that layer, the key is checked here.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(Caller(*p));
        }
        principal_from(&parts.headers, source_of(&parts.extensions), state)
            .await
            .map(Caller)
    }
}

/// Middleware of every `/v1` route: the API key is checked before anything else of the
/// request (path, query, body) is looked at, so an unauthenticated request learns nothing but
/// 401. The principal is left in the request's extensions for [`Caller`].
pub async fn require_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let principal = principal_from(req.headers(), source_of(req.extensions()), &state).await?;
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}

/// Middleware of a run's event stream: a stream token (`?token=`) for the run in the path, or
/// else the API key, checked before the rest of the request. Leaves a [`StreamTenant`].
pub async fn require_key_or_stream_token(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = Query::<TokenParam>::try_from_uri(req.uri())
        .ok()
        .and_then(|Query(q)| q.token);
    let tenant = match token {
        Some(token) => {
            let run = req
                .extract_parts::<RawPathParams>()
                .await
                .ok()
                .and_then(|params| {
                    params
                        .iter()
                        .find(|(k, _)| *k == "id")
                        .and_then(|(_, v)| crate::validate::parse_uuid(v))
                });
            let Some(run) = run else {
                return Err(unauthorized(&TokenError::WrongRun.to_string()));
            };
            let now = chrono::Utc::now();
            let claims = state
                .tokens
                .verify(&token, run, now.timestamp())
                .map_err(|e| unauthorized(&e.to_string()))?;
            // The key that asked for the token must still be live: from the auth cache, so a
            // revocation reaches tokens as it reaches the key (announced, or within the TTL).
            let live = state
                .auth_cache
                .get_or_lookup(&cache_id(claims.key), || {
                    tenants::principal_of_key(&state.pool, claims.key)
                })
                .await
                .map_err(ApiError::unexpected)?
                .filter(|p| p.tenant_id == claims.tenant && !p.expired_at(now));
            if live.is_none() {
                return Err(unauthorized(
                    "the API key that issued this stream token is revoked or expired",
                ));
            }
            claims.tenant
        }
        None => {
            let source = source_of(req.extensions());
            let principal = principal_from(req.headers(), source, &state).await?;
            // Left for the rate limit, which counts key-authenticated stream requests.
            req.extensions_mut().insert(principal);
            principal.tenant_id
        }
    };
    req.extensions_mut().insert(StreamTenant(tenant));
    Ok(next.run(req).await)
}

/// A key's entry in the auth cache by id (a stream token names its key by id, not by its
/// secret): 19 bytes, never the 32 of a key hash, so the two kinds of entry cannot collide.
fn cache_id(key: uuid::Uuid) -> Vec<u8> {
    let mut id = b"id:".to_vec();
    id.extend_from_slice(key.as_bytes());
    id
}

#[derive(serde::Deserialize)]
struct TokenParam {
    token: Option<String>,
}

/// The tenant an event stream is read for, as [`require_key_or_stream_token`] found it.
#[derive(Debug, Clone, Copy)]
pub struct StreamTenant(pub uuid::Uuid);

impl FromRequestParts<AppState> for StreamTenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<StreamTenant>()
            .copied()
            .ok_or_else(|| unauthorized("missing Authorization: Bearer <api key>"))
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// The peer's address, when the server recorded it (a router driven directly has none).
fn source_of(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The principal behind the request's `Authorization: Bearer <api key>`, sent from `source`.
/// What is not the shape of a key is refused without a lookup; a key is then taken from the
/// auth cache (known or known unknown), and only otherwise looked up in Postgres, unless its
/// source has presented too many unknown keys lately (`crate::auth::attempts`).
pub async fn principal_from(
    headers: &axum::http::HeaderMap,
    source: Option<IpAddr>,
    state: &AppState,
) -> Result<Principal, ApiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <api key>"))?;
    let key = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or_else(|| unauthorized("Authorization must be `Bearer <api key>`"))?;
    if !keys::well_formed(key) {
        metrics::counter!("agentfleet_auth_refused_total", "reason" => "malformed").increment(1);
        return Err(unauthorized(
            "not an API key (`af_` and 64 hexadecimal digits)",
        ));
    }
    let hash = keys::hash_key(key);
    let principal = match state.auth_cache.get(&hash) {
        Some(principal) => principal,
        None => lookup(state, &hash, source).await?,
    };
    // Postgres refuses expired keys, but a cached entry may outlive the expiry: checked here
    // on every request, so an expiry is exact on every replica (a revocation takes the TTL).
    if principal.expired_at(chrono::Utc::now()) {
        return Err(unauthorized("unknown, revoked or expired API key"));
    }
    state.key_usage.mark(principal.key_id);
    Ok(principal)
}

/// A key not in the cache: refused from memory when it was unknown a moment ago, or when its
/// source is past its failed attempts and the key was not valid lately; else looked up (each
/// unknown key counts a failure).
async fn lookup(
    state: &AppState,
    hash: &[u8],
    source: Option<IpAddr>,
) -> Result<Principal, ApiError> {
    const UNKNOWN: &str = "unknown, revoked or expired API key";
    if state.auth_cache.known_unknown(hash) {
        metrics::counter!("agentfleet_auth_refused_total", "reason" => "known_unknown")
            .increment(1);
        return Err(unauthorized(UNKNOWN));
    }
    let now = std::time::Instant::now();
    let attempts = state.auth_failures.as_ref().zip(source);
    // A key valid not long ago (its cache entry expired) is asked again whatever its source
    // did: behind one proxy address, a flood must not lock real clients out.
    let seen = state.auth_cache.seen(hash);
    if let Some((attempts, source)) = attempts
        && !seen
        && let Some(wait) = attempts.locked_out(source, now)
    {
        metrics::counter!("agentfleet_auth_refused_total", "reason" => "too_many_attempts")
            .increment(1);
        // Held a moment (a timer, no CPU) when there is room: a client sending one request
        // after another is slowed to a pace that leaves the process to everyone else.
        if let Ok(_held) = state.auth_delayed.try_acquire() {
            let delay = Duration::from_millis(state.settings.api.auth_lockout_delay_ms);
            tokio::time::sleep(delay.min(wait)).await;
        }
        return Err(crate::auth::attempts::locked_out(
            wait,
            "too many unknown API keys from this address; try again later (api.auth_max_failures)",
        ));
    }
    // Keys never seen valid here take turns for a few connections; the pool stays free for
    // the rest (a flood of made-up keys from many sources is bounded here).
    let _turn = if seen {
        None
    } else {
        Some(
            state
                .auth_unseen_lookups
                .acquire()
                .await
                .map_err(ApiError::unexpected)?,
        )
    };
    let found = state
        .auth_cache
        .get_or_lookup(hash, || tenants::authenticate_hash(&state.pool, hash))
        .await
        .map_err(ApiError::unexpected)?;
    match found {
        Some(principal) => Ok(principal),
        None => {
            if let Some((attempts, source)) = attempts {
                attempts.fail(source, now);
            }
            metrics::counter!("agentfleet_auth_refused_total", "reason" => "unknown").increment(1);
            Err(unauthorized(UNKNOWN))
        }
    }
}
