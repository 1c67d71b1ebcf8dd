//! `GET /openapi.json`: the API's OpenAPI document.

use axum::Json;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use agentfleet_shared::domain::{AgentSpec, Risk, RunStatus, ToolKind, ToolSpec};

use super::runs_create::CreateRun;
use super::runs_resume::{DecisionBody, ResumeBody};

#[derive(OpenApi)]
#[openapi(
    info(title = "agentfleet", description = "Runs LLM agents on a fleet of workers. Errors are `{\"error\": {\"code\", \"message\"}}`."),
    paths(
        super::runs_create::create_run,
        super::runs_batch::create_batch,
        super::runs_list::list_runs,
        super::runs_get::get_run,
        super::runs_events::run_events,
        super::runs_resume::resume_run,
        super::runs_cancel::cancel_run,
        super::runs_stream_token::issue_stream_token,
        super::threads_messages::list_messages,
        super::threads_events::thread_events,
    ),
    components(schemas(CreateRun, super::runs_batch::CreateBatch, ResumeBody, DecisionBody, AgentSpec, ToolSpec, ToolKind, Risk, RunStatus)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
