/** Typed errors: every refusal of the API is `{"error": {"code", "message"}}` with a status. */

export class AgentfleetError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** No answer: the API could not be reached, or the connection broke, after the retries. */
export class APIConnectionError extends AgentfleetError {}

/** An event stream could not be resumed (too many failed reconnections, or a malformed event). */
export class StreamError extends AgentfleetError {}

/** A webhook delivery is not signed with the secret (tampered, replayed, or another endpoint's). */
export class WebhookVerificationError extends AgentfleetError {}

/** The API refused a request: `status` is the HTTP status, `code` and `message` its error. */
export class APIError extends AgentfleetError {
  constructor(
    readonly status: number,
    readonly code: string,
    /** The API's message (it names the field of an invalid request). */
    message: string,
    /** Seconds the API asked to wait (`Retry-After`), on 429 and 503. */
    readonly retryAfter?: number,
  ) {
    super(message);
  }

  override toString(): string {
    return `${this.name}: ${this.status} ${this.code}: ${this.message}`;
  }
}
/** 400: the body is not JSON. */
export class BadRequestError extends APIError {}
/** 401: no valid key. */
export class AuthenticationError extends APIError {}
/** 403: e.g. `tenant_suspended`. */
export class PermissionDeniedError extends APIError {}
/** 404: no such resource for this key's tenant. */
export class NotFoundError extends APIError {}
/** 409: e.g. `thread_busy`, `idempotency_key_reused`, a run that is not waiting. */
export class ConflictError extends APIError {}
/** 422: `invalid_request`; the message names the field. */
export class UnprocessableEntityError extends APIError {}
/** 429: `rate_limited`, `too_many_active_runs`, `thread_queue_full`. */
export class RateLimitError extends APIError {}
/** 5xx. */
export class InternalServerError extends APIError {}

const BY_STATUS: Record<number, typeof APIError> = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  422: UnprocessableEntityError,
  429: RateLimitError,
};
// A refusal is a short document; more is not one.
const MAX_MESSAGE_CHARS = 500;

export function retryAfterSeconds(headers: Headers): number | undefined {
  const value = headers.get("retry-after");
  if (value === null || !/^\s*\d+\s*$/.test(value)) return undefined;
  return Number(value.trim());
}

/** The typed error of a refused answer (a stand-in code `http_<status>` when it has none). */
export async function errorFromResponse(response: Response): Promise<APIError> {
  const text = await response.text().catch(() => "");
  let code = `http_${response.status}`;
  let message = "";
  try {
    const doc = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    if (typeof doc?.error?.code === "string") code = doc.error.code;
    if (typeof doc?.error?.message === "string") message = doc.error.message.slice(0, MAX_MESSAGE_CHARS);
  } catch {
    // Not the API's JSON (a proxy's page): its text stands in.
  }
  if (!message) message = text.slice(0, MAX_MESSAGE_CHARS) || `HTTP ${response.status}`;
  const Class = BY_STATUS[response.status] ?? (response.status >= 500 ? InternalServerError : APIError);
  return new Class(response.status, code, message, retryAfterSeconds(response.headers));
}
