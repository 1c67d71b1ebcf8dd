//! Who is calling: the API key of every `/v1` request (checked, cached, dropped from the cache
//! when an operator changes it, its last use noted) and the stream tokens of browsers.

pub mod cache;
pub mod caller;
pub mod invalidation;
pub mod key_usage;
pub mod stream_token;
