//! `/v1/runs`: one file per endpoint (`create.rs` is `POST /v1/runs`, `batch.rs`
//! `POST /v1/runs/batch`, `list.rs` the list and its cursor).

pub mod batch;
pub mod cancel;
pub mod counts;
pub mod create;
pub mod events;
pub mod get;
pub mod list;
pub mod resume;
pub mod stream_token;
pub mod tasks;
