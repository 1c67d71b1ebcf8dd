"""Retries as ``agentfleetctl`` does them: a request that could have been carried out is sent
again only when repeating it changes nothing.

- Safe requests (``GET``, a cancel, anything sent with an ``Idempotency-Key``) are retried on
  429, on 5xx and on connection failures and time-outs.
- Any other request is retried only when it surely did nothing: 429 (refused before any work)
  and a connection that could not be made.

The wait is the answer's ``Retry-After`` when it has one (at most a minute), else a backoff
that doubles from ``backoff`` up to ``max_backoff``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from ._errors import retry_after_seconds

# A longer Retry-After would make a call look hung; agentfleetctl caps it the same way.
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    #: Attempts after the first.
    retries: int = 2
    backoff: float = 0.25
    max_backoff: float = 10.0

    def wait(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            after = retry_after_seconds(response.headers)
            if after is not None:
                return min(float(after), MAX_RETRY_AFTER)
        return min(self.backoff * (2 ** min(attempt, 16)), self.max_backoff)


def is_safe(request: httpx.Request) -> bool:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return True
    if "idempotency-key" in request.headers:
        return True
    return request.method == "POST" and request.url.path.endswith("/cancel")


def _transient_response(request: httpx.Request, response: httpx.Response) -> bool:
    return response.status_code == 429 or (response.status_code >= 500 and is_safe(request))


def _transient_error(request: httpx.Request, error: httpx.TransportError) -> bool:
    surely_unsent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
    return surely_unsent or is_safe(request)


class RetryTransport(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport, policy: RetryPolicy):
        self._inner = inner
        self._policy = policy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt = 0
        while True:
            last = attempt >= self._policy.retries
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as e:
                if last or not _transient_error(request, e):
                    raise
                wait = self._policy.wait(attempt, None)
            else:
                if last or not _transient_response(request, response):
                    return response
                wait = self._policy.wait(attempt, response)
                response.close()
            attempt += 1
            time.sleep(wait)

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, policy: RetryPolicy):
        self._inner = inner
        self._policy = policy

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        attempt = 0
        while True:
            last = attempt >= self._policy.retries
            try:
                response = await self._inner.handle_async_request(request)
            except httpx.TransportError as e:
                if last or not _transient_error(request, e):
                    raise
                wait = self._policy.wait(attempt, None)
            else:
                if last or not _transient_response(request, response):
                    return response
                wait = self._policy.wait(attempt, response)
                await response.aclose()
            attempt += 1
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        await self._inner.aclose()
