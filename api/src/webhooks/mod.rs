//! Sending webhook deliveries: the deliverer task of every API replica and the Standard
//! Webhooks signature of each attempt. The endpoints that register them are `routes::webhooks`.

pub mod deliverer;
pub mod signing;
