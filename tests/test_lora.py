"""LoRA: the adapter's two forms (its own tensors, the merged model), adapter-only pushes into vLLM
and transformers that agree with the merged weights after each update, and the learner training
only the adapter."""
import contextlib
import sys
import time

import pytest
import ray
import torch

from coderloo.models import TinyModelSpec, build_tiny_model
from tests.rounding import assert_same_greedy, logprob_bound
from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
from common.hf import load_causal_lm
from common.weight_sync import ADAPTER_PROBE, WeightSource, plan_buckets, probe_sums
from learner import lora
from learner.actor import named_weights
from learner.config import LoraSettings
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker
from rollout_workers.config import WeightSyncConfig
from rollout_workers.hf_backend import TransformersBackend

PROMPTS = [t.prompt for t in synthetic_suite()["heldout"][::6]]
GREEDY = GenerationParams(n=1, max_new_tokens=16, temperature=0.0)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# The actor below calls this module's helpers: Ray's workers cannot import a test module, so they
# travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def settings(rank=8, modules_to_save=(), **more):
    return LoraSettings(rank=rank, alpha=2.0 * rank, target_modules=TARGETS, modules_to_save=list(modules_to_save), **more)


def perturb_adapter(model, scale: float) -> None:
    """Large random adapters: PEFT starts lora_B at zero (no change), and greedy outputs of small
    changes are the base model's."""
    with torch.no_grad():
        for _, p in lora.trainable(model):
            p.add_(torch.randn_like(p) * scale)


@pytest.fixture(scope="module")
def untied_model(tmp_path_factory):
    spec = TinyModelSpec(tie_word_embeddings=False, seed=1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-untied-lora"), corpus_for_tokenizer(), spec)


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_the_merged_weights_are_the_adapted_model(tiny_model, untied_model, which):
    path = tiny_model if which == "tied" else untied_model
    torch.manual_seed(0)
    # untied: lm_head trained whole as well (a module saved beside the adapter)
    model = lora.wrap(load_causal_lm(path), settings(modules_to_save=[] if which == "tied" else ["lm_head"]))
    trained = lora.trainable(model)
    assert trained and all(".lora_" in n or "modules_to_save" in n for n, _ in trained)
    assert sum(p.numel() for _, p in trained) < sum(p.numel() for p in model.parameters()) / 2
    perturb_adapter(model, 0.3)
    plain = load_causal_lm(path)
    plain.load_state_dict(lora.merged_weights(model), strict=True)
    ids = torch.randint(0, 200, (3, 20))
    with torch.no_grad():
        adapted, merged = model(input_ids=ids).logits, plain(input_ids=ids).logits
        base = load_causal_lm(path)(input_ids=ids).logits
        with lora.reference_disabled(model):
            reference = model(input_ids=ids).logits
    assert (adapted - base).abs().max() > 1.0, "the adapter changed nothing"
    # x (W + s A B) against x W + s x A B: the same sums rounded otherwise (tests/rounding.py)
    torch.testing.assert_close(merged, adapted, atol=logprob_bound(plain, 20, lora_rank=8), rtol=0)
    torch.testing.assert_close(reference, base, atol=0, rtol=0)  # the adapter off: the base model exactly
    under = load_causal_lm(path)
    under.load_state_dict(lora.base_weights(model), strict=True)  # the weights under the adapter
    with torch.no_grad():
        torch.testing.assert_close(under(input_ids=ids).logits, base, atol=0, rtol=0)

    adapter = lora.adapter_weights(model)
    assert all(n.startswith("base_model.model.") and ".default." not in n for n in adapter)
    plan = plan_buckets(adapter.items(), 1 << 16, lora.adapter_config(model), form="adapter")
    assert plan.probes == (ADAPTER_PROBE,) and plan.adapter["r"] == 8
    total = sum(float(t.double().sum()) for n, t in adapter.items() if ".lora_A." in n)
    assert probe_sums(adapter, plan.probes) == {ADAPTER_PROBE: pytest.approx(total)}
    assert probe_sums(dict(model.named_parameters()), plan.probes) == {ADAPTER_PROBE: pytest.approx(total)}


def test_lora_plus_moves_each_b_matrix_at_its_own_rate(tiny_model):
    # orthogonal init: A and B both nonzero (their product zero), so both get gradients at once
    model = lora.wrap(load_causal_lm(tiny_model), settings(init="orthogonal"))
    groups = lora.parameter_groups(model, 1e-3, 16.0)
    assert [g["lr"] for g in groups] == [1e-3, 1.6e-2]
    before = {n: p.detach().clone() for n, p in lora.trainable(model)}
    assert all(p.abs().max() > 0 for p in before.values())
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    model(input_ids=torch.randint(0, 200, (2, 12)), labels=torch.randint(0, 200, (2, 12))).loss.backward()
    optimizer.step()
    # Adam's first step moves each parameter by its group's rate (times the sign of its gradient)
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in lora.trainable(model)}
    assert all(v == pytest.approx(1.6e-2, rel=1e-3) for n, v in moved.items() if ".lora_B." in n)
    assert all(v == pytest.approx(1e-3, rel=1e-3) for n, v in moved.items() if ".lora_A." in n)
    assert lora.parameter_groups(model, 1e-3, 1.0)[0]["params"] == [p for _, p in lora.trainable(model)]


@ray.remote
class AdapterSource(WeightSource):
    """The sender's side of an adapter push, holding a PEFT model whose adapter the test changes."""

    def __init__(self, path: str, new_base: bool = False, rslora: bool = False):
        """`new_base`: the adapter is on other weights than the path's (lora.start rl's SFT'd
        policy): an engine gets them first. `rslora`: the update scaled by alpha / sqrt(rank)."""
        torch.manual_seed(0)
        model = load_causal_lm(path)
        if new_base:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.3)
        self.model = lora.wrap(model, settings(rslora=rslora))
        self.forms = ["base", "adapter"] if new_base else ["adapter"]

    def sync_forms(self):
        return self.forms

    def adapter_config(self):
        return lora.adapter_config(self.model)

    @contextlib.contextmanager
    def weights_for_sync(self, form="weights"):
        yield lora.adapter_weights(self.model) if form == "adapter" else named_weights(self.model, base=form == "base")

    def perturb(self, scale: float) -> dict:
        perturb_adapter(self.model, scale)
        return {n: t.clone() for n, t in lora.merged_weights(self.model).items()}


# rsLoRA scales the update by alpha / sqrt(rank), 2.8x alpha / rank at rank 8: an engine that read
# the adapter's config as plain LoRA would not match the merged weights.
@pytest.mark.parametrize("which, rslora", [("tied", False), ("untied", True)], ids=["tied", "untied, rsLoRA"])
def test_vllm_with_the_pushed_adapter_matches_transformers_with_the_merged_weights(ray_cluster, tiny_model, untied_model, which, rslora):
    path = str(tiny_model if which == "tied" else untied_model)
    source = AdapterSource.remote(path, rslora=rslora)
    vllm_worker = RolloutWorker.remote(path, "vllm", threads=1, lora_rank=8)
    hf_worker = RolloutWorker.remote(path, "transformers", threads=1)
    merged = TransformersBackend(path)  # transformers with the merged weights, here in the test's process
    group = RolloutGroup([vllm_worker, hf_worker], WeightSyncConfig(bucket_mb=0.05, timeout_s=60))
    previous = None
    try:
        group.connect([source])
        plan = group._plan
        assert plan.adapter is not None and len(plan.buckets) > 1
        full_bytes = sum(p.numel() * 4 for p in load_causal_lm(path).parameters())
        assert plan.nbytes < full_bytes / 5, "an adapter push should be a fraction of the model"
        for version in (1, 2, 3):
            # rsLoRA's larger scale: smaller steps, for updates of the same size (large ones bring near-ties)
            weights = ray.get(source.perturb.remote(0.15 if rslora else 0.4))
            merged.model.load_state_dict(weights, strict=True)
            timing = group.push()
            assert group.version == version and timing["sync_bytes"] == plan.nbytes
            ids_vllm = [r.samples[0].token_ids for r in RolloutGroup([vllm_worker]).generate(PROMPTS, GREEDY)]
            ids_hf = [r.samples[0].token_ids for r in RolloutGroup([hf_worker]).generate(PROMPTS, GREEDY)]
            from_merged = [r for _, r in merged.generate_stream(PROMPTS, GREEDY, version)]
            ids_merged = [r.samples[0].token_ids for r in from_merged]
            assert len({tuple(ids) for ids in ids_merged}) >= 4, "outputs too uniform for a meaningful check"
            # unmerged (x W + s x A B) and merged (x (W + s A B)) products round differently: equal
            # greedy tokens up to a near-tie (tests/rounding.py)
            prompt_ids = [r.prompt_ids for r in from_merged]
            for ids, what in ((ids_vllm, "vLLM with the adapter"), (ids_hf, "transformers with the adapter")):
                assert_same_greedy(merged.model, prompt_ids, ids_merged, ids, lora_rank=8, what=f"{which} model, version {version}: {what}")
            assert ids_vllm != previous, "outputs did not change after an update"
            previous = ids_vllm
    finally:
        for actor in (source, vllm_worker, hf_worker):
            ray.kill(actor)


# the last case: rsLoRA, LoRA+ (two optimizer groups under ZeRO-2) and an adapter that starts nonzero
@pytest.mark.parametrize("stage, sync, dtype, more", [
    (0, "adapter", "float32", {}), (3, "merged", "float32", {}),
    (2, "adapter", "bfloat16", {"rslora": True, "lr_ratio": 4.0, "init": "orthogonal"}),
])
def test_the_learner_trains_only_the_adapter_its_reference_is_the_base_and_it_resumes(ray_cluster, tiny_model, tmp_path, stage, sync, dtype, more):
    from peft import PeftModel

    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from test_learner_actor import batch, loss

    config = LearnerConfig(zero_stage=stage, optimizer_steps=2, kl={"coef": 0.1}, max_tokens_per_micro_batch=256, dtype=dtype,
                           lora=LoraSettings(rank=8, alpha=16, sync=sync, **more))
    # the whole model's parameters; AdamW over all of them would hold two fp32 moments of each
    whole = sum(p.numel() for p in load_causal_lm(tiny_model).parameters())
    examples, sequences = batch(tiny_model)
    learner = LearnerGroup(str(tiny_model), config, sft_lr=1e-3)
    worker = RolloutWorker.remote(str(tiny_model), "transformers", threads=1)
    try:
        stats = learner.sft_step(examples)
        assert stats["grad_norm"] > 0
        stats = learner.train_step(sequences, *loss(config))
        # the reference is the base model: after the adapter moved, the KL to it is no longer 0
        assert stats["kl"] > 0
        counts = learner.parameter_counts()
        assert counts["parameters"] == whole + counts["trainable"]  # the base and the adapter
        assert 0 < counts["trainable"] < whole / 5
        # AdamW's two moments (and a step count) for the adapter only
        assert 0 < counts["optimizer_state_bytes"] < 2 * 4 * whole / 5
        group = RolloutGroup([worker])
        group.connect(learner.weight_sources)
        names = [s.name for b in group._plan.buckets for s in b]
        if sync == "adapter":
            assert group._plan.form == "adapter" and all(".lora_" in n for n in names)
        else:  # the merged model, under the names of the model's own checkpoint
            assert group._plan.form == "weights" and set(names) == set(load_causal_lm(tiny_model).state_dict())
        group.push()
        learner.save(str(tmp_path / "ckpt"), with_state=True)
        before = learner.token_stats(sequences, 1.0, kl=True, values=False)[0]
    finally:
        learner.kill()
    # the checkpoint: PEFT's adapter, and the merged model, which equals base + adapter
    adapted = PeftModel.from_pretrained(load_causal_lm(tiny_model), str(tmp_path / "ckpt" / lora.ADAPTER_DIR))
    merged = load_causal_lm(tmp_path / "ckpt")
    ids = torch.tensor([sequences[0].prompt_ids + sequences[0].completion_ids])
    with torch.no_grad():
        # float32: the merged and unmerged products round otherwise; bf16: the export is rounded to it
        tolerance = logprob_bound(merged, ids.shape[1], lora_rank=8) if dtype == "float32" else 5e-2
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=tolerance, rtol=0 if dtype == "float32" else tolerance)
        assert not torch.allclose(merged(input_ids=ids).logits, load_causal_lm(tiny_model)(input_ids=ids).logits)
    resumed = LearnerGroup(str(tiny_model), config, sft_lr=1e-3)
    try:
        resumed.load_state(str(tmp_path / "ckpt"))
        after = resumed.token_stats(sequences, 1.0, kl=True, values=False)[0]
    finally:
        resumed.kill()
    flat = lambda rows: [v for row in rows for v in row]
    assert flat(after) == pytest.approx(flat(before), abs=1e-6)


def test_a_restarted_engine_gets_the_adapters_base_then_the_adapter(ray_cluster, tiny_model):
    """An adapter on an SFT'd base (lora.start rl): an engine that restarts from the model's path
    is brought back with the base and then the adapter, under one new version."""
    path = str(tiny_model)
    source = AdapterSource.remote(path, new_base=True)
    worker = RolloutWorker.options(max_restarts=-1).remote(path, "vllm", threads=1, lora_rank=8)
    merged = TransformersBackend(path)
    group = RolloutGroup([worker], WeightSyncConfig(timeout_s=60))
    try:
        group.connect([source])
        assert [p.form for p in group._plans] == ["base", "adapter"]
        merged.model.load_state_dict(ray.get(source.perturb.remote(0.4)), strict=True)
        group.push(catch_up=True)  # as a resumed run does
        from_merged = [r for _, r in merged.generate_stream(PROMPTS, GREEDY, 1)]
        expected, prompt_ids = [r.samples[0].token_ids for r in from_merged], [r.prompt_ids for r in from_merged]
        assert len({tuple(ids) for ids in expected}) >= 4
        same_greedy = lambda what: assert_same_greedy(merged.model, prompt_ids, expected, [r.samples[0].token_ids for r in group.generate(PROMPTS, GREEDY)],
                                                      lora_rank=8, what=what)
        same_greedy("the base and the adapter pushed")
        assert group.version == 1
        pid = ray.get(worker.status.remote())[0]
        ray.kill(worker, no_restart=False)
        deadline = time.time() + 120
        while time.time() < deadline:  # until Ray has restarted it (the kill is asynchronous)
            try:
                if ray.get(worker.status.remote(), timeout=10)[0] != pid:
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(0.5)
        assert ray.get(worker.status.remote()) == (ray.get(worker.status.remote())[0], 0)  # back at the path's weights
        group.recover()
        assert group.version == 2 and ray.get(worker.status.remote())[1] == 2
        same_greedy("after the restart")
        timing = group.push()  # each step's push: the adapter alone
        assert timing["sync_bytes"] == group._plan.nbytes and group._plan.form == "adapter"
    finally:
        ray.kill(source)
        ray.kill(worker)


def test_lora_settings_that_cannot_work_name_the_field():
    from coderloo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="learner.lora.modules_to_save"):
        load_config(None, ["learner.lora.modules_to_save=[lm_head]"])  # vLLM serves no adapter with them
    assert load_config(None, ["learner.lora.modules_to_save=[lm_head]", "learner.lora.sync=merged"]).learner.pushed_adapter_rank is None
    with pytest.raises(ConfigError, match="learner.lora.rank=600"):
        load_config(None, ["learner.lora.rank=600"])
    with pytest.raises(ConfigError, match="learner.lora.*even rank, got rank 5"):
        load_config(None, ["learner.lora.rank=5", "learner.lora.init=orthogonal"])
    no_export = ["learner.lora.rank=8", "learner.lora.merged_export=false", "critic.enabled=true"]
    with pytest.raises(ConfigError, match="critic.start sft reads the policy after SFT"):
        load_config(None, no_export)  # the SFT'd LoRA policy would not be written whole for the critic
    load_config(None, [*no_export, "critic.start=model"])
    with pytest.raises(ConfigError, match="value_model shared"):
        load_config("configs/ppo.yaml", ["learner.lora.rank=8", "learner.advantage.value_model=shared"])
    config = load_config("configs/lora.yaml")
    assert config.learner.lora.start == "rl" and config.learner.pushed_adapter_rank == 16
