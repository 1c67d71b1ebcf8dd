//! Admin API, keys: one file per endpoint; `expiry.rs` is the expiry that creating and rotating
//! a key take.

pub mod create;
pub mod expiry;
pub mod get;
pub mod list;
pub mod revoke;
pub mod rotate;
