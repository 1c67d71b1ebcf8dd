/**
 * Requests with the key, time-outs and retries as `agentfleetctl` makes them: a request that
 * could have been carried out is sent again only when repeating it changes nothing.
 *
 * - Safe requests (`GET`, a cancel, anything sent with an `Idempotency-Key`) are retried on
 *   429, on 5xx and on network failures and time-outs.
 * - Any other request is retried only when it surely did nothing: 429 (refused before any
 *   work) and a connection that could not be made.
 *
 * The wait is the answer's `Retry-After` when it has one (at most a minute), else a backoff that
 * doubles from 250 ms up to 10 s.
 */

import { APIConnectionError, APIError, errorFromResponse, retryAfterSeconds } from "./errors.js";
import { VERSION } from "./generated/version.js";

export interface ClientOptions {
  /** The tenant's API key (`af_…`). */
  apiKey: string;
  /** The API's address; `http://127.0.0.1:8080` by default. */
  baseUrl?: string;
  /** Bounds each request until its answer is read (streams: until their head); 30 s by default. */
  timeoutMs?: number;
  /** Attempts after the first, for what may be retried; 2 by default. */
  maxRetries?: number;
  /** An event stream silent this long (keep-alives included) is reconnected; 60 s by default. */
  streamIdleTimeoutMs?: number;
  /** A streamed event (or a line of batch results) longer than this many characters is a `StreamError`; 16 MiB by default. */
  maxEventChars?: number;
  /** The secret `webhooks.verify` checks with when it is given none. */
  webhookSecret?: string;
  /** Another `fetch` (a test's, an instrumented one). */
  fetch?: typeof fetch;
}

export interface RequestOptions {
  query?: Record<string, string | number | undefined | null>;
  body?: unknown;
  headers?: Record<string, string>;
  /** Answer with the response unread (a stream); the time-out then bounds only its head. */
  stream?: boolean;
  signal?: AbortSignal;
}

// A longer Retry-After would make a call look hung; agentfleetctl caps it the same way.
const MAX_RETRY_AFTER_S = 60;

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function isSafe(method: string, path: string, headers: Record<string, string>): boolean {
  if (method === "GET" || method === "HEAD") return true;
  if (Object.keys(headers).some((h) => h.toLowerCase() === "idempotency-key")) return true;
  return method === "POST" && path.endsWith("/cancel");
}

/** A connection that was refused never carried the request. */
function surelyUnsent(error: unknown): boolean {
  const cause = (error as { cause?: { code?: string } })?.cause;
  return ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN"].includes(cause?.code ?? "");
}

export class Http {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly streamIdleTimeoutMs: number;
  readonly maxEventChars: number;
  private readonly apiKey: string;
  private readonly fetchFn: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options.apiKey) throw new TypeError("apiKey is required");
    this.apiKey = options.apiKey;
    this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.maxRetries = options.maxRetries ?? 2;
    this.streamIdleTimeoutMs = options.streamIdleTimeoutMs ?? 60_000;
    // An event of the API carries at most a message's text or a tool's (bounded) result.
    this.maxEventChars = options.maxEventChars ?? 16 * 1024 * 1024;
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  url(path: string, query?: RequestOptions["query"]): string {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    }
    return url.toString();
  }

  /** A 2xx response, or a typed error after the retries. */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.apiKey}`,
      Accept: "application/json",
      ...options.headers,
    };
    // Browsers refuse to set User-Agent; Node sends it.
    if (typeof window === "undefined") headers["User-Agent"] = `agentfleet-typescript/${VERSION}`;
    let body: string | undefined;
    if (options.body !== undefined) {
      body = JSON.stringify(options.body);
      headers["Content-Type"] = "application/json";
    }
    const safe = isSafe(method, path, headers);
    for (let attempt = 0; ; attempt++) {
      const last = attempt >= this.maxRetries;
      const controller = new AbortController();
      const onAbort = () => controller.abort(options.signal?.reason);
      options.signal?.addEventListener("abort", onAbort, { once: true });
      const timer = setTimeout(() => controller.abort(new DOMException("timed out", "TimeoutError")), this.timeoutMs);
      let wait: number;
      // A stream's body outlives this call: the caller's signal must still abort it.
      let streaming = false;
      try {
        const response = await this.fetchFn(this.url(path, options.query), {
          method,
          headers,
          body,
          signal: controller.signal,
          redirect: "manual",
        });
        if (response.ok) {
          if (options.stream) {
            streaming = true;
            return response;
          }
          // The whole answer within the time-out.
          const text = await response.text();
          return new Response(text, { status: response.status, headers: response.headers });
        }
        const transient = response.status === 429 || (response.status >= 500 && safe);
        if (!transient || last) throw await errorFromResponse(response);
        await response.body?.cancel().catch(() => undefined);
        const after = retryAfterSeconds(response.headers);
        wait = after !== undefined ? Math.min(after, MAX_RETRY_AFTER_S) * 1000 : this.backoff(attempt);
      } catch (error) {
        if (error instanceof APIError) throw error;
        if (options.signal?.aborted) throw error;
        if (last || !(safe || surelyUnsent(error))) {
          throw new APIConnectionError(`${method} ${path}: ${describe(error)}`, { cause: error });
        }
        wait = this.backoff(attempt);
      } finally {
        clearTimeout(timer);
        if (!streaming) options.signal?.removeEventListener("abort", onAbort);
      }
      await sleep(wait);
    }
  }

  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    return (await (await this.request(method, path, options)).json()) as T;
  }

  private backoff(attempt: number): number {
    return Math.min(250 * 2 ** Math.min(attempt, 16), 10_000);
  }
}

function describe(error: unknown): string {
  const e = error as { name?: string; message?: string; cause?: { code?: string; message?: string } };
  const cause = e?.cause?.code ?? e?.cause?.message;
  return [e?.name, e?.message, cause].filter(Boolean).join(": ");
}
