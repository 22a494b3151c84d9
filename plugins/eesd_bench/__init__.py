"""The measuring tools of eesd: ``eesd bench``, ``eesd demo`` and trace record/replay.

- :mod:`eesd_bench.cli` and the modules it drives run Spec-Bench's protocol for eesd and its
  baselines: Spec-Bench prompts (first turn, chat template), batch size 1, one process, every
  method on every prompt in rotating order after one warm-up generation each; speedup is the ratio
  of mean tokens per second to transformers' plain ``generate()``; every greedy output is checked
  against the baseline's token for token. Methods are spec strings (:mod:`eesd_bench.methods`)
  built through the plug-in registry, never by importing a plug-in.
- :mod:`eesd_bench.trace` records what a drafter proposes at every position and replays
  controllers against the record in modelled time (:mod:`eesd_bench.offline` uses it for the
  oracle bound).
- :mod:`eesd_bench.demo` streams one reply and compares it with plain decoding.

A tool plug-in like any other: it reaches the command line through ``eesd_cli_commands``. Importing
it stays light (argument parsers only); torch and transformers load when a command runs.
"""

from __future__ import annotations

import argparse

from eesd_core.hookspecs import hookimpl


@hookimpl
def eesd_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eesd_bench.cli import add_bench
    from eesd_bench.demo import add_demo
    from eesd_bench.evalcli import add_controllers, add_costs, add_trace

    add_demo(subparsers)
    add_bench(subparsers)
    add_trace(subparsers)
    add_costs(subparsers)
    add_controllers(subparsers)
