"""The rollout sections of the config: the workers, their engines, weight sync, the environment, and
how tasks become prompts."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, TypeAdapter, ValidationInfo, field_validator, model_validator

from common.config import Section, Variant
from common.cpus import CpuSet, precision


class WeightSyncConfig(Section):
    transport: Literal["auto", "shm", "gloo", "nccl"] = Field(
        default="auto",
        description="auto: shm for a vLLM worker on the learner's Ray node, gloo for the others; shm: through a file in "
        "/dev/shm that the engine maps (every vLLM worker on the learner's node); gloo: CPU broadcast over TCP (any "
        "machine); nccl: GPU broadcast into the vLLM workers.",
    )
    bucket_mb: float = Field(default=32.0, gt=0, description="Parameters travel in buckets of at most this many MiB.")
    timeout_s: float = Field(default=120.0, gt=0, description="A push that a peer does not finish in this time raises instead of hanging.")

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * (1 << 20))


class RolloutConfig(Section):
    backend: Literal["vllm", "transformers"] = Field(default="vllm", description="Generation backend of the rollout workers.")
    num_workers: int = Field(default=1, ge=1, description="Rollout worker actors.")
    samples_per_prompt: int = Field(default=8, ge=1, description="k: completions sampled per prompt (RLOO and the other group baselines need k >= 2).")
    max_new_tokens: int = Field(default=48, ge=1, description="Longest completion, in tokens.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (the learner uses the same one for logprobs).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    stop: list[str] = Field(default_factory=lambda: ["\ndef ", "\nclass ", "\nif __name__", "\nprint("], description="Stop sequences.")
    # 1 on the default's 2 cores: the sandbox's programs run there alongside generation, and an engine
    # of 2 OpenMP threads then waits at its barriers for a descheduled thread (bench/results.md, pipeline).
    threads: int = Field(default=1, ge=1, description="CPU threads of each worker's engine (CPU runs only). Leave the "
                         "cores the sandbox scores on alongside generation: more threads than free cores make the engine slower.")
    cpus: CpuSet = Field(default=None, description="The CPUs each worker's process is pinned to " + '(a cpuset list: "0", "0-3", "0,2"; common/cpus.py), so that one machine stands in for separate devices; null: any. A CPU the node lacks is refused before the run starts.'
                         + " Set threads to their number.")
    temperature_schedule: list[tuple[int, float]] | None = Field(
        default=None,
        description="(RL step, temperature) points; the sampling temperature moves linearly between them "
        "and stays at the first one before them and at the last one after them (e.g. [[1, 0.9], [150, 0.1]]). None: `temperature` throughout.",
    )
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig, description="How new weights reach the engines.")
    update_in_flight: bool = Field(
        default=False,
        description="A push reaches the engines while they generate (with train.max_staleness >= 1): each pauses between "
        "two decoding steps (vLLM's own pause, keeping its requests), loads the new weights, recomputes the running "
        "sequences' keys and values with them and goes on; each sample records the version of each of its tokens "
        "(Sample.segments). False: a push waits for the generation the engines are running to end (drain). vllm "
        "backend only; not with learner.lora (a request keeps the adapter it was queued with).")
    # Placement and the engine on GPUs (cluster.yaml, configs/qwen2.5-coder-*.yaml)
    gpus_per_worker: float = Field(
        default=0.0, ge=0, description="GPUs each worker reserves in Ray: 1 on GPU nodes (an actor that reserves none sees none).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each worker asks for, to place it on a node type that offers them "
        "(cluster.yaml's rollout nodes offer `rollout_gpu`).",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="vLLM's weights and activations: float32 on CPU (matches the learner's logprobs), bfloat16 on GPUs. "
        "auto: bfloat16 on GPUs and on a CPU that computes it (AVX-512 BF16 or AMX), else float32; the run's config.yaml records which.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of its GPU's memory vLLM takes for weights and KV cache (GPU workers only).")
    max_model_len: int | None = Field(default=None, ge=1, description="vLLM's longest prompt + completion (None: the model's).")
    memory_limit_mb: float | None = Field(
        default=None, gt=0,
        description="Each worker's memory limit (MiB), held by a memory cgroup of its own (common/memory.py; needs root or a "
        "delegated cgroup): a worker that outgrows it is killed by the kernel, Ray restarts it and its prompts are "
        "generated again. None: no limit.")
    stuck_timeout_s: float = Field(
        default=600.0, gt=0,
        description="A worker that hands over nothing in this time while it has prompts in flight, neither a finished "
        "prompt nor a heartbeat (its engine sends one each quarter of this while it steps), is stuck (not dead: stopped, "
        "deadlocked): it is killed, Ray restarts it and its prompts are generated again.")

    @field_validator("dtype")
    @classmethod
    def _precision(cls, dtype: str, info: ValidationInfo) -> str:
        if dtype == "auto" and info.data.get("backend") == "transformers":  # it generates in float32 only
            return "float32"
        return precision(dtype, bool(info.data.get("gpus_per_worker")))

    @model_validator(mode="after")
    def _engine_options(self) -> "RolloutConfig":
        if self.backend == "transformers" and self.dtype != "float32":
            raise ValueError("rollout.dtype applies to the vllm backend; the transformers backend generates in float32")
        if self.backend == "transformers" and self.update_in_flight:
            raise ValueError("rollout.update_in_flight: the transformers backend takes pushes between generations only (use the vllm backend)")
        if self.backend == "transformers" and self.weight_sync.transport not in ("auto", "gloo"):
            raise ValueError(f"rollout.weight_sync.transport {self.weight_sync.transport!r}: the transformers backend "
                             "receives weights by gloo (use 'auto' or 'gloo')")
        return self

    def temperature_at(self, step: int) -> float:
        """The sampling temperature at RL step `step`: piecewise linear between the schedule's points."""
        if not self.temperature_schedule:
            return self.temperature
        steps, temperatures = zip(*self.temperature_schedule)
        return float(np.interp(step, steps, temperatures))

    def engine_options(self) -> dict:
        """The vLLM engine's arguments from this section (rollout_workers.vllm_backend.VLLMBackend)."""
        if self.backend != "vllm":
            return {}
        options = {"dtype": self.dtype, "max_model_len": self.max_model_len}
        if self.gpus_per_worker:
            options["gpu_memory_utilization"] = self.gpu_memory_utilization
        return options


class SingleEnv(Variant):
    """One attempt per sample."""

    tag: ClassVar[str] = "name"
    name: Literal["single"] = "single"
    multi_turn: ClassVar[bool] = False
    train_as: ClassVar[str] = "turns"
    turn_cost: ClassVar[float] = 0.0
    per_round: ClassVar[int] = 0  # refinement's budget and choice (RefineEnv); none here
    choose: ClassVar[str] = "random"


class _MultiTurnEnv(Variant):
    tag: ClassVar[str] = "name"
    multi_turn: ClassVar[bool] = True
    # each turn a whole attempt at the task: round 1 is the policy's single attempt, and pass@1 is
    # measured by round (the interpreter's turns are tool calls before one answer)
    turns_are_attempts: ClassVar[bool] = True
    max_turns: int = Field(default=3, ge=1, description="Most policy turns per trajectory (attempts; tool calls and the answer).")
    max_total_tokens: int = Field(
        default=1024, ge=1, description="Most tokens per trajectory, its first prompt, the policy's and the observations' together; "
        "a trajectory that would pass it (or the engine's context) ends with the turns it has.")
    observation_tokens: int = Field(default=160, ge=8, description="An observation longer than this is cut to it, ending with a marker.")
    turn_cost: float = Field(
        default=0.0, ge=0, description="Subtracted from a trajectory's reward per turn after its first (so the policy is not paid to dawdle).")
    train_as: Literal["turns", "concat"] = Field(
        default="turns",
        description="turns: each turn is a training sequence (its whole context as the prompt); concat: a trajectory is one "
        "sequence (prompt, turn, observation, turn, ...) with the observations masked out of the loss.",
    )


class RefineEnv(_MultiTurnEnv):
    """A failed attempt is followed by its execution feedback and another attempt, up to max_turns."""

    name: Literal["refine"] = "refine"
    max_turns: int = Field(default=3, ge=2, description="Most attempts per trajectory (1 is env single).")
    feedback_chars: int = Field(default=500, ge=1, description="Execution feedback shown to the model is cut to this many characters.")
    per_round: int = Field(
        default=0, ge=0,
        description="Most of a task's failed attempts that are refined each round, the rest ending with what they hold "
        "(the budget per round; 0: every failed attempt goes on). Which ones: `choose`.")
    choose: Literal["random", "critic"] = Field(
        default="random",
        description="Which failed attempts go on when more than per_round failed: random, or the critic's choice "
        "(CodeRL's: those it rates most likely to pass; needs critic.enabled). With critic, every evaluation also "
        "reports pass@1 with a random choice of as many, from first attempts drawn with the same seed (pass@1_random_choice).")
    go_on: Literal["verdict", "shown"] = Field(
        default="verdict",
        description="Which failed attempt gets another. verdict: one that fails any test (told how the held tests ended, "
        "never what they are: a training signal, as the reward is). shown: one that fails the task's shown tests, all a "
        "deployed model knows before it submits; the first attempt that passes them is the answer, judged by every test "
        "(how to evaluate refinement; a task that shows no tests gets one attempt).")
    feedback: Literal["context", "note", "none"] = Field(
        default="context",
        description="What a later attempt reads. context: the attempts before it and what their runs said, one "
        "conversation. note: the task's prompt afresh with what the last attempt's run said, not its code (a small "
        "model copies the failed code it reads). none: the task's prompt alone, independent attempts under the same "
        "go_on rule and budget (refinement's equal-samples control). note and none need train_as turns.")

    @model_validator(mode="after")
    def _fresh_attempts_train_as_turns(self) -> "RefineEnv":
        if self.feedback != "context" and self.train_as == "concat":
            raise ValueError(f"feedback {self.feedback} samples each attempt afresh from the task's prompt: its attempts are "
                             "not one sequence, so train_as must be turns")
        return self


class InterpreterEnv(_MultiTurnEnv):
    """The model may run code mid-answer (a turn ending at run_marker) and read its stdout, stderr and
    exit status, up to max_tool_calls, before its answer is scored by the tests."""

    name: Literal["interpreter"] = "interpreter"
    per_round: ClassVar[int] = 0  # tool calls are not attempts: no budget per round
    choose: ClassVar[str] = "random"
    feedback: ClassVar[str] = "context"  # a run's report always continues the context
    turns_are_attempts: ClassVar[bool] = False
    max_tool_calls: int = Field(default=2, ge=0, description="Most runs per trajectory; the turn after the last one is the answer.")
    run_marker: str = Field(default="#>>> run", min_length=1, description="A turn that ends with this asks to run its code.")

    @model_validator(mode="after")
    def _answer_turn(self) -> "InterpreterEnv":
        if self.max_tool_calls >= self.max_turns:
            raise ValueError(f"max_tool_calls={self.max_tool_calls} leaves no turn for the answer in max_turns={self.max_turns}")
        return self


# The environment a trajectory runs in (rollout_workers/environments.py), chosen by its name.
EnvConfig = Annotated[SingleEnv | RefineEnv | InterpreterEnv, Field(discriminator="name")]


def env_config(**fields) -> EnvConfig:
    """The environment section of `fields` (name: single when left out)."""
    return TypeAdapter(EnvConfig).validate_python({"name": "single", **fields})


# What a chat prompt asks before the task's text, by the task's kind of test (Task.test_kind).
DEFAULT_INSTRUCTIONS = {
    "assert": "Write a {language} function for the task below; its tests call it. "
              "Answer with the whole program, imports included, in one ```{tag} code block.",
    "stdio": "Write a {language} program for the task below: it reads the input from standard input and prints the "
             "answer to standard output. Answer with the whole program in one ```{tag} code block.",
    "call": "Write the {language} code the task below asks for (the function, or the method of class Solution, that "
            "its tests call). Answer with the whole program in one ```{tag} code block.",
}


class PromptConfig(Section):
    chat_template: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="auto: a model whose tokenizer has a chat template is prompted through it, any other with the "
        "task's prompt as it is; on: through the template (a tokenizer without one is an error); off: the task's "
        "prompt as it is (a base model's continuation). Through the template, the model answers with the whole "
        "program in a fenced block and ends its turn itself: the stop sequences (rollout.stop, an evaluation set's) "
        "are for continuations and are not used.",
    )
    system: str = Field(default="", description="The system message of a chat prompt (empty: none, or the template's own default).")
    instructions: dict[Literal["assert", "stdio", "call"], str] = Field(
        default_factory=lambda: dict(DEFAULT_INSTRUCTIONS),
        description="What a chat prompt's user message asks before the task's text, by the task's kind of tests "
        "(assert: Python statements; stdio: stdin/stdout cases; call: call cases); {language} is the task's "
        "language (Python, C++, JavaScript) and {tag} its fence tag. A kind left out keeps its default.",
    )

    @field_validator("chat_template", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value  # YAML reads on/off as booleans

    @field_validator("instructions", mode="before")
    @classmethod
    def _defaults_for_the_rest(cls, value):
        return {**DEFAULT_INSTRUCTIONS, **value} if isinstance(value, dict) else value

    @field_validator("instructions")
    @classmethod
    def _placeholders(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, text in value.items():
            try:
                text.format(language="Python", tag="python")
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"instructions.{kind}: {text!r} is not a template of {{language}} and {{tag}} "
                                 f"({type(e).__name__}: {e}; write {{{{ and }}}} for a literal brace)") from None
        return value
