"""The learner's sections of the config: the policy learner (its algorithm and loss) and the critic."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import Section
from learner.losses import LossConfig


class LoraSettings(Section):
    rank: int = Field(default=16, ge=1, description="r: the rank of each adapter matrix pair.")
    alpha: float = Field(default=32.0, gt=0, description="lora_alpha: the adapter's update is scaled by alpha / rank.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="Linear layers (by module name, as PEFT matches them) that get an adapter.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained and saved whole beside the adapter (e.g. embed_tokens, lm_head); vLLM "
        "serves no adapter with them, so they need sync merged.",
    )
    sync: Literal["adapter", "merged"] = Field(
        default="adapter",
        description="What reaches the rollout engines after each step: adapter (only the adapter's tensors; vLLM "
        "serves it with its LoRA support) or merged (the whole model with the adapter merged in, for engines "
        "or models where adapters are not supported).",
    )
    start: Literal["sft", "rl"] = Field(
        default="sft",
        description="sft: the adapter trains from the start, in the SFT warm-up too (the model's path is its base); "
        "rl: the SFT warm-up trains every weight and the adapter starts on the result, as a LoRA run on an "
        "instruct model does (on the CPU default, whose model is random, only this learns: the warm-up "
        "stands in for that model's training). Its base then travels to the rollout engines once, after SFT, "
        "and to an engine that restarts.",
    )
    merged_export: bool = Field(
        default=True,
        description="Checkpoints also hold the merged model in Hugging Face format (beside the adapter, "
        "always saved under adapter/); false: the adapter only.",
    )


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
    pack_sequences: bool = Field(
        default=True,
        description="Put sequences end to end in a micro-batch's rows, kept apart by their position ids (learner/batch.py), "
        "rather than one sequence a row padded to the longest; the padding share is in each step's record.",
    )
    pack_row_tokens: int = Field(
        default=0, ge=0,
        description="Width of a packed row (0: the micro-batch's longest sequence). Wider rows leave less padding, and "
        "max_tokens_per_micro_batch makes a micro-batch one row, none at all; the attention of a row costs its width "
        "squared except with flash attention's varlen kernel (a GPU), so on a CPU the longest sequence is the cheapest.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Keep only each decoder layer's input for the backward and recompute the layer there (transformers' "
        "non-reentrant checkpointing): a micro-batch's activations shrink from every layer's intermediates to one "
        "layer's, for one more forward pass of compute. `coderloo plan` counts it.",
    )
    logit_chunk_tokens: int = Field(
        default=512, ge=1,
        description="Tokens whose logits are computed at once (learner/logits.py): the language-model head, the fp32 "
        "log-softmax and its gradient hold this many tokens x the vocabulary, whatever the micro-batch's size.",
    )
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = Field(
        default="token_mean",
        description="What a mini-batch's token losses are divided by. token_mean: the mini-batch's trained "
        "tokens (DAPO; long completions weigh more); seq_mean_token_mean: each sequence's mean, then the mean "
        "over sequences (the original GRPO; a token of a short completion weighs more); seq_mean_token_sum: "
        "the sequence count (each token weighs the same whatever its completion's length); "
        "seq_mean_token_sum_norm: the sequence count times rollout.max_new_tokens (Dr. GRPO: a constant).",
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    memory_limit_mb: float | None = Field(
        default=None, gt=0,
        description="Each rank's memory limit (MiB), held by a memory cgroup of its own (common/memory.py; needs root or a "
        "delegated cgroup): a rank that outgrows it is the one the kernel kills, and the run stops saying so. None: no limit.")
    step_timeout_s: float = Field(
        default=1800.0, gt=0,
        description="A learner call (a step, a save) that no rank finishes in this time is a hang: the learner is "
        "stopped and the run ends with an error naming the ranks that did not answer.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="Clip range of the importance ratio (both sides unless clip_eps_low/high say otherwise).")
    clip_eps_low: float | None = Field(default=None, gt=0, lt=1, description="The ratio's lower clip 1 - clip_eps_low (null: clip_eps).")
    clip_eps_high: float | None = Field(
        default=None, gt=0,
        description="The ratio's upper clip 1 + clip_eps_high (null: clip_eps); DAPO's clip-higher is 0.28 "
        "against a low of 0.2. With policy_loss cispo, the importance weight's cap.",
    )
    clip_ratio_c: float | None = Field(
        default=None, gt=1,
        description="Dual clip: the loss of a token with a negative advantage is at most -clip_ratio_c x A "
        "(its ratio's pull is bounded however far the policy moved; 3 in the dual-clip PPO paper). Null: off.",
    )
    clip_delta: float | None = Field(
        default=None, gt=1,
        description="Two-sided clip (TRL's delta): the unclipped ratio is capped at clip_delta, so a negative "
        "advantage's loss stays bounded. Null: off.",
    )
    policy_loss: Literal["clip", "cispo", "sapo", "vespo"] = Field(
        default="clip",
        description="The surrogate (learner/losses.py policy_loss): clip (PPO's clipped ratio; GRPO, DAPO, "
        "Dr. GRPO, GSPO); cispo (a clipped, stop-gradient importance weight on a REINFORCE term: MiniMax-M1); "
        "sapo (a soft sigmoid gate in place of the clip); vespo (a gamma weight of the sequence's ratio).",
    )
    importance_level: Literal["token", "sequence"] = Field(
        default="token",
        description="token: a ratio per token; sequence (GSPO): the length-normalized geometric mean of a "
        "sequence's token ratios, clipped per sequence.",
    )
    sapo_tau_pos: float = Field(default=1.0, gt=0, description="policy_loss sapo: the gate's temperature for positive advantages.")
    sapo_tau_neg: float = Field(default=1.05, gt=0, description="policy_loss sapo: the gate's temperature for negative advantages.")
    vespo_k_pos: float = Field(default=2.0, ge=0, description="policy_loss vespo: the gamma weight's k for advantages >= 0.")
    vespo_lambda_pos: float = Field(default=3.0, gt=0, description="policy_loss vespo: the gamma weight's lambda for advantages >= 0.")
    vespo_k_neg: float = Field(default=3.0, ge=0, description="policy_loss vespo: the gamma weight's k for negative advantages.")
    vespo_lambda_neg: float = Field(default=2.0, gt=0, description="policy_loss vespo: the gamma weight's lambda for negative advantages.")
    mask_truncated: bool = Field(
        default=False,
        description="Leave completions cut by max_new_tokens (finish reason 'length') out of the loss: their "
        "rewards still count in their group's baseline (DAPO's overlong filtering; TRL's mask_truncated_completions).",
    )
    overlong_buffer: int = Field(
        default=0, ge=0,
        description="DAPO's soft overlong penalty: a completion longer than max_new_tokens - overlong_buffer "
        "tokens loses overlong_penalty x the share of the buffer it used, as a term of its reward (0: off).",
    )
    overlong_penalty: float = Field(default=1.0, ge=0, description="The soft overlong penalty at max_new_tokens (with overlong_buffer).")
    tis_cap: float | None = Field(
        default=2.0, gt=0,
        description="Truncated importance sampling: each token's loss is weighted by "
        "min(p_learner / p_sampler, tis_cap), correcting the gap between the sampler's and the "
        "learner's probabilities (null: no correction).",
    )
    advantage_estimator: Literal["rloo", "grpo", "dr_grpo", "reinforce_pp", "reinforce", "ppo"] = Field(
        default="rloo",
        description="rloo: leave-one-out baseline; grpo: group mean and std; dr_grpo: group mean, no std "
        "(Dr. GRPO); reinforce_pp: group mean baseline, batch std; reinforce: no baseline (for comparison); "
        "ppo: per-token GAE advantages from a value model trained alongside the policy (value_model, gae_gamma, "
        "gae_lambda; rollout.samples_per_prompt may be 1).",
    )
    value_model: Literal["separate", "shared"] = Field(
        default="separate",
        description="advantage_estimator ppo: separate: a value model of its own (the policy's backbone, copied "
        "from the policy when RL starts, and a scalar head; its own optimizer and ZeRO state); shared: a scalar "
        "head on the policy's backbone, the value loss added to the policy's with value_loss_coef.",
    )
    value_lr: float | None = Field(default=None, gt=0, description="ppo, value_model separate: AdamW learning rate of the value model (null: lr).")
    value_clip: float | None = Field(
        default=0.5, gt=0,
        description="ppo: a value may move at most this far (reward units) from its estimate at the step's start "
        "unless that brings it nearer its return (PPO's clipped value loss; null: plain squared error).",
    )
    value_loss_coef: float = Field(default=0.1, gt=0, description="ppo, value_model shared: weight of the value loss in the joint loss (TRL's vf_coef).")
    gae_gamma: float = Field(default=1.0, ge=0, le=1, description="ppo: GAE's discount per token.")
    gae_lambda: float = Field(
        default=0.95, ge=0, le=1,
        description="ppo: GAE's lambda: 1 is the return minus the value (Monte Carlo, no bias from the value model); "
        "lower values lean on the value model's estimates (less variance, its bias).",
    )
    filter_uninformative: bool = Field(
        default=True,
        description="Drop prompt groups whose k outcome rewards are all equal (no signal for a baseline "
        "estimator; shaping terms alone, KL, the critic's or the overlong penalty, do not keep a group, as "
        "DAPO filters by accuracy); their count is logged as groups_filtered. train.max_refill_rounds "
        "replaces them with new prompts.",
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
    lora: LoraSettings | None = Field(
        default=None,
        description="Train a LoRA adapter (PEFT) instead of every weight: only its parameters have gradients "
        "and optimizer state, the KL reference is the base model with the adapter disabled, and the rollout "
        "engines get the adapter (lora.sync). Null: full fine-tuning.",
    )
    seed: int = Field(default=0, description="Seed of the learner.")

    @model_validator(mode="after")
    def _lora(self) -> "LearnerConfig":
        if self.lora is not None and self.advantage_estimator == "ppo" and self.value_model == "shared":
            raise ValueError("lora with value_model shared: a value head on an adapted backbone is not supported; "
                             "use value_model separate (a value model of its own, trained whole)")
        return self

    @model_validator(mode="after")
    def _dense(self) -> "LearnerConfig":
        if self.dense_rewards and self.advantage_estimator not in ("rloo", "ppo"):
            raise ValueError(
                f"dense_rewards needs advantage_estimator 'rloo' (its per-token term is a leave-one-out "
                f"baseline in reward units) or 'ppo' (GAE over the per-token rewards), got {self.advantage_estimator!r}"
            )
        if self.overlong_buffer and self.overlong_penalty == 0:
            raise ValueError("overlong_buffer is set but overlong_penalty is 0: the penalty would do nothing")
        return self

    @property
    def group_baseline(self) -> bool:
        """Whether advantages compare each sample with the others of its prompt (k >= 2 needed;
        groups of equal rewards carry no signal)."""
        return self.advantage_estimator not in ("reinforce", "ppo")

    @property
    def pushed_adapter_rank(self) -> int | None:
        """The rank of the LoRA adapters the learner pushes to the rollout engines (None: it pushes whole weights)."""
        return self.lora.rank if self.lora is not None and self.lora.sync == "adapter" else None

    def kl_coef_at(self, step: int) -> float:
        """The KL weight at RL step `step` (1-based)."""
        if self.kl_coef_final is None or not self.kl_schedule_steps:
            return self.kl_coef
        frac = min(1.0, (step - 1) / self.kl_schedule_steps)
        return self.kl_coef + (self.kl_coef_final - self.kl_coef) * frac

    def loss_config(self, step: int, temperature: float, max_new_tokens: int) -> LossConfig:
        """The learner's loss at RL step `step` for samples drawn at `temperature` with at most
        `max_new_tokens` each (a KL in the reward is the algorithm's, not the loss's)."""
        return LossConfig(
            clip_eps_low=self.clip_eps if self.clip_eps_low is None else self.clip_eps_low,
            clip_eps_high=self.clip_eps if self.clip_eps_high is None else self.clip_eps_high,
            tis_cap=self.tis_cap, kl_coef=self.kl_coef_at(step) if self.kl_in == "loss" else 0.0,
            kl_estimator=self.kl_estimator, aggregation=self.loss_aggregation, temperature=temperature,
            surrogate=self.policy_loss, importance_level=self.importance_level, clip_ratio_c=self.clip_ratio_c,
            clip_delta=self.clip_delta, sapo_tau_pos=self.sapo_tau_pos, sapo_tau_neg=self.sapo_tau_neg,
            vespo_pos=(self.vespo_k_pos, self.vespo_lambda_pos), vespo_neg=(self.vespo_k_neg, self.vespo_lambda_neg),
            max_new_tokens=max_new_tokens, train_value=self.advantage_estimator == "ppo", value_clip=self.value_clip,
            value_loss_coef=self.value_loss_coef,
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
