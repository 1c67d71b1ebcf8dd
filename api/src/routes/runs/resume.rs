//! `POST /v1/runs/{id}/resume`: `{"input": "..."}` answers a question (or continues a run
//! paused on its tenant's token budget); `{"decisions": [...]}` settles pending confirmations. The run goes back to `queued`, `run_resumed` is appended,
//! the list loses its expiry, and the run is published for whichever worker is free.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use agentfleet_shared::events::{EventType, Expiry, Floor, NewEvent, pending_event, resume_fence};
use agentfleet_shared::store::transitions::{self, Decision, ResumeError, ResumeInput};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

/// Exactly one of `input` (answers a question, or continues after a budget pause) or
/// `decisions` (settles confirmations).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(max_properties = 1)]
pub struct ResumeBody {
    /// Answers a question: not blank, no NUL, at most `api.max_input_bytes` bytes.
    #[serde(default)]
    #[schema(schema_with = answer)]
    input: Option<String>,
    /// Settles every pending confirmation.
    #[serde(default)]
    #[schema(schema_with = decisions)]
    decisions: Option<Vec<DecisionBody>>,
}

/// The request body of a resume: a [`ResumeBody`] with one property, exactly (its two fields
/// and no other). utoipa writes a struct's `min_properties` as `maxProperties`, hence the
/// `allOf` here and `max_properties` on the struct.
pub struct ResumeRequest;

impl utoipa::PartialSchema for ResumeRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Ref, SchemaType};
        AllOfBuilder::new()
            .item(Ref::from_schema_name("ResumeBody"))
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::AnyValue)
                    .min_properties(Some(1)),
            )
            .into()
    }
}

impl utoipa::ToSchema for ResumeRequest {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("ResumeBody".into(), ResumeBody::schema()));
        <ResumeBody as utoipa::ToSchema>::schemas(schemas);
    }
}

fn decisions() -> utoipa::openapi::schema::ArrayBuilder {
    crate::schema::non_empty_list(utoipa::openapi::schema::Ref::from_schema_name(
        "DecisionBody",
    ))
    .description(Some("Settles every pending confirmation"))
}

fn answer() -> utoipa::openapi::schema::ObjectBuilder {
    crate::schema::user_text().description(Some(
        "Answers a question (or continues after a budget pause): not blank, no NUL, at most `api.max_input_bytes` bytes",
    ))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    #[schema(pattern = "^[^\u{0}]*$")]
    tool_call_id: String,
    approve: bool,
    /// Why; at most `api.max_input_bytes` bytes.
    #[serde(default)]
    #[schema(pattern = "^[^\u{0}]*$")]
    reason: Option<String>,
}

impl From<ResumeError> for ApiError {
    fn from(e: ResumeError) -> ApiError {
        let unprocessable =
            |code, msg: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, msg);
        match e {
            ResumeError::NotFound => ApiError::not_found("run"),
            ResumeError::NotWaiting(status) => ApiError::new(
                StatusCode::CONFLICT,
                "run_not_waiting",
                format!("run is {status}; only a waiting run can be resumed"),
            ),
            ResumeError::WrongInput { expected } => unprocessable(
                "invalid_request",
                format!("the run is waiting for {expected}"),
            ),
            ResumeError::MissingDecisions(ids) => unprocessable(
                "missing_decisions",
                format!(
                    "decisions: every pending call needs a decision; missing: {}",
                    ids.join(", ")
                ),
            ),
            ResumeError::UnknownToolCalls(ids) => unprocessable(
                "unknown_tool_call",
                format!("decisions: not awaiting a decision: {}", ids.join(", ")),
            ),
            ResumeError::DuplicateDecision(id) => unprocessable(
                "invalid_request",
                format!("decisions: `{id}` is decided twice"),
            ),
            ResumeError::Store(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(post, path = "/v1/runs/{id}/resume", tag = "runs", operation_id = "resume_run", params(("id" = uuid::Uuid, Path, description = "The run")), request_body = ResumeRequest,
    responses((status = 202, description = "The run, queued again", body = view::Run),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`run_not_waiting`: the run is not waiting", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request`, `missing_decisions` or `unknown_tool_call`", body = crate::routes::view::ErrorBody)))]
pub async fn resume_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    JsonBody(body): JsonBody<ResumeBody>,
) -> Result<(StatusCode, Json<view::Run>), ApiError> {
    crate::suspension::require_active(&caller)?;
    let run_id = id;
    let input = match (body.input, body.decisions) {
        (Some(text), None) => {
            validate::user_text("input", &text, state.settings.api.max_input_bytes)?;
            ResumeInput::Answer(text)
        }
        (None, Some(decisions)) => {
            if decisions.is_empty() {
                return Err(ApiError::invalid("decisions", "must not be empty"));
            }
            let max = state.settings.api.max_input_bytes;
            for (i, d) in decisions.iter().enumerate() {
                if d.reason.as_ref().is_some_and(|r| r.len() > max) {
                    return Err(ApiError::invalid(
                        &format!("decisions[{i}].reason"),
                        format!("longer than {max} bytes"),
                    ));
                }
            }
            ResumeInput::Decisions(
                decisions
                    .into_iter()
                    .map(|d| Decision {
                        tool_call_id: d.tool_call_id,
                        approve: d.approve,
                        reason: d.reason,
                    })
                    .collect(),
            )
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "send exactly one of `input` or `decisions`",
            ));
        }
    };
    let resumed =
        transitions::resume(&state.pool, caller.tenant_id, run_id, input, caller.key_id).await?;
    metrics::counter!("agentfleet_runs_resumed_total").increment(1);
    let run = &resumed.run;
    let fence = resume_fence(resumed.paused_attempt);
    // The pausing worker appends its pausing event just after its commit. Give it a moment;
    // if it died in between, append that event on its behalf so the stream has no hole. The
    // resume token fences the paused holder out from here on.
    let expected = run.last_event_id as u64;
    let present = wait_until_len(&state, run_id, expected, Duration::from_secs(2)).await;
    if !present {
        let (kind, data) = pending_event(&resumed.pending);
        let ev = NewEvent {
            run_id,
            thread_id: run.thread_id,
            kind,
            data: &data,
        };
        if let Err(e) = state
            .bus
            .append(
                ev,
                fence,
                Floor::Recorded(expected.saturating_sub(1)),
                Expiry::Keep,
            )
            .await
        {
            tracing::warn!(%run_id, error = %e, "could not append the missing pausing event");
        }
    }
    let data = json!({"kind": resumed.pending.get("kind")});
    let ev = NewEvent {
        run_id,
        thread_id: run.thread_id,
        kind: EventType::RunResumed,
        data: &data,
    };
    if let Err(e) = state
        .bus
        .append(ev, fence, Floor::Recorded(expected), Expiry::Persist)
        .await
    {
        tracing::warn!(%run_id, error = %e, "could not append run_resumed");
    }
    if run.held {
        // Its tenant has a running limit: the run waits its turn like a new one.
        crate::fair_dispatch::dispatch_and_publish(&state, run.tenant_id).await;
    } else if let Err(e) = state.publisher.publish_run(run_id).await {
        tracing::warn!(%run_id, error = %e, "publish failed; the sweeper will re-enqueue");
    }
    Ok((StatusCode::ACCEPTED, Json(view::run(run))))
}

async fn wait_until_len(state: &AppState, run_id: uuid::Uuid, len: u64, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        match state.bus.len(run_id).await {
            Ok(n) if n >= len => return true,
            Err(_) => return true, // Redis is down: nothing to repair now.
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
