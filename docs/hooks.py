"""MkDocs hook: the configuration reference, rendered from the pydantic schema at every build.

The page docs/configuration.md holds a marker; `on_page_markdown` replaces it with a table per
config section, walking the models generically (nested models, unions and discriminated unions,
lists, dicts, Optional), so the reference follows the schema without naming any of its fields.
`on_files` adds bench/results.md and bench/plots/ to the site as they are.
"""
from __future__ import annotations

import enum
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = "<!-- config-reference -->"
REPO_ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Any, config: Any) -> Any:
    """bench/results.md and its charts join the site as they are, so the figures are never copied."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "results.md", abs_src_path=str(REPO_ROOT / "bench" / "results.md")))
    for chart in sorted((REPO_ROOT / "bench" / "plots").glob("*.png")):
        files.append(File.generated(config, f"plots/{chart.name}", abs_src_path=str(chart)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from coderloo.config import Config

    return markdown.replace(MARKER, render_reference(Config))


# --- types -------------------------------------------------------------------------------------

def _unwrap(annotation: Any) -> Any:
    """Annotated[X, ...] -> X (the metadata is read from the FieldInfo)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(origin: Any) -> bool:
    return origin is typing.Union or origin is types.UnionType


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every BaseModel an annotation can hold, in order: X, X | Y, list[X], dict[str, X], Optional[X]..."""
    annotation = _unwrap(annotation)
    if _is_model(annotation):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in models_in(arg):
            if model not in found:
                found.append(model)
    return found


def type_name(annotation: Any) -> str:
    """A short, readable name of a field's type."""
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if origin is typing.Literal:
        return " | ".join(json.dumps(a.value if isinstance(a, enum.Enum) else a) for a in args)
    if _is_union(origin):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset, dict) or (origin is not None and args):
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{name}[{inner}]"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "length >=", "max_length": "length <="}


def constraints(info: FieldInfo) -> str:
    """The field's bounds (ge, gt, ..., min_length), as pydantic keeps them in its metadata."""
    parts = []
    for item in info.metadata:
        for attr, symbol in _BOUNDS.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def default_of(info: FieldInfo) -> Any:
    """The field's default (a factory's product too); PydanticUndefined when required."""
    if info.default is not PydanticUndefined:
        return info.default
    if info.default_factory is not None:
        try:
            return info.default_factory()
        except TypeError:  # a factory that takes the validated data: no default to show on its own
            return PydanticUndefined
    return PydanticUndefined


def show_default(info: FieldInfo) -> str:
    value = default_of(info)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        discriminated = _discriminator_value(value)
        return f"`{discriminated}`" if discriminated is not None else "(its own defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        text = json.dumps(value, default=lambda v: v.model_dump() if isinstance(v, BaseModel) else str(v))
    except ValueError:
        text = str(value)
    return _code(text.replace("`", "'"))


def _discriminator_value(value: BaseModel) -> str | None:
    """The value of a one-valued Literal field of a model instance (its `type: clip`), if any."""
    for name, info in type(value).model_fields.items():
        if typing.get_origin(_unwrap(info.annotation)) is typing.Literal and len(typing.get_args(_unwrap(info.annotation))) == 1:
            return f"{name}: {getattr(value, name)}"
    return None


def _discriminator(info: FieldInfo) -> str | None:
    """The discriminator's field name, from the Field or from an Annotated union inside the type."""
    found = info.discriminator
    stack = [info.annotation]
    while found is None and stack:
        annotation = stack.pop()
        if typing.get_origin(annotation) is typing.Annotated:
            for meta in typing.get_args(annotation)[1:]:
                if isinstance(meta, FieldInfo) and meta.discriminator is not None:
                    found = meta.discriminator
        stack.extend(typing.get_args(annotation))
    if found is not None and not isinstance(found, str):  # a callable Discriminator: its tag is unknown here
        return None
    return found


def _tag(model: type[BaseModel], discriminator: str | None) -> str | None:
    if discriminator is None or discriminator not in model.model_fields:
        return None
    args = typing.get_args(_unwrap(model.model_fields[discriminator].annotation))
    return " | ".join(str(a.value if isinstance(a, enum.Enum) else a) for a in args) or None


# --- rendering ----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """One line for a table cell: a `|` is escaped outside code spans (inside them it splits no cell)."""
    parts = re.sub(r"\s+", " ", text).strip().split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def _code(text: str) -> str:
    return "`" + re.sub(r"\s+", " ", text).strip() + "`"


def _anchor(path: str) -> str:
    return "cfg-" + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if doc.strip() and not any(doc == base.__doc__ for base in (BaseModel,) + model.__mro__[1:]):
        return " ".join(doc.split())
    return ""


def render_reference(root: type[BaseModel]) -> str:
    """Markdown of every section of `root`: one table of fields each, a sub-section per nested model."""
    out: list[str] = []
    top = [(name, info) for name, info in root.model_fields.items()]
    leaves = [(name, info) for name, info in top if not models_in(info.annotation)]
    if leaves:
        out += [f"## Top level {{ #{_anchor(root.__name__)} }}", "", _table(root, "", leaves), ""]
    for name, info in top:
        if models_in(info.annotation):
            _render_field(out, name, info, level=2, seen=(root,))
    return "\n".join(out).rstrip() + "\n"


def _render_field(out: list[str], path: str, info: FieldInfo, level: int, seen: tuple, anchor_path: str | None = None) -> None:
    """`anchor_path`: `path` with the variants it lies in, so that a section a model shares by all
    its variants (learner.loss.mismatch) has an anchor in each."""
    anchor_path = anchor_path or path
    models = models_in(info.annotation)
    discriminator = _discriminator(info)
    annotation = _unwrap(info.annotation)
    origin = typing.get_origin(annotation)
    suffix = "[]" if origin in (list, tuple, set, frozenset) else ".<name>" if origin is dict else ""
    many = len(models) > 1
    if many:
        # A choice of models: an overview, then a section per variant.
        heading = "#" * min(level, 6)
        out += [f"{heading} `{path}{suffix}` {{ #{_anchor(anchor_path)} }}", ""]
        if info.description:
            out += [info.description.strip(), ""]
        key = f"chosen by `{discriminator}`" if discriminator else "one of"
        out += [f"Type {_code(type_name(info.annotation))}, default {show_default(info)}; {key}:", ""]
        for model in models:
            tag = _tag(model, discriminator)
            label = f"`{discriminator}: {tag}`" if tag else f"`{model.__name__}`"
            out.append(f"- [{label}](#{_anchor(anchor_path + '.' + model.__name__)})")
        out.append("")
        for model in models:
            tag = _tag(model, discriminator)
            title = f"`{path}{suffix}` with `{discriminator}: {tag}`" if tag else f"`{path}{suffix}`: `{model.__name__}`"
            _render_model(out, path + suffix, model, level + 1, seen, title, anchor_path + "." + model.__name__, None)
    else:
        _render_model(out, path + suffix, models[0], level, seen, f"`{path}{suffix}`", anchor_path, info)


def _render_model(out: list[str], path: str, model: type[BaseModel], level: int, seen: tuple,
                  title: str, anchor_path: str, info: FieldInfo | None) -> None:
    heading = "#" * min(level, 6)
    out += [f"{heading} {title} {{ #{_anchor(anchor_path)} }}", ""]
    if info is not None:
        if info.description:
            out += [info.description.strip(), ""]
        out += [f"Type {_code(type_name(info.annotation))}, default {show_default(info)}.", ""]
    if _doc(model):
        out += [_doc(model), ""]
    if model in seen:  # a model that holds itself: described once, above
        out += [f"(the same fields as `{model.__name__}` above)", ""]
        return
    fields = list(model.model_fields.items())
    if fields:
        out += [_table(model, path, fields, anchor_path), ""]
    for name, field in fields:
        if models_in(field.annotation):
            _render_field(out, f"{path}.{name}", field, level + 1, seen + (model,), f"{anchor_path}.{name}")


def _table(model: type[BaseModel], path: str, fields: list[tuple[str, FieldInfo]], anchor_path: str | None = None) -> str:
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, info in fields:
        kind = type_name(info.annotation)
        bounds = constraints(info)
        kind_cell = _code(kind) + (f" ({_cell(bounds)})" if bounds else "")
        full = f"{path}.{name}" if path else name
        description = _cell(info.description or "")
        if models_in(info.annotation):
            linked = f"{anchor_path}.{name}" if anchor_path else full
            description = (description + " " if description else "") + f"[Fields](#{_anchor(linked)})."
        rows.append(f"| `{name}` | {kind_cell} | {show_default(info)} | {description} |")
    return "\n".join(rows)
