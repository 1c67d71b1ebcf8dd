//! The HTTP client of tool calls, held to the egress policy. It lives in
//! `agentfleet_shared::egress_client` since the API's webhook deliveries use the same one.

pub use agentfleet_shared::egress_client::{client, is_denied};
