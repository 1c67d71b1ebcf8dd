//! End-to-end tests against real Postgres, RabbitMQ and Redis. One binary, several modules.

mod api_contract;
mod batches;
mod chaos;
mod combined;
mod ctl;
mod double_texting;
mod fairness;
mod faults;
mod foundation;
mod hostile;
mod keys;
mod limits;
mod outages;
mod pause_resume;
mod resilience;
mod startup;
mod streams;
mod tenancy;
mod usage;
mod validation;
mod webhooks;
