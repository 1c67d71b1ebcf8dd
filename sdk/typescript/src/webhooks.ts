/**
 * Checking a webhook delivery: Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
 * `webhook-signature`: `v1,` + base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`, keyed with
 * the endpoint's `whsec_…` secret), as the API signs them, with WebCrypto (Node and browsers,
 * no dependency). A timestamp more than five minutes away from now is refused (a replay).
 */

import { WebhookVerificationError } from "./errors.js";

export interface WebhookEvent {
  type: string;
  timestamp: string;
  data: Record<string, any>;
}

export interface VerifyOptions {
  /** Seconds a timestamp may be away from now; 300 by default. */
  toleranceSeconds?: number;
  /** Now, in Unix seconds (tests). */
  now?: number;
}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? v[0] : v;
  }
  return undefined;
}

function base64ToBytes(text: string): Uint8Array {
  const binary = atob(text);
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

/** Constant-time comparison of two strings of base64. */
function same(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * The delivery's JSON if it is signed with `secret`; throws `WebhookVerificationError`
 * otherwise. Pass the body exactly as received (the raw bytes, or their text).
 */
export async function verifyWebhook(
  secret: string,
  headers: HeaderSource,
  body: string | Uint8Array,
  options: VerifyOptions = {},
): Promise<WebhookEvent> {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) throw new WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature");
  if (!/^\d+$/.test(timestamp)) throw new WebhookVerificationError("invalid webhook-timestamp");
  const now = options.now ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - Number(timestamp)) > (options.toleranceSeconds ?? 300)) {
    throw new WebhookVerificationError("the timestamp is too far from now");
  }
  let key: Uint8Array;
  try {
    key = base64ToBytes(secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret);
  } catch {
    throw new WebhookVerificationError("the secret is not whsec_ and base64");
  }
  const raw = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + raw.length);
  signed.set(prefix);
  signed.set(raw, prefix.length);
  const hmac = await crypto.subtle.importKey("raw", key as BufferSource, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const expected = bytesToBase64(new Uint8Array(await crypto.subtle.sign("HMAC", hmac, signed as BufferSource)));
  const match = signatures.split(" ").some((s) => {
    const [version, signature] = s.split(",", 2);
    return version === "v1" && signature !== undefined && same(signature, expected);
  });
  if (!match) throw new WebhookVerificationError("no matching signature");
  try {
    return JSON.parse(new TextDecoder().decode(raw)) as WebhookEvent;
  } catch (error) {
    throw new WebhookVerificationError("the body is not JSON", { cause: error });
  }
}
