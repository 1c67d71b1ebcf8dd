import asyncio
import json

from conftest import script

from agentfleet import AsyncClient, EventType
from agentfleet.models import RunStatus

PAY = {
    "name": "pay",
    "kind": "http",
    "risk": "high",
    "description": "Pays an invoice.",
    "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
}


def test_create_stream_answer_approve_completes(client, model, receiver):
    run = client.runs.create(
        script(
            {"content": "Which invoice?", "tool_calls": [{"name": "ask", "arguments": {"text": "Which invoice?"}}]},
            {"content": "Paying.", "tool_calls": [{"name": "pay", "arguments": {"amount": 42}}]},
            {"content": "Paid the March invoice."},
        ),
        agent={"model": model, "tools": [{**PAY, "url": receiver.url("/pay")}]},
        metadata={"suite": "python"},
    )
    assert run.status == RunStatus.QUEUED

    events = []
    for event in client.runs.stream(run.id):
        events.append(event)
        if event.type == EventType.INPUT_REQUIRED:
            assert event.data["question"] == "Which invoice?"
            client.runs.answer(run.id, "The March one")
        elif event.type == EventType.CONFIRMATION_REQUIRED:
            assert [c["name"] for c in event.data["tool_calls"]] == ["pay"]
            # No call ran before the decision.
            assert receiver.posts("/pay") == []
            client.runs.approve(run.id)

    assert [e.id for e in events] == list(range(1, len(events) + 1))
    types = [e.type for e in events]
    assert types[0] == EventType.RUN_QUEUED and types[-1] == EventType.RUN_COMPLETED
    order = [
        EventType.INPUT_REQUIRED,
        EventType.RUN_RESUMED,
        EventType.CONFIRMATION_REQUIRED,
        EventType.RUN_RESUMED,
        EventType.TOOL_COMPLETED,
        EventType.RUN_COMPLETED,
    ]
    positions = [types.index(t, types.index(order[i - 1]) + 1 if i else 0) for i, t in enumerate(order)]
    assert positions == sorted(positions)
    completed = next(e for e in events if e.type == EventType.TOOL_COMPLETED)
    assert completed.data["ok"] is True and completed.data["name"] == "pay"
    assert [json.loads(body)["arguments"] for _, _, body in receiver.posts("/pay")] == [{"amount": 42}]

    final = client.runs.get(run.id)
    assert final.status == RunStatus.COMPLETED
    assert final.metadata.to_dict() == {"suite": "python"}
    messages = list(client.threads.iter_messages(str(final.thread_id)))
    assert messages and messages[-1].role == "assistant"
    assert any(str(r.id) == str(run.id) for r in client.threads.runs(str(final.thread_id)))


def test_reject_tells_the_model_and_the_call_never_runs(client, model, receiver):
    run = client.runs.create(
        script({"tool_calls": [{"name": "pay", "arguments": {"amount": 7}}]}, {"content": "Not paid."}),
        agent={"model": model, "tools": [{**PAY, "url": receiver.url("/pay")}]},
    )
    events = list(client.runs.stream(run.id, stop_at_pause=True))
    assert events[-1].type == EventType.CONFIRMATION_REQUIRED
    client.runs.reject(run.id, reason="not this month")
    rest = list(client.runs.stream(run.id, after=events[-1].id))
    assert rest[0].id == events[-1].id + 1 and rest[-1].type == EventType.RUN_COMPLETED
    assert receiver.posts("/pay") == []


def test_async_client_streams_a_run_to_its_end(api_url, api_key, model):
    async def main():
        async with AsyncClient(api_key=api_key, base_url=api_url) as client:
            run = await client.runs.create(script({"content": "Hello from asyncio."}), agent={"model": model})
            events = [e async for e in client.runs.stream(run.id)]
            assert [e.id for e in events] == list(range(1, len(events) + 1))
            assert events[-1].type == EventType.RUN_COMPLETED
            page = await client.runs.list(limit=5)
            assert any(str(r.id) == str(run.id) for r in page.data)
            cancelled = await client.runs.create(script({"content": "x", "delay_ms": 5000}), agent={"model": model})
            assert (await client.runs.cancel(cancelled.id)).status == RunStatus.CANCELLED

    asyncio.run(main())
