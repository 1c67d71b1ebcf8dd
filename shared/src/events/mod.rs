//! Run events: the envelope every event shares (docs/events.md) and the Redis event bus that stores and announces them.
//!
//! Each event's `id` is the length of the run's list after the append. One Lua script computes
//! it, appends and publishes atomically, so ids are gap-free whatever the number of writers, and
//! it refuses writers whose fencing token is older than the newest one seen for the run: a worker
//! that lost its lease cannot slip events into a stream another worker now owns.
//!
//! Every call goes over one shared connection per process ([`redis_connection`]): a multiplexed
//! connection pipelines the commands of all tasks, so an append is one round trip, and it is
//! re-made in the background when it breaks. Each call is bounded by `redis.timeout_ms`.

mod bus;
mod connection;
mod envelope;
mod erasure;
mod keys;
mod pack;

pub use bus::*;
pub use connection::*;
pub use envelope::*;
pub use keys::*;
pub use pack::{Packed, pack, unpack};

#[cfg(test)]
mod tests;
