//! `/v1/threads/{id}/…`: a thread's messages and its event stream.

pub mod events;
pub mod messages;
