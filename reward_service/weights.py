"""How the reward components are weighed into one number (`reward.weights` in the config)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RewardWeights(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A syntax weight near the functionality weight collapses a weak policy onto "compiles, passes
    # nothing" (a one-off run: bench/results.md, "one-off measurements"), so it stays a small
    # shaping term. The lint penalty is off by default for the same reason: a weak policy
    # earns more by writing less (an empty body has no diagnostics) than by passing tests.
    # Performance is off too: the small programs of the task sets run in milliseconds, where the
    # sandbox's start-up dominates the measured time, so the signal is mostly noise there.
    syntax: float = Field(0.1, ge=0, description="Weight of the syntax component (the program parses and compiles).")
    functionality: float = Field(1.0, ge=0, description="Weight of the functionality component (fraction of tests passed).")
    lint: float = Field(
        0.0, ge=0, description="Penalty weight of the lint component (0: Ruff is not run and lint is not reported)."
    )
    performance: float = Field(
        0.0, ge=0,
        description="Weight of the performance component (0: the reference is not timed and performance is not reported).",
    )
    coverage: float = Field(
        0.0, ge=0,
        description="Weight of the coverage component: the share of the program's executable lines its tests ran "
        "(Python; as the program's own process reports them; 0: not measured, no tracer runs).",
    )
    lint_saturation: int = Field(
        5, ge=1, description="Diagnostics at which the lint penalty is full: lint = min(diagnostics, this) / this."
    )
    lint_rules: list[str] = Field(
        default_factory=lambda: ["E4", "E7", "E9", "F", "S"],
        min_length=1,
        description="Ruff rule selectors: Ruff's default error rules (pycodestyle E4/E7/E9, Pyflakes F) "
        "and the security S rules.",
    )

    constant: bool = Field(
        False, description="Every total is 0, whatever the components (still measured and reported): the control run "
        "with no learning signal, whose held-out 'gain' is the evaluation's drift (needs "
        "learner.advantage.filter_uninformative false: every group is uniform).")

    @model_validator(mode="after")
    def _some_weight(self) -> "RewardWeights":
        if self.syntax + self.functionality <= 0 and not self.constant:
            raise ValueError("at least one of the syntax and functionality weights must be positive")
        return self
