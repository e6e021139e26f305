"""The base of every typed config section: unknown fields are errors, assignments are checked."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
