"""One benchmark session: the timed run, the optional probes and models, and the files they make.

The result is one JSON-ready dict: ``environment``, ``settings``, ``methods``, every raw
``samples`` record, the ``summary``, greedy ``mismatches``, ``products`` (how each eesd method's
model adapter ran its short passes), ``assistant`` (the draft model of ``hf_assisted``: name,
checkpoint, parameters, parameter bytes, dtype), and ``memory``, ``modelled`` and ``oracle`` when
asked for (``None`` otherwise), plus ``notes`` on anything left out. Schema 2 replaced schema 1's
``matmul`` with ``products``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eesd_bench.methods import MethodSpec
from eesd_bench.prompts import Question
from eesd_bench.report import markdown, mismatches, summarize, ties
from eesd_bench.runners import BenchSettings

SCHEMA = "eesd-bench/2"


class Session:
    def __init__(
        self,
        model: Any,
        prompts: Sequence[tuple[Question, list[int]]],
        methods: Sequence[MethodSpec],
        settings: BenchSettings,
        notes: Sequence[str] = (),
        model_name: str | None = None,
        assistant: Any = None,
        assistant_name: str | None = None,
    ) -> None:
        """``assistant`` is ``hf_assisted``'s draft model, loaded from ``settings.assistant`` if absent."""
        self.model, self.prompts, self.methods, self.settings = model, list(prompts), list(methods), settings
        self.notes = list(notes)
        self.model_name = model_name or str(getattr(model, "name_or_path", "") or type(model).__name__)
        self.assistant, self.assistant_name = assistant, assistant_name
        self.sections: list[list[str]] = []

    @property
    def timed(self) -> list[MethodSpec]:
        return [m for m in self.methods if m.kind != "oracle"]

    def run(
        self, baseline: str = "hf", runs: int = 1, group_by: str = "task", progress: bool = True
    ) -> dict[str, Any]:
        """Time every method on every prompt (see :mod:`eesd_bench.run`) and summarise."""
        from eesd_bench.env import environment
        from eesd_bench.run import run_benchmark
        from eesd_bench.runners import build_runner

        assistant = self._assistant()
        runners = {m.name: build_runner(m, self.model, self.settings, assistant) for m in self.timed}
        total = runs * len(self.prompts) * len(self.timed)
        with _progress(total, progress) as bar:
            samples = run_benchmark(
                self.model,
                self.prompts,
                self.methods,
                self.settings,
                baseline=baseline,
                runs=runs,
                progress=bar.update,
                runners=runners,
            )
        names = [m.name for m in self.timed]
        return {
            "schema": SCHEMA,
            "environment": environment(self.model, self.model_name),
            "settings": {
                **asdict(self.settings),
                "baseline": baseline,
                "runs": runs,
                "prompts": len(self.prompts),
            },
            "methods": [{"name": m.name, "kind": m.kind, "options": m.options} for m in self.methods],
            "notes": self.notes,
            "products": self._products(runners),
            "assistant": self._assistant_record(),
            "summary": summarize(samples, names, baseline, group_by),
            "mismatches": mismatches(samples),
            "ties": ties(samples),
            "memory": None,
            "modelled": None,
            "oracle": None,
            "samples": samples,
        }

    def _assistant(self) -> Any:
        """The draft model of the ``hf_assisted`` methods, loaded once; ``None`` if none is run."""
        from eesd_bench.runners import load_assistant

        wanted = any(m.kind == "hf_assisted" for m in self.timed)
        if wanted and self.assistant is None and self.settings.assistant:
            self.assistant = load_assistant(self.settings.assistant, self.model)
        return self.assistant if wanted else None

    def _assistant_record(self) -> dict[str, Any] | None:
        from eesd_bench.runners import assistant_record

        if self._assistant() is None:
            return None
        record = assistant_record(self.assistant, self.assistant_name)
        self.notes.append(
            f"hf_assisted drafts with {record['name']}: {record['parameters'] / 1e6:.1f} M parameters, "
            f"{record['parameter_bytes'] / 2**20:.1f} MiB in {record['dtype']}"
        )
        return record

    def _products(self, runners: dict[str, Any]) -> dict[str, str] | None:
        """How each eesd method's model adapter ran its short passes (chosen during the run)."""
        from eesd_bench.env import products_of
        from eesd_bench.runners import EesdRunner

        described = {
            name: products_of(runner.decoder.adapter)
            for name, runner in runners.items()
            if isinstance(runner, EesdRunner)
        }
        if not described:
            return None
        for plan in sorted(set(described.values())):
            users = ", ".join(name for name, text in described.items() if text == plan)
            self.notes.append(f"short-pass products of {users}: {plan}")
        return described

    def add_memory(self, result: dict[str, Any], model_path: str, dtype: str, threads: int | None) -> None:
        """Each method's peak memory on the longest prompt, each in a fresh process."""
        from eesd_bench.memory import measure

        longest = max((p for _, p in self.prompts), key=len)
        result["memory"] = {}
        for spec in self.timed:
            spec_text = _spec_text(spec)
            result["memory"][spec.name] = measure(
                model_path, spec_text, longest, self.settings, dtype, threads
            )
            if "error" in result["memory"][spec.name]:
                self.notes.append(
                    f"memory probe of {spec.name} failed: {result['memory'][spec.name]['error']}"
                )

    def add_modelled(self, result: dict[str, Any]) -> None:
        """Modelled speedup by alpha and k from the early-exit drafter's measured costs."""
        from eesd_bench.modelled import markdown_lines, modelled_report
        from eesd_bench.offline import measure_round_costs
        from eesd_bench.runners import early_exit_decoder

        costs = measure_round_costs(early_exit_decoder(self.model, self.settings), self.prompts[0][1])
        measured = {}
        for spec in self.timed:
            row = result["summary"]["overall"].get(spec.name)
            if spec.kind == "eesd" and spec.decoder_kwargs()["drafter"] == "early_exit" and row:
                positions = row["acceptance_by_position"]
                measured[spec.name] = positions[0] if positions else None
        result["modelled"] = modelled_report(costs, measured)
        self.sections.append(markdown_lines(result["modelled"]))

    def add_oracle(self, result: dict[str, Any]) -> None:
        """The replayed per-round oracle and controllers (greedy runs only)."""
        from eesd_bench.offline import oracle_markdown, oracle_report
        from eesd_bench.runners import early_exit_decoder

        if not self.settings.greedy:
            self.notes.append("oracle skipped: traces record greedy drafts only")
            return
        decoder = early_exit_decoder(self.model, self.settings)
        result["oracle"] = oracle_report(
            decoder, self.prompts, self.methods, self.settings.max_new_tokens, result["summary"]["group_key"]
        )
        self.sections.append(oracle_markdown(result["oracle"]))

    def markdown(self, result: dict[str, Any]) -> str:
        return markdown(result, self.sections)

    def write(self, result: dict[str, Any], out: Path) -> list[Path]:
        """``results.json``, ``results.md`` and, with matplotlib, ``speedup.png`` in ``out``."""
        from eesd_bench.plot import plot_speedups

        out.mkdir(parents=True, exist_ok=True)
        files = [out / "results.json", out / "results.md"]
        why_not = plot_speedups(result["summary"], out / "speedup.png")
        if why_not:
            self.notes.append(why_not)
        else:
            files.append(out / "speedup.png")
        files[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
        files[1].write_text(self.markdown(result))
        return files

    def overview(self, result: dict[str, Any]) -> str:
        """The page up to its per-task tables, for the terminal."""
        page = self.markdown(result)
        return page.split("\n## Mean accepted tokens")[0].rstrip() + "\n"


def _spec_text(spec: MethodSpec) -> str:
    if not spec.options:
        return spec.kind
    return (
        spec.kind
        + ":"
        + ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in spec.options.items())
    )


class _progress:
    """A tqdm bar when wanted and available; otherwise a silent counter."""

    def __init__(self, total: int, show: bool) -> None:
        self.total, self.show, self.bar = total, show, None

    def __enter__(self) -> Any:
        if self.show:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc="generations", unit="gen")
        return self.bar if self.bar is not None else _Silent()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass
