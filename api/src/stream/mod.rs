//! Event streams to SSE clients: the process's one subscription to live events (`hub`),
//! following a run's events without gap (`follow`), and the cap on streams per tenant (`slots`).

pub mod follow;
pub mod hub;
pub mod slots;
