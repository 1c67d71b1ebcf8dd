//! agentfleet's test support: the scripted OpenAI-compatible LLM server, a tool server, an
//! OTLP trace collector, and the harness the end-to-end tests, the demo and the benchmark share.

pub mod cut_proxy;
pub mod harness;
pub mod mcp_server;
pub mod mock_llm;
pub mod otlp_collector;
pub mod stall_proxy;
pub mod tool_server;
pub mod webhook_receiver;
