/**
 * Submitting a batch from an iterable: sent in chunks, one `POST /v1/batches` each, whose
 * `Idempotency-Key` is a hash of that very request body (and an optional label) with the
 * chunk's range, as `agentfleetctl submit` makes them. Submitting the same items again (after a
 * crash or a time-out) finds the batches already made (200) and creates nothing twice; another
 * `label` makes new runs.
 */

import type { components } from "./generated/schema.js";

type Schemas = components["schemas"];
/** A run's body with an optional `custom_id` (`item-<n>` by default). */
export type BatchInput = Omit<Schemas["BatchItem"], "custom_id"> & { custom_id?: string };

export interface Chunk {
  first: number;
  body: Schemas["SubmitBatch"];
  key: string;
}

// The API's `custom_id` bound.
const MAX_CUSTOM_ID_CHARS = 128;

/** JSON with object keys sorted, so that one body is always the same bytes. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

export async function idempotencyKey(body: unknown, label: string | undefined, first: number, last: number): Promise<string> {
  const text = `${label ?? ""}\0${canonicalJson(body)}`;
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
  const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  return `agentfleet-ts-${hex.slice(0, 40)}-${first + 1}-${last + 1}`;
}

function item(index: number, input: BatchInput): Schemas["BatchItem"] {
  const custom_id = input.custom_id ?? `item-${index + 1}`;
  if (typeof custom_id !== "string" || custom_id.length < 1 || custom_id.length > MAX_CUSTOM_ID_CHARS) {
    throw new RangeError(`batch item ${index}: custom_id must be a string of 1 to ${MAX_CUSTOM_ID_CHARS} characters`);
  }
  return { ...input, custom_id };
}

/** The chunks of `items`, read lazily: at most one chunk is held at a time. */
export async function* chunks(
  items: Iterable<BatchInput> | AsyncIterable<BatchInput>,
  chunkSize: number,
  metadata: Record<string, unknown> | undefined,
  label: string | undefined,
): AsyncGenerator<Chunk> {
  if (!(chunkSize >= 1)) throw new RangeError("chunkSize must be at least 1");
  let first = 0;
  let runs: Schemas["BatchItem"][] = [];
  const flush = async (): Promise<Chunk> => {
    const body: Schemas["SubmitBatch"] = metadata === undefined ? { runs } : { runs, metadata };
    const chunk = { first, body, key: await idempotencyKey(body, label, first, first + runs.length - 1) };
    first += runs.length;
    runs = [];
    return chunk;
  };
  for await (const input of items as AsyncIterable<BatchInput>) {
    runs.push(item(first + runs.length, input));
    if (runs.length === chunkSize) yield await flush();
  }
  if (runs.length) yield await flush();
}
