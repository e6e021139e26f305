"""The trainer's handle on the reward service (`RewardClient`): the submits of one moment share
requests of `client_batch_items` items, each submit gets its own rewards back in order, a collect
does not wait out the linger, and submits from several threads are safe. One real service (Serve,
sandbox pool) for the module."""
import threading

import time

import pytest

from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.config import ServiceConfig

TASKS = synthetic_suite()["train"]
BATCH_ITEMS = 20


def prompt(i: int) -> tuple[list, list[str], list[bool]]:
    """A prompt's 8 samples: its task 8 times, completions (every third one wrong), whether each passes."""
    task = TASKS[i % len(TASKS)]
    right = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
    completions = [("    return None\n" if s % 3 == 0 else right) + f"# {i} {s}\n" for s in range(8)]
    return [task] * 8, completions, [s % 3 != 0 for s in range(8)]


@pytest.fixture(scope="module")
def client(ray_cluster):
    from reward_service.client import RewardClient

    client = RewardClient(ServiceConfig(client_batch_items=BATCH_ITEMS, client_linger_ms=50))
    yield client
    client.close()


def test_submits_of_one_moment_share_requests_and_each_gets_its_own_rewards(client):
    prompts = [prompt(i) for i in range(10)]
    pending = [client.submit(tasks, completions) for tasks, completions, _ in prompts]
    requests = {id(request) for p in pending for request, _, _ in p}
    assert len(requests) == 4  # 80 items in requests of 20
    assert sum(len(p) for p in pending) == 12  # the submits of items 16-24 and 56-64 span two requests each
    for p, (_, _, passes) in zip(pending, prompts):
        assert [r.passed for r in client.collect(p)] == passes


def test_a_collect_sends_the_request_still_being_filled(client):
    tasks, completions, passes = prompt(3)
    linger, client.linger_s = client.linger_s, 3600.0  # the client's thread would send it in an hour
    try:
        pending = client.submit(tasks, completions)
        ((request, start, end),) = pending
        assert request.response is None and (start, end) == (0, 8)  # waiting for more items
        assert [r.passed for r in client.collect(pending)] == passes
    finally:
        client.linger_s = linger


def test_a_collect_that_does_not_send_waits_for_the_linger_and_later_submits_join_the_request(client):
    """Partial rollouts collect each group as soon as it is submitted: the request still goes out
    with the items submitted within its linger, in one request."""
    linger, client.linger_s = client.linger_s, 0.5
    try:
        first = client.submit(*prompt(4)[:2])
        got = []
        collecting = threading.Thread(target=lambda: got.append(client.collect(first, send=False)))
        collecting.start()
        time.sleep(0.1)
        assert first[0][0].response is None  # not sent by the collect
        second = client.submit(*prompt(5)[:2])
        collecting.join(timeout=30)
    finally:
        client.linger_s = linger
    assert first[0][0] is second[0][0]  # one request for both
    assert [r.passed for r in got[0]] == prompt(4)[2] and [r.passed for r in client.collect(second)] == prompt(5)[2]


def test_without_a_linger_each_submit_is_sent_at_once_in_requests_of_its_own(client):
    linger, client.linger_s = client.linger_s, 0.0
    try:
        pending = [client.submit(*prompt(i)[:2]) for i in range(3)]
    finally:
        client.linger_s = linger
    assert all(len(p) == 1 and p[0][0].response is not None for p in pending)
    assert len({id(p[0][0]) for p in pending}) == 3
    assert [[r.passed for r in client.collect(p)] for p in pending] == [prompt(i)[2] for i in range(3)]


def test_submits_and_collects_from_several_threads(client):
    """The rollout group's threads submit as prompts finish; each collects its own."""
    got: dict[int, list[bool]] = {}

    def score(i: int) -> None:
        tasks, completions, _ = prompt(i)
        got[i] = [r.passed for r in client.collect(client.submit(tasks, completions))]

    threads = [threading.Thread(target=score, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == {i: prompt(i)[2] for i in range(12)}
