"""The learner's sections of the config: the policy learner (its algorithm and loss) and the critic."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from common.config import Section, Variant, with_default_variants
from common.cpus import CpuSet, precision


class LoraSettings(Section):
    rank: int = Field(default=16, ge=1, description="r: the rank of each adapter matrix pair.")
    alpha: float = Field(default=32.0, gt=0, description="lora_alpha: the adapter's update is scaled by alpha / rank.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    rslora: bool = Field(
        default=False, description="rsLoRA: scale the update by alpha / sqrt(rank), not alpha / rank, so that a higher "
        "rank does not learn slower.",
    )
    lr_ratio: float = Field(
        default=1.0, gt=0, description="LoRA+: each B matrix learns at lr_ratio times learner.lr (the A matrices at "
        "learner.lr). B starts at zero, so at 1 the update grows slowly; the LoRA+ paper uses 16.",
    )
    init: Literal["kaiming", "gaussian", "orthogonal"] = Field(
        default="kaiming", description="How the adapter starts, as PEFT's init_lora_weights (each leaves the base "
        "weights as they are, so vLLM serves the adapter): kaiming (A Kaiming-uniform, B zero: PEFT's default), "
        "gaussian (A normal), orthogonal (A and B from one orthogonal basis whose product is zero; an even rank).",
    )
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

    @model_validator(mode="after")
    def _even_rank(self) -> "LoraSettings":
        if self.init == "orthogonal" and self.rank % 2:
            raise ValueError(f"init orthogonal needs an even rank, got rank {self.rank}")
        return self


class MismatchCorrection(Section):
    """How the sampler/learner mismatch is corrected: each token's loss is weighted by the importance
    ratio p_learner / p_sampler (the learner's probability at the step's start over that of the
    engine that sampled the token: other kernels, another precision, older weights), bounded."""

    mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        default="token_truncate",
        description="token_truncate: each token's ratio clamped to [floor, cap] (truncated IS); token_mask: a "
        "token whose ratio leaves [floor, cap] weighs 0, the others their ratio (masked IS; IcePop with floor 0.5 "
        "and cap 5); sequence_truncate and sequence_mask: the same with one ratio per sequence, the product of its "
        "token ratios, for all its tokens (sequence-level TIS and MIS). TRL's vllm_importance_sampling_mode.",
    )
    cap: float = Field(default=2.0, gt=0, description="C_max: the ratio's upper bound.")
    floor: float | None = Field(
        default=None, ge=0,
        description="C_min: the ratio's lower bound. Null: none for the truncate modes, 1 / cap for the mask "
        "modes (a band [1/c, c] around 1).",
    )

    @model_validator(mode="after")
    def _band(self) -> "MismatchCorrection":
        if self.floor is not None and self.floor >= self.cap:
            raise ValueError(f"floor {self.floor} must be below cap {self.cap}")
        return self

    @property
    def lower(self) -> float | None:
        """The lower bound in force: floor, or 1 / cap for a mask mode without one."""
        return self.floor if self.floor is not None or self.mode.endswith("truncate") else 1.0 / self.cap


class _PolicyLossBase(Variant):
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = Field(
        default="token_mean",
        description="What a mini-batch's token losses are divided by. token_mean: the mini-batch's trained "
        "tokens (DAPO; long completions weigh more); seq_mean_token_mean: each sequence's mean, then the mean "
        "over sequences (the original GRPO; a token of a short completion weighs more); seq_mean_token_sum: "
        "the sequence count (each token weighs the same whatever its completion's length); "
        "seq_mean_token_sum_norm: the sequence count times rollout.max_new_tokens (Dr. GRPO: a constant).",
    )
    mismatch: MismatchCorrection | None = Field(
        default_factory=MismatchCorrection,
        description="The correction of the gap between the sampler's and the learner's probabilities (null: none).",
    )


class _RatioLevel(Variant):
    importance_level: Literal["token", "sequence"] = Field(
        default="token",
        description="token: a ratio per token; sequence (GSPO): the length-normalized geometric mean of a "
        "sequence's token ratios, clipped per sequence.",
    )


class ClipLoss(_PolicyLossBase, _RatioLevel):
    """PPO's clipped ratio (GRPO, DAPO, Dr. GRPO, GSPO)."""

    type: Literal["clip"] = "clip"
    eps_low: float = Field(default=0.2, gt=0, lt=1, description="The ratio's lower clip: 1 - eps_low.")
    eps_high: float = Field(
        default=0.2, gt=0,
        description="The ratio's upper clip: 1 + eps_high (DAPO's clip-higher is 0.28 against a low of 0.2).",
    )
    dual_clip: float | None = Field(
        default=None, gt=1,
        description="Dual clip: the loss of a token with a negative advantage is at most -dual_clip x A "
        "(its ratio's pull is bounded however far the policy moved; 3 in the dual-clip PPO paper). Null: off.",
    )
    delta: float | None = Field(
        default=None, gt=1,
        description="Two-sided clip (TRL's delta): the unclipped ratio is capped at delta, so a negative "
        "advantage's loss stays bounded. Null: off.",
    )


class CispoLoss(_PolicyLossBase, _RatioLevel):
    """A clipped, stop-gradient importance weight on a REINFORCE term (MiniMax-M1)."""

    type: Literal["cispo"] = "cispo"
    eps_high: float = Field(default=0.2, gt=0, description="The importance weight's cap: 1 + eps_high.")


class SapoLoss(_PolicyLossBase, _RatioLevel):
    """A soft sigmoid gate in place of the clip."""

    type: Literal["sapo"] = "sapo"
    tau_pos: float = Field(default=1.0, gt=0, description="The gate's temperature for positive advantages.")
    tau_neg: float = Field(default=1.05, gt=0, description="The gate's temperature for negative advantages.")


class VespoLoss(_PolicyLossBase):
    """A gamma weight of the sequence's importance ratio (always per sequence)."""

    type: Literal["vespo"] = "vespo"
    k_pos: float = Field(default=2.0, ge=0, description="The gamma weight's k for advantages >= 0.")
    lambda_pos: float = Field(default=3.0, gt=0, description="The gamma weight's lambda for advantages >= 0.")
    k_neg: float = Field(default=3.0, ge=0, description="The gamma weight's k for negative advantages.")
    lambda_neg: float = Field(default=2.0, gt=0, description="The gamma weight's lambda for negative advantages.")

    @model_validator(mode="after")
    def _token_mismatch(self) -> "VespoLoss":
        # its weight is already one of the sequence's ratio: the mismatch enters it per token (as in TRL)
        if self.mismatch is not None and self.mismatch.mode.startswith("sequence"):
            raise ValueError(f"learner.loss.mismatch.mode {self.mismatch.mode}: vespo takes token_truncate or token_mask")
        return self


PolicyLoss = Annotated[ClipLoss | CispoLoss | SapoLoss | VespoLoss, Field(discriminator="type")]


class _Estimator(Variant):
    normalize: bool = Field(default=True, description="Scale advantages to unit std over the batch.")


class _GroupEstimator(_Estimator):
    filter_uninformative: bool = Field(
        default=True,
        description="Drop prompt groups whose k outcome rewards are all equal (no signal for a baseline "
        "estimator; shaping terms alone, KL, the critic's or the overlong penalty, do not keep a group, as "
        "DAPO filters by accuracy); their count is logged as groups_filtered. train.max_refill_rounds "
        "replaces them with new prompts.",
    )


class DenseRewards(Section):
    coef: float = Field(
        default=1.0, gt=0,
        description="The weight of the per-token term against the sequence advantage (both in reward units before whitening).",
    )
    gamma: float = Field(
        default=1.0, ge=0, le=1,
        description="The discount of the reward-to-go: 1 is unbiased, and a penalty also falls on every token "
        "before it; lower values keep it nearer the tokens that caused it.",
    )


class RlooEstimator(_GroupEstimator):
    """Leave-one-out baseline."""

    type: Literal["rloo"] = "rloo"
    dense: DenseRewards | None = Field(
        default=None,
        description="Per-token advantages from the reward service's per-token rewards (the tests' outcome "
        "spread over the code tokens, lint and syntax penalties on the tokens that caused them): each "
        "token's advantage is the RLOO advantage of its sample plus dense.coef x its leave-one-out "
        "reward-to-go (learner/advantages.py dense_advantages); the reward service then decodes the sampled "
        "token ids with the policy's tokenizer (reward.tokenizer_path defaults to model.path). Null: off.",
    )


class GrpoEstimator(_GroupEstimator):
    """Group mean and std."""

    type: Literal["grpo"] = "grpo"


class DrGrpoEstimator(_GroupEstimator):
    """Group mean, no std (Dr. GRPO)."""

    type: Literal["dr_grpo"] = "dr_grpo"


class ReinforcePPEstimator(_GroupEstimator):
    """Group mean baseline, batch std."""

    type: Literal["reinforce_pp"] = "reinforce_pp"


class ReinforceEstimator(_Estimator):
    """No baseline (for comparison); rollout.samples_per_prompt may be 1."""

    type: Literal["reinforce"] = "reinforce"


class PpoEstimator(_Estimator):
    """Per-token GAE advantages from a value model trained alongside the policy; rollout.samples_per_prompt may be 1."""

    type: Literal["ppo"] = "ppo"
    dense_rewards: bool = Field(
        default=False,
        description="GAE over the reward service's per-token penalties (lint, syntax) on the tokens that caused "
        "them, the rest of the outcome at the last token; false: the whole reward at the last token.",
    )
    value_model: Literal["separate", "shared"] = Field(
        default="separate",
        description="separate: a value model of its own (the policy's backbone, copied from the policy when RL "
        "starts, and a scalar head; its own optimizer and ZeRO state); shared: a scalar head on the policy's "
        "backbone, the value loss added to the policy's with value_loss_coef.",
    )
    value_lr: float | None = Field(default=None, gt=0, description="value_model separate: AdamW learning rate of the value model (null: learner.lr).")
    value_clip: float | None = Field(
        default=0.5, gt=0,
        description="A value may move at most this far (reward units) from its estimate at the step's start "
        "unless that brings it nearer its return (PPO's clipped value loss; null: plain squared error).",
    )
    value_loss_coef: float = Field(default=0.1, gt=0, description="value_model shared: weight of the value loss in the joint loss (TRL's vf_coef).")
    gae_gamma: float = Field(default=1.0, ge=0, le=1, description="GAE's discount per token.")
    gae_lambda: float = Field(
        default=0.95, ge=0, le=1,
        description="GAE's lambda: 1 is the return minus the value (Monte Carlo, no bias from the value model); "
        "lower values lean on the value model's estimates (less variance, its bias).",
    )


AdvantageEstimator = Annotated[
    RlooEstimator | GrpoEstimator | DrGrpoEstimator | ReinforcePPEstimator | ReinforceEstimator | PpoEstimator,
    Field(discriminator="type"),
]


class KLPenalty(Section):
    coef: float = Field(ge=0, description="Weight of the KL penalty to the reference (the first step's, with a schedule).")
    coef_final: float | None = Field(
        default=None, ge=0, description="With schedule_steps, the KL weight moves linearly from coef to this."
    )
    schedule_steps: int = Field(default=0, ge=0, description="RL steps over which the KL weight moves to coef_final.")
    estimator: Literal["k1", "k3"] = Field(default="k3", description="Per-token KL estimate: k1 = log p - log p_ref; k3 = r - 1 - log r.")
    into: Literal["loss", "reward"] = Field(
        default="loss",
        description="loss: a per-token penalty in the loss; reward: the summed KL of each sample is "
        "subtracted from its reward before advantages (as RLOO in TRL and OpenRLHF).",
    )
    reference_mix: float = Field(
        default=0.0, ge=0, le=1,
        description="Every reference_every RL steps, the reference moves towards the policy: reference <- "
        "(1 - reference_mix) x reference + reference_mix x policy (TRL's sync_ref_model alpha; the RLOO design's "
        "soft-updated target, 0.01 then 0.001). 0: the reference stays the policy RL started from.",
    )
    reference_every: int = Field(default=1, ge=1, description="RL steps between two moves of the reference (with reference_mix).")

    @model_validator(mode="after")
    def _reference_moves(self) -> "KLPenalty":
        if self.reference_every != 1 and self.reference_mix == 0:
            raise ValueError("reference_every is set but reference_mix is 0: the reference would never move")
        return self


class LearnerConfig(Section):
    num_ranks: int = Field(default=1, ge=1, description="Learner ranks (Ray actors in one torch.distributed group; data parallel).")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="cpu (gloo) or cuda (one GPU per rank, NCCL).")
    threads: int = Field(default=2, ge=1, description="CPU threads of each rank's torch (CPU runs; Ray would give an actor one).")
    cpus: CpuSet = Field(default=None, description="The CPUs each rank's process is pinned to " + '(a cpuset list: "0", "0-3", "0,2"; common/cpus.py), so that one machine stands in for separate devices; null: any. A CPU the node lacks is refused before the run starts.'
                         + " Set threads to their number.")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each rank asks for, to place it on a node type that offers them "
        "(cluster.yaml's learner nodes offer `learner_gpu`).",
    )
    lr: float = Field(default=2e-4, gt=0, description="AdamW learning rate of the RL phase. The default suits the tiny "
                      "random model; a pretrained model wants about 1e-6 (configs/real-0.5b.yaml).")
    warmup_steps: int = Field(
        default=0, ge=0, description="RL steps over which the learning rate rises linearly to lr (step s at "
        "lr x s / warmup_steps; 0: lr from the first step). An optimizer that starts at the RL phase (a LoRA "
        "adapter's, with lora.start rl) has no moments yet: its first updates move every parameter by about lr, "
        "whatever the size of its gradient.",
    )
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    zero_stage: int = Field(default=0, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="Training precision. auto: bfloat16 on GPUs and on a CPU that computes it "
        "(AVX-512 BF16 or AMX; elsewhere it is emulated, several times slower), else float32; the run's config.yaml "
        "records which.")
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
    share_prefixes: bool = Field(
        default=True,
        description="Compute a prefix shared by several sequences of a micro-batch once: a group's prompt (and the "
        "instructions every prompt starts with), a turn's earlier turns (multi-turn trained as turns). Each sequence's "
        "last prompt token and completion get columns of their own on top of the shared ones, and an attention mask "
        "keeps the branches apart (learner/batch.py prefix_trees; needs the model's sdpa attention). The same logprobs "
        "and gradients to float rounding, fewer tokens computed: make train's learner step 1.6x faster (bench/results.md).",
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
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    memory_limit_mb: float | None = Field(
        default=None, gt=0,
        description="Each rank's memory limit (MiB), held by a memory cgroup of its own (common/memory.py; needs root or a "
        "delegated cgroup): a rank that outgrows it is the one the kernel kills, and the run stops saying so. None: no limit.")
    step_timeout_s: float = Field(
        default=1800.0, gt=0,
        description="A learner call (a step, a save) that no rank finishes in this time is a hang: the learner is "
        "stopped and the run ends with an error naming the ranks that did not answer.")
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
    loss: PolicyLoss = Field(
        default_factory=ClipLoss,
        description="The policy loss (learner/losses.py policy_loss), chosen by its type: clip, cispo, sapo or vespo.",
    )
    advantage: AdvantageEstimator = Field(
        default_factory=RlooEstimator,
        description="The advantage estimator (learner/advantages.py), chosen by its type: rloo, grpo, dr_grpo, "
        "reinforce_pp, reinforce or ppo.",
    )
    kl: KLPenalty | None = Field(
        default=None,
        description="A KL penalty to a reference policy (in the loss or in the reward): the policy as RL starts (after the "
        "SFT warm-up), frozen or following the policy (reference_mix). Null: none, and no reference model.",
    )
    lora: LoraSettings | None = Field(
        default=None,
        description="Train a LoRA adapter (PEFT) instead of every weight: only its parameters have gradients "
        "and optimizer state, the KL reference is the base model with the adapter disabled, and the rollout "
        "engines get the adapter (lora.sync). Null: full fine-tuning.",
    )
    seed: int = Field(default=0, description="Seed of the learner.")

    @model_validator(mode="before")
    @classmethod
    def _default_variants(cls, data):
        return with_default_variants(data, {"loss": ("type", "clip"), "advantage": ("type", "rloo")})

    @field_validator("dtype")
    @classmethod
    def _precision(cls, dtype: str, info: ValidationInfo) -> str:
        return precision(dtype, info.data.get("device") == "cuda")

    @model_validator(mode="after")
    def _combinations(self) -> "LearnerConfig":
        if self.lora is not None and self.advantage.type == "ppo" and self.advantage.value_model == "shared":
            raise ValueError("lora with advantage.value_model shared: a value head on an adapted backbone is not supported; "
                             "use value_model separate (a value model of its own, trained whole)")
        if self.lora is not None and self.kl is not None and self.kl.reference_mix > 0:
            raise ValueError("lora with kl.reference_mix: a LoRA policy's reference is its base with the adapter off, "
                             "which has no weights of its own to move; set learner.kl.reference_mix=0")
        if self.overlong_buffer and self.overlong_penalty == 0:
            raise ValueError("overlong_buffer is set but overlong_penalty is 0: the penalty would do nothing")
        return self

    @property
    def group_baseline(self) -> bool:
        """Whether advantages compare each sample with the others of its prompt (k >= 2 needed;
        groups of equal rewards carry no signal)."""
        return self.advantage.type not in ("reinforce", "ppo")

    @property
    def filters_groups(self) -> bool:
        """Whether a step drops the groups whose outcome rewards are all equal."""
        return self.group_baseline and self.advantage.filter_uninformative

    @property
    def dense_rewards(self) -> bool:
        """Whether the estimator takes the reward service's per-token rewards."""
        estimator = self.advantage
        return estimator.dense is not None if estimator.type == "rloo" else estimator.type == "ppo" and estimator.dense_rewards

    @property
    def needs_reference(self) -> bool:
        """Whether the KL term needs the reference's logprobs at some step."""
        return self.kl is not None and (self.kl.coef > 0 or (self.kl.coef_final or 0) > 0)

    @property
    def own_reference(self) -> bool:
        """Whether the KL reference is a model of its own (with LoRA, it is the base with the adapter off)."""
        return self.needs_reference and self.lora is None

    @property
    def pushed_adapter_rank(self) -> int | None:
        """The rank of the LoRA adapters the learner pushes to the rollout engines (None: it pushes whole weights)."""
        return self.lora.rank if self.lora is not None and self.lora.sync == "adapter" else None

    def lr_at(self, step: int) -> float:
        """The learning rate of RL step `step` (1-based)."""
        return self.lr * min(1.0, step / self.warmup_steps) if self.warmup_steps else self.lr

    def kl_coef_at(self, step: int) -> float:
        """The KL weight at RL step `step` (1-based); 0 without a KL term."""
        kl = self.kl
        if kl is None:
            return 0.0
        if kl.coef_final is None or not kl.schedule_steps:
            return kl.coef
        frac = min(1.0, (step - 1) / kl.schedule_steps)
        return kl.coef + (kl.coef_final - kl.coef) * frac

    def loss_kl_coef(self, step: int) -> float:
        """The weight of the per-token KL penalty in the loss at RL step `step` (a KL in the reward
        is the algorithm's, not the loss's)."""
        return self.kl_coef_at(step) if self.kl is not None and self.kl.into == "loss" else 0.0


class CriticConfig(Section):
    enabled: bool = Field(
        default=False,
        description="Train a critic online (learner/critic.py) that predicts each program's outcome (syntax "
        "error, runtime error, failed test, passed); log its held-out accuracy and AUC per RL step and "
        "critic-guided best-of-n (pass@1_critic against pass@1_random) at each evaluation.",
    )
    lr: float = Field(default=3e-4, gt=0, description="AdamW learning rate of the critic (backbone and head).")
    start: Literal["model", "sft"] = Field(
        default="sft",
        description="The critic's backbone: sft, the policy after the SFT warm-up (a model that has read the "
        "reference solutions; CodeRL's critic starts from a pretrained code model, and on the CPU default the "
        "warm-up stands in for that model's training); model: the model's path as it is. Without SFT steps, "
        "the model's path either way.",
    )
    backbone: Literal["train", "frozen"] = Field(
        default="train",
        description="train: the backbone is fine-tuned with the head, as CodeRL's critic is; frozen: only the head "
        "trains, on features each program gets once (a forward pass without gradients, kept): a real model's "
        "critic on a CPU, where a forward and backward per program and optimizer step would not fit a run.",
    )
    rank_coef: float = Field(
        default=0.0, ge=0, description="Weight of a ranking loss within each task's group of k (a better outcome "
        "scores higher than a worse one of the same prompt) next to the outcome classes' cross-entropy; 0: the "
        "cross-entropy alone. Batches hold whole groups either way.")
    steps_per_rl_step: int = Field(default=4, ge=1, description="Critic optimizer steps on each RL step's samples.")
    batch_size: int = Field(default=32, ge=1, description="Samples per critic optimizer step, in whole groups of a task's samples (at least one), and per forward pass when predicting.")
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
