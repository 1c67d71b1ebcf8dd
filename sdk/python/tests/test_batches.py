from conftest import wait_for

from agentfleet.models import BatchStatus


def items(model, n):
    """An iterable that is no list: the runs are produced as they are sent."""
    for i in range(1, n + 1):
        yield {"custom_id": f"doc-{i}", "input": f"summarise document {i}", "agent": {"model": model}}


def test_a_batch_of_500_from_an_iterable_with_progress(client, model):
    submitted = []
    submission = client.batches.create(
        items(model, 500), chunk_size=200, metadata={"job": "sdk-test"}, label="py-500", on_progress=submitted.append
    )
    assert submitted == [200, 400, 500]
    assert submission.total == 500 and submission.created == [True, True, True]
    assert [b.total for b in submission.batches] == [200, 200, 100]

    # The same items again: the idempotency keys find the same batches, nothing is created twice.
    again = client.batches.create(items(model, 500), chunk_size=200, metadata={"job": "sdk-test"}, label="py-500")
    assert again.ids == submission.ids and again.created == [False, False, False]

    progress = []
    finished = client.batches.wait(
        submission.ids,
        poll_interval=0.5,
        timeout=120,
        on_progress=lambda bs: progress.append(sum(b.counts.completed for b in bs)),
    )
    assert [b.status for b in finished] == [BatchStatus.COMPLETED] * 3
    assert progress[-1] == 500 and progress == sorted(progress)

    results = [r for batch_id in submission.ids for r in client.batches.results(batch_id)]
    assert [r["custom_id"] for r in results] == [f"doc-{i}" for i in range(1, 501)]
    assert all(r["status"] == "completed" for r in results)
    assert results[41]["output"] == "echo: summarise document 42"
    assert str(client.batches.get(submission.ids[0]).id) == submission.ids[0]


def test_a_cancelled_batch_ends_cancelled_and_says_so_per_item(client, model):
    slow = {"input": '{"mock_script": [{"content": "x", "delay_ms": 10000}]}', "agent": {"model": model}}
    submission = client.batches.create([dict(slow) for _ in range(5)], label="py-cancel")
    batch_id = submission.ids[0]
    assert client.batches.cancel(batch_id).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    (finished,) = client.batches.wait([batch_id], poll_interval=0.2, timeout=60)
    assert finished.status == BatchStatus.CANCELLED
    results = list(client.batches.results(batch_id))
    assert [r["custom_id"] for r in results] == [f"item-{i}" for i in range(1, 6)]
    assert all(r["status"] == "cancelled" for r in results)
    assert any(str(b.id) == batch_id for b in client.batches.list(limit=50).batches)


def test_usage_counts_the_tenants_runs(client, model):
    before = client.usage.get().total.runs
    run = client.runs.create("count me", agent={"model": model})
    assert [e.type for e in client.runs.stream(run.id)][-1] == "run_completed"
    report = wait_for("the run in the usage", 30, lambda: (r := client.usage.get()).total.runs > before and r)
    assert report.total.total_tokens > 0
    assert report.days and all(report.from_ <= d.day <= report.to for d in report.days)
