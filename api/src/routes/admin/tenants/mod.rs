//! Admin API, tenants: one file per endpoint; `view.rs` is the tenant as they answer it.

pub mod create;
pub mod erase;
pub mod erasure;
pub mod get;
pub mod limits;
pub mod list;
pub mod resume;
pub mod retention;
pub mod suspend;
pub mod view;
