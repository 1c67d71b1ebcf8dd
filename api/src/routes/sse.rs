//! The event streams' shapes in the OpenAPI document: each Server-Sent Event as schemathesis
//! and browsers read it (`id`, `event`, `data`), its data a JSON envelope (docs/events.md). The
//! streams themselves are written by `runs::events`, `threads::events` and `batches::events`.

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use agentfleet_shared::domain::schema::keyword;

/// Every event type (docs/events.md); the match fails to compile when a type is added.
pub fn event_types() -> Vec<&'static str> {
    use agentfleet_shared::events::EventType as E;
    let all = [
        E::RunQueued,
        E::RunStarted,
        E::IterationStarted,
        E::MessageDelta,
        E::MessageCompleted,
        E::ToolStarted,
        E::ToolCompleted,
        E::InputRequired,
        E::ConfirmationRequired,
        E::RunResumed,
        E::RunRecovered,
        E::RunCompleted,
        E::RunFailed,
        E::RunCancelled,
        E::StreamRebuilt,
        E::ContextCompacted,
        E::PlanCreated,
        E::TaskCompleted,
        E::RoundCompleted,
    ];
    for e in all {
        match e {
            E::RunQueued
            | E::RunStarted
            | E::IterationStarted
            | E::MessageDelta
            | E::MessageCompleted
            | E::ToolStarted
            | E::ToolCompleted
            | E::InputRequired
            | E::ConfirmationRequired
            | E::RunResumed
            | E::RunRecovered
            | E::RunCompleted
            | E::RunFailed
            | E::RunCancelled
            | E::StreamRebuilt
            | E::ContextCompacted
            | E::PlanCreated
            | E::TaskCompleted
            | E::RoundCompleted => {}
        }
    }
    all.iter().map(|e| e.as_str()).collect()
}

/// One event: `id` as `Last-Event-ID` takes it back (`id_pattern`), `event` one of `events`,
/// `data` JSON of the schema `data` names. (Comments, the `retry` hint and keep-alives carry
/// no data.)
fn sse_event(id_pattern: Option<&str>, events: Vec<&str>, data: &str) -> RefOr<Schema> {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let content = keyword(
        string().content_media_type("application/json"),
        "contentSchema",
        json!({"$ref": format!("#/components/schemas/{data}")}),
    );
    let mut event = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("event", string().enum_values(Some(events)))
        .property("data", content)
        .property(
            "retry",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .required("event")
        .required("data");
    if let Some(pattern) = id_pattern {
        event = event
            .property("id", string().pattern(Some(pattern)))
            .required("id");
    }
    event.into()
}

const UUID: &str = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";

macro_rules! sse_schema {
    ($(#[$doc:meta])* $name:ident, $schema:expr, $($dep:ty),*) => {
        $(#[$doc])*
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }

            #[allow(unused_variables)]
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                $(
                    schemas.push((<$dep>::name().into(), <$dep>::schema()));
                    <$dep>::schemas(schemas);
                )*
            }
        }
    };
}

sse_schema!(
    /// An event of `GET /v1/runs/{id}/events`: its id is the event's.
    RunEvent,
    sse_event(Some("^[0-9]+$"), event_types(), "EventEnvelope"),
    EventEnvelope
);

sse_schema!(
    /// An event of `GET /v1/threads/{id}/events`: its id is `<run_id>:<event id>`.
    ThreadEvent,
    sse_event(Some(&format!("^{UUID}:[0-9]+$")), event_types(), "EventEnvelope"),
    EventEnvelope
);

sse_schema!(
    /// An event of `GET /v1/batches/{id}/events`: the batch as it is now.
    BatchEvent,
    sse_event(None, vec!["progress", "batch_completed"], "Batch"),
    crate::routes::view::Batch
);

sse_schema!(
    /// The JSON of every event (docs/events.md).
    EventEnvelope,
    {
        let uuid = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                    utoipa::openapi::KnownFormat::Uuid,
                )))
        };
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .description(Some("Gap-free from 1 within the run")),
            )
            .property("run_id", uuid())
            .property("thread_id", uuid())
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(event_types())),
            )
            .property(
                "at",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                        utoipa::openapi::KnownFormat::DateTime,
                    ))),
            )
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
                    .description(Some("Per type: see docs/events.md")),
            )
            .required("id")
            .required("run_id")
            .required("thread_id")
            .required("type")
            .required("at")
            .required("data")
            .into()
    },
);
