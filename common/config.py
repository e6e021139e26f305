"""The base of every typed config section: unknown fields are errors, assignments are checked."""
from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _tag_required(schema: dict, cls: type[Variant]) -> None:
    schema["required"] = [cls.tag, *schema.get("required", [])]


class Variant(Section):
    """One variant of a section, chosen by its `tag` field (a discriminated union). A section
    written without its tag is its default variant (the composing section fills it in); a schema
    asks for the tag, so that an editor knows which variant's fields to offer."""

    tag: ClassVar[str] = "type"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_tag_required)


def with_default_variants(data, defaults: dict[str, tuple[str, str]]):
    """`data` (a section's input) with each variant section of `defaults` (name: (tag, default
    variant)) given its tag when it was written without one."""
    if not isinstance(data, dict):
        return data
    for section, (tag, default) in defaults.items():
        if isinstance(data.get(section), dict) and tag not in data[section]:
            data = {**data, section: {tag: default, **data[section]}}
    return data
