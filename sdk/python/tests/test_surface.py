"""Every call of the client once, against the API: each answers what its name says."""

import asyncio
import uuid

from conftest import script

from agentfleet import AsyncClient
from agentfleet.models import RunStatus


def test_runs_threads_and_webhooks_calls(client, model, receiver):
    created = client.runs.create_many(
        [{"input": script({"content": f"hello {i}"}), "agent": {"model": model}} for i in range(2)]
    )
    ids = [str(r.id) for r in created.runs]
    assert len(ids) == 2 and created.batch_id
    for run_id in ids:
        assert list(client.runs.stream(run_id))[-1].type == "run_completed"
    page = client.runs.list(status="completed", batch_id=str(created.batch_id), limit=1)
    assert len(page.data) == 1 and page.data[0].status == RunStatus.COMPLETED and page.next_cursor
    assert sorted(str(r.id) for r in client.runs.iter(batch_id=str(created.batch_id), page_size=1)) == sorted(ids)
    counts = client.runs.counts(batch_id=str(created.batch_id))
    assert counts.counts.to_dict()["completed"] == 2
    token = client.runs.stream_token(ids[0])
    assert token.token and ids[0] in token.url
    same_key = str(uuid.uuid4())
    first = client.runs.create("keyed", agent={"model": model}, idempotency_key=same_key)
    again = client.runs.create("keyed", agent={"model": model}, idempotency_key=same_key)
    assert str(first.id) == str(again.id)
    assert list(client.runs.stream(first.id))[-1].type == "run_completed"
    assert client.threads.messages(str(first.thread_id), limit=1).data[0].role == "user"

    hook = client.webhooks.create(receiver.url("/hook"), ["run.failed"])
    try:
        assert any(str(e.id) == str(hook.id) for e in client.webhooks.list().data)
        assert client.webhooks.get(str(hook.id)).events == ["run.failed"]
        rotated = client.webhooks.rotate_secret(str(hook.id))
        assert rotated.secret.startswith("whsec_") and rotated.secret != hook.secret
    finally:
        client.webhooks.delete(str(hook.id))


def test_async_calls(api_url, api_key, model):
    async def main():
        async with AsyncClient(api_key=api_key, base_url=api_url) as client:
            run = await client.runs.create(
                script({"tool_calls": [{"name": "ask", "arguments": {"text": "?"}}]}, {"content": "ok"}),
                agent={"model": model},
            )
            events = [e async for e in client.runs.stream(run.id, stop_at_pause=True)]
            assert events[-1].type == "input_required"
            await client.runs.answer(run.id, "yes")
            rest = [e async for e in client.runs.stream(run.id, after=events[-1].id)]
            assert rest[-1].type == "run_completed"
            messages = [m async for m in client.threads.iter_messages(str(run.thread_id))]
            assert [m.role for m in messages][0] == "user"
            submission = await client.batches.create([{"input": "a", "agent": {"model": model}}], label="py-async")
            (batch,) = await client.batches.wait(submission.ids, poll_interval=0.2, timeout=60)
            assert [r["output"] async for r in client.batches.results(submission.ids[0])] == ["echo: a"]
            assert batch.counts.completed == 1
            assert (await client.usage.get()).total.runs >= 1

    asyncio.run(main())
