"""LoRA on the learner (`learner.lora`): PEFT adapters on the policy, and the two forms of its
weights that leave the learner.

- The adapter alone (`adapter_weights`): PEFT's own tensor names and format, what `peft` saves and
  what vLLM's LoRA support loads; a few MB where the model is GB. `adapter_config` is the
  adapter_config.json that goes with it.
- The merged weights (`merged_weights`): the model as a plain Hugging Face checkpoint, each adapted
  layer's weight plus its adapter's delta, computed out of place (the training weights are never
  merged and unmerged in place, which would drift in bf16); for engines that take no adapter, and
  for the Hugging Face export.

The KL reference of a LoRA policy is the same module with its adapter disabled
(`reference_disabled`): no second copy of the weights.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

ADAPTER = "default"  # the one adapter of a policy, PEFT's default name
ADAPTER_DIR = "adapter"  # a checkpoint's adapter, in PEFT's format (peft, vLLM's --lora-modules)
BASE_DIR = "base"  # with lora.start rl, the model under the adapter (not the model's path)


def wrap(model, settings):
    """`model` (a causal LM) as a PEFT model with one LoRA adapter from `settings` (a
    learner.config.LoraSettings); only the adapter's parameters (and `modules_to_save`) train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, use_rslora=settings.rslora,
        init_lora_weights=True if settings.init == "kaiming" else settings.init,
        target_modules=list(settings.target_modules), modules_to_save=list(settings.modules_to_save) or None,
        bias="none", task_type="CAUSAL_LM",
    )
    # autocast_adapter_dtype=False: the adapter in the model's dtype, as DeepSpeed's precision sets it
    return get_peft_model(model, config, autocast_adapter_dtype=False)


def parameter_groups(model, lr: float, lr_ratio: float) -> list[dict]:
    """The optimizer's groups of `model`'s trained parameters: with LoRA+ (`lr_ratio`), each B
    matrix in a group of its own whose `lr_scale` the learning rate is multiplied by."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not is_peft(model) or lr_ratio == 1:
        return [{"params": [p for _, p in trained], "lr": lr, "lr_scale": 1.0}]
    b = [p for name, p in trained if ".lora_B." in name]
    rest = [p for name, p in trained if ".lora_B." not in name]
    return [{"params": rest, "lr": lr, "lr_scale": 1.0}, {"params": b, "lr": lr * lr_ratio, "lr_scale": lr_ratio}]


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def adapter_config(model) -> dict:
    """The adapter's adapter_config.json, as a dict."""
    config = model.peft_config[ADAPTER].to_dict()
    # JSON-able: PEFT keeps target modules as a set
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def adapter_weights(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names PEFT saves them with (no adapter name:
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`)."""
    from peft import get_peft_model_state_dict

    # Only the trained parameters: under ZeRO-3 the frozen ones are shards (the caller gathers these).
    state = {name: p.detach() for name, p in trainable(model)}
    return get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)


def merged_weights(model) -> dict[str, torch.Tensor]:
    """The policy as plain Hugging Face tensors: each LoRA layer's weight plus its delta, a module
    saved whole as its trained copy, everything else as it is."""
    from peft.tuners.lora import LoraLayer

    inner = model.base_model.model  # the causal LM inside PeftModel and LoraModel
    merged: dict[str, torch.Tensor] = {}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            base = module.get_base_layer()
            with torch.no_grad():
                weight = base.weight.detach() + module.get_delta_weight(ADAPTER).to(base.weight.dtype)
            merged[f"{name}.weight"] = weight
    for name, tensor in _plain(inner, trained=True).items():
        merged.setdefault(name, tensor)
    return merged


def base_weights(model) -> dict[str, torch.Tensor]:
    """The model under the adapter, as plain Hugging Face tensors: no delta, modules saved whole
    as they were before training."""
    return _plain(model.base_model.model, trained=False)


def _plain(inner, trained: bool) -> dict[str, torch.Tensor]:
    """`inner`'s tensors under Hugging Face names, the adapter's left out; of a module saved whole,
    its trained copy or its original."""
    keep, drop = (f".modules_to_save.{ADAPTER}.", ".original_module.") if trained else (".original_module.", f".modules_to_save.{ADAPTER}.")
    out = {}
    for name, tensor in inner.state_dict().items():
        if ".lora_" in name or drop in name:
            continue
        out[name.replace(".base_layer.", ".").replace(keep, ".")] = tensor.detach()
    return out


def save(model, path: str | Path, merged: bool, base: bool) -> None:
    """The adapter under `path`/adapter (adapter_config.json, adapter_model.safetensors); with
    `merged`, the merged model in Hugging Face format at `path` itself; with `base`, the model
    under the adapter in Hugging Face format under `path`/base (the adapter's base when it is not
    the model's path)."""
    model.save_pretrained(Path(path) / ADAPTER_DIR, safe_serialization=True)
    inner = model.base_model.model
    if merged:
        inner.save_pretrained(path, safe_serialization=True, state_dict=merged_weights(model))
    if base:
        inner.save_pretrained(Path(path) / BASE_DIR, safe_serialization=True, state_dict=base_weights(model))


@contextlib.contextmanager
def reference_disabled(model):
    """The base model: `model` with its adapter (and modules saved whole) switched off."""
    with model.disable_adapter():
        yield
