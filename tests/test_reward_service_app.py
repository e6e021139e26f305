"""The reward service over real HTTP on 127.0.0.1 and through a DeploymentHandle: real Serve, real
sandbox pool, real Ruff."""
import json

import pytest

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings

from coderloo.tasksets.synthetic import synthetic_suite
from common.placement import free_port
from reward_service.config import AutoscalingSettings, ServiceConfig
from reward_service.schemas import RewardItem, RewardRequest
from reward_service.tasks import save_jsonl
from reward_service.weights import RewardWeights

TASK = synthetic_suite()["train"][0]
RIGHT = TASK.reference[len(TASK.prompt):]


@pytest.fixture(scope="module")
def service(ray_cluster, tiny_model, tmp_path_factory):
    from ray import serve

    from reward_service.app import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    task_file = tmp_path_factory.mktemp("tasks") / "train.jsonl"  # the tasks requests name by id
    save_jsonl(synthetic_suite()["train"], task_file)
    config = ServiceConfig(
        weights=RewardWeights(lint=0.2), task_files=[str(task_file)], tokenizer_path=str(tiny_model), max_batch=8, max_body_bytes=64 * 1024,
        autoscaling=AutoscalingSettings(min_replicas=1, max_replicas=2, target_ongoing_requests=4),
    )
    handle = serve.run(build_app(config), name="rewards", route_prefix="/")
    yield handle, f"http://127.0.0.1:{port}"
    serve.shutdown()


def post(url, body, **kw):
    return requests.post(f"{url}/v1/rewards", data=body, headers={"content-type": "application/json"}, timeout=60, **kw)


def test_scores_over_http_with_token_rewards(service, tiny_model):
    from common.hf import load_tokenizer

    _, url = service
    ids = load_tokenizer(tiny_model)(RIGHT, add_special_tokens=False)["input_ids"]
    body = {"items": [
        {"task_id": TASK.id, "completion": RIGHT, "completion_token_ids": ids},
        {"task": TASK.model_dump(), "completion": "    import os\n    return x\n"},
    ]}
    r = post(url, json.dumps(body))
    assert r.status_code == 200, r.text
    right, wrong = r.json()["items"]
    assert right["passed"] and right["status"] == "passed" and right["total"] == pytest.approx(1.1)
    assert right["components"] == {"syntax": 1.0, "functionality": 1.0, "lint": 0.0, "performance": None, "coverage": None,
                                   "domain": {}}
    assert len(right["token_rewards"]) == len(ids) and sum(right["token_rewards"]) == pytest.approx(1.1)
    assert not wrong["passed"] and wrong["components"]["lint"] == 0.2 and wrong["token_rewards"] is None
    assert [d["code"] for d in wrong["diagnostics"]] == ["F401"]
    # what a rewrite would be told: nothing when it passed, else the first failing test
    assert right["feedback"] == "" and "first failing test: " in wrong["feedback"]


def test_a_plugged_in_component_that_raises_is_a_503_naming_it(service):
    """Its failure is the service's, not the program's: no score of 0 comes back."""
    from ray import serve

    from reward_service.app import build_app

    _, url = service
    config = ServiceConfig(components=[{"name": "broken", "path": "json:loads", "weight": 0.1}])
    serve.run(build_app(config), name="broken", route_prefix="/broken")
    try:
        r = post(f"{url}/broken", json.dumps({"items": [{"task": TASK.model_dump(), "completion": RIGHT}]}))
    finally:
        serve.delete("broken")
    assert r.status_code == 503, r.text
    assert "reward component 'broken' (json:loads) on task" in r.json()["detail"] and "raised TypeError" in r.json()["detail"]


def test_handle_without_http(service):
    handle, _ = service
    request = RewardRequest(items=[RewardItem(task=TASK, completion=RIGHT)])
    response = handle.score.remote(request).result()
    assert response.items[0].passed


def test_healthz_metrics_openapi(service):
    _, url = service
    assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    assert "/v1/rewards" in requests.get(f"{url}/openapi.json", timeout=10).json()["paths"]
    post(url, json.dumps({"items": [{"task_id": TASK.id, "completion": RIGHT}]}))
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert 'reward_requests_total{code="200",path="/v1/rewards"}' in metrics
    assert 'reward_item_outcomes_total{status="passed"}' in metrics and "reward_request_seconds_bucket" in metrics


@pytest.mark.parametrize("body, code", [
    (b'{"items": [', 422),  # malformed JSON
    (b'{"items": [{"task_id": "x"}]}', 422),  # missing completion
    (b'{"items": [{"task_id": 3, "completion": 5}]}', 422),  # wrong types
    (b'{"items": [{"completion": "x"}]}', 422),  # neither task nor task_id
    (b'{"items": []}', 422),  # empty batch
    (b'{"items": [{"task_id": "a", "completion": "\xff\xfe"}]}', 400),  # invalid UTF-8
])
def test_bad_input_is_a_clear_4xx(service, body, code):
    _, url = service
    r = post(url, body)
    assert r.status_code == code, r.text


def test_unknown_task_id_is_named(service):
    _, url = service
    r = post(url, json.dumps({"items": [{"task_id": "no/such/task", "completion": "x"}]}))
    assert r.status_code == 404 and "no/such/task" in r.text


@pytest.mark.parametrize("ids, named", [([-3], "greater than or equal to 0"), ([5, 10**6], "over the vocabulary")])
def test_token_ids_outside_the_vocabulary_are_a_422(service, ids, named):
    # Found by the fuzz test: a negative id reached the tokenizer and became a 500.
    _, url = service
    r = post(url, json.dumps({"items": [{"task_id": TASK.id, "completion": "x", "completion_token_ids": ids}]}))
    assert r.status_code == 422 and named in r.text, r.text


def test_size_and_batch_limits(service):
    _, url = service
    assert post(url, b'{"items": [' + b" " * 70_000 + b"]}").status_code == 413
    chunked = iter([b'{"items": [', b" " * 70_000, b"]}"])  # no Content-Length: counted as it arrives
    assert post(url, chunked).status_code == 413
    batch = {"items": [{"task_id": TASK.id, "completion": "x"}] * 9}
    r = post(url, json.dumps(batch))
    assert r.status_code == 413 and "limit of 8" in r.text
    assert requests.get(f"{url}/healthz", timeout=10).status_code == 200  # the replica is still up



@pytest.fixture(scope="module")
def openapi_schema(service):
    _, url = service
    return schemathesis.openapi.from_url(f"{url}/openapi.json")



def test_fuzzed_requests_never_get_a_server_error(openapi_schema):
    """Schemathesis generates requests from /openapi.json (valid and not); none may get a 5xx."""
    for operation in openapi_schema.get_all_operations():

        @given(operation.ok().as_strategy())
        @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def call(case):
            response = case.call(timeout=30)
            assert response.status_code < 500, (case.as_curl_command(), response.text)

        call()


def test_autoscaling_options_from_config():
    from pydantic import ValidationError

    from reward_service.app import deployment_options

    config = ServiceConfig(autoscaling={"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 3}, replica_cpus=1,
                           health_check_timeout_s=5, max_queued_requests=16, retry_after_s=2)
    options = deployment_options(config)
    backpressure = options.pop("backpressure_config")
    assert (backpressure.status_code, backpressure.retry_after_s) == (503, 2)
    assert options == {
        "autoscaling_config": {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 3.0},
        "ray_actor_options": {"num_cpus": 1.0},
        "health_check_period_s": 10.0, "health_check_timeout_s": 5.0,
        "max_ongoing_requests": 64, "max_queued_requests": 16,
    }
    with pytest.raises(ValidationError, match="max_replicas"):
        AutoscalingSettings(min_replicas=3, max_replicas=2)
