//! Sending webhook deliveries: the deliverer task of every API replica, the Standard Webhooks
//! signature of each attempt, and the start-up step sealing secrets still stored plain. The endpoints that register them are `routes::webhooks`.

pub mod deliverer;
pub mod sealing;
pub mod signing;
