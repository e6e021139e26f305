"""Generation with transformers: slower than vLLM, but any model and no extra engine."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from rollout_workers.types import GenerationParams, Prompt, PromptRollout, Sample
from common.weight_sync import (
    BucketPlan,
    Receiver,
    WeightSyncError,
    open_group,
    probe_sums,
)


class TransformersBackend:
    def __init__(self, model_path: str, seed: int = 0):
        from common.hf import load_causal_lm, load_tokenizer

        self.tokenizer = load_tokenizer(model_path)
        self.model = load_causal_lm(model_path).eval()
        self.context_length = self.model.config.max_position_embeddings
        torch.manual_seed(seed)

    @torch.no_grad()
    def generate_stream(self, prompts: list[Prompt], params: GenerationParams, version: int,
                        heartbeat_s: float | None = None) -> Iterator[tuple[int, PromptRollout]]:
        """(index, rollout) for each prompt, one prompt at a time (no heartbeat: a prompt's samples
        come from one `generate` call)."""
        eos = self.tokenizer.eos_token_id
        for index, prompt in enumerate(prompts):
            prompt_ids = list(prompt) if isinstance(prompt, list) else self.tokenizer(prompt)["input_ids"]
            greedy = params.temperature == 0
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=not greedy,
                temperature=None if greedy else params.temperature,
                top_p=None if greedy else params.top_p,
                top_k=None if greedy else 0,
                num_return_sequences=params.n,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
                output_scores=True,
                return_dict_in_generate=True,
            )
            # scores are the processed (temperature-scaled, filtered) logits of each step
            step_logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1)
            samples = []
            for row in range(params.n):
                ids = out.sequences[row, len(prompt_ids):].tolist()
                if eos in ids:
                    ids = ids[: ids.index(eos) + 1]
                    finish = "stop"
                else:
                    finish = "length"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                ids, text, finish, stop = _apply_stop(ids, text, finish, params.stop, self.tokenizer)
                logprobs = [step_logprobs[row, t, tok].item() for t, tok in enumerate(ids)]
                samples.append(Sample(ids, logprobs, text, finish, version, stop))
            yield index, PromptRollout(prompt_ids, samples)

    def join_weight_group(self, backend: str, *args) -> None:
        if backend != "gloo":
            raise ValueError(f"the transformers backend receives weights on the CPU: transport must be 'gloo', got {backend!r}")
        self.group = open_group(backend, *args)

    def receive_weights(self, plan: BucketPlan, version: int | None = None) -> None:
        """Load a push (never during generation: this backend takes no in-flight updates)."""
        receiver = Receiver(self.group, plan, "cpu", self.model.dtype)
        if plan.adapter is not None:
            self._load_adapter(plan.adapter, {name: t.clone() for name, t in receiver.tensors()})
            receiver.finish(self.probe)
            return
        if hasattr(self.model, "peft_config"):  # new base weights: the adapter goes until the next adapter push
            self.model = self.model.unload()
        state = dict(receiver.tensors())
        # Both names of a tied embedding arrive; strict=False accepts lm_head and tie_weights() below
        # makes the two one tensor again.
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise WeightSyncError(f"weight update does not fit the model: missing {missing}, unexpected {unexpected}")
        if self.model.config.tie_word_embeddings:
            self.model.tie_weights()
        receiver.finish(self.probe)

    def _load_adapter(self, config: dict, tensors: dict[str, torch.Tensor]) -> None:
        """A LoRA adapter (PEFT's names) on the base model: PEFT wraps the model at the first one."""
        from peft import PeftConfig, get_peft_model, set_peft_model_state_dict

        if not hasattr(self.model, "peft_config"):
            settings = {k: v for k, v in config.items() if k not in ("peft_version", "auto_mapping")}
            self.model = get_peft_model(self.model, PeftConfig.from_peft_type(**settings), autocast_adapter_dtype=False).eval()
        result = set_peft_model_state_dict(self.model, tensors)
        if result.unexpected_keys:
            raise WeightSyncError(f"adapter does not fit the model: unexpected {result.unexpected_keys}")

    def load_adapter(self, directory: str) -> None:
        from peft import PeftModel

        self.model = PeftModel.from_pretrained(self.model, directory).eval()

    def reseed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def probe(self, names: list[str]) -> dict[str, float]:
        return probe_sums(dict(self.model.named_parameters()), names)


def _apply_stop(ids, text, finish, stops, tokenizer):
    """Cut at the first stop sequence, as vLLM does: the text loses it, the tokens keep up to it.
    Returns the ids, the text, the finish reason and the stop sequence it ended at."""
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return ids, text, finish, None
    cut, stop = min(found)
    for n in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:n], skip_special_tokens=True)) > cut:
            return ids[:n], text[:cut], "stop", stop
    return ids, text[:cut], "stop", stop
