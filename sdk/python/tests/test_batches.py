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
