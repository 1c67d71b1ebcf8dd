/**
 * Following a run's events (`GET /v1/runs/{id}/events`) across reconnections.
 *
 * The API replays what comes after `Last-Event-ID` and then follows the run live, without gap
 * or duplicate; it ends a response after a terminal event, and after a pause that is the run's
 * newest event (then a reconnection waits, with keep-alives, for the resume). So this
 * reconnects whenever a response ends before the run did, sending the id of the last event it
 * yielded, and drops any event at or below it: a caller gets every event exactly once, in
 * order, until `run_completed`, `run_failed` or `run_cancelled`.
 */

import { createParser, type EventSourceMessage, type ParseError } from "eventsource-parser";

import { APIError, StreamError } from "./errors.js";
import type { components } from "./generated/schema.js";
import { type Http, sleep } from "./http.js";

export type EventType = components["schemas"]["EventEnvelope"]["type"];

/** One event of a run (docs/events.md): the envelope, `data` per `type`. */
export interface RunEvent extends Omit<components["schemas"]["EventEnvelope"], "type" | "data"> {
  /** An `EventType`, or the name of a type newer than this library. */
  type: EventType | (string & {});
  data: Record<string, any>;
}

export const TERMINAL: ReadonlySet<string> = new Set(["run_completed", "run_failed", "run_cancelled"]);
export const PAUSES: ReadonlySet<string> = new Set(["input_required", "confirmation_required"]);

export interface StreamOptions {
  /** Only the events after this id (0: from the first). */
  after?: number;
  /** End at a pause (`input_required`, `confirmation_required`) instead of waiting for the resume. */
  stopAtPause?: boolean;
  /** Failed reconnections in a row before giving up with a `StreamError`; 10 by default. */
  maxReconnects?: number;
  signal?: AbortSignal;
}

function parseEvent(data: string): RunEvent {
  try {
    const event = JSON.parse(data) as RunEvent;
    if (!Number.isInteger(event.id) || typeof event.type !== "string") throw new Error("no id or type");
    return event;
  } catch (error) {
    throw new StreamError(`a malformed event: ${String(error)}`, { cause: error });
  }
}

/** Where a stream is: what to send as `Last-Event-ID`, which events to yield, when to stop. */
interface Cursor {
  path: string;
  lastEventId(): string | undefined;
  /** Whether `event` is new (then it is where the stream is). */
  advance(event: RunEvent): boolean;
  /** Whether the stream ends after `event`. */
  endsAfter(event: RunEvent): boolean;
}

export function streamRun(http: Http, runId: string, options: StreamOptions = {}): AsyncGenerator<RunEvent> {
  let last = options.after ?? 0;
  return follow(http, options, {
    path: `/v1/runs/${encodeURIComponent(runId)}/events`,
    lastEventId: () => (last ? String(last) : undefined),
    advance: (event) => {
      if (event.id <= last) return false;
      last = event.id;
      return true;
    },
    endsAfter: (event) => TERMINAL.has(event.type) || (!!options.stopAtPause && PAUSES.has(event.type)),
  });
}

export interface ThreadStreamOptions extends Omit<StreamOptions, "after" | "stopAtPause"> {
  /** Resume after this event: `${event.run_id}:${event.id}`. */
  lastEventId?: string;
}

/**
 * A thread's runs one after another (`GET /v1/threads/{id}/events`): SSE ids are
 * `<run_id>:<event id>`, and the stream stays open for the thread's next run until the caller
 * stops (`break`, or `signal`).
 */
export function streamThread(http: Http, threadId: string, options: ThreadStreamOptions = {}): AsyncGenerator<RunEvent> {
  let run: string | undefined;
  let last = 0;
  if (options.lastEventId) {
    const match = /^(.+):(\d+)$/.exec(options.lastEventId);
    if (!match) throw new RangeError("lastEventId must be `<run_id>:<event id>`, as a thread stream's events give it");
    run = match[1];
    last = Number(match[2]);
  }
  return follow(http, options, {
    path: `/v1/threads/${encodeURIComponent(threadId)}/events`,
    lastEventId: () => (run ? `${run}:${last}` : undefined),
    advance: (event) => {
      if (event.run_id === run && event.id <= last) return false;
      run = event.run_id;
      last = event.id;
      return true;
    },
    endsAfter: () => false,
  });
}

async function* follow(http: Http, options: StreamOptions, cursor: Cursor): AsyncGenerator<RunEvent> {
  const path = cursor.path;
  const maxReconnects = options.maxReconnects ?? 10;
  let failures = 0;
  let retryMs = 2000;
  const failed = (error?: unknown): number => {
    failures += 1;
    if (failures > maxReconnects) {
      const why = error ? String(error) : "responses ended without events";
      throw new StreamError(`${path}: gave up after ${maxReconnects} reconnections: ${why}`, { cause: error });
    }
    // A cut connection at once; then the server's hint, approached by doubling.
    return failures === 1 ? 0 : Math.min(retryMs, 250 * 2 ** (failures - 2));
  };

  for (;;) {
    const controller = new AbortController();
    const onAbort = () => controller.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let idle: ReturnType<typeof setTimeout> | undefined;
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => controller.abort(new StreamError("no data within the idle time-out")), http.streamIdleTimeoutMs);
    };
    let yielded = false;
    let broken: { error: unknown } | undefined;
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream", "Cache-Control": "no-store" };
      const lastEventId = cursor.lastEventId();
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      const response = await http.request("GET", path, { headers, stream: true, signal: controller.signal });
      arm();
      const queue: EventSourceMessage[] = [];
      let tooLong: ParseError | undefined;
      const parser = createParser({
        onEvent: (m) => queue.push(m),
        onRetry: (ms) => (retryMs = ms),
        onError: (e) => (tooLong ??= e.type === "max-buffer-size-exceeded" ? e : undefined),
        maxBufferSize: http.maxEventChars,
      });
      const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        arm();
        parser.feed(value);
        if (tooLong) throw new StreamError(`an event longer than ${http.maxEventChars} characters`, { cause: tooLong });
        while (queue.length) {
          const message = queue.shift()!;
          if (!message.data) continue;
          // The parser bounds what it buffers between chunks; an event whole in one chunk is checked here.
          if (message.data.length > http.maxEventChars) throw new StreamError(`an event longer than ${http.maxEventChars} characters`);
          const event = parseEvent(message.data);
          if (!cursor.advance(event)) continue;
          failures = 0;
          yielded = true;
          yield event;
          if (cursor.endsAfter(event)) return;
        }
      }
    } catch (error) {
      // A refusal, the caller's abort and a malformed event end the stream; a broken
      // connection (or one silent past the idle time-out) is resumed.
      if (options.signal?.aborted) throw error;
      // A replica restarting or overloaded (5xx, 429) is resumed from like a cut connection.
      if (error instanceof APIError && error.status < 500 && error.status !== 429) throw error;
      if (error instanceof StreamError && !controller.signal.aborted) throw error;
      broken = { error };
    } finally {
      clearTimeout(idle);
      controller.abort();
      options.signal?.removeEventListener("abort", onAbort);
    }
    // A response that ended before the run did at a pause: the next one waits for the resume.
    let wait = broken ? failed(broken.error) : yielded ? 0 : failed();
    if (broken?.error instanceof APIError) wait = Math.max(wait, (broken.error.retryAfter ?? 0) * 1000);
    await sleep(wait);
  }
}
