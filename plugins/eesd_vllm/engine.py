"""Start vLLM with or without speculation, and run a set of prompts: what the tests and the bench share.

Run as a module, it serves one configuration in a process of its own and prints JSON, so that
several configurations can be compared without two engines in one process::

    python -m eesd_vllm.engine --model PATH --method eesd --prompts prompts.json --max-tokens 64

Methods: ``plain`` (no speculation), ``plain_sync`` (no speculation and no async scheduling,
which vLLM turns off for every ``custom_class`` proposer), ``ngram`` (vLLM's prompt lookup),
``draft`` (a separate draft model, ``--draft-model``), ``eesd`` (this package's proposer; options
in ``--options`` JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from eesd_core.errors import ConfigError

METHODS = ("plain", "plain_sync", "ngram", "draft", "eesd")


def speculative(
    method: str, k: int, draft_model: str | None = None, options: dict[str, Any] | None = None
) -> Any:
    """vLLM's ``speculative_config`` for ``method`` with ``k`` draft tokens."""
    if method in ("plain", "plain_sync"):
        return None
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    if method == "draft":
        if not draft_model:
            raise ValueError("method 'draft' needs a draft model")
        return {"method": "draft_model", "model": draft_model, "num_speculative_tokens": k}
    if method == "eesd":
        import eesd_vllm

        return eesd_vllm.speculative_config(k, **(options or {}))
    raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")


def start(
    model: str,
    method: str = "plain",
    k: int = 8,
    *,
    draft_model: str | None = None,
    options: dict[str, Any] | None = None,
    max_model_len: int = 1024,
    kv_blocks: int | None = None,
    max_num_seqs: int = 64,
    dtype: str = "float32",
    seed: int = 0,
    memory_fraction: float | None = None,
) -> Any:
    """An in-process vLLM engine (no engine-core subprocess) serving ``model`` by token ids.
    ``memory_fraction``: vLLM's ``gpu_memory_utilization``, which its CPU build reads as the share
    of the machine's memory that must be free at start (its default, 0.92, fails when other
    processes hold a little)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    extra: dict[str, Any] = {}
    if method == "plain_sync":
        extra["async_scheduling"] = False
    if kv_blocks is not None:  # a small budget, in small blocks, so that requests outgrow it
        extra.update(num_gpu_blocks_override=kv_blocks, block_size=32)
    if memory_fraction is not None:
        extra["gpu_memory_utilization"] = memory_fraction
    return LLM(
        model=model,
        skip_tokenizer_init=True,
        speculative_config=speculative(method, k, draft_model, options),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enforce_eager=True,
        dtype=dtype,
        seed=seed,
        **extra,
    )


def run(
    llm: Any,
    prompts: list[list[int]],
    max_tokens: int | list[int],
    temperature: float = 0.0,
    seed: int = 0,
    in_flight: int | None = None,
) -> dict[str, Any]:
    """Generate for every prompt (``max_tokens`` for all, or one per prompt); the tokens of each,
    and the wall time of the call. All are submitted at once; ``in_flight``: the scheduler admits at
    most that many at a time and admits the next as soon as one finishes (continuous batching at a
    fixed concurrency, as a server under that many clients), else every prompt runs at once."""
    from vllm import SamplingParams

    limits = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [
        SamplingParams(
            max_tokens=limits[i],
            temperature=temperature,
            seed=None if temperature == 0 else seed + i,
            ignore_eos=True,
            detokenize=False,
        )
        for i in range(len(prompts))
    ]
    with contextlib.nullcontext() if in_flight is None else _admitting(llm, in_flight):
        started = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - started
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "seconds": seconds}


@contextlib.contextmanager
def _admitting(llm: Any, most: int) -> Iterator[None]:
    """The scheduler of an in-process engine admits at most ``most`` running requests inside."""
    scheduler = _scheduler(llm)
    if scheduler is None:
        raise ConfigError(
            "in_flight needs an in-process vLLM engine: start it with VLLM_ENABLE_V1_MULTIPROCESSING=0"
        )
    admitted = scheduler.max_num_active_reqs
    scheduler.max_num_active_reqs = min(most, scheduler.max_num_running_reqs)
    try:
        yield
    finally:
        scheduler.max_num_active_reqs = admitted


def _scheduler(llm: Any) -> Any:
    """The scheduler of an in-process engine, or None."""
    try:
        return llm.llm_engine.engine_core.engine_core.scheduler
    except AttributeError:
        return None


def proposer_of(llm: Any) -> Any:
    """The eesd proposer inside an in-process engine, or None (for its statistics)."""
    try:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        return executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None


def _after(llm: Any, method: str, then: Any) -> None:
    """Call ``then(scheduler)`` after every call of the scheduler's ``method`` (an in-process
    engine's; nothing otherwise)."""
    scheduler = _scheduler(llm)
    if scheduler is None:
        return
    original = getattr(scheduler, method)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        then(scheduler)
        return out

    setattr(scheduler, method, wrapped)


def count_preemptions(llm: Any) -> dict[str, int]:
    """A counter of the requests the scheduler of an in-process engine preempts from now on."""
    counter = {"preemptions": 0}
    _after(llm, "_preempt_request", lambda _: counter.update(preemptions=counter["preemptions"] + 1))
    return counter


def watch_running(llm: Any) -> dict[str, int]:
    """The most requests the scheduler of an in-process engine ran in one step, from now on."""
    seen = {"most_running": 0}
    _after(llm, "schedule", lambda s: seen.update(most_running=max(seen["most_running"], len(s.running))))
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eesd_vllm.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", choices=METHODS, default="plain")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--options", type=json.loads, default={})
    parser.add_argument("--prompts", required=True, help="JSON file: a list of token-id lists")
    parser.add_argument("--max-tokens", type=json.loads, default=64, help="N, or a JSON list: one per prompt")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-blocks", type=int, default=None, help="a small KV budget forces preemption")
    parser.add_argument("--in-flight", type=int, default=None, help="run at most this many requests at once")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--memory-fraction", type=float, default=None, help="share of memory that must be free at start"
    )
    parser.add_argument("--out", required=True, help="where the JSON result goes (vLLM logs to stdout)")
    args = parser.parse_args(argv)
    with open(args.prompts) as f:
        prompts = json.load(f)
    llm = start(
        args.model,
        args.method,
        args.k,
        draft_model=args.draft_model,
        options=args.options,
        max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks,
        dtype=args.dtype,
        memory_fraction=args.memory_fraction,
    )
    preempted, running = count_preemptions(llm), watch_running(llm)
    result = run(llm, prompts, args.max_tokens, args.temperature, in_flight=args.in_flight)
    result.update(preempted, **running)
    proposer = proposer_of(llm)
    if proposer is not None and hasattr(proposer, "stats"):
        result["proposer"] = dict(proposer.stats, memory_bytes=proposer.memory_bytes())
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
