"""Turn a GGUF file into an ordinary safetensors checkpoint, and prove the copy faithful.

transformers reads GGUF directly and dequantizes it, but slowly, and ``save_pretrained`` refuses a
model loaded that way. The conversion copies the dequantized weights into a fresh model, saves it,
reloads the result and requires the same tokens, the same weights bit for bit and, in float32, the
same logits as the GGUF model.
"""

from __future__ import annotations

import gc
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eesd_core.errors import ModelFetchError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_SAMPLE_TEXT = "def is_prime(n):\n    "
_CONFIG_KEYS_TO_DROP = (
    "quantization_config",
    "architectures",
    "transformers_version",
    "_name_or_path",
    "_model_name_or_path",
    "dtype",
)


@dataclass(frozen=True)
class Fingerprint:
    """What a faithful copy of a model reproduces, small enough to outlive the model itself."""

    ids: list[int]  # a sample text, encoded
    chat_template: str | None
    tied: bool | None  # config.tie_word_embeddings
    weights: dict[str, str]  # name -> sha256 of the tensor's bytes in the checkpoint's dtype
    logits: torch.Tensor | None  # [1, T, V] over ids; float32 only

    def differences(self, copy: Fingerprint) -> list[str]:
        """How ``copy`` departs from this fingerprint, in words; empty when it is faithful."""
        import torch

        problems = []
        if copy.ids != self.ids:
            problems.append("the tokenizer encodes differently")
        if copy.chat_template != self.chat_template:
            problems.append("the chat template differs")
        if copy.tied != self.tied:
            problems.append(f"tie_word_embeddings is {copy.tied}, expected {self.tied}")
        differing = [key for key, digest in self.weights.items() if copy.weights.get(key) != digest]
        if differing:
            more = f" (and {len(differing) - 1} more)" if len(differing) > 1 else ""
            problems.append(f"weight {differing[0]} differs{more}")
        if self.logits is not None and (copy.logits is None or not torch.equal(copy.logits, self.logits)):
            problems.append("the logits differ from those of the GGUF model")
        return problems


def convert_gguf(gguf: Path, out: Path, *, dtype: str = "float32") -> None:
    """Write the GGUF model and tokenizer as a safetensors checkpoint in ``out``, then check it.

    One copy of the weights lives at a time (the 1.5B Qwen is 7.1 GB in float32): the GGUF model
    is fingerprinted and freed before the checkpoint is reloaded to be compared with it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        expected = fingerprint(source, tokenizer, torch_dtype)
        model = plain_copy(source, torch_dtype)
        del source
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        del model
    except ImportError as exc:
        raise ModelFetchError(
            f"could not convert {gguf.name}: {exc}. Reading GGUF files needs the 'gguf' package "
            "next to transformers (pip install gguf)"
        ) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFetchError(f"could not convert {gguf.name}: {exc}") from exc
    gc.collect()
    check_checkpoint(expected, out, torch_dtype)


def plain_copy(source: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A model of ``source``'s class and weights with no quantization attached, hence saveable.

    In float32 the copy shares the source's tensors rather than duplicate them. Whether the output
    matrix is tied to the embeddings comes with the config: transformers unties it when the GGUF
    file carries its own ``output.weight``, as the Qwen2.5-Coder files do.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = source.config.to_dict()
    for key in _CONFIG_KEYS_TO_DROP:
        settings.pop(key, None)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights = {k: v.detach().to(dtype).contiguous() for k, v in source.state_dict().items()}
    model.load_state_dict(weights, assign=True, strict=True)
    model.tie_weights()
    return model


def fingerprint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dtype: torch.dtype,
    *,
    inputs: list[int] | None = None,
) -> Fingerprint:
    """The fingerprint of ``model`` as a checkpoint in ``dtype`` would hold it.

    The logits are taken over ``inputs``, by default the tokenizer's encoding of a sample text.
    """
    import torch

    ids = tokenizer(_SAMPLE_TEXT).input_ids
    logits = None
    if dtype == torch.float32:
        with torch.no_grad():
            logits = model.eval()(torch.tensor([inputs or ids])).logits  # [1, T, V]
    return Fingerprint(
        ids=ids,
        chat_template=tokenizer.chat_template,
        tied=getattr(model.config, "tie_word_embeddings", None),
        weights={key: _digest(value.to(dtype)) for key, value in model.state_dict().items()},
        logits=logits,
    )


def check_checkpoint(expected: Fingerprint, out: Path, dtype: torch.dtype) -> None:
    """Reload ``out`` and raise :class:`ModelFetchError` unless it matches ``expected``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(out)
    problems = expected.differences(fingerprint(reloaded, tokenizer, dtype, inputs=expected.ids))
    if problems:
        raise ModelFetchError(
            f"the converted checkpoint does not match its GGUF source: {'; '.join(problems)}"
        )


def _digest(tensor: torch.Tensor) -> str:
    import torch

    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().data).hexdigest()
