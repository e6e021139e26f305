"""What other trainers send and call: OpenRLHF's remote reward protocol (served by the app at POST
/v1/openrlhf), a TRL reward function and a verl `compute_score`, both of which call a running
service (`coderloo serve`) over HTTP.

A label names a task: a task id the service was configured with (`reward.task_files`), or the task
as JSON: a whole task in coderloo's one format; just its tests, `{"tests": [...]}` with optionally
`entry_point`, `language`, `test_setup`, `time_limit_s`, `memory_mb` and `match`; or the
`{"inputs": [...], "outputs": [...], "fn_name"?}` of verl's and TACO's datasets (with `fn_name`,
call cases: each input a list of arguments or one JSON argument per line, each output the value).
"""
from __future__ import annotations

import json
import time
from typing import Any

import requests
from pydantic import BaseModel, Field, ValidationError, model_validator

from common.config import Section
from reward_service.schemas import ItemReward
from reward_service.tasks import Task

SHORT_FORM = {"tests", "entry_point", "language", "test_setup", "time_limit_s", "memory_mb", "match"}
IN_OUT_FORM = {"inputs", "outputs", "fn_name"}


def label_task(label: str | dict, where: str, prompt: str = "", known: dict[str, Task] | None = None) -> Task:
    """The task a label names; a ValueError says what is wrong with it, naming `where`."""
    if isinstance(label, str) and known and label in known:
        return known[label]
    record = label
    if isinstance(label, str):
        try:
            record = json.loads(label)
        except ValueError:
            raise ValueError(f"{where} is neither a task id the service knows nor JSON") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object (a task, or its tests), got {type(record).__name__}")
    if record and set(record) <= IN_OUT_FORM and {"inputs", "outputs"} <= set(record):
        record = {"tests": _in_out_tests(record, where), "entry_point": record.get("fn_name")}
    if set(record) <= SHORT_FORM:
        record = {"id": where, "prompt": prompt or "(prompt)", "reference": "", "difficulty": 1, "source": "peer",
                  "prompt_is_code": False, **record}
    try:
        return Task.model_validate(record)
    except ValidationError as e:
        reasons = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'task'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{where}: not a task: {reasons}") from None


def _in_out_tests(record: dict, where: str) -> list[dict]:
    inputs, outputs = record["inputs"], record["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError(f"{where}: inputs and outputs must be lists of one length")
    if not record.get("fn_name"):
        return [{"stdin": str(i), "stdout": str(o)} for i, o in zip(inputs, outputs)]
    tests = []
    for i, o in zip(inputs, outputs):
        try:
            args = i if isinstance(i, list) else [json.loads(line) for line in str(i).splitlines() if line.strip()]
            value = json.loads(o) if isinstance(o, str) else o
        except ValueError:
            raise ValueError(f"{where}: a call case's input or output is not JSON: {str(i)[:80]!r} -> {str(o)[:80]!r}") from None
        tests.append({"args": args, "accepted": [value]})
    return tests


class OpenRLHFRequest(Section):
    query: list[str] = Field(min_length=1, description="Each prompt followed by its response, with the chat template.")
    prompts: list[str] = Field(description="Each query's prompt, as it begins the query.")
    labels: list[str] = Field(description="Each query's task: a task id, or the task (or its tests) as JSON.")

    @model_validator(mode="after")
    def _aligned(self) -> "OpenRLHFRequest":
        if not len(self.query) == len(self.prompts) == len(self.labels):
            raise ValueError(f"query, prompts and labels must have one entry per query: {len(self.query)}, "
                             f"{len(self.prompts)} and {len(self.labels)} given")
        for i, (query, prompt) in enumerate(zip(self.query, self.prompts)):
            if not query.startswith(prompt):
                raise ValueError(f"query[{i}] does not begin with prompts[{i}]: the response is what follows the prompt")
        return self

    def responses(self) -> list[str]:
        return [query[len(prompt):] for query, prompt in zip(self.query, self.prompts)]


class OpenRLHFResponse(BaseModel):
    rewards: list[float] = Field(description="The composite reward of each query (what the advantages use).")
    scores: list[float] = Field(description="The share of its tests each response's program passed, in [0, 1] (what "
                                "OpenRLHF's dynamic filtering reads).")
    extra_logs: dict[str, list[float]] = Field(description="Per query: passed (1 or 0) and syntax (1: it compiles).")


def openrlhf_response(rewards: list[ItemReward]) -> OpenRLHFResponse:
    return OpenRLHFResponse(rewards=[r.total for r in rewards], scores=[r.components.functionality for r in rewards],
                            extra_logs={"passed": [float(r.passed) for r in rewards],
                                        "syntax": [r.components.syntax for r in rewards]})


class ServiceUnavailable(RuntimeError):
    """The service did not score: its sandbox failed, or it did not answer. Never a reward of 0."""


def score_items(url: str, items: list[dict], retries: int = 5, timeout_s: float = 300.0) -> list[dict]:
    """POST /v1/rewards; a 503 (a sandbox failure, a full queue) waits its Retry-After and is sent
    again, `retries` times, then raises ServiceUnavailable, as does no answer; a 4xx raises ValueError."""
    for attempt in range(retries + 1):
        try:
            answer = requests.post(f"{url.rstrip('/')}/v1/rewards", json={"items": items}, timeout=timeout_s)
        except requests.RequestException as e:
            raise ServiceUnavailable(f"reward service at {url}: {e}") from e
        if answer.status_code == 200:
            return answer.json()["items"]
        if answer.status_code != 503:
            raise ValueError(f"reward service at {url}: {answer.status_code}: {answer.text[:500]}")
        if attempt < retries:
            time.sleep(float(answer.headers.get("retry-after", 1)))
    raise ServiceUnavailable(f"reward service at {url}: 503 after {retries + 1} tries: {answer.text[:500]}")


def _item(label: Any, completion: str, where: str) -> dict:
    if isinstance(label, str) and not label.lstrip().startswith("{"):
        return {"task_id": label, "completion": completion}
    return {"task": label_task(label, where).model_dump(mode="json"), "completion": completion}


class CoderlooReward:
    """A TRL reward function (GRPOTrainer's and RLOOTrainer's `reward_funcs`) scored by a running
    coderloo service: each completion's composite reward for the task its dataset row names in the
    column `task_column` (a task id the service knows, or a label as above).

        GRPOTrainer(model, reward_funcs=[CoderlooReward("http://127.0.0.1:8080")], train_dataset=rows, ...)

    A conversational completion's last message is scored. A sandbox failure raises
    (ServiceUnavailable) rather than returning a 0 the policy would learn from."""

    def __init__(self, url: str, task_column: str = "task", retries: int = 5):
        self.url, self.task_column, self.retries = url, task_column, retries
        self.__name__ = "coderloo"  # TRL logs each reward function by its name

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, **columns) -> list[float]:
        if self.task_column not in columns:
            raise KeyError(f"the dataset has no column {self.task_column!r} naming each row's task (task_column); "
                           f"columns: {sorted(columns)}")
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        items = [_item(label, text, f"{self.task_column}[{i}]") for i, (label, text) in enumerate(zip(columns[self.task_column], texts))]
        return [item["total"] for item in score_items(self.url, items, self.retries)]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  url: str = "http://127.0.0.1:8080", retries: int = 5) -> dict:
    """verl's custom reward function (`custom_reward_function.path` this file, `.name: compute_score`,
    `reward_kwargs.url` the service): the completion `solution_str` scored for the task
    `ground_truth` names (a label as above). Returns verl's dict: `score` (the composite reward)
    and the components it logs. A sandbox failure raises, rather than scoring 0."""
    item = score_items(url, [_item(ground_truth, solution_str, f"ground_truth ({data_source})")], retries)[0]
    components = item["components"]
    return {"score": item["total"], "passed": float(item["passed"]), "functionality": components["functionality"],
            "syntax": components["syntax"]}
