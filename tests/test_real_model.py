"""The smallest real model of the catalogue (SmolLM2-135M-Instruct, fetched once per machine)
through the real components: vLLM and transformers give the same greedy tokens on its chat
prompts, a float32 push into a bf16 engine is verified (and a load that drops a tensor caught),
and one RL step with the model's own chat template scores, learns and evaluates."""
import json

import pytest
import ray
import torch

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.model_import import fetch
from coderloo.tasksets.synthetic import synthetic_suite
from common.hf import load_tokenizer
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker, WeightSyncError
from rollout_workers.config import PromptConfig, WeightSyncConfig
from rollout_workers.prompts import render
from tests.rounding import assert_same_greedy, reference_model
from tests.test_weight_sync_shm import ModelSource, VLLMEngine

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smol():
    return fetch(NAME)


def chat_prompts(path, n: int) -> list[str]:
    tokenizer = load_tokenizer(path)
    return [render(t, tokenizer, PromptConfig(chat_template="on")) for t in synthetic_suite()["heldout"][:n]]


def test_vllm_and_transformers_give_the_same_greedy_tokens(ray_cluster, smol):
    engines = [RolloutWorker.remote(str(smol), backend, threads=1) for backend in ("vllm", "transformers")]
    try:
        outs = [RolloutGroup([w]).generate(chat_prompts(smol, 4), GenerationParams(n=1, max_new_tokens=24, temperature=0.0))
                for w in engines]
    finally:
        for w in engines:
            ray.kill(w)
    ids = [[r.samples[0].token_ids for r in out] for out in outs]
    assert len({tuple(i) for i in ids[0]}) == 4, "the prompts should not all be answered alike"
    # each engine's kernels round differently: equal greedy tokens up to a near-tie (tests/rounding.py)
    assert_same_greedy(reference_model(smol), [r.prompt_ids for r in outs[1]], ids[1], ids[0], what=NAME)


def test_a_float32_push_into_a_bf16_engine_is_verified_and_a_dropped_tensor_caught(ray_cluster, smol):
    source = ModelSource.remote(str(smol))
    engine = VLLMEngine.remote(str(smol), dtype="bfloat16")
    group = RolloutGroup([engine], WeightSyncConfig(timeout_s=60))
    try:
        group.connect([source])
        ray.get(source.perturb.remote(1e-3))
        group.push()
        sent, held = ray.get(source.weights.remote()), ray.get(engine.parameters.remote())
        embedding = "model.embed_tokens.weight"
        assert held[embedding].dtype == torch.bfloat16
        assert torch.equal(held[embedding], sent[embedding].to(torch.bfloat16))
        ray.get(source.perturb.remote(1e-3))
        ray.get(engine.drop_from_loads.remote([embedding, "lm_head.weight"]))  # tied: lm_head's load would fill it
        with pytest.raises(WeightSyncError, match=f"{embedding} in the engine sums to .* rounded to its dtype"):
            group.push()
    finally:
        ray.kill(source)
        ray.kill(engine)


def test_one_rl_step_on_a_real_model_with_its_chat_template(ray_cluster, smol, tmp_path):
    out = tmp_path / "run"
    config = load_config("configs/real-135m.yaml", [
        f"model.path={smol}", f"train.output_dir={out}",
        "tasks.max_eval_tasks=8",
        "train.steps=1", "train.prompts_per_step=2", "train.eval_every=0", "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=96", "eval.max_new_tokens=96", "learner.advantage.filter_uninformative=false",
    ])
    summary = train(config)
    assert summary["policy_version"] == 1  # the step's push went through its checks
    # an instruct model answers through its chat template: a fenced program that passes tests
    assert summary["base"]["greedy_pass@1"] >= 0.5, summary["base"]
    assert 0 <= summary["final"]["greedy_pass@1"] <= 1
    # the checkpoint keeps the chat template (`coderloo eval --model` of it renders prompts through it)
    assert load_tokenizer(out / "checkpoints" / "final").chat_template == load_tokenizer(smol).chat_template
    # no SFT steps: RL starts from the base policy, whose evaluation is recorded again, not run again
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["phase"] == "eval"]
    assert [(r["stage"], r["step"]) for r in evals] == [("base", 0), ("rl", 0), ("rl", 1)]
    assert {**evals[1], "time": None, "stage": None} == {**evals[0], "time": None, "stage": None}
