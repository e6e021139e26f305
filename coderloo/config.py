"""Typed configuration: YAML files in configs/, overridable from the command line (`learner.lr=1e-5`).

Each component owns its section (learner/config.py, rollout_workers/config.py,
reward_service/config.py, sandbox_pool's PoolSettings and Limits); this module composes them
with the driver's own sections and checks what spans several. Every field is documented; an
invalid config fails before anything starts, naming the field and the reason.
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from coderloo.curriculum import CurriculumConfig
from coderloo.models import TinyModelSpec
from coderloo.runtime import resolve
from coderloo.tasksets.competitive import ColumnMapping
from common.config import Section, with_default_variants
from common.cpus import CpuSet
from learner.config import CriticConfig, LearnerConfig
from reward_service.config import ServiceConfig
from rollout_workers.config import EnvConfig, PromptConfig, RolloutConfig, SingleEnv
from sandbox_pool import PoolSettings


class ModelConfig(Section):
    path: str = Field(
        default=".cache/tiny-qwen2",
        description="Directory of a Hugging Face causal LM (relative paths are from the repository root, ~ is "
        "the home directory). A real model needs settings the tiny model's defaults do not give (learner.lr 1e-6, "
        "not 2e-4, which destroys it in a few steps; its chat template): start from configs/real-0.5b.yaml or "
        "configs/real-135m.yaml (docs: real-models.md; `coderloo model fetch NAME` brings the weights).",
    )
    build_tiny: bool = Field(
        default=True,
        description="Build a tiny Qwen2 model and tokenizer at `path` when the directory has no model yet.",
    )
    tiny: TinyModelSpec = Field(default_factory=TinyModelSpec, description="Shape of the tiny model when it is built.")


class TasksConfig(Section):
    train_set: str = Field(default="synthetic", description="Task set to train on: synthetic, mbpp, mbpp-sanitized, humaneval, "
                           "jsonl, apps, codecontests, taco, livecodebench, deepcoder, code-r1, generic (coderloo/tasksets/benchmarks.py).")
    train_path: str | None = Field(default=None, description="File of the train set (not used by synthetic); the "
                                   "competitive-programming sets also take a directory of files.")
    train_split: str = Field(default="train", description="Split of the train set to train on.")
    eval_set: str = Field(default="synthetic", description="Task set for held-out evaluation.")
    eval_path: str | None = Field(default=None, description="File of the evaluation set (not used by synthetic).")
    eval_split: str = Field(default="heldout", description="Split of the evaluation set.")
    max_eval_tasks: int = Field(default=0, ge=0, description="Evaluate on at most this many tasks (0: all).")
    columns: ColumnMapping | None = Field(
        default=None, description="The generic set's columns (coderloo/tasksets/competitive.py ColumnMapping), for "
        "train_set or eval_set generic (both: the same mapping), e.g. {id: problem_id, prompt: question, "
        "input_output: input_output, solutions: solutions}.")
    synthetic_kinds: list[Literal["function", "stdio"]] = Field(
        default_factory=lambda: ["function"], min_length=1,
        description="Kinds of task in the synthetic set (train and evaluation): function (a function from its "
        "docstring, checked by asserts), stdio (a program that reads stdin and prints the answer, checked by "
        "stdin/stdout cases). A tiny model built by the run has its tokenizer trained on them too.",
    )

    @field_validator("synthetic_kinds")
    @classmethod
    def _each_kind_once(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"{kinds} names a kind twice")
        return kinds

    @model_validator(mode="after")
    def _paths(self) -> "TasksConfig":
        for name in ("train", "eval"):
            if getattr(self, f"{name}_set") != "synthetic" and not getattr(self, f"{name}_path"):
                raise ValueError(f"{name}_path is required when {name}_set is not 'synthetic'")
        generic = "generic" in (self.train_set, self.eval_set)
        if generic and self.columns is None:
            raise ValueError("columns is required when train_set or eval_set is 'generic' (which columns hold what)")
        if self.columns is not None and not generic:
            raise ValueError("columns is read by the generic set only; neither train_set nor eval_set is 'generic'")
        return self


class SFTConfig(Section):
    steps: int = Field(default=115, ge=0, description="Supervised steps on reference solutions before RL (0: none).")
    batch_size: int = Field(default=32, ge=1, description="Reference solutions per SFT step.")
    lr: float = Field(default=1e-3, gt=0, description="Learning rate of the SFT phase.")
    demonstrations: float = Field(
        default=0.0, ge=0, le=1,
        description="Share of each SFT batch that is multi-turn demonstrations of env.name, built from the training tasks "
        "and run for real (rollout_workers/demonstrations.py): refine, a wrong attempt (a mutant of the "
        "reference), its feedback and the fix; interpreter, a probe, its output and the answer.",
    )


class EvalConfig(Section):
    samples_per_task: int = Field(default=8, ge=1, description="n: samples per task for pass@k (unbiased estimator).")
    k: list[int] = Field(default_factory=lambda: [1, 4], description="The k of each reported pass@k (each <= samples_per_task).")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of the evaluation samples.")
    greedy: bool = Field(default=True, description="Also report greedy pass@1.")
    sampled: bool = Field(default=True, description="Report pass@k from samples_per_task samples (false: greedy only).")
    sets: list[str] = Field(
        default_factory=list,
        description="`coderloo eval`: benchmark sets to evaluate (mbpp, mbpp-sanitized, humaneval, humaneval+, "
        "mbpp+, humaneval+base, mbpp+base, apps, codecontests, taco, livecodebench; see "
        "coderloo/tasksets/evalsets.py); empty: tasks.eval_set.",
    )
    data_dir: str = Field(default="../shared/data", description="`coderloo eval`: directory of the benchmark files (relative: from the repository root).")
    max_new_tokens: int | None = Field(default=None, ge=1, description="`coderloo eval`: longest completion (None: rollout.max_new_tokens).")
    after: datetime.date | None = Field(
        default=None, description="`coderloo eval`: only the tasks published after this day (YYYY-MM-DD; the day "
        "itself is left out), e.g. a model's training cut-off on LiveCodeBench; tasks without a date are left out. "
        "None: every task.")

    @model_validator(mode="after")
    def _k(self) -> "EvalConfig":
        bad = [k for k in self.k if not 1 <= k <= self.samples_per_task]
        if bad:
            raise ValueError(f"each k must be between 1 and samples_per_task={self.samples_per_task}, got {bad}")
        if not (self.sampled or self.greedy):
            raise ValueError("sampled and greedy are both false: nothing to evaluate")
        return self


class TrainConfig(Section):
    steps: int = Field(default=150, ge=0, description="RL steps.")
    prompts_per_step: int = Field(default=32, ge=1, description="Prompts per RL step (each sampled k times).")
    eval_every: int = Field(default=25, ge=0, description="Held-out evaluation every N RL steps (0: start and end only).")
    checkpoint_every: int = Field(default=50, ge=0, description="Checkpoint every N RL steps (0: only at the end).")
    keep_checkpoints: int = Field(
        default=0, ge=0,
        description="How many of the newest checkpoints stay; older ones are removed once a newer one is whole "
        "(the one `latest` names always stays). 0: all (a long run's checkpoints then fill its disk: 6 GB each at 0.5B).")
    max_skipped_steps: int = Field(
        default=3, ge=1,
        description="A step whose loss or gradient norm is not finite (NaN or inf; from a non-finite advantage, "
        "logprob or overflow) is skipped: the weights stay as they were and nothing is pushed. This many skipped "
        "steps in a row stop the run with an error (its last checkpoint is as it was).")
    resources_every: int = Field(
        default=10, ge=0, description="Every N RL steps, a `resources` record in metrics.jsonl: memory, descriptors and "
        "child processes of the driver and each actor on this node, /dev/shm, the run directory, leaked sandbox "
        "processes (coderloo/ops/resources.py; `python -m coderloo.ops.soak RUN_DIR` judges them). 0: none.")
    output_dir: str = Field(default="runs/default", description="Where metrics, plots and checkpoints go.")
    seed: int = Field(default=0, description="Seed of task sampling.")
    replay_groups: int = Field(
        default=0, ge=0,
        description="Groups replayed per step from a prioritized buffer of earlier high-advantage groups "
        "(RLlib's PrioritizedReplayBuffer; 0: none, on-policy only).",
    )
    replay_capacity: int = Field(default=256, ge=1, description="Groups the replay buffer holds.")
    driver_cpus: CpuSet = Field(
        default=None, description="The CPUs the driver (this process, once the actors have started) is pinned to "
        "(a cpuset list; common/cpus.py); null: any. rollout.cpus, learner.cpus, reward.cpus and reward.pool.cpus "
        "pin the other roles.",
    )
    max_staleness: int = Field(
        default=0, ge=0,
        description="How many steps generation may run ahead of the learner: 0 is synchronous (generate, "
        "score, train, push); 1 generates step t+1 while the learner trains on step t. Samples are "
        "then up to this many policy versions old; learner.loss.mismatch corrects for it. On one CPU "
        "machine where generation, scoring and learning share the cores overlapping them gains nothing "
        "(bench/results.md, pipeline); on a cluster, where they run on different devices, or with the roles "
        "pinned to cores of their own (configs/async-pinned.yaml), use 1.",
    )
    partial_rollouts: bool = Field(
        default=False,
        description="A pool of (1 + max_staleness) x prompts_per_step groups generates across steps, and each step "
        "trains on prompts_per_step groups that finished scoring, in the order they did; the others go on generating "
        "(later tokens with the newer weights a push brings them in flight) and are taken by later steps. No step trains "
        "a group whose oldest token is more than max_staleness versions behind: one at that bound is taken first (a "
        "step waits for it), one over it is dropped, counted in pool_dropped_groups. A checkpoint keeps the tasks of the groups not trained yet, and "
        "--resume generates exactly those first. Needs rollout.update_in_flight. "
        "Not reproducible to the bit (which groups a step takes depends on timing).")
    stream_groups: bool = Field(
        default=False,
        description="The learner starts on a step's groups as they are scored, instead of waiting for the whole "
        "step: each group's advantages are computed alone and its sequences are laid out in micro-batches while the "
        "others are still generated and scored (sent as one while the learner is busy). With learner.optimizer_steps "
        "k, the groups of the step's first 1/k tasks are the first mini-batch, backpropagated as they come; the "
        "others get their step-start logprobs as they come and train after the earlier optimizer steps. What only the "
        "whole step knows (each mini-batch's loss normalizer, the advantages' whitening divisor) divides the gradients "
        "before each optimizer step, so each update is the one without streaming, up to float rounding (with k > 1 "
        "and filtered groups, the mini-batches split the step by task rather than its kept sequences evenly). Needs "
        "what can be computed group by group: learner.zero_stage 0 or 1 in float32, a group-baseline estimator, no KL "
        "or critic term in the reward (nor a KL term in the loss with whitened advantages), no replay, refills or "
        "partial rollouts; each refused naming its field. Pays where the learner's work after a step's last group "
        "is the step's critical path: synchronous steps (max_staleness 0) with the roles on devices of their own; "
        "asynchronous steps already overlap that work with the next step's rollouts (bench/results.md, pipeline).",
    )
    max_refill_rounds: int = Field(
        default=0, ge=0,
        description="Dynamic sampling that refills (DAPO): while fewer than prompts_per_step of a step's groups "
        "are informative (their k outcome rewards not all equal), up to this many further generation rounds "
        "of new prompts (as many as the informative rate so far says are needed), then the first "
        "prompts_per_step informative groups train. Needs learner.advantage.filter_uninformative. 0: off (a step "
        "trains on what its one round gave).",
    )
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Where every step's metrics, every evaluation and the config go, each in the run directory: "
        "jsonl (metrics.jsonl; always listed, as the report, plots and --resume read it), tensorboard "
        "(tensorboard/), wandb (wandb/; offline unless WANDB_MODE says otherwise, `wandb sync` uploads it "
        "later), mlflow (mlflow/, a SQLite store). Each but jsonl needs the pip extra of its name "
        "(`loggers`: all three).",
    )
    wandb_project: str = Field(default="coderloo", description="W&B project of the run (its name: train.output_dir's last part).")

    @field_validator("loggers")
    @classmethod
    def _jsonl_listed(cls, loggers: list[str]) -> list[str]:
        if "jsonl" not in loggers:
            raise ValueError("jsonl is always written (the report, the plots and --resume read metrics.jsonl): "
                             "list it with the others")
        if len(set(loggers)) != len(loggers):
            raise ValueError("each logger once")
        return loggers


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward: ServiceConfig = Field(
        default_factory=lambda: ServiceConfig(pool=PoolSettings(initial_executors=2)),
        description="The reward service: component weights, its sandbox pool and limits, replicas (by default its pool "
        "starts 2 executors; a reward section written in a file has the pool's own defaults).",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Prompt selection by running pass rate.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="An outcome critic trained online on the scored samples.")
    env: EnvConfig = Field(
        default_factory=SingleEnv,
        description="The environment of a trajectory: one attempt, or several turns with refinement from execution feedback, "
        "feedback from the shown tests, or a code interpreter (rollout_workers/environments.py).",
    )
    prompt: PromptConfig = Field(
        default_factory=PromptConfig,
        description="How tasks become prompts for generation, evaluation and SFT: as they are, or through the model's "
        "chat template (rollout_workers/prompts.py).",
    )
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray_address: str | None = Field(default=None, description="Address of a Ray cluster to join (None: start a local one).")
    dashboard: bool = Field(
        default=True, description="Local cluster only: serve Ray's dashboard on 127.0.0.1 (port 8265, or the next free "
        "one), its address on the run's first line; off for the soak. A cluster's is the cluster's (cluster.yaml).")
    metrics_export_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="Local cluster only: port of Ray's Prometheus endpoint on 127.0.0.1 (None: a free one, printed at "
        "start). On a cluster, `ray start --metrics-export-port` sets it (cluster.yaml).",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_variants(cls, data):
        return with_default_variants(data, {"env": ("name", "single")})

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
            self.reward.tokenizer_path = str(resolve(self.model.path))
        return self

    @model_validator(mode="after")
    def _multi_turn_rewards(self) -> "Config":
        if self.sft.demonstrations and not self.env.multi_turn:
            raise ValueError("sft.demonstrations: multi-turn demonstrations are of an environment; set env.name "
                             "(refine, interpreter) or sft.demonstrations 0")
        if self.env.multi_turn and self.learner.dense_rewards:
            raise ValueError(f"env.name {self.env.name} and dense rewards (learner.advantage) are not supported together: a trajectory's "
                             "turns share its sequence advantage; turn one of them off")
        if self.env.train_as == "concat" and self.learner.overlong_buffer:
            raise ValueError("env.train_as concat with learner.overlong_buffer: the overlong penalty is of a turn's length, "
                             "and a concatenated trajectory holds several turns and observations; train_as turns")
        return self

    @model_validator(mode="after")
    def _constant_reward(self) -> "Config":
        if self.reward.weights.constant and self.learner.filters_groups:
            raise ValueError("reward.weights.constant makes every group uniform, and learner.advantage.filter_uninformative "
                             "would drop them all: set it false (the control trains on zero advantages, as the run it controls "
                             "trains on its own)")
        if self.reward.weights.constant and self.learner.dense_rewards:
            raise ValueError("reward.weights.constant with dense rewards (learner.advantage): per-token rewards are "
                             "attributed from the components, not the total; turn dense rewards off")
        return self

    @model_validator(mode="after")
    def _critic_start(self) -> "Config":
        lora = self.learner.lora
        if (self.critic.enabled and self.critic.start == "sft" and self.sft.steps and lora is not None
                and lora.start == "sft" and not lora.merged_export):
            raise ValueError("critic.start sft reads the policy after SFT as a Hugging Face model, which a LoRA policy "
                             "(learner.lora.start sft) exports only with learner.lora.merged_export true; or set critic.start model")
        return self

    @model_validator(mode="after")
    def _refill_filters(self) -> "Config":
        if self.train.max_refill_rounds and not self.learner.group_baseline:
            raise ValueError(f"train.max_refill_rounds: advantage {self.learner.advantage.type} keeps every "
                             "group (no group baseline), so there is nothing to refill")
        if self.train.max_refill_rounds and not self.learner.filters_groups:
            raise ValueError("train.max_refill_rounds refills the groups that learner.advantage.filter_uninformative drops: "
                             "turn filtering on, or set max_refill_rounds to 0")
        return self

    @model_validator(mode="after")
    def _ppo_replay(self) -> "Config":
        if self.train.replay_groups and self.learner.advantage.type == "ppo":
            raise ValueError("train.replay_groups with advantage ppo: a replayed group's returns and value "
                             "estimates are of an older value model; set replay_groups to 0")
        return self

    @model_validator(mode="after")
    def _partial_rollouts(self) -> "Config":
        if not self.train.partial_rollouts:
            return self
        if not self.rollout.update_in_flight:
            raise ValueError("train.partial_rollouts needs rollout.update_in_flight: the groups that go on generating "
                             "across a push take it in flight (a push that waited for them would wait for the whole pool)")
        return self

    @model_validator(mode="after")
    def _stream_groups(self) -> "Config":
        if not self.train.stream_groups:
            return self
        learn, train = self.learner, self.train
        kl = learn.kl.into if learn.kl is not None else None
        refused = [
            (learn.zero_stage > 1, f"learner.zero_stage={learn.zero_stage}: ZeRO-2 and 3 reduce gradients at each backward, "
             "before the step's normalizer is known; use 0 or 1"),
            (learn.dtype != "float32", f"learner.dtype={learn.dtype}: DeepSpeed's bf16 optimizer moves gradients out of "
             "the parameters at each backward; use float32"),
            (learn.advantage.type in ("ppo", "reinforce_pp"), f"learner.advantage.type={learn.advantage.type}: its "
             "advantages need the whole batch (values, a batch-wide spread)"),
            (kl == "reward", "learner.kl.into=reward: the KL to the reference is computed over the whole batch before its advantages"),
            (kl == "loss" and learn.advantage.normalize, "learner.kl.into=loss with learner.advantage.normalize: the whitening "
             "divisor is applied to the step's gradients, which would scale the KL term too; set normalize false or drop the KL"),
            (self.critic.enabled and self.critic.reward_coef > 0, "critic.reward_coef: the critic's term is computed over the whole batch"),
            (train.replay_groups > 0, "train.replay_groups: replayed groups join the batch once it is whole"),
            (train.max_refill_rounds > 0, "train.max_refill_rounds: a refill is decided once the step's groups are all scored"),
            (train.partial_rollouts, "train.partial_rollouts: the pool hands a step its groups at once"),
        ]
        for bad, why in refused:
            if bad:
                raise ValueError(f"train.stream_groups with {why}")
        return self

    @model_validator(mode="after")
    def _in_flight(self) -> "Config":
        if not self.rollout.update_in_flight:
            return self
        if not self.train.max_staleness:
            raise ValueError("rollout.update_in_flight with train.max_staleness 0: no generation runs while the learner "
                             "pushes (synchronous steps); set max_staleness to 1 or more")
        if self.learner.pushed_adapter_rank:
            raise ValueError("rollout.update_in_flight with a LoRA adapter push (learner.lora.sync adapter): a request keeps "
                             "the adapter it was queued with; set learner.lora.sync: merged, or update_in_flight: false")
        return self

    @model_validator(mode="after")
    def _lora_engine(self) -> "Config":
        lora = self.learner.lora
        if lora is None or lora.sync != "adapter" or self.rollout.backend != "vllm":
            return self
        if lora.modules_to_save:
            raise ValueError(f"learner.lora.modules_to_save={lora.modules_to_save}: vLLM serves no adapter with modules "
                             "trained whole; set learner.lora.sync: merged (the whole model is pushed)")
        from rollout_workers.vllm_backend import LORA_RANKS

        if lora.rank > LORA_RANKS[-1]:
            raise ValueError(f"learner.lora.rank={lora.rank}: vLLM serves adapters of rank at most {LORA_RANKS[-1]}; "
                             "set learner.lora.sync: merged for a larger one")
        return self

    @model_validator(mode="after")
    def _group_size(self) -> "Config":
        if self.rollout.samples_per_prompt < 2 and self.learner.group_baseline:
            raise ValueError(f"rollout.samples_per_prompt=1: advantage {self.learner.advantage.type} compares "
                             "the samples of a prompt and needs at least 2 (ppo and reinforce can use 1)")
        return self

    @model_validator(mode="after")
    def _critic_selection(self) -> "Config":
        if self.critic.enabled and self.critic.select_n > self.eval.samples_per_task:
            raise ValueError(f"critic.select_n={self.critic.select_n} is more than eval.samples_per_task={self.eval.samples_per_task}")
        return self

    @model_validator(mode="after")
    def _refine_choice(self) -> "Config":
        if self.env.choose == "critic" and not self.critic.enabled:
            raise ValueError("env.choose critic: the critic chooses which failed attempts are refined, and critic.enabled is false")
        return self


class ConfigError(ValueError):
    """An invalid config; the message names the field and the reason."""


def _moved(new: str, variant: str = "") -> str:
    return f"{new} with {variant}" if variant else new


_CLIP, _SAPO, _VESPO = "learner.loss.type: clip", "learner.loss.type: sapo", "learner.loss.type: vespo"
_GROUP = "learner.advantage.type: rloo, grpo, dr_grpo or reinforce_pp"
_PPO, _KL = "learner.advantage.type: ppo", "learner.kl set (absent: no KL term)"
# Fields of an earlier shape of the config, by dotted path, and where each now lives. A config
# file or an override that names one fails with the new place.
MOVED = {
    "refine": "env (refine.enabled true, refine.rounds R -> env.name refine, env.max_turns R; "
              "refine.feedback_chars -> env.feedback_chars)",
    "learner.policy_loss": "learner.loss.type",
    "learner.loss_aggregation": "learner.loss.aggregation",
    "learner.tis_cap": "learner.loss.mismatch.cap",
    "learner.loss.tis_cap": "learner.loss.mismatch.cap (learner.loss.mismatch: null for no correction)",
    "learner.importance_level": _moved("learner.loss.importance_level", "learner.loss.type: clip, cispo or sapo"),
    "learner.clip_eps": _moved("learner.loss.eps_low and learner.loss.eps_high", _CLIP),
    "learner.clip_eps_low": _moved("learner.loss.eps_low", _CLIP),
    "learner.clip_eps_high": _moved("learner.loss.eps_high", "learner.loss.type: clip or cispo"),
    "learner.clip_ratio_c": _moved("learner.loss.dual_clip", _CLIP),
    "learner.clip_delta": _moved("learner.loss.delta", _CLIP),
    "learner.sapo_tau_pos": _moved("learner.loss.tau_pos", _SAPO),
    "learner.sapo_tau_neg": _moved("learner.loss.tau_neg", _SAPO),
    "learner.vespo_k_pos": _moved("learner.loss.k_pos", _VESPO),
    "learner.vespo_lambda_pos": _moved("learner.loss.lambda_pos", _VESPO),
    "learner.vespo_k_neg": _moved("learner.loss.k_neg", _VESPO),
    "learner.vespo_lambda_neg": _moved("learner.loss.lambda_neg", _VESPO),
    "learner.advantage_estimator": "learner.advantage.type",
    "learner.normalize_advantages": "learner.advantage.normalize",
    "learner.filter_uninformative": _moved("learner.advantage.filter_uninformative", _GROUP),
    "learner.dense_rewards": "learner.advantage.dense (an empty mapping {} for the defaults) with learner.advantage.type: "
                             "rloo, or learner.advantage.dense_rewards with learner.advantage.type: ppo",
    "learner.dense_coef": _moved("learner.advantage.dense.coef", "learner.advantage.type: rloo"),
    "learner.dense_gamma": _moved("learner.advantage.dense.gamma", "learner.advantage.type: rloo"),
    "learner.value_model": _moved("learner.advantage.value_model", _PPO),
    "learner.value_lr": _moved("learner.advantage.value_lr", _PPO),
    "learner.value_clip": _moved("learner.advantage.value_clip", _PPO),
    "learner.value_loss_coef": _moved("learner.advantage.value_loss_coef", _PPO),
    "learner.gae_gamma": _moved("learner.advantage.gae_gamma", _PPO),
    "learner.gae_lambda": _moved("learner.advantage.gae_lambda", _PPO),
    "learner.kl_coef": _moved("learner.kl.coef", _KL),
    "learner.kl_coef_final": _moved("learner.kl.coef_final", _KL),
    "learner.kl_schedule_steps": _moved("learner.kl.schedule_steps", _KL),
    "learner.kl_estimator": _moved("learner.kl.estimator", _KL),
    "learner.kl_in": _moved("learner.kl.into", _KL),
}


def check_moved(tree: dict[str, Any], source: str) -> None:
    """Fail on the first field of `tree` that MOVED lists, naming its new place."""
    for old, new in MOVED.items():
        node: Any = tree
        for key in old.split("."):
            node = node.get(key, MOVED) if isinstance(node, dict) else MOVED
        if node is not MOVED:
            raise ConfigError(f"{source}: {old} was moved: use {new}")


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


def read_config_file(path: str | Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's tree. A file may start from another with `extends: FILE` (a path relative
    to it): its own fields are merged over that file's, section by section."""
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        where = f" (extended by {seen[-1]})" if seen else ""
        raise ConfigError(f"config file {path} does not exist{where}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: invalid YAML: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping, got {type(loaded).__name__}")
    tree = loaded or {}
    check_moved(tree, f"config file {path}")
    base = tree.pop("extends", None)
    if base is None:
        return tree
    if not isinstance(base, str):
        raise ConfigError(f"config file {path}: extends must be a file name, got {base!r}")
    base_path = path.parent / base
    if base_path.resolve() in [p.resolve() for p in (*seen, path)]:
        raise ConfigError(f"config file {path}: extends {base} makes a cycle ({' -> '.join(str(p) for p in (*seen, path, base_path))})")
    return _merge(read_config_file(base_path, (*seen, path)), tree)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        tree = read_config_file(path)
    extra = parse_overrides(overrides or [])
    check_moved(extra, "override")
    tree = _merge(tree, extra)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        reasons = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            reasons.append(f"  {field}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"invalid config ({source}):\n" + "\n".join(reasons)) from None


def config_schema() -> dict[str, Any]:
    """The JSON Schema of a config file (`coderloo config schema`), `extends` included, for
    editors to check a YAML file as it is typed."""
    schema = Config.model_json_schema()
    schema["properties"]["extends"] = {
        "type": "string", "description": "A config file (relative to this one) whose fields this file's are merged over."}
    return schema


def dump_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
