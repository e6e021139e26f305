"""The reward service's code interpreter (`RewardService.run`, POST /v1/run): a program run with no
tests, for what it printed and how it ended. One real service (Serve, sandbox pool) for the
module, through `RewardClient.run` (the handle) and over HTTP on 127.0.0.1."""
import json

import pytest
import requests

from common.placement import free_port
from reward_service.config import ServiceConfig
from reward_service.tasks import Task, save_jsonl
from sandbox_pool import Limits, Status

WALL_S = 2.0
# A code prompt that would stop the program if it were prepended: a run is the program as given.
TASK = Task(id="run/python", prompt="raise SystemExit('the prompt ran')\n", tests=["assert True"], reference="",
            difficulty=1, source="test", prompt_is_code=True)
FAST = TASK.model_copy(update={"id": "run/fast", "time_limit_s": 0.5})
CPP = Task(id="run/cpp", prompt="Echo a word.", tests=[{"stdin": "a", "stdout": "a"}], reference="", difficulty=1,
           source="test", prompt_is_code=False, language="cpp")


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory):
    from reward_service.client import RewardClient

    task_file = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    save_jsonl([TASK, CPP], task_file)
    port = free_port()
    config = ServiceConfig(limits=Limits(wall_timeout_s=WALL_S, cpu_time_s=2, output_mb=1), task_files=[str(task_file)],
                           max_batch=2)
    client = RewardClient(config, http_port=port)
    yield client, f"http://127.0.0.1:{port}/coderloo-rewards"
    client.close()


def post(url, body):
    return requests.post(f"{url}/v1/run", data=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)


def test_prints_raises_exits_and_floods_through_the_handle(service):
    client, _ = service
    programs = [
        "print('hello')\nprint(6 * 7)\n",
        "print('before')\n1 / 0\n",
        "import sys\nprint('bye')\nsys.exit(3)\n",
        "import sys\nsys.exit(0)\n",
        "while True:\n    print('x' * 1000)\n",
    ]
    printed, raised, three, zero, flood = client.run([TASK] * len(programs), programs)  # 3 requests of max_batch 2
    assert (printed.status, printed.stdout, printed.stderr, printed.exit) == (Status.passed, "hello\n42\n", "",
                                                                                "exited normally")
    assert raised.status == Status.runtime_error and raised.stdout == "before\n"
    assert raised.stderr.startswith("Traceback (most recent call last):") and "line 2" in raised.stderr
    assert "sandbox_pool" not in raised.stderr and "runner.py" not in raised.stderr  # only the program's own frames
    assert raised.exit == "raised ZeroDivisionError: division by zero"
    assert (three.status, three.stdout, three.exit) == (Status.runtime_error, "bye\n", "exited with code 3")
    assert (zero.status, zero.exit) == (Status.passed, "exited normally")
    # more than output_mb ends it; what comes back is the sandbox's tail, and the replica is fine
    assert flood.status == Status.runtime_error and flood.exit == "wrote more than 1 MiB of output"
    assert flood.stdout.endswith("x\n") and len(flood.stdout) <= Limits().output_tail_kb * 1024


def test_infinite_loops_stop_at_the_service_and_the_task_limits(service):
    client, _ = service
    loop = "while True:\n    pass\n"
    at_wall, at_task = client.run([TASK, FAST], [loop, loop])
    assert (at_wall.status, at_wall.exit) == (Status.timeout, f"timed out after {WALL_S:g} s")
    assert WALL_S <= at_wall.duration_s < WALL_S + 1.5
    assert (at_task.status, at_task.exit) == (Status.timeout, "timed out after 0.5 s")
    assert at_task.duration_s < 1.5


def test_http_route_with_stdin_and_its_errors(service):
    _, url = service
    r = post(url, {"items": [
        {"task_id": TASK.id, "program": "import sys\nprint(sys.stdin.read().upper(), end='')\n", "stdin": "abc\n"},
        {"task_id": CPP.id, "program": "#include <iostream>\nint main(){std::string w; std::cin >> w; "
                                       "std::cout << w << w << std::endl;}\n", "stdin": "ab"},
    ]})
    assert r.status_code == 200, r.text
    python, cpp = r.json()["items"]
    assert (python["status"], python["stdout"], python["exit"]) == ("passed", "ABC\n", "exited normally")
    assert (cpp["status"], cpp["stdout"], cpp["exit"]) == ("passed", "abab\n", "exited normally")

    r = post(url, {"items": [{"task_id": "no/such/task", "program": "print(1)\n"}]})
    assert r.status_code == 404 and "no/such/task" in r.text
    assert post(url, {"items": [{"task_id": TASK.id, "program": "1"}] * 3}).status_code == 413  # over max_batch
    assert post(url, {"items": [{"program": "print(1)\n"}]}).status_code == 422  # neither task nor task_id
    assert post(url, {"items": [{"task_id": TASK.id, "program": "1", "stdin": "x" * 70_000}]}).status_code == 422
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert 'reward_requests_total{code="200",path="/v1/run"}' in metrics
    assert 'reward_requests_total{code="404",path="/v1/run"}' in metrics
