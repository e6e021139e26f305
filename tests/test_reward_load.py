"""The reward service under load, over 127.0.0.1 only: 64 concurrent clients against the real Serve
app, started as the trainer starts it (RewardClient), autoscaling on, with a queue bound small
enough to overflow. Every answer is a 200 with the right rewards, a 503 with Retry-After (the queue
was full) or the 413 an oversized request asked for (declared or chunked); clients that send
their body slowly, or leave mid-request or mid-response, break nothing: afterwards the service
scores right and is healthy. The trainer's handle rides out the same bound by waiting and sending
again. No timing is asserted: the Retry-After a client waits only bounds how long the test runs."""
import asyncio
import json

import aiohttp
import pytest
import requests

from coderloo.tasksets.synthetic import synthetic_suite
from common.placement import free_port
from reward_service.config import AutoscalingSettings, ServiceConfig
from reward_service.tasks import save_jsonl

TASKS = synthetic_suite()["train"]
BATCH = 4  # items per request: small, fast programs
MAX_BODY = 64 * 1024
RETRY_AFTER = "1"
# Clients by kind, 64 in all, each sending ROUNDS requests.
CLIENTS = {"normal": 40, "slow": 6, "leaves mid-request": 6, "leaves mid-response": 6, "oversized": 6}
ROUNDS = 2
ATTEMPTS = 30  # a 503 is sent again after its Retry-After; the queue drains as the others finish
# What each kind may be answered (None: it left before any answer); a 503 must carry Retry-After.
ALLOWED = {"normal": {200, 503}, "slow": {200, 503}, "leaves mid-request": {None}, "leaves mid-response": {200, 503},
           "oversized": {413, 503}}


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory):
    from ray import serve

    from reward_service.client import APP_NAME, RewardClient

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    task_file = tmp_path_factory.mktemp("tasks") / "train.jsonl"
    save_jsonl(TASKS, task_file)
    config = ServiceConfig(
        task_files=[str(task_file)], max_batch=8, max_body_bytes=MAX_BODY,
        max_ongoing_requests=2, max_queued_requests=4, retry_after_s=int(RETRY_AFTER),
        autoscaling=AutoscalingSettings(min_replicas=1, max_replicas=2, target_ongoing_requests=1),
    )
    client = RewardClient(config)  # Serve runs already: the client adds its app to it
    yield client, f"http://127.0.0.1:{port}/{APP_NAME}"
    client.close()
    serve.shutdown()


def scoring_body(first: int) -> tuple[bytes, list[bool]]:
    """A request of BATCH items naming their tasks by id, the last one wrong; whether each passes."""
    items, passes = [], []
    for i in range(BATCH):
        task = TASKS[(first + i) % len(TASKS)]
        right = i < BATCH - 1
        items.append({"task_id": task.id, "completion": task.reference[len(task.prompt):] if right else "    return None\n"})
        passes.append(right)
    return json.dumps({"items": items}).encode(), passes


def head(path: str, length: int | None) -> bytes:
    """A POST's request line and headers: a declared length, or chunked (None)."""
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode()


async def pieces(body: bytes, count: int, pause_s: float):
    """`body` in `count` pieces with a pause before each but the first: a slow client."""
    step = -(-len(body) // count)
    for start in range(0, len(body), step):
        if start:
            await asyncio.sleep(pause_s)
        yield body[start:start + step]


def oversized(which: int):
    """A body over the limit, declared or chunked, or a batch over max_batch."""
    huge = b'{"items": [' + b" " * (3 * MAX_BODY) + b"]}"
    return [huge, pieces(huge, 6, 0), json.dumps({"items": [{"task_id": TASKS[0].id, "completion": "x"}] * 9}).encode()][which % 3]


async def over_http(kind: str, body: bytes, passes: list[bool], which: int, session: aiohttp.ClientSession, url: str) -> dict:
    """A request through aiohttp: a whole body, one sent slowly or an oversized one; its answer."""
    headers, data = {"content-type": "application/json"}, body
    if kind == "slow":  # in 4 pieces 0.25 s apart, with a declared length or chunked
        data = pieces(body, 4, 0.25)
        if which % 2:
            headers["content-length"] = str(len(body))
    elif kind == "oversized":
        data = oversized(which)
    async with session.post(f"{url}/v1/rewards", data=data, headers=headers) as response:
        answer = {"status": response.status, "retry_after": response.headers.get("retry-after"), "right": None}
        if response.status == 200:
            answer["right"] = [item["passed"] for item in (await response.json())["items"]] == passes
        else:
            await response.read()
    return answer


async def and_leave(kind: str, body: bytes, url: str) -> dict:
    """A request over a bare socket that leaves: after half its body, or once the status line and
    headers of its answer are in."""
    address, prefix = url.removeprefix("http://").split("/", 1)
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answer = {"status": None, "retry_after": None, "right": None}
    request = head(f"/{prefix}/v1/rewards", len(body)) + body
    if kind == "leaves mid-request":
        writer.write(request[: len(request) - len(body) // 2])
        await writer.drain()
        await asyncio.sleep(0.2)
    else:
        writer.write(request)
        await writer.drain()
        lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
        answer.update(status=int(lines[0].split()[1]), retry_after=fields.get("retry-after"))
    writer.close()
    return answer


async def client(kind: str, index: int, session: aiohttp.ClientSession, url: str) -> list[dict]:
    """One client's ROUNDS requests, each sent again after a 503's Retry-After, up to ATTEMPTS
    times; every answer it got."""
    out = []
    for round_ in range(ROUNDS):
        body, passes = scoring_body(index * ROUNDS + round_)
        for _ in range(ATTEMPTS):
            if kind in ("leaves mid-request", "leaves mid-response"):
                answer = await and_leave(kind, body, url)
            else:
                answer = await over_http(kind, body, passes, index + round_, session, url)
            out.append({"kind": kind, **answer})
            if answer["status"] != 503:
                break
            await asyncio.sleep(int(answer["retry_after"] or 0))
    return out


async def load(url: str) -> list[dict]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        clients = [client(kind, i, session, url) for kind, n in CLIENTS.items() for i in range(n)]
        return [answer for answers in await asyncio.gather(*clients) for answer in answers]


def test_load_gets_200_503_with_retry_after_or_413(service):
    _, url = service
    assert sum(CLIENTS.values()) == 64
    answers = asyncio.run(load(url))

    for a in answers:
        assert a["status"] in ALLOWED[a["kind"]], a
        assert a["status"] != 503 or a["retry_after"] == RETRY_AFTER, a  # a full queue says when to come back
        assert a["status"] != 200 or a["kind"] == "leaves mid-response" or a["right"], a  # scored right
    statuses = [a["status"] for a in answers]
    counts = {code: statuses.count(code) for code in sorted(set(statuses), key=str)}
    print(f"answers by status: {counts}")
    assert counts.get(503, 0) > 0 and counts.get(200, 0) > 0  # the bound was reached, and work was done
    assert counts.get(413, 0) > 0  # oversized bodies were refused, not parsed

    # afterwards: right scores and a healthy service
    body, passes = scoring_body(0)
    r = requests.post(f"{url}/v1/rewards", data=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200 and [item["passed"] for item in r.json()["items"]] == passes
    assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}


def test_the_trainers_handle_waits_out_a_full_queue(service):
    """The same bound holds for the trainer's handle: 10 requests at once overflow its queue of 4;
    the refused ones are sent again after Retry-After and every reward comes back, right."""
    rewards, _ = service
    tasks = [TASKS[i % len(TASKS)] for i in range(80)]  # 10 requests of max_batch 8
    completions = [t.reference[len(t.prompt):] if i % 5 else "    return None\n" for i, t in enumerate(tasks)]
    before = rewards.retries
    scored = rewards.score(tasks, completions)
    assert [r.passed for r in scored] == [bool(i % 5) for i in range(80)]
    assert rewards.retries > before  # some were refused and sent again
