//! Admission of request bodies, so that what one API process reads and parses at once stays
//! within its memory whatever clients send.
//!
//! A body is held whole while it is parsed and checked (and a batch's items again while they
//! are written), which takes several times its size. Two bounds, checked after the key and
//! before the body is read:
//!
//! - **A byte budget per process** (`api.body_budget_bytes`). A request counts its
//!   `Content-Length`, or its route's body limit when it sends none, from before its body is
//!   read until it is answered; one that would pass the budget is answered 503 `overloaded`
//!   with `Retry-After` at once, without reading anything (waiting would hold the connection
//!   and its buffers all the same).
//! - **Large bodies per tenant** (`api.max_large_bodies_per_tenant`): bodies over
//!   `api.max_body_bytes`, which only `POST /v1/batches` accepts, in flight per tenant on this
//!   process; one more is 429 `too_many_large_requests`, so one tenant cannot hold the whole
//!   budget.
//!
//! Both are per process: each replica admits its own share, and a client refused by one may
//! find another free (`Retry-After` says when to try again).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use agentfleet_shared::config::ApiSettings;
use agentfleet_shared::store::tenants::Principal;
use agentfleet_shared::tenant_tally::{self, TenantTally};

use crate::error::ApiError;

/// The budget is kept in KiB, so that a semaphore's `u32` permits can count any budget.
const UNIT: usize = 1024;

/// What `Retry-After` says to a refused request: bodies in flight end within a request's
/// time, usually far sooner.
const RETRY_AFTER_SECS: u64 = 1;

pub struct Admission {
    budget: Arc<Semaphore>,
    budget_bytes: usize,
    /// Bodies over this many bytes are large.
    large_over: usize,
    max_large: usize,
    /// Bodies the batch route may carry; every other route carries `large_over` at most.
    batch_limit: usize,
    large: TenantTally,
}

/// What an admitted request holds until it is answered.
pub struct Held {
    _bytes: OwnedSemaphorePermit,
    _large: Option<tenant_tally::Held>,
}

/// Why a request was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The process holds as many body bytes as its budget allows.
    Budget,
    /// The tenant has `api.max_large_bodies_per_tenant` large bodies in flight here.
    LargeBodies,
}

impl Admission {
    pub fn new(api: &ApiSettings) -> Arc<Admission> {
        let units = api
            .body_budget_bytes
            .div_ceil(UNIT)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Admission {
            budget: Arc::new(Semaphore::new(units)),
            budget_bytes: api.body_budget_bytes,
            large_over: api.max_body_bytes,
            max_large: api.max_large_bodies_per_tenant,
            batch_limit: api.max_batch_body_bytes,
            large: TenantTally::default(),
        })
    }

    /// The bytes a request is charged: its declared length, or its route's limit when it
    /// declares none, never more than that limit (a longer body is refused as it is read).
    pub fn charge(&self, method: &Method, path: &str, declared: Option<usize>) -> usize {
        let limit = if path == "/v1/batches" {
            self.batch_limit
        } else {
            self.large_over
        };
        match declared {
            Some(n) => n.min(limit),
            // Requests of these methods carry no body the API reads.
            None if matches!(*method, Method::GET | Method::HEAD | Method::DELETE) => 0,
            None => limit,
        }
    }

    /// Admits `bytes` of `tenant`'s request body, or says why not.
    pub fn admit(&self, tenant: Uuid, bytes: usize) -> Result<Option<Held>, Refused> {
        if bytes == 0 {
            return Ok(None);
        }
        let large = if bytes > self.large_over {
            let slot = self.large.take(tenant, 1, self.max_large as u64);
            Some(slot.ok_or(Refused::LargeBodies)?)
        } else {
            None
        };
        let units = bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS) as u32;
        // A refusal drops `large`, which gives its slot back.
        let bytes = self
            .budget
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| Refused::Budget)?;
        Ok(Some(Held {
            _bytes: bytes,
            _large: large,
        }))
    }

    /// Body bytes held now (for the gauge).
    fn held_bytes(&self) -> usize {
        let free = self.budget.available_permits() * UNIT;
        self.budget_bytes.saturating_sub(free)
    }
}

/// Middleware of the keyed `/v1` routes, after the key (it needs the tenant) and before the
/// handler reads the body.
pub async fn admit_body(
    State(admission): State<Arc<Admission>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(tenant) = req.extensions().get::<Principal>().map(|p| p.tenant_id) else {
        return Ok(next.run(req).await);
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let bytes = admission.charge(req.method(), req.uri().path(), declared);
    let held = match admission.admit(tenant, bytes) {
        Ok(held) => held,
        Err(refused) => {
            discard(req.into_body(), bytes).await;
            return Err(refusal(&admission, refused));
        }
    };
    metrics::gauge!("agentfleet_api_body_bytes_held").set(admission.held_bytes() as f64);
    let response = next.run(req).await;
    drop(held);
    metrics::gauge!("agentfleet_api_body_bytes_held").set(admission.held_bytes() as f64);
    Ok(response)
}

/// Reads a refused request's body and drops it chunk by chunk, up to `limit` bytes (its
/// route's limit at most): answering before the client has sent its body would close the
/// connection under it, and the client would see a broken pipe instead of the answer. This
/// holds one chunk at a time, never the body; `api.request_timeout_ms` bounds a slow sender.
async fn discard(body: axum::body::Body, limit: usize) {
    let mut chunks = body.into_data_stream();
    let mut read = 0usize;
    while let Some(Ok(chunk)) = chunks.next().await {
        read = read.saturating_add(chunk.len());
        if read > limit {
            break;
        }
    }
}

fn refusal(admission: &Admission, refused: Refused) -> ApiError {
    let (status, code, reason, message) = match refused {
        Refused::Budget => (
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "body_budget",
            format!(
                "this API process is reading as many request bodies as it may at once \
                 ({} bytes, api.body_budget_bytes); retry after Retry-After",
                admission.budget_bytes
            ),
        ),
        Refused::LargeBodies => (
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_large_requests",
            "large_bodies",
            format!(
                "this tenant already has {} request(s) larger than {} bytes in flight on this API \
                 process (api.max_large_bodies_per_tenant); retry after Retry-After",
                admission.max_large, admission.large_over
            ),
        ),
    };
    metrics::counter!("agentfleet_requests_limited_total", "reason" => reason).increment(1);
    ApiError {
        retry_after_secs: Some(RETRY_AFTER_SECS),
        ..ApiError::new(status, code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(budget: usize, max_large: usize) -> Arc<Admission> {
        Arc::new(Admission {
            budget: Arc::new(Semaphore::new(budget / UNIT)),
            budget_bytes: budget,
            large_over: 10 * UNIT,
            max_large,
            batch_limit: 100 * UNIT,
            large: TenantTally::default(),
        })
    }

    #[test]
    fn a_request_is_charged_its_length_or_its_routes_limit() {
        let a = admission(1000 * UNIT, 1);
        assert_eq!(a.charge(&Method::POST, "/v1/runs", Some(5)), 5);
        assert_eq!(a.charge(&Method::POST, "/v1/runs", None), 10 * UNIT);
        assert_eq!(
            a.charge(&Method::POST, "/v1/runs", Some(usize::MAX)),
            10 * UNIT
        );
        assert_eq!(a.charge(&Method::POST, "/v1/batches", None), 100 * UNIT);
        assert_eq!(a.charge(&Method::GET, "/v1/batches", None), 0);
    }

    #[test]
    fn the_budget_and_each_tenants_large_bodies_are_bounded_and_given_back() {
        let a = admission(250 * UNIT, 2);
        let (t1, t2) = (Uuid::now_v7(), Uuid::now_v7());
        let first = a.admit(t1, 100 * UNIT).unwrap();
        let second = a.admit(t1, 100 * UNIT).unwrap();
        assert_eq!(
            a.admit(t1, 11 * UNIT).err(),
            Some(Refused::LargeBodies),
            "the tenant's third large body"
        );
        assert_eq!(a.admit(t2, 100 * UNIT).err(), Some(Refused::Budget));
        assert!(a.admit(t2, UNIT).unwrap().is_some(), "small bodies fit");
        assert_eq!(
            a.large.snapshot(),
            vec![(t1, 2)],
            "a refusal gives its large slot back"
        );
        drop(first);
        assert!(a.admit(t2, 100 * UNIT).unwrap().is_some());
        drop(second);
        assert!(a.large.is_empty());
        assert!(a.admit(t1, 0).unwrap().is_none(), "no body, no charge");
    }
}
