"""coderloo's reward service through other frameworks' own client code: the `sandbox-fusion`
client package and verl's `sandbox_fusion` reward code (installed by `make install` into
.cache/peers/verl and loaded by path: verl itself needs CUDA packages to import) over POST
/run_code, and OpenRLHF's remote reward protocol. One real service (Serve on 127.0.0.1, a real
sandbox pool) for the module."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path

import pytest
import requests

import sandbox_fusion as sf
from common.placement import free_port
from reward_service.config import AutoscalingSettings, ServiceConfig
from reward_service.tasks import save_jsonl
from sandbox_pool import Limits

VERL_UTILS = Path(__file__).parents[1] / ".cache/peers/verl/verl/utils/reward_score/sandbox_fusion/utils.py"
CONFIG = ServiceConfig(limits=Limits(memory_mb=256, max_wall_s=20), run_code_max_memory_mb=1024)
ADD = "def add(a, b):\n    return a + b\n"
SUM_STDIN = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_CASES = {"inputs": ["1 2\n", "40 2\n", "-5 5\n"], "outputs": ["3\n", "42\n", "0\n"]}
# Programs that try to pass without solving the task; none may score a passed case.
HOSTILE = {
    # the right answer, then a crash: verl reads the exit code, so it fails
    "answer then crash": "print(3)\nraise SystemExit(1)\n",
    # the right answer, then past the time limit
    "answer then hang": "print(3, flush=True)\nimport time\ntime.sleep(30)\n",
    # looks for the expected output where a careless harness might leave it: the environment, its
    # parent's command line and files, the other processes'
    "reads the harness": (
        "import os, glob\nseen = ' '.join(os.environ.values())\n"
        "for path in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ'):\n"
        "    try:\n        seen += open(path, 'rb').read().decode('utf-8', 'replace')\n    except OSError:\n        pass\n"
        "print(seen[:100] or 'nothing')\n"),
    # kills whatever it can reach, then prints
    "kills its parent": "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\nprint(3)\nraise SystemExit(1)\n",
}


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory):
    from ray import serve

    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.app import deploy

    task_file = tmp_path_factory.mktemp("tasks") / "train.jsonl"
    save_jsonl(synthetic_suite()["train"][:4], task_file)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(CONFIG.model_copy(update={"task_files": [str(task_file)]}))
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


@pytest.fixture(scope="module")
def verl():
    """verl's sandbox_fusion reward package as verl ships it (it imports only the standard library and
    requests), loaded by path: `check_correctness` from its utils.py, and its `compute_score`."""
    if not VERL_UTILS.is_file():
        pytest.fail(f"verl's reward code is not at {VERL_UTILS}: `make install` puts it there")
    name = "verl_sandbox_fusion"
    spec = importlib.util.spec_from_file_location(name, VERL_UTILS.parent / "__init__.py",
                                                  submodule_search_locations=[str(VERL_UTILS.parent)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
        yield package
    finally:
        del sys.modules[name]


def run_code(url: str, code: str, language: str = "python", **fields) -> sf.RunCodeResponse:
    return sf.run_code(sf.RunCodeRequest(code=code, language=language, **fields), endpoint=url, max_attempts=1)


def summary(response: sf.RunCodeResponse) -> str:
    return sf.summary_run_code_result(response, sf.SummaryMapping(
        CompileFailed="compile failed", CompileTimeout="compile timeout", RunFailed="run failed", RunTimeout="run timeout"))


def test_sandbox_fusion_client_runs_each_language(service):
    python = run_code(service, "print(input()[::-1])\n", stdin="abc\n")
    assert (python.status, python.compile_result, python.run_result.return_code, python.run_result.stdout) == (
        sf.RunStatus.Success, None, 0, "cba\n")
    cpp = run_code(service, "#include <iostream>\nint main(){int a;std::cin>>a;std::cout<<a*2<<'\\n';}\n", "cpp", stdin="21")
    assert cpp.status == sf.RunStatus.Success and cpp.run_result.stdout == "42\n"
    assert (cpp.compile_result.status, cpp.compile_result.return_code) == (sf.CommandRunStatus.Finished, 0)
    node = run_code(service, "const s = require('fs').readFileSync(0, 'utf8'); console.log(s.trim() + '!');\n", "nodejs",
                    stdin="hi\n")
    assert node.status == sf.RunStatus.Success and node.run_result.stdout == "hi!\n" and node.compile_result is None
    assert summary(python) == summary(cpp) == summary(node) == "Success"
    assert requests.get(f"{service}/v1/ping", timeout=10).json() == "pong"


def test_sandbox_fusion_statuses(service):
    raised = run_code(service, "raise ValueError('bad')\n")
    assert raised.status == sf.RunStatus.Failed and raised.run_result.return_code == 1
    assert "ValueError: bad" in raised.run_result.stderr and summary(raised) == "run failed"
    assert run_code(service, "import sys\nprint('a')\nsys.exit(3)\n").run_result.return_code == 3
    hung = run_code(service, "import time\nprint('s', flush=True)\ntime.sleep(30)\n", run_timeout=1)
    assert hung.run_result.status == sf.CommandRunStatus.TimeLimitExceeded and hung.run_result.stdout == "s\n"
    assert summary(hung) == "run timeout"
    syntax = run_code(service, "def f(:\n")
    assert (syntax.run_result.return_code, summary(syntax)) == (1, "run failed")
    assert "SyntaxError" in syntax.run_result.stderr
    broken = run_code(service, "int main(){ return x; }\n", "cpp")
    assert broken.run_result is None and broken.compile_result.return_code == 1
    assert "not declared" in broken.compile_result.stderr and summary(broken) == "compile failed"
    # memory_limit_MB is the run's: 300 MiB fits in 512, not in 128 (verl sends it; SandboxFusion's
    # client package has no such field)
    def grab(memory_mb):
        body = {"code": "x = bytearray(300 * 2**20)\nprint(len(x))\n", "language": "python", "memory_limit_MB": memory_mb}
        return requests.post(f"{service}/run_code", json=body, timeout=60).json()

    assert grab(512)["run_result"]["stdout"] == f"{300 * 2**20}\n"
    starved = grab(128)
    assert starved["status"] == "Failed" and starved["run_result"]["return_code"] == -9
    killed = run_code(service, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert killed.run_result.return_code == -11


def test_stdout_comes_back_byte_exact(service):
    spaced = run_code(service, "import sys\nsys.stdout.write('x  \\n\\n\\t')\n")
    assert spaced.run_result.stdout == "x  \n\n\t"
    big = run_code(service, "print('y' * 2_000_000)\n")  # past the 4 KiB that training's results carry
    assert big.status == sf.RunStatus.Success and big.run_result.stdout == "y" * 2_000_000 + "\n"
    flood = run_code(service, "while True:\n    print('z' * 1000)\n")  # past the output limit: the sandbox ends it
    assert flood.status == sf.RunStatus.Failed and flood.run_result.return_code == -9


def test_bad_requests_are_refused_naming_what_is_wrong(service):
    def post(body):
        return requests.post(f"{service}/run_code", json=body, timeout=30)

    go = post({"code": "package main", "language": "go"})
    assert go.status_code == 422 and "supported: python, cpp, nodejs" in go.text
    files = post({"code": "print(1)", "language": "python", "files": {"data.txt": "aGk="}})
    assert files.status_code == 422 and "data.txt" in files.text
    assert post({"code": "print(1)", "language": "python", "files": {"ignored": None}}).status_code == 200
    greedy = post({"code": "print(1)", "language": "python", "memory_limit_MB": 10**6})
    assert greedy.status_code == 422 and "run_code_max_memory_mb" in greedy.text
    slow = post({"code": "print(1)", "language": "python", "run_timeout": 3600})
    assert slow.status_code == 422 and "max_wall_s" in slow.text
    assert post({"language": "python"}).status_code == 422
    assert requests.post(f"{service}/run_code", data=b"x" * (CONFIG.max_body_bytes + 1), timeout=30).status_code == 413
    assert requests.get(f"{service}/run_code", timeout=30).status_code == 405


def test_verl_scores_through_coderloo(service, verl):
    url = f"{service}/run_code"
    right, _ = verl.utils.check_correctness(url, SUM_CASES, SUM_STDIN, timeout=5)
    wrong, _ = verl.utils.check_correctness(url, SUM_CASES, SUM_STDIN.replace("a + b", "a * b"), timeout=5)
    assert (right, wrong) == ([True] * 3, [False, False, False])
    # call-based: verl's fn_name wrapper reads one JSON argument per line
    calls = {"inputs": ["1\n2", "40\n2"], "outputs": ["3", "42"], "fn_name": "add"}
    assert verl.utils.check_correctness(url, calls, ADD, timeout=5)[0] == [True, True]
    assert verl.utils.check_correctness(url, calls, ADD.replace("a + b", "a - b"), timeout=5)[0] == [False, False]
    asserts = {"assert_case": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    asserts.update(inputs=["", ""], outputs=[None, None])
    assert verl.utils.check_correctness(url, asserts, ADD, timeout=5)[0] == [True, True]
    assert verl.utils.check_correctness(url, asserts, ADD.replace("a + b", "a * b"), timeout=5)[0] == [-2, -2]
    one = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    for name, program in HOSTILE.items():
        results, meta = verl.utils.check_correctness(url, one, program, timeout=3)
        assert results != [True], (name, meta)
    # verl's whole score, from a completion with a fenced block, as its reward manager calls it
    from threading import Semaphore

    completion = f"Here it is:\n```python\n{SUM_STDIN}```\n"
    assert verl.compute_score(url, Semaphore(4), 256, completion, json.dumps(SUM_CASES), timeout=5)[0] == 1.0
    assert verl.compute_score(url, Semaphore(4), 256, completion.replace("a + b", "a - b"), SUM_CASES, timeout=5)[0] == 0.0


def test_openrlhf_remote_reward(service):
    """OpenRLHF's remote_rm_url protocol, as its experience maker posts it: query (prompt and response),
    prompts, labels -> rewards, scores, extra_logs."""
    from coderloo.tasksets.synthetic import synthetic_suite

    task = synthetic_suite()["train"][0]
    prompt = "<|im_start|>user\nWrite add.<|im_end|>\n<|im_start|>assistant\n"
    stdio = json.dumps({"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "2 2\n", "stdout": "4\n"}]})
    right_known = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
    responses = [(task.id, right_known), (task.id, "    return None\n"),
                 (stdio, f"```python\n{SUM_STDIN}```"), (stdio, "```python\nprint(3)\n```")]
    prompts = [task.prompt if label == task.id else prompt for label, _ in responses]
    body = {"query": [p + r for p, (_, r) in zip(prompts, responses)], "prompts": prompts,
            "labels": [label for label, _ in responses]}
    answer = requests.post(f"{service}/v1/openrlhf", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["scores"] == [1.0, 0.0, 1.0, 0.5]
    assert got["extra_logs"]["passed"] == [1.0, 0.0, 1.0, 0.0]
    assert got["rewards"][0] > got["rewards"][1] and got["rewards"][2] > got["rewards"][3]
    bad = dict(body, labels=["no/such/task"] + body["labels"][1:])
    refused = requests.post(f"{service}/v1/openrlhf", json=bad, timeout=60)
    assert refused.status_code == 422 and "labels[0]" in refused.text
    unaligned = dict(body, query=["something else"] + body["query"][1:])
    refused = requests.post(f"{service}/v1/openrlhf", json=unaligned, timeout=60)
    assert refused.status_code == 422 and "query[0] does not begin with prompts[0]" in refused.text


def test_trl_reward_function_in_a_grpo_step(service, tiny_model, tmp_path):
    """CoderlooReward as TRL's GRPOTrainer calls it, for one real step on the tiny model: the rewards
    TRL gets are the service's own for the same completions, and TRL logs them under its name."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.peers import CoderlooReward

    tasks = synthetic_suite()["train"][:2]
    calls = []

    class Recording(CoderlooReward):
        def __call__(self, prompts, completions, completion_ids=None, **columns):
            rewards = super().__call__(prompts, completions, completion_ids, **columns)
            calls.append((list(completions), list(columns["task"]), rewards))
            return rewards

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, max_completion_length=12,
                      max_steps=1, logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), reward_funcs=[Recording(service)], args=args,
                          train_dataset=Dataset.from_dict({"prompt": [t.prompt for t in tasks], "task": [t.id for t in tasks]}),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model))
    trainer.train()
    completions, named, rewards = calls[0]
    assert len(completions) == len(rewards) == 8 and sorted(set(named)) == sorted(t.id for t in tasks)
    direct = requests.post(f"{service}/v1/rewards", json={"items": [{"task_id": t, "completion": c}
                                                                    for t, c in zip(named, completions)]}, timeout=120)
    assert [item["total"] for item in direct.json()["items"]] == rewards
    logged = [h["rewards/coderloo/mean"] for h in trainer.state.log_history if "rewards/coderloo/mean" in h]
    assert logged and logged[0] == pytest.approx(sum(rewards) / len(rewards), abs=1e-5)
    # the function tells a right completion from a wrong one, also given the task itself as its label
    right = tasks[0].reference[len(tasks[0].prompt):]
    label = json.dumps(tasks[0].model_dump(mode="json"))
    scored = CoderlooReward(service)([tasks[0].prompt] * 2, [right, "    return None\n"], None, task=[label, tasks[0].id])
    assert scored[0] > scored[1]


def test_verl_compute_score(service):
    """compute_score as verl's reward manager calls it (keywords; the url from reward_kwargs), with a
    ground truth in verl's datasets' shape: stdin/stdout and fn_name call cases."""
    from functools import partial

    from reward_service.peers import compute_score

    score = partial(compute_score, url=service)
    stdio = json.dumps(SUM_CASES)
    right = score(data_source="code", solution_str=f"```python\n{SUM_STDIN}```", ground_truth=stdio, extra_info={"index": 0})
    wrong = score(data_source="code", solution_str="```python\nprint(0)\n```", ground_truth=stdio, extra_info=None)
    assert right["passed"] == 1.0 and right["functionality"] == 1.0 and right["score"] > wrong["score"]
    assert wrong["functionality"] == pytest.approx(1 / 3)  # "-5 5" sums to 0
    calls = {"inputs": ["1\n2", [40, 2]], "outputs": ["3", 42], "fn_name": "add"}
    assert score(data_source="code", solution_str=f"```python\n{ADD}```", ground_truth=calls)["passed"] == 1.0
    assert score(data_source="code", solution_str="```python\ndef add(a, b):\n    return a - b\n```",
                 ground_truth=calls)["functionality"] == 0.0
    with pytest.raises(ValueError, match="inputs and outputs must be lists of one length"):
        score(data_source="code", solution_str="x", ground_truth={"inputs": ["1"], "outputs": []})


def redeploy(config: ServiceConfig) -> None:
    from reward_service.app import deploy

    deploy(config)


def test_a_sandbox_failure_is_a_sandbox_error_never_a_failed_run(service, verl):
    """A pool that cannot start its executors (a Docker runtime the engine lacks): each /run_code is
    SandboxError, which SandboxFusion's client raises on and verl counts as an API error (-1), not a
    wrong answer."""
    from sandbox_pool import PoolSettings
    from sandbox_pool.pool import DockerSandbox

    redeploy(CONFIG.model_copy(update={"pool": PoolSettings(backend=DockerSandbox(runtime="no-such-runtime"),
                                                            start_timeout_s=20)}))
    raw = requests.post(f"{service}/run_code", json={"code": "print(3)", "language": "python"}, timeout=120)
    assert raw.status_code == 200 and raw.json()["status"] == "SandboxError", raw.text
    assert "no-such-runtime" in raw.json()["message"]
    with pytest.raises(Exception, match="Sandbox responded with error"):
        run_code(service, "print(3)")
    results, meta = verl.utils.check_correctness(f"{service}/run_code", {"inputs": ["1 2\n"], "outputs": ["3\n"]}, "print(3)",
                                           timeout=5)
    assert results == [-1] and meta[0]["status"] == "sandbox_error"
    # coderloo's own functions for TRL and verl raise too: a reward of 0 would be learned from
    from reward_service.peers import CoderlooReward, ServiceUnavailable, compute_score

    with pytest.raises(ServiceUnavailable, match="503"):
        CoderlooReward(service, retries=0)(["p"], ["```python\nprint(3)\n```"], None, task=[json.dumps(SUM_CASES)])
    with pytest.raises(ServiceUnavailable):
        compute_score("code", "```python\nprint(3)\n```", json.dumps(SUM_CASES), url=service, retries=0)


def test_a_full_queue_answers_504_which_verl_retries(service, verl, caplog):
    """One replica taking one request at a time and one waiting: the rest of 8 concurrent clients get
    504 (never Serve's 503, which verl would score as a failed test); verl's client sends them again."""
    redeploy(CONFIG.model_copy(update={"max_ongoing_requests": 1, "max_queued_requests": 1,
                                       "autoscaling": AutoscalingSettings(min_replicas=1, max_replicas=1)}))
    slow = {"code": "import time\ntime.sleep(1)\nprint(3)\n", "language": "python"}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: requests.post(f"{service}/run_code", json=slow, timeout=60).status_code, range(8)))
    assert set(codes) <= {200, 504} and 504 in codes and 200 in codes, codes
    # A 1 s program holds the replica's place, then three verl clients of programs that only print
    # come for the one place in its queue: two get 504 whenever they arrive in that second (three
    # clients of their own alone could arrive staggered enough that each finds a place: seen once in
    # a full suite). verl sends them again after 1 s, then, for the last time, 2 s more: by then the
    # held program and the queued one have long ended, however loaded the machine (0.5 s programs of
    # the clients' own once left one of them without a place at its last try, in a full suite).
    caplog.set_level(logging.WARNING, logger="verl_sandbox_fusion.utils")
    program = "print(3)\n"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = pool.submit(requests.post, f"{service}/run_code", json=slow, timeout=60)
        time.sleep(0.3)  # it has the place (a request starts within tens of ms)
        scored = list(pool.map(lambda _: verl.utils.check_correctness(f"{service}/run_code", {"inputs": [""], "outputs": ["3\n"]},
                                                                program, timeout=5)[0], range(3)))
        assert held.result().status_code == 200
    assert scored == [[True]] * 3
    assert any("Gateway Timeout (504)" in record.getMessage() for record in caplog.records), "no client was sent back"


@pytest.mark.slow
def test_the_serve_command(tmp_path):
    """`coderloo serve` as a user starts it: its own local Ray, the service on the given port; it says
    where, answers SandboxFusion's ping and /run_code, and stops cleanly on SIGTERM."""
    import signal
    import subprocess
    import time

    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    command = [sys.executable, "-m", "coderloo.cli", "serve", "--port", str(port), "reward.pool.max_executors=1"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while f"reward service at http://127.0.0.1:{port}" not in Path(log.name).read_text():
            assert process.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()[-3000:]
            time.sleep(1)
        url = f"http://127.0.0.1:{port}"
        assert requests.get(f"{url}/v1/ping", timeout=30).json() == "pong"
        assert run_code(url, "print(6 * 7)").run_result.stdout == "42\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, Path(log.name).read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
