import time
import uuid

import pytest
from conftest import script

from agentfleet import (
    APIConnectionError,
    Client,
    ConflictError,
    EventType,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    UnprocessableEntityError,
)


def test_404_is_a_not_found_error(client):
    with pytest.raises(NotFoundError) as e:
        client.runs.get(str(uuid.uuid4()))
    assert e.value.status == 404 and e.value.code == "not_found" and e.value.message


def test_409_is_a_conflict_error(client, model):
    run = client.runs.create(script({"content": "done"}), agent={"model": model})
    assert list(client.runs.stream(run.id))[-1].type == EventType.RUN_COMPLETED
    with pytest.raises(ConflictError) as e:
        client.runs.answer(run.id, "too late")
    assert e.value.status == 409 and e.value.code and "completed" in e.value.message


def test_422_is_an_unprocessable_entity_error_naming_the_field(client, model):
    with pytest.raises(UnprocessableEntityError) as e:
        client.runs.create("hello", agent={"model": model, "max_iterations": 0})
    assert e.value.status == 422 and e.value.code == "invalid_request"
    assert "agent.max_iterations" in e.value.message


def test_429_is_a_rate_limit_error_after_retries_that_honour_retry_after(api_url, model, limited_key):
    # The tenant may have one active run: a run waiting for input holds it.
    with Client(api_key=limited_key, base_url=api_url, max_retries=1) as client:
        waiting = client.runs.create(
            script({"tool_calls": [{"name": "ask", "arguments": {"text": "?"}}]}), agent={"model": model}
        )
        try:
            started = time.monotonic()
            with pytest.raises(RateLimitError) as e:
                client.runs.create("one more", agent={"model": model})
            assert e.value.status == 429 and e.value.code == "too_many_active_runs"
            assert e.value.retry_after is not None and e.value.retry_after >= 1
            # One retry, after the Retry-After the API asked for.
            assert time.monotonic() - started >= e.value.retry_after
        finally:
            client.runs.cancel(waiting.id)


def test_no_answer_is_a_connection_error():
    with Client(api_key="af_none", base_url="http://127.0.0.1:9", max_retries=0) as client:
        with pytest.raises(APIConnectionError):
            client.runs.get(str(uuid.uuid4()))


def test_5xx_is_retried_only_for_a_safe_request(api_key, model, cut_proxy):
    with Client(api_key=api_key, base_url=cut_proxy.url, max_retries=1) as client:
        # A create without a key could have been carried out: it is not sent again.
        cut_proxy.refuse_next(1)
        with pytest.raises(InternalServerError) as e:
            client.runs.create("not sent twice", agent={"model": model})
        assert e.value.status == 503 and e.value.code == "unavailable" and e.value.retry_after == 1
        assert cut_proxy.refused == 1
        # With an Idempotency-Key it is, after the Retry-After.
        cut_proxy.refuse_next(1)
        started = time.monotonic()
        run = client.runs.create("sent twice", agent={"model": model}, idempotency_key=str(uuid.uuid4()))
        assert cut_proxy.refused == 2 and time.monotonic() - started >= 1
        assert str(client.runs.get(run.id).id) == str(run.id)
