"""transformers' ``generate()`` keywords in terms of the core's: processors, stopping criteria,
sampling parameters, or a refusal that names the keyword.

transformers' processors are pure functions of ``(input_ids, scores)``, so the round can call them
at any position of any row, on drafts and on positions later rejected. Its processors that need
the prompt's length or keep state across steps are refused (:data:`REFUSED`), and so are a user's
processors of the stateful kinds transformers ships (:data:`STATEFUL`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eesd_core.config import GenerationConfig as CoreConfig
from eesd_core.errors import InputError

TAKEN = (
    "generation_config", "do_sample", "max_length", "min_length", "repetition_penalty",
    "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "sequence_bias", "forced_bos_token_id",
    "prefix_allowed_tokens_fn", "stop_strings", "tokenizer", "max_time", "renormalize_logits",
)  # fmt: skip

# How transformers computes, not what it returns: taken and left aside.
COMPUTATION = frozenset({
    "use_cache", "cache_implementation", "cache_config", "compile_config", "disable_compile", "low_memory",
    "prefill_chunk_size", "max_cache_len", "continuous_batching_config", "transformers_version",
    "bos_token_id", "decoder_start_token_id", "is_assistant", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
    "target_lookbehind", "max_matching_ngram_size", "assistant_early_exit", "use_mtp",
    "assistant_ensemble_weight", "speculation_type",
})  # fmt: skip

# Values that leave decoding as it is, for keywords refused otherwise.
NEUTRAL: dict[str, Any] = {
    "num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "diversity_penalty": 0.0,
    "length_penalty": 1.0, "early_stopping": False, "output_scores": False, "output_logits": False,
    "return_dict_in_generate": False, "output_attentions": False, "output_hidden_states": False,
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "guidance_scale": 1.0,
    "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0, "remove_invalid_values": False,
    "token_healing": False, "synced_gpus": False,
}  # fmt: skip

_BEAMS = "eesd samples from the model or decodes greedily, one sequence per row; it does no beam search"
_SCORES = "eesd returns log-probabilities instead: logprobs=True, and top_logprobs=n for the n best"
_WARPS = "eesd samples with temperature, top_k and top_p; other warpers are not implemented"
_DRAFTS = "eesd drafts itself: choose its drafter (drafter='prompt_lookup' drafts from the prompt)"
_PROMPT = "it depends on the prompt's length, which differs by row in a batch"
REFUSED: dict[str, str] = {
    "num_beams": _BEAMS, "num_beam_groups": _BEAMS, "diversity_penalty": _BEAMS, "length_penalty": _BEAMS,
    "early_stopping": _BEAMS, "constraints": _BEAMS, "force_words_ids": _BEAMS,
    "num_return_sequences": "repeat the prompt in a batch (row b draws from seed + b)",
    "output_scores": _SCORES, "output_logits": _SCORES, "return_dict_in_generate": _SCORES,
    "output_attentions": "eesd returns tokens and log-probabilities only",
    "output_hidden_states": "eesd returns tokens and log-probabilities only",
    "min_p": _WARPS, "typical_p": _WARPS, "epsilon_cutoff": _WARPS, "eta_cutoff": _WARPS, "top_h": _WARPS,
    "penalty_alpha": "contrastive search is not sampling from the model",
    "dola_layers": "DoLa decoding contrasts layers and is not sampling from the model",
    "guidance_scale": "classifier-free guidance runs the model twice per step",
    "negative_prompt_ids": "classifier-free guidance runs the model twice per step",
    "negative_prompt_attention_mask": "classifier-free guidance runs the model twice per step",
    "assistant_model": _DRAFTS, "assistant_tokenizer": _DRAFTS, "prompt_lookup_num_tokens": _DRAFTS,
    "begin_suppress_tokens": _PROMPT, "exponential_decay_length_penalty": _PROMPT,
    "forced_eos_token_id": "it needs max_length; eesd counts max_new_tokens",
    "remove_invalid_values": "eesd refuses NaN and infinite logits instead of replacing them",
    "watermarking_config": "watermarking is not implemented",
    "token_healing": "it rewrites the prompt",
    "encoder_repetition_penalty": "eesd decodes decoder-only models",
    "encoder_no_repeat_ngram_size": "eesd decodes decoder-only models",
    "inputs_embeds": "give input_ids",
    "synced_gpus": "eesd decodes on one device",
    "custom_generate": "eesd's round is its own",
    "use_model_defaults": "pass generation_config=model.generation_config for a checkpoint's defaults",
}  # fmt: skip

# A user's processors of these kinds keep state across steps or run the model: refused.
STATEFUL = frozenset({
    "UnbatchedClassifierFreeGuidanceLogitsProcessor", "ClassifierFreeGuidanceLogitsProcessor",
    "SynthIDTextWatermarkLogitsProcessor", "WhisperTimeStampLogitsProcessor",
    "WhisperNoSpeechDetection", "AlternatingCodebooksLogitsProcessor", "BarkEosPrioritizerLogitsProcessor",
})  # fmt: skip


def translate(decoder: Any, keywords: dict[str, Any]) -> None:
    """Rewrite ``keywords`` of a ``generate()``/``stream()`` call in place into the core's
    keywords, or raise :class:`~eesd_core.errors.InputError` naming what cannot be honoured."""
    _merge_config(keywords)
    for name in COMPUTATION & set(keywords):
        del keywords[name]
    refused = [
        f"{name}={keywords[name]!r} ({why})"
        for name, why in REFUSED.items()
        if name in keywords and keywords[name] is not None and keywords[name] != NEUTRAL.get(name, ...)
    ]
    if refused:
        raise InputError(f"eesd cannot honour {'; '.join(refused)}.")
    for name in REFUSED.keys() & set(keywords):
        del keywords[name]
    known = {*CoreConfig.model_fields, *CoreConfig.keywords, *TAKEN}
    unknown = sorted(name for name in keywords if name not in known)
    if unknown:
        said = "; ".join(f"unknown option {name!r}" for name in unknown)
        raise InputError(f"Invalid generation arguments: {said}. Valid options: {', '.join(sorted(known))}.")
    _sampling(keywords)
    _lengths(keywords)
    processors = _processors(decoder, keywords)
    user = keywords.pop("logits_processor", None) or ()
    for processor in user:
        if type(processor).__name__ in STATEFUL:
            raise InputError(
                f"logits_processor holds a {type(processor).__name__}, which keeps state across steps or "
                "runs the model: speculative decoding calls processors out of step order, so it is refused."
            )
    if processors or user:
        keywords["logits_processor"] = [*processors, *user]
    criteria = [*(keywords.pop("stopping_criteria", None) or ()), *_criteria(decoder, keywords)]
    if criteria:
        keywords["stopping_criteria"] = criteria
    keywords.pop("renormalize_logits", None)  # softmax and argmax are the same after it


def _merge_config(keywords: dict[str, Any]) -> None:
    """The fields a transformers ``GenerationConfig`` sets, under the keywords given beside it."""
    config = keywords.pop("generation_config", None)
    if config is None:
        return
    from transformers import GenerationConfig

    if not isinstance(config, GenerationConfig):
        raise InputError(
            f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}."
        )
    for name, value in config.to_dict().items():
        if value is not None and not name.startswith("_") and name != "pad_token_id":
            keywords.setdefault(name, value)  # the model's pad id fills rows anyway


def _sampling(keywords: dict[str, Any]) -> None:
    """``do_sample`` as transformers reads it: False decodes greedily whatever the temperature;
    True samples at ``temperature`` (default 1.0) with ``top_k`` (default 50) and ``top_p``."""
    do_sample = keywords.pop("do_sample", None)
    if do_sample is None:
        return
    if not do_sample:
        keywords["temperature"] = 0.0
        keywords.pop("top_k", None), keywords.pop("top_p", None)
        return
    if keywords.setdefault("temperature", 1.0) in (0, 0.0):
        raise InputError("do_sample=True needs a temperature above 0 (temperature=0 decodes greedily).")
    if keywords.get("top_k") is None:
        keywords["top_k"] = 50


def _lengths(keywords: dict[str, Any]) -> None:
    max_length = keywords.pop("max_length", None)
    if max_length is not None and keywords.get("max_new_tokens") is None:
        raise InputError(
            f"max_length={max_length} counts the prompt, which differs by row: give max_new_tokens instead."
        )


def _processors(decoder: Any, keywords: dict[str, Any]) -> list[Any]:
    """transformers' processors for the keywords that have them, in transformers' order."""
    import transformers.generation.logits_process as lp

    eos = keywords.get("eos_token_id")
    if eos is None:
        eos = getattr(getattr(decoder.model, "generation_config", None), "eos_token_id", None)
    try:
        eos = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    except (TypeError, ValueError):
        raise InputError(f"eos_token_id must be a token id or a list of them, got {eos!r}.") from None
    device = decoder.adapter.device
    makers: dict[str, Callable[[Any], Any]] = {  # transformers' order
        "sequence_bias": lambda bias: lp.SequenceBiasLogitsProcessor(sequence_bias=bias),
        "repetition_penalty": lambda x: lp.RepetitionPenaltyLogitsProcessor(x) if x != 1.0 else None,
        "no_repeat_ngram_size": lambda n: lp.NoRepeatNGramLogitsProcessor(n) if n != 0 else None,
        "bad_words_ids": lambda words: lp.NoBadWordsLogitsProcessor(words, eos_token_id=eos),
        "min_length": lambda n: lp.MinLengthLogitsProcessor(n, eos, device=device) if n and eos else None,
        "prefix_allowed_tokens_fn": lambda allowed: lp.PrefixConstrainedLogitsProcessor(allowed, num_beams=1),
        "forced_bos_token_id": lambda bos: lp.ForcedBOSTokenLogitsProcessor(bos),
        "suppress_tokens": lambda tokens: lp.SuppressTokensLogitsProcessor(tokens, device=device),
    }
    made = []
    for name, make in makers.items():
        value = keywords.pop(name, None)
        try:
            processor = None if value is None else make(value)
        except (TypeError, ValueError) as exc:
            raise InputError(f"Invalid {name}={value!r}: {exc}") from None
        if processor is not None:
            made.append(processor)
    return made


def _criteria(decoder: Any, keywords: dict[str, Any]) -> list[Any]:
    from transformers.generation.stopping_criteria import MaxTimeCriteria, StopStringCriteria

    made: list[Any] = []
    tokenizer = keywords.pop("tokenizer", None) or decoder.tokenizer
    stops = keywords.pop("stop_strings", None)
    if stops:
        if tokenizer is None:
            raise InputError(
                "stop_strings needs the tokenizer: pass tokenizer=, as to transformers' generate()."
            )
        try:
            made.append(StopStringCriteria(tokenizer, [stops] if isinstance(stops, str) else list(stops)))
        except (TypeError, ValueError) as exc:
            raise InputError(f"Invalid stop_strings {stops!r}: {exc}") from None
    if (seconds := keywords.pop("max_time", None)) is not None:
        made.append(MaxTimeCriteria(seconds))
    return made
