//! `/v1/batches`: one file per endpoint (`get.rs` serves one batch and the list); the work
//! after the answer is `crate::batch_driver`'s.

pub mod cancel;
pub mod create;
pub mod events;
pub mod get;
pub mod results;
