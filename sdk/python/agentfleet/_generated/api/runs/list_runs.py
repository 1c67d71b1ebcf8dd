from http import HTTPStatus
from typing import Any
from uuid import UUID

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error_body import ErrorBody
from ...models.run_page import RunPage
from ...models.run_status import RunStatus
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    status: RunStatus | Unset = UNSET,
    thread_id: UUID | Unset = UNSET,
    batch_id: UUID | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_status: str | Unset = UNSET
    if not isinstance(status, Unset):
        json_status = status.value

    params["status"] = json_status

    json_thread_id: str | Unset = UNSET
    if not isinstance(thread_id, Unset):
        json_thread_id = str(thread_id)
    params["thread_id"] = json_thread_id

    json_batch_id: str | Unset = UNSET
    if not isinstance(batch_id, Unset):
        json_batch_id = str(batch_id)
    params["batch_id"] = json_batch_id

    params["limit"] = limit

    params["cursor"] = cursor

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/runs",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ErrorBody | RunPage | None:
    if response.status_code == 200:
        response_200 = RunPage.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = ErrorBody.from_dict(response.json())

        return response_401

    if response.status_code == 408:
        response_408 = ErrorBody.from_dict(response.json())

        return response_408

    if response.status_code == 422:
        response_422 = ErrorBody.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = ErrorBody.from_dict(response.json())

        return response_429

    if response.status_code == 500:
        response_500 = ErrorBody.from_dict(response.json())

        return response_500

    if response.status_code == 503:
        response_503 = ErrorBody.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ErrorBody | RunPage]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    status: RunStatus | Unset = UNSET,
    thread_id: UUID | Unset = UNSET,
    batch_id: UUID | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[ErrorBody | RunPage]:
    """`GET /v1/runs`: newest first; `status`, `thread_id`, `batch_id` filters; `limit`; `cursor`
    from `next_cursor` of the previous page.

    Args:
        status (RunStatus | Unset): The statuses of a run (docs/architecture.md); stored as text
            in `runs.status`.
        thread_id (UUID | Unset):
        batch_id (UUID | Unset):
        limit (int | Unset): Page size, 1 to 500 (`api.max_page_size`); 50 when absent
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | RunPage]
    """

    kwargs = _get_kwargs(
        status=status,
        thread_id=thread_id,
        batch_id=batch_id,
        limit=limit,
        cursor=cursor,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    status: RunStatus | Unset = UNSET,
    thread_id: UUID | Unset = UNSET,
    batch_id: UUID | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> ErrorBody | RunPage | None:
    """`GET /v1/runs`: newest first; `status`, `thread_id`, `batch_id` filters; `limit`; `cursor`
    from `next_cursor` of the previous page.

    Args:
        status (RunStatus | Unset): The statuses of a run (docs/architecture.md); stored as text
            in `runs.status`.
        thread_id (UUID | Unset):
        batch_id (UUID | Unset):
        limit (int | Unset): Page size, 1 to 500 (`api.max_page_size`); 50 when absent
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | RunPage
    """

    return sync_detailed(
        client=client,
        status=status,
        thread_id=thread_id,
        batch_id=batch_id,
        limit=limit,
        cursor=cursor,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    status: RunStatus | Unset = UNSET,
    thread_id: UUID | Unset = UNSET,
    batch_id: UUID | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[ErrorBody | RunPage]:
    """`GET /v1/runs`: newest first; `status`, `thread_id`, `batch_id` filters; `limit`; `cursor`
    from `next_cursor` of the previous page.

    Args:
        status (RunStatus | Unset): The statuses of a run (docs/architecture.md); stored as text
            in `runs.status`.
        thread_id (UUID | Unset):
        batch_id (UUID | Unset):
        limit (int | Unset): Page size, 1 to 500 (`api.max_page_size`); 50 when absent
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | RunPage]
    """

    kwargs = _get_kwargs(
        status=status,
        thread_id=thread_id,
        batch_id=batch_id,
        limit=limit,
        cursor=cursor,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    status: RunStatus | Unset = UNSET,
    thread_id: UUID | Unset = UNSET,
    batch_id: UUID | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> ErrorBody | RunPage | None:
    """`GET /v1/runs`: newest first; `status`, `thread_id`, `batch_id` filters; `limit`; `cursor`
    from `next_cursor` of the previous page.

    Args:
        status (RunStatus | Unset): The statuses of a run (docs/architecture.md); stored as text
            in `runs.status`.
        thread_id (UUID | Unset):
        batch_id (UUID | Unset):
        limit (int | Unset): Page size, 1 to 500 (`api.max_page_size`); 50 when absent
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | RunPage
    """

    return (
        await asyncio_detailed(
            client=client,
            status=status,
            thread_id=thread_id,
            batch_id=batch_id,
            limit=limit,
            cursor=cursor,
        )
    ).parsed
