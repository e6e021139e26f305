"""The learner's sections of the config: the policy learner (its algorithm and loss) and the critic."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import Section
from learner.losses import LossConfig


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

    def loss_config(self, step: int, temperature: float) -> LossConfig:
        """The learner's loss at RL step `step` for samples drawn at `temperature` (a KL in the
        reward is the algorithm's, not the loss's)."""
        return LossConfig(
            clip_eps=self.clip_eps, tis_cap=self.tis_cap, kl_coef=self.kl_coef_at(step) if self.kl_in == "loss" else 0.0,
            kl_estimator=self.kl_estimator, aggregation=self.loss_aggregation, temperature=temperature,
        )


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
