/** `new AgentfleetClient({ apiKey, baseUrl })`: a tenant's view of the API. */

import { type BatchInput, chunks } from "./batches.js";
import type { components } from "./generated/schema.js";
import { StreamError } from "./errors.js";
import { type ClientOptions, Http, sleep } from "./http.js";
import { type RunEvent, type StreamOptions, streamRun, streamThread, type ThreadStreamOptions } from "./stream.js";
import { type VerifyOptions, type WebhookEvent, verifyWebhook } from "./webhooks.js";

type Schemas = components["schemas"];
export type Run = Schemas["Run"];
export type RunPage = Schemas["RunPage"];
export type RunStatus = Schemas["RunStatus"];
export type AgentSpec = Schemas["AgentSpec"];
export type ToolSpec = Schemas["ToolSpec"];
export type CreateRun = Schemas["CreateRun"];
export type Batch = Schemas["Batch"];
export type Message = Schemas["Message"];
export type WebhookEventName = Schemas["CreateWebhook"]["events"][number];

const id = (value: string) => encodeURIComponent(value);

/** Every id of a confirmation the run waits for (none unless it waits for one). */
function pendingCallIds(run: Run): string[] {
  const pending = run.pending as { kind?: string; tool_calls?: { tool_call_id: string }[] } | null | undefined;
  return pending?.kind === "confirmation" ? (pending.tool_calls ?? []).map((c) => c.tool_call_id) : [];
}

export class AgentfleetClient {
  readonly runs: Runs;
  readonly batches: Batches;
  readonly threads: Threads;
  readonly webhooks: Webhooks;
  readonly usage: Usage;
  /** The underlying requests (the key, retries, typed errors), for an operation this layer lacks. */
  readonly http: Http;

  constructor(options: ClientOptions) {
    this.http = new Http(options);
    this.runs = new Runs(this.http);
    this.batches = new Batches(this.http);
    this.threads = new Threads(this.http, this.runs);
    this.webhooks = new Webhooks(this.http, options.webhookSecret);
    this.usage = new Usage(this.http);
  }
}

export interface CreateRunOptions extends Omit<CreateRun, "input"> {
  /** Makes a retry answer the same run. */
  idempotencyKey?: string;
}

export class Runs {
  constructor(private readonly http: Http) {}

  /** Starts a run (202). With `idempotencyKey` a retry answers the same run. */
  create(input: string, options: CreateRunOptions): Promise<Run> {
    const { idempotencyKey, ...rest } = options;
    const headers: Record<string, string> = idempotencyKey ? { "Idempotency-Key": idempotencyKey } : {};
    return this.http.json("POST", "/v1/runs", { body: { input, ...rest } satisfies CreateRun, headers });
  }

  /** `POST /v1/runs/batch`: up to `api.max_batch_runs` runs, all or nothing. */
  createMany(runs: CreateRun[]): Promise<Schemas["BatchCreated"]> {
    return this.http.json("POST", "/v1/runs/batch", { body: { runs } satisfies Schemas["CreateBatch"] });
  }

  get(runId: string): Promise<Run> {
    return this.http.json("GET", `/v1/runs/${id(runId)}`);
  }

  /** A page of runs, newest first (`data`, `next_cursor`). */
  list(query: { status?: RunStatus; thread_id?: string; batch_id?: string; limit?: number; cursor?: string } = {}): Promise<RunPage> {
    return this.http.json("GET", "/v1/runs", { query });
  }

  /** Every matching run, newest first, page after page. */
  async *iter(query: { status?: RunStatus; thread_id?: string; batch_id?: string; limit?: number } = {}): AsyncGenerator<Run> {
    let cursor: string | undefined;
    do {
      const page = await this.list({ ...query, cursor });
      yield* page.data;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  counts(query: { thread_id?: string; batch_id?: string } = {}): Promise<Schemas["RunCounts"]> {
    return this.http.json("GET", "/v1/runs/counts", { query });
  }

  /** Repeating it on a cancelled run changes nothing. */
  cancel(runId: string): Promise<Run> {
    return this.http.json("POST", `/v1/runs/${id(runId)}/cancel`);
  }

  /** Answers the run's question (`input_required`). */
  answer(runId: string, input: string): Promise<Run> {
    return this.resume(runId, { input });
  }

  /** Approves the given tool calls, or every call the run waits for. */
  approve(runId: string, toolCallIds?: string[], reason?: string): Promise<Run> {
    return this.decide(runId, true, toolCallIds, reason);
  }

  /** Rejects the given tool calls, or every call the run waits for; the model is told `reason`. */
  reject(runId: string, toolCallIds?: string[], reason?: string): Promise<Run> {
    return this.decide(runId, false, toolCallIds, reason);
  }

  async decide(runId: string, approve: boolean, toolCallIds?: string[], reason?: string): Promise<Run> {
    const ids = toolCallIds ?? pendingCallIds(await this.get(runId));
    return this.resume(runId, { decisions: ids.map((tool_call_id) => ({ tool_call_id, approve, reason })) });
  }

  /** The raw `POST /v1/runs/{id}/resume`: `{input}` or `{decisions: [...]}`. */
  resume(runId: string, body: Schemas["ResumeRequest"]): Promise<Run> {
    return this.http.json("POST", `/v1/runs/${id(runId)}/resume`, { body });
  }

  /** A token for a browser's `EventSource` (`url`). */
  streamToken(runId: string): Promise<Schemas["StreamToken"]> {
    return this.http.json("POST", `/v1/runs/${id(runId)}/stream-token`);
  }

  /**
   * Every event of the run after `after`, exactly once and in order, until it ends (or, with
   * `stopAtPause`, pauses). A broken connection is resumed with `Last-Event-ID`; at a pause
   * the iterator waits for the resume (answer or decide from the loop).
   */
  stream(runId: string, options: StreamOptions = {}): AsyncGenerator<RunEvent> {
    return streamRun(this.http, runId, options);
  }
}

export interface BatchSubmission {
  /** One batch per chunk, in order. */
  batches: Batch[];
  /** Whether each was created now (false: an earlier submission had made it). */
  created: boolean[];
  total: number;
}

export interface CreateBatchOptions {
  /** Items per `POST /v1/batches` (within `api.max_batch_items`); 1000 by default. */
  chunkSize?: number;
  metadata?: Record<string, unknown>;
  /** Mixed into the idempotency keys: the same items under another label make new runs. */
  label?: string;
  /** Called after each chunk with the items submitted so far. */
  onProgress?: (submitted: number) => void;
}

export class Batches {
  constructor(private readonly http: Http) {}

  /**
   * Submits the runs of `items` (read lazily, sync or async) as one batch per `chunkSize`
   * items, each under an idempotency key of its content: submitting the same items again
   * creates nothing twice.
   */
  async create(items: Iterable<BatchInput> | AsyncIterable<BatchInput>, options: CreateBatchOptions = {}): Promise<BatchSubmission> {
    const out: BatchSubmission = { batches: [], created: [], total: 0 };
    for await (const chunk of chunks(items, options.chunkSize ?? 1000, options.metadata, options.label)) {
      const response = await this.http.request("POST", "/v1/batches", {
        body: chunk.body,
        headers: { "Idempotency-Key": chunk.key },
      });
      out.batches.push((await response.json()) as Batch);
      out.created.push(response.status === 202);
      out.total += chunk.body.runs.length;
      options.onProgress?.(out.total);
    }
    return out;
  }

  get(batchId: string): Promise<Batch> {
    return this.http.json("GET", `/v1/batches/${id(batchId)}`);
  }

  list(query: { limit?: number; before?: string } = {}): Promise<Schemas["BatchPage"]> {
    return this.http.json("GET", "/v1/batches", { query });
  }

  /** Nothing more is created; runs not yet ended are cancelled. */
  cancel(batchId: string): Promise<Batch> {
    return this.http.json("POST", `/v1/batches/${id(batchId)}/cancel`);
  }

  /** One object per item in submission order: `custom_id`, `run_id`, `status`, `output`, `error`. */
  async *results(batchId: string, options: { finishedOnly?: boolean } = {}): AsyncGenerator<BatchResult> {
    const query = options.finishedOnly ? { status: "finished" } : {};
    const response = await this.http.request("GET", `/v1/batches/${id(batchId)}/results`, { query, stream: true });
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += value ?? "";
      const lines = buffer.split("\n");
      buffer = done ? "" : lines.pop()!;
      if (buffer.length > this.http.maxEventChars) throw new StreamError(`a result line longer than ${this.http.maxEventChars} characters`);
      for (const line of lines) if (line.trim()) yield JSON.parse(line) as BatchResult;
      if (done) return;
    }
  }

  /** Polls the batches until each is completed or cancelled; `onProgress(batches)` after each look. */
  async wait(batchIds: string[], options: { pollMs?: number; timeoutMs?: number; onProgress?: (batches: Batch[]) => void } = {}): Promise<Batch[]> {
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const batches = await Promise.all(batchIds.map((b) => this.get(b)));
      options.onProgress?.(batches);
      if (batches.every((b) => b.status === "completed" || b.status === "cancelled")) return batches;
      if (Date.now() >= deadline) throw new Error(`batches not finished within ${options.timeoutMs} ms`);
      await sleep(options.pollMs ?? 1000);
    }
  }
}

export interface BatchResult {
  custom_id: string;
  run_id: string | null;
  status: string;
  output: string | null;
  error: { code: string; message: string } | null;
}

export class Threads {
  constructor(private readonly http: Http, private readonly runs: Runs) {}

  /** A page of the thread's messages, oldest first (`data`, `next_after`). */
  messages(threadId: string, query: { after?: number; limit?: number } = {}): Promise<Schemas["MessagePage"]> {
    return this.http.json("GET", `/v1/threads/${id(threadId)}/messages`, { query });
  }

  /** Every message of the thread, oldest first, page after page. */
  async *iterMessages(threadId: string, query: { limit?: number } = {}): AsyncGenerator<Message> {
    let after: number | undefined;
    do {
      const page = await this.messages(threadId, { ...query, after });
      yield* page.data;
      after = page.next_after ?? undefined;
    } while (after !== undefined);
  }

  /**
   * The events of the thread's runs, one run after another, each exactly once; it stays open
   * for the next run until the caller stops (`break`, or `signal`). Resume with
   * `lastEventId` set to an event's `run_id` and `id` joined by a colon.
   */
  stream(threadId: string, options: ThreadStreamOptions = {}): AsyncGenerator<RunEvent> {
    return streamThread(this.http, threadId, options);
  }

  /** The thread's runs, newest first. */
  runsOf(threadId: string): AsyncGenerator<Run> {
    return this.runs.iter({ thread_id: threadId });
  }
}

export class Webhooks {
  constructor(private readonly http: Http, private readonly secret?: string) {}

  /** Registers an endpoint; the answer's `secret` is shown only this once. */
  create(body: Schemas["CreateWebhook"]): Promise<Schemas["WebhookCreated"]> {
    return this.http.json("POST", "/v1/webhooks", { body });
  }

  list(): Promise<Schemas["WebhookList"]> {
    return this.http.json("GET", "/v1/webhooks");
  }

  get(webhookId: string): Promise<Schemas["Endpoint"]> {
    return this.http.json("GET", `/v1/webhooks/${id(webhookId)}`);
  }

  delete(webhookId: string): Promise<Schemas["Endpoint"]> {
    return this.http.json("DELETE", `/v1/webhooks/${id(webhookId)}`);
  }

  deliveries(webhookId: string, query: { limit?: number; cursor?: string } = {}): Promise<Schemas["DeliveryPage"]> {
    return this.http.json("GET", `/v1/webhooks/${id(webhookId)}/deliveries`, { query });
  }

  retryDelivery(webhookId: string, deliveryId: string): Promise<Schemas["DeliveryInfo"]> {
    return this.http.json("POST", `/v1/webhooks/${id(webhookId)}/deliveries/${id(deliveryId)}/retry`);
  }

  rotateSecret(webhookId: string, secret?: string): Promise<Schemas["WebhookCreated"]> {
    return this.http.json("POST", `/v1/webhooks/${id(webhookId)}/rotate-secret`, { body: secret ? { secret } : {} });
  }

  /**
   * The delivery's JSON if it is signed with `secret` (or the client's `webhookSecret`); throws
   * `WebhookVerificationError` otherwise. Pass the body exactly as received.
   */
  verify(headers: Parameters<typeof verifyWebhook>[1], body: string | Uint8Array, options: VerifyOptions & { secret?: string } = {}): Promise<WebhookEvent> {
    const secret = options.secret ?? this.secret;
    if (!secret) throw new TypeError("no webhook secret: pass { secret } or webhookSecret to the client");
    return verifyWebhook(secret, headers, body, options);
  }
}

export class Usage {
  constructor(private readonly http: Http) {}

  /** The tenant's usage per UTC day, `from` to `to` (`YYYY-MM-DD`; the last 30 days by default). */
  get(query: { from?: string; to?: string } = {}): Promise<Schemas["UsageReport"]> {
    return this.http.json("GET", "/v1/usage", { query });
  }
}
