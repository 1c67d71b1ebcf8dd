//! `/v1/batches`: one file per endpoint (`get.rs` also makes every answer of a batch); the work
//! after the answer is `crate::batch_driver`'s.

pub mod cancel;
pub mod create;
pub mod events;
pub mod get;
pub mod list;
pub mod results;
