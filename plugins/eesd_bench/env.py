"""Where and with what a benchmark ran, stored beside its numbers so that runs can be compared."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def cache_bytes(cache: Any) -> int:
    """Bytes a KV cache's buffers hold."""
    return sum(t.numel() * t.element_size() for t in cache.keys + cache.values if t is not None)


def products_of(adapter: Any) -> str:
    """How a model adapter's linear layers multiply (a products plug-in's choice, or F.linear), and
    how it runs its passes where a plug-in runs them (with what capturing them cost so far)."""
    products = getattr(adapter, "products", None)
    text = "standard F.linear for every pass" if products is None else str(products.describe())
    passes = getattr(adapter, "passes", None)
    return text if passes is None else f"{text}; passes: {passes.describe()}"


def environment(model: Any, model_name: str) -> dict[str, Any]:
    import torch
    import transformers

    from eesd_core import __version__

    parameters = sum(p.numel() for p in model.parameters())
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model_name,
        "parameters": parameters,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": str(next(model.parameters()).device),
        "eesd": __version__,
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "command": " ".join(sys.argv),
    }
