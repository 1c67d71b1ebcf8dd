/**
 * @agentfleet/client: a typed client for the agentfleet HTTP API, for Node (20+) and browsers.
 * The types are generated from the API's OpenAPI document (`components`, `paths`); this layer
 * adds retries, typed errors, resumable event streams, chunked batches and webhook verification.
 */

export {
  AgentfleetClient,
  type AgentSpec,
  type Batch,
  type BatchResult,
  type BatchSubmission,
  type CreateBatchOptions,
  type CreateRun,
  type CreateRunOptions,
  type Message,
  type Run,
  type RunPage,
  type RunStatus,
  type ToolSpec,
  type WebhookEventName,
} from "./client.js";
export { type BatchInput } from "./batches.js";
export * from "./errors.js";
export type { components, operations, paths } from "./generated/schema.js";
export { VERSION } from "./generated/version.js";
export type { ClientOptions } from "./http.js";
export { type EventType, PAUSES, type RunEvent, type StreamOptions, TERMINAL, type ThreadStreamOptions } from "./stream.js";
export { type VerifyOptions, type WebhookEvent, verifyWebhook } from "./webhooks.js";
