"""What a round that drafts nothing costs beyond a plain step, on a model whose step is all overhead.

A tiny random Llama (8 layers, hidden 128, 1 thread) makes a decoding step of a few milliseconds,
so the engine's own work per round shows. Three decoders on the same model, interleaved over
repeats, medians: plain (``drafter=None``), the early-exit drafter with a controller that never
drafts (every round k = 0), and the default Thompson controller (untrained exit at N = 2).

    python benchmarks/round_overhead.py            # 15 repeats of 200 tokens
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eesd_core import SpeculativeDecoder


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=2000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_llama()
    early_exit = {"exit_layer": 2, "head": None}
    decoders = {
        "plain": SpeculativeDecoder(model, drafter=None),
        "always_no": SpeculativeDecoder(
            model, drafter_options=early_exit, controller="fixed", controller_options={"k": 0}
        ),
        "thompson": SpeculativeDecoder(model, drafter_options=early_exit),
    }
    prompt = list(range(5, 40))
    for dec in decoders.values():
        dec.generate(prompt, max_new_tokens=50, eos_token_id=[])
    per_round: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.repeats):
        for name, dec in decoders.items():
            start = time.perf_counter()
            result = dec.generate(prompt, max_new_tokens=args.max_new_tokens, eos_token_id=[])
            per_round[name].append((time.perf_counter() - start) / result.stats.rounds)
    base = statistics.median(per_round["plain"])
    for name, times in per_round.items():
        m = statistics.median(times)
        print(f"{name:10s} {m * 1e3:.3f} ms a round, {m / base:.3f}x plain, {1e6 * (m - base):+.0f} us")


if __name__ == "__main__":
    main()
