"""The docs: the configuration reference generated from the schema (docs/hooks.py), and the README's size.

No Ray, vLLM or DeepSpeed: these import the schema and render markdown. `make docs` builds the
site itself with `mkdocs build --strict`.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parent.parent


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Clip(BaseModel):
    """The clipped ratio."""
    type: Literal["clip"] = "clip"
    eps: float = Field(default=0.2, gt=0, description="Clip range | both sides.")


class Soft(BaseModel):
    type: Literal["soft"] = "soft"
    tau_pos: float = Field(default=1.0, description="Gate temperature for positive advantages.")


class Kl(BaseModel):
    coef: float = Field(default=0.05, ge=0, description="KL coefficient.")


class Adapter(BaseModel):
    rank: int = Field(default=8, description="Adapter rank.")


class Learner(BaseModel):
    lr: float = Field(default=1e-3, description="Learning rate.")
    loss: Annotated[Clip | Soft, Field(discriminator="type")] = Field(default_factory=Clip, description="The policy loss.")
    kl: Kl | None = Field(default=None, description="The KL term, or none.")
    adapters: list[Adapter] = Field(default_factory=list, description="Adapters to train.")
    named: dict[str, Adapter] = Field(default_factory=dict, description="Adapters by name.")
    mode: Literal["token", "sequence"] = "token"


class Made(BaseModel):
    seed: int = Field(default=0, description="Seed.")
    learner: Learner = Field(default_factory=Learner)


def test_a_made_up_schema_with_a_discriminated_union():
    text = _hooks().render_reference(Made)
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert "## `learner` { #cfg-learner }" in headings
    # Each variant of the union has its own section, named by its discriminator value, with only its fields.
    assert "### `learner.loss` { #cfg-learner-loss }" in headings
    assert "#### `learner.loss` with `type: clip` { #cfg-learner-loss-clip }" in headings
    assert "#### `learner.loss` with `type: soft` { #cfg-learner-loss-soft }" in headings
    clip = text.split("with `type: clip`")[1].split("with `type: soft`")[0]
    soft = text.split("with `type: soft`")[1]
    assert "`eps`" in clip and "`tau_pos`" not in clip
    assert "`tau_pos`" in soft.split("###")[0] and "`eps`" not in soft.split("###")[0]
    assert "chosen by `type`" in text and "[`type: soft`](#cfg-learner-loss-soft)" in text
    # Types, bounds, defaults (a factory's too), descriptions; a `|` in a description cannot break the
    # table, and one in a code span needs no escape (it would show).
    assert "| `eps` | `float` (> 0) | `0.2` | Clip range \\| both sides. |" in text
    assert "| `loss` | `Clip | Soft` | `type: clip` |" in text
    assert "| `mode` | `\"token\" | \"sequence\"` | `\"token\"` |" in text
    assert "Type `Clip | Soft`, default `type: clip`; chosen by `type`:" in text
    # Optional, list and dict of models are walked too.
    assert "### `learner.kl` { #cfg-learner-kl }" in headings
    assert "### `learner.adapters[]` { #cfg-learner-adapters }" in headings
    assert "### `learner.named.<name>` { #cfg-learner-named }" in headings
    assert "## Top level { #cfg-made }" in headings and "| `seed` |" in text
    # Every in-page link has its anchor.
    anchors = set(re.findall(r"\{ #([a-z0-9-]+) \}", text))
    assert set(re.findall(r"\]\(#([a-z0-9-]+)\)", text)) <= anchors


def _table_rows(model: type[BaseModel], models_in, top: bool = False) -> list[str]:
    """The fields that must each have a row: all of them but the root's sections, which are headings."""
    rows = []
    for name, info in model.model_fields.items():
        inner = models_in(info.annotation)
        if not (top and inner):
            rows.append(name)
        for sub in inner:
            rows += _table_rows(sub, models_in)
    return rows


def test_the_current_schema_every_field_documented():
    from coderloo.config import Config

    hooks = _hooks()
    text = hooks.render_reference(Config)
    for name in Config.model_fields:
        assert f"`{name}`" in text, name
    for field in _table_rows(Config, hooks.models_in, top=True):
        assert f"| `{field}` |" in text, field
    anchors = set(re.findall(r"\{ #([a-z0-9-]+) \}", text))
    assert set(re.findall(r"\]\(#([a-z0-9-]+)\)", text)) <= anchors
    assert len(anchors) == len(re.findall(r"\{ #([a-z0-9-]+) \}", text)), "an anchor used twice"


def test_the_readme_is_short_and_links_the_docs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make test" in readme and "make train" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).exists(), link


def _schema_paths(model: type[BaseModel], prefix: str, models_in, out: set[str]) -> set[str]:
    for name, info in model.model_fields.items():
        out.add(prefix + name)
        for sub in models_in(info.annotation):
            _schema_paths(sub, f"{prefix}{name}.", models_in, out)
    return out


def test_config_paths_named_in_the_docs_exist():
    """A dotted field path in the docs (`learner.kl`, `train.max_staleness=0`) is one the schema has."""
    from coderloo.config import Config

    paths = _schema_paths(Config, "", _hooks().models_in, set())
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    stale = []
    for path in files:
        for match in re.finditer(r"`([a-z_]+(?:\.[a-z_0-9]+)+)(?:[=:][^`]*)?`", path.read_text()):
            name = match.group(1)
            if name.split(".")[0] in Config.model_fields and name.rsplit(".", 1)[1] not in {"pt", "py", "yaml", "json", "safetensors"}:
                if name not in paths:
                    stale.append(f"{path.name}: {name}")
    assert not stale, stale
