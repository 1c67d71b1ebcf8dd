//! Who is calling: the API key of every `/v1` request (checked, cached, dropped from the cache
//! when an operator changes it, its last use noted) and the stream tokens of browsers; failed
//! authentications counted per source (`/v1` keys and the admin token alike).

pub mod attempts;
pub mod cache;
pub mod caller;
pub mod invalidation;
pub mod key_usage;
pub mod stream_token;
