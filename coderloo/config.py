"""Typed configuration: YAML files in configs/, overridable from the command line (`learner.lr=1e-5`).

Every field is documented; an invalid config fails before anything starts, naming the field
and the reason.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coderloo.curriculum import CurriculumConfig
from coderloo.models import TinyModelSpec
from coderloo.refine import RefineConfig
from coderloo.runtime import REPO_ROOT
from reward_service.schemas import ServiceConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field(
        default=".cache/tiny-qwen2",
        description="Directory of a Hugging Face causal LM (relative paths are from the repository root).",
    )
    build_tiny: bool = Field(
        default=True,
        description="Build a tiny Qwen2 model and tokenizer at `path` when the directory has no model yet.",
    )
    tiny: TinyModelSpec = Field(default_factory=TinyModelSpec, description="Shape of the tiny model when it is built.")


class TasksConfig(Section):
    train_set: str = Field(default="synthetic", description="Task set to train on: synthetic, mbpp, mbpp-sanitized, humaneval, jsonl.")
    train_path: str | None = Field(default=None, description="File of the train set (not used by synthetic).")
    train_split: str = Field(default="train", description="Split of the train set to train on.")
    eval_set: str = Field(default="synthetic", description="Task set for held-out evaluation.")
    eval_path: str | None = Field(default=None, description="File of the evaluation set (not used by synthetic).")
    eval_split: str = Field(default="heldout", description="Split of the evaluation set.")
    max_eval_tasks: int = Field(default=0, ge=0, description="Evaluate on at most this many tasks (0: all).")

    @model_validator(mode="after")
    def _paths(self) -> "TasksConfig":
        for name in ("train", "eval"):
            if getattr(self, f"{name}_set") != "synthetic" and not getattr(self, f"{name}_path"):
                raise ValueError(f"{name}_path is required when {name}_set is not 'synthetic'")
        return self


class WeightSyncConfig(Section):
    transport: Literal["gloo", "nccl"] = Field(
        default="gloo",
        description="gloo: CPU broadcast over TCP (any machine); nccl: GPU broadcast into the vLLM workers.",
    )
    bucket_mb: float = Field(default=32.0, gt=0, description="Parameters travel in buckets of at most this many MiB.")
    timeout_s: float = Field(default=120.0, gt=0, description="A push that a peer does not finish in this time raises instead of hanging.")

    def settings(self):
        from rollout_workers.group import SyncSettings

        return SyncSettings(self.transport, int(self.bucket_mb * (1 << 20)), self.timeout_s)


class RolloutConfig(Section):
    backend: Literal["vllm", "transformers"] = Field(default="vllm", description="Generation backend of the rollout workers.")
    num_workers: int = Field(default=1, ge=1, description="Rollout worker actors.")
    samples_per_prompt: int = Field(default=8, ge=2, description="k: completions sampled per prompt (RLOO needs k >= 2).")
    max_new_tokens: int = Field(default=48, ge=1, description="Longest completion, in tokens.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (the learner uses the same one for logprobs).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    stop: list[str] = Field(default_factory=lambda: ["\ndef ", "\nclass ", "\nif __name__", "\nprint("], description="Stop sequences.")
    threads: int = Field(default=2, ge=1, description="CPU threads of each worker's engine (CPU runs only).")
    temperature_schedule: list[tuple[int, float]] | None = Field(
        default=None,
        description="(RL step, temperature) points; the sampling temperature moves linearly between them "
        "and stays at the last one (e.g. [[1, 0.9], [150, 0.1]]). None: `temperature` throughout.",
    )
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig, description="How new weights reach the engines.")
    # Placement and the engine on GPUs (cluster.yaml, configs/qwen2.5-coder-*.yaml)
    gpus_per_worker: float = Field(
        default=0.0, ge=0, description="GPUs each worker reserves in Ray: 1 on GPU nodes (an actor that reserves none sees none).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each worker asks for, to place it on a node type that offers them "
        "(cluster.yaml's rollout nodes offer `rollout_gpu`).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="vLLM's weights and activations: float32 on CPU (matches the learner's logprobs), bfloat16 on GPUs.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of its GPU's memory vLLM takes for weights and KV cache (GPU workers only).")
    max_model_len: int | None = Field(default=None, ge=1, description="vLLM's longest prompt + completion (None: the model's).")

    @model_validator(mode="after")
    def _engine_options(self) -> "RolloutConfig":
        if self.backend == "transformers" and self.dtype != "float32":
            raise ValueError("rollout.dtype applies to the vllm backend; the transformers backend generates in float32")
        return self

    def engine_options(self) -> dict:
        """The vLLM engine's arguments from this section (rollout_workers.vllm_backend.VLLMBackend)."""
        if self.backend != "vllm":
            return {}
        options = {"dtype": self.dtype, "max_model_len": self.max_model_len}
        if self.gpus_per_worker:
            options["gpu_memory_utilization"] = self.gpu_memory_utilization
        return options


class LearnerConfig(Section):
    num_ranks: int = Field(default=1, ge=1, description="Learner ranks (Ray actors in one torch.distributed group; data parallel).")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="cpu (gloo) or cuda (one GPU per rank, NCCL).")
    threads: int = Field(default=2, ge=1, description="CPU threads of each rank's torch (CPU runs; Ray would give an actor one).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each rank asks for, to place it on a node type that offers them "
        "(cluster.yaml's learner nodes offer `learner_gpu`).",
    )
    lr: float = Field(default=2e-4, gt=0, description="AdamW learning rate of the RL phase.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    zero_stage: int = Field(default=0, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="Training precision.")
    optimizer_steps: int = Field(
        default=2, ge=1,
        description="Optimizer steps per RL batch: the samples are split into this many mini-batches "
        "(later ones are slightly off-policy; the clipped ratio accounts for it).",
    )
    max_tokens_per_micro_batch: int = Field(
        default=6144, ge=64,
        description="Token budget of one forward/backward pass (rows x longest sequence, padding "
        "included); a mini-batch is packed into as many micro-batches as it needs.",
    )
    loss_aggregation: Literal["token_mean", "seq_mean_token_sum"] = Field(
        default="token_mean",
        description="token_mean: sum of token losses / tokens in the mini-batch (long completions weigh "
        "more); seq_mean_token_sum: sum of token losses / sequences (each token weighs the same "
        "whatever its completion's length).",
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="Clip range of the importance ratio.")
    tis_cap: float | None = Field(
        default=2.0, gt=0,
        description="Truncated importance sampling: each token's loss is weighted by "
        "min(p_learner / p_sampler, tis_cap), correcting the gap between the sampler's and the "
        "learner's probabilities (null: no correction).",
    )
    advantage_estimator: Literal["rloo", "grpo", "reinforce_pp", "reinforce"] = Field(
        default="rloo",
        description="rloo: leave-one-out baseline; grpo: group mean and std; reinforce_pp: group "
        "mean baseline, batch std; reinforce: no baseline (for comparison).",
    )
    filter_uninformative: bool = Field(
        default=True,
        description="Drop prompt groups whose k rewards are all equal (no signal for a baseline "
        "estimator); their count is logged as groups_filtered.",
    )
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of the KL penalty to the frozen reference (0: no reference model).")
    kl_coef_final: float | None = Field(
        default=None, ge=0, description="With kl_schedule_steps, the KL weight moves linearly from kl_coef to this."
    )
    kl_schedule_steps: int = Field(default=0, ge=0, description="RL steps over which the KL weight moves to kl_coef_final.")
    kl_estimator: Literal["k1", "k3"] = Field(default="k3", description="Per-token KL estimate: k1 = log p - log p_ref; k3 = r - 1 - log r.")
    kl_in: Literal["loss", "reward"] = Field(
        default="loss",
        description="loss: a per-token penalty in the loss; reward: the summed KL of each sample is "
        "subtracted from its reward before advantages (as RLOO in TRL and OpenRLHF).",
    )
    normalize_advantages: bool = Field(default=True, description="Scale advantages to unit std over the batch.")
    dense_rewards: bool = Field(
        default=False,
        description="Per-token advantages from the reward service's per-token rewards (the tests' outcome "
        "spread over the code tokens, lint and syntax penalties on the tokens that caused them): each "
        "token's advantage is the RLOO advantage of its sample plus dense_coef x its leave-one-out "
        "reward-to-go (learner/advantages.py dense_advantages). Needs advantage_estimator rloo; the reward "
        "service then decodes the sampled token ids with the policy's tokenizer (reward.tokenizer_path "
        "defaults to model.path).",
    )
    dense_coef: float = Field(
        default=1.0, gt=0,
        description="With dense_rewards, the weight of the per-token term against the sequence advantage "
        "(both in reward units before whitening).",
    )
    dense_gamma: float = Field(
        default=1.0, ge=0, le=1,
        description="With dense_rewards, the discount of the reward-to-go: 1 is unbiased, and a penalty also "
        "falls on every token before it; lower values keep it nearer the tokens that caused it.",
    )
    seed: int = Field(default=0, description="Seed of the learner.")

    @model_validator(mode="after")
    def _dense(self) -> "LearnerConfig":
        if self.dense_rewards and self.advantage_estimator != "rloo":
            raise ValueError(
                f"dense_rewards needs advantage_estimator 'rloo' (its per-token term is a leave-one-out "
                f"baseline in reward units), got {self.advantage_estimator!r}"
            )
        return self

    def kl_coef_at(self, step: int) -> float:
        """The KL weight at RL step `step` (1-based)."""
        if self.kl_coef_final is None or not self.kl_schedule_steps:
            return self.kl_coef
        frac = min(1.0, (step - 1) / self.kl_schedule_steps)
        return self.kl_coef + (self.kl_coef_final - self.kl_coef) * frac


class SFTConfig(Section):
    steps: int = Field(default=115, ge=0, description="Supervised steps on reference solutions before RL (0: none).")
    batch_size: int = Field(default=32, ge=1, description="Reference solutions per SFT step.")
    lr: float = Field(default=1e-3, gt=0, description="Learning rate of the SFT phase.")


class EvalConfig(Section):
    samples_per_task: int = Field(default=8, ge=1, description="n: samples per task for pass@k (unbiased estimator).")
    k: list[int] = Field(default_factory=lambda: [1, 4], description="The k of each reported pass@k (each <= samples_per_task).")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of the evaluation samples.")
    greedy: bool = Field(default=True, description="Also report greedy pass@1.")
    sampled: bool = Field(default=True, description="Report pass@k from samples_per_task samples (false: greedy only).")
    sets: list[str] = Field(
        default_factory=list,
        description="`coderloo eval`: benchmark sets to evaluate (mbpp, mbpp-sanitized, humaneval, humaneval+, "
        "mbpp+, humaneval+base, mbpp+base; see coderloo/tasksets/evalsets.py); empty: tasks.eval_set.",
    )
    data_dir: str = Field(default="../shared/data", description="`coderloo eval`: directory of the benchmark files (relative: from the repository root).")
    max_new_tokens: int | None = Field(default=None, ge=1, description="`coderloo eval`: longest completion (None: rollout.max_new_tokens).")

    @model_validator(mode="after")
    def _k(self) -> "EvalConfig":
        bad = [k for k in self.k if not 1 <= k <= self.samples_per_task]
        if bad:
            raise ValueError(f"each k must be between 1 and samples_per_task={self.samples_per_task}, got {bad}")
        if not (self.sampled or self.greedy):
            raise ValueError("sampled and greedy are both false: nothing to evaluate")
        return self


class CriticConfig(Section):
    enabled: bool = Field(
        default=False,
        description="Train a critic online (learner/critic.py) that predicts each program's outcome (syntax "
        "error, runtime error, failed test, passed); log its held-out accuracy and AUC per RL step and "
        "critic-guided best-of-n (pass@1_critic against pass@1_random) at each evaluation.",
    )
    lr: float = Field(default=3e-4, gt=0, description="AdamW learning rate of the critic (backbone and head).")
    steps_per_rl_step: int = Field(default=4, ge=1, description="Critic optimizer steps on each RL step's samples.")
    batch_size: int = Field(default=32, ge=1, description="Samples per critic optimizer step (and per forward pass when predicting).")
    heldout_fraction: float = Field(
        default=0.2, gt=0, lt=1,
        description="Share of the training tasks (by task id) whose samples the critic never trains on; "
        "its accuracy and AUC are measured on them.",
    )
    reward_coef: float = Field(
        default=0.0, ge=0,
        description="Add reward_coef x the critic's P(passed) to each sample's reward (0: none; else each "
        "step waits for the critic's predictions before its advantages).",
    )
    select_n: int = Field(
        default=8, ge=2,
        description="Evaluation: pass@1 of the critic's pick among the first select_n samples of each task "
        "(at most eval.samples_per_task).",
    )
    threads: int = Field(default=1, ge=1, description="CPU threads of the critic actor's torch.")


class TrainConfig(Section):
    steps: int = Field(default=150, ge=0, description="RL steps.")
    prompts_per_step: int = Field(default=32, ge=1, description="Prompts per RL step (each sampled k times).")
    eval_every: int = Field(default=25, ge=0, description="Held-out evaluation every N RL steps (0: start and end only).")
    checkpoint_every: int = Field(default=50, ge=0, description="Checkpoint every N RL steps (0: only at the end).")
    output_dir: str = Field(default="runs/default", description="Where metrics, plots and checkpoints go.")
    seed: int = Field(default=0, description="Seed of task sampling.")
    replay_groups: int = Field(
        default=0, ge=0,
        description="Groups replayed per step from a prioritized buffer of earlier high-advantage groups "
        "(RLlib's PrioritizedReplayBuffer; 0: none, on-policy only).",
    )
    replay_capacity: int = Field(default=256, ge=1, description="Groups the replay buffer holds.")
    max_staleness: int = Field(
        default=1, ge=0,
        description="How many steps generation may run ahead of the learner: 0 is synchronous (generate, "
        "score, train, push); 1 generates step t+1 while the learner trains on step t. Samples are "
        "then up to this many policy versions old; truncated importance sampling corrects for it.",
    )


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward: ServiceConfig = Field(
        default_factory=ServiceConfig,
        description="The reward service: component weights, its sandbox pool and limits, replicas.",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Prompt selection by running pass rate.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="An outcome critic trained online on the scored samples.")
    refine: RefineConfig = Field(default_factory=RefineConfig, description="Multi-round refinement from execution feedback (coderloo/refine.py).")
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray_address: str | None = Field(default=None, description="Address of a Ray cluster to join (None: start a local one).")
    metrics_export_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="Local cluster only: port of Ray's Prometheus endpoint on 127.0.0.1 (None: a free one, printed at "
        "start). On a cluster, `ray start --metrics-export-port` sets it (cluster.yaml).",
    )

    @model_validator(mode="after")
    def _metrics_port_local(self) -> "Config":
        if self.metrics_export_port is not None and self.ray_address:
            raise ValueError("metrics_export_port sets the endpoint of a local cluster; a cluster's is set by "
                             "`ray start --metrics-export-port` (cluster.yaml): leave it out with ray_address")
        return self

    @model_validator(mode="after")
    def _batches_split(self) -> "Config":
        need = self.learner.optimizer_steps * self.learner.num_ranks
        samples = self.train.prompts_per_step * self.rollout.samples_per_prompt
        if samples < need:
            raise ValueError(
                f"train.prompts_per_step x rollout.samples_per_prompt = {samples} samples cannot fill "
                f"learner.optimizer_steps x learner.num_ranks = {need} mini-batch shares"
            )
        if self.sft.steps and self.sft.batch_size < self.learner.num_ranks:
            raise ValueError(f"sft.batch_size={self.sft.batch_size} cannot be shared among learner.num_ranks={self.learner.num_ranks}")
        return self

    @model_validator(mode="after")
    def _dense_rewards_tokenizer(self) -> "Config":
        """Per-token rewards need the service to decode the policy's token ids with the policy's
        tokenizer; an absolute path, as the service's replicas need not share our directory."""
        if self.learner.dense_rewards and self.reward.tokenizer_path is None:
            path = Path(self.model.path)
            self.reward.tokenizer_path = str(path if path.is_absolute() else REPO_ROOT / path)
        return self

    @model_validator(mode="after")
    def _refine_sequence_rewards(self) -> "Config":
        if self.refine.enabled and self.learner.dense_rewards:
            raise ValueError("refine.enabled and learner.dense_rewards are not supported together: a trajectory's "
                             "attempts share its sequence advantage; turn one of them off")
        return self

    @model_validator(mode="after")
    def _critic_selection(self) -> "Config":
        if self.critic.enabled and self.critic.select_n > self.eval.samples_per_task:
            raise ValueError(f"critic.select_n={self.critic.select_n} is more than eval.samples_per_task={self.eval.samples_per_task}")
        return self


class ConfigError(ValueError):
    """An invalid config; the message names the field and the reason."""


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`a.b=value` pairs; values are read as YAML (numbers, booleans, lists)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected section.field=value")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {e}") from None
        _set_dotted(tree, key, value)
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: invalid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded or {}
    tree = _merge(tree, parse_overrides(overrides or []))
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        reasons = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            reasons.append(f"  {field}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"invalid config ({source}):\n" + "\n".join(reasons)) from None


def dump_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
