//! `/v1/webhooks`: registering endpoints and reading their deliveries, one file per endpoint;
//! the deliveries themselves are sent by `crate::webhooks`.

pub mod create;
pub mod delete;
pub mod deliveries;
pub mod get;
pub mod list;
pub mod retry;
pub mod rotate;
