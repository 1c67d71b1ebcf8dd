import pytest
from conftest import script

from agentfleet import Client, EventType, StreamError

# About 60 deltas 30 ms apart: the stream is cut twice while the run is still going.
SLOW = {"content": "".join(f"w{i:02d} " for i in range(60)), "chunks": 60, "chunk_delay_ms": 30}


def test_a_stream_cut_twice_yields_every_event_once_in_order(client, api_key, model, cut_proxy):
    run = client.runs.create(script(SLOW), agent={"model": model})
    cuts = {5: False, 25: False}
    events = []
    with Client(api_key=api_key, base_url=cut_proxy.url) as through_proxy:
        for event in through_proxy.runs.stream(run.id):
            events.append(event)
            if len(events) in cuts:
                assert event.type != EventType.RUN_COMPLETED, "the run ended before the cut"
                cuts[len(events)] = True
                cut_proxy.cut()
    assert all(cuts.values())
    # Two cuts, two reconnections with Last-Event-ID.
    assert cut_proxy.connections >= 3
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == EventType.RUN_COMPLETED
    deltas = "".join(e.data["text"] for e in events if e.type == EventType.MESSAGE_DELTA)
    assert deltas == SLOW["content"]
    # What a reader that was never cut gets is the same, event for event.
    replay = list(client.runs.stream(run.id))
    assert [(e.id, e.type, e.data) for e in replay] == [(e.id, e.type, e.data) for e in events]


def test_a_stream_resumes_after_a_given_id(client, model):
    run = client.runs.create(script({"content": "one two three"}), agent={"model": model})
    everything = list(client.runs.stream(run.id))
    tail = list(client.runs.stream(run.id, after=3))
    assert [e.id for e in tail] == [e.id for e in everything][3:]


def test_a_thread_stream_follows_its_runs_one_after_another_across_a_cut(client, api_key, model, cut_proxy):
    first = client.runs.create(script(SLOW), agent={"model": model})
    second = client.runs.create(
        script({"content": "second answer"}), agent={"model": model}, thread_id=str(first.thread_id), if_busy="enqueue"
    )
    events = []
    with Client(api_key=api_key, base_url=cut_proxy.url) as through_proxy:
        for event in through_proxy.threads.stream(str(first.thread_id)):
            events.append(event)
            if len(events) == 10:
                cut_proxy.cut()
            if event.run_id == str(second.id) and event.type == EventType.RUN_COMPLETED:
                break
    assert cut_proxy.connections >= 2
    runs = [e.run_id for e in events]
    split = runs.index(str(second.id))
    assert set(runs[:split]) == {str(first.id)} and set(runs[split:]) == {str(second.id)}
    for part in (events[:split], events[split:]):
        assert [e.id for e in part] == list(range(1, len(part) + 1))
        assert part[-1].type == EventType.RUN_COMPLETED
    # Resuming from an event of the first run gives the rest, from the next one on.
    after = events[split - 3]
    rest = []
    for event in client.threads.stream(str(first.thread_id), last_event_id=f"{after.run_id}:{after.id}"):
        rest.append(event)
        if event.run_id == str(second.id) and event.type == EventType.RUN_COMPLETED:
            break
    assert [(e.run_id, e.id) for e in rest] == [(e.run_id, e.id) for e in events[split - 2 :]]


def test_an_event_longer_than_the_bound_is_a_stream_error(client, api_url, api_key, model):
    run = client.runs.create(script({"content": "x" * 2000}), agent={"model": model})
    assert list(client.runs.stream(run.id))[-1].type == EventType.RUN_COMPLETED
    with Client(api_key=api_key, base_url=api_url, max_event_chars=1000) as bounded:
        with pytest.raises(StreamError, match="longer than 1000"):
            list(bounded.runs.stream(run.id))


def test_a_stream_outlives_an_unavailable_api(client, api_key, model, cut_proxy):
    run = client.runs.create(script(SLOW), agent={"model": model})
    events = []
    # No retries of a request's own: the stream itself resumes after the 503s.
    with Client(api_key=api_key, base_url=cut_proxy.url, max_retries=0) as through_proxy:
        for event in through_proxy.runs.stream(run.id):
            events.append(event)
            if len(events) == 5:
                cut_proxy.refuse_next(2)
                cut_proxy.cut()
    assert cut_proxy.refused == 2
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == EventType.RUN_COMPLETED
