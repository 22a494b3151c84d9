"""Peak memory of one generation per method, each measured in a fresh process.

Within one process the peaks of different methods cannot be told apart: the allocator keeps what
an earlier method freed, and the kernel's high-water mark (VmHWM) only grows. So each method runs
in its own child process: load the model, page every weight in (transformers maps safetensors
files lazily, and the first forward pass would otherwise count them) and make one 2-token warm-up
generation; then note the resident set (VmRSS), reset the high-water mark (writing 5 to
/proc/self/clear_refs, Linux 4.0+), generate once from the longest prompt, and read VmHWM again.
The difference is the memory that generation added on top of the loaded model: the KV cache,
activations, logits and each method's own buffers. Without /proc (not Linux) the probe reports
nothing rather than a wrong number.

Run as ``python -m eesd_bench.memory`` with a JSON request on standard input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak() -> bool:
    """Reset this process's VmHWM to its current VmRSS; False where the kernel does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_during(run: Any) -> dict[str, int | None]:
    """Call ``run()`` and return the resident set before it and the peak it reached above that."""
    before = _status_bytes("VmRSS")
    if before is None or not reset_peak():
        run()
        return {"rss_before_bytes": before, "peak_rss_delta_bytes": None}
    run()
    peak = _status_bytes("VmHWM")
    return {
        "rss_before_bytes": before,
        "peak_rss_delta_bytes": None if peak is None else max(peak - before, 0),
    }


def model_bytes(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def settle(model: Any, runner: Any, prompt: list[int], settings: Any) -> None:
    """Page every weight in and make one 2-token generation, so neither counts as the method's."""
    import torch

    with torch.inference_mode():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.sum()
    runner.generate(prompt[:8], replace(settings, max_new_tokens=2), settings.seed)


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """The child's side: load, generate once under :func:`peak_during`, report."""
    import torch
    from transformers import AutoModelForCausalLM

    from eesd_bench.env import cache_bytes
    from eesd_bench.methods import parse_method
    from eesd_bench.runners import BenchSettings, build_runner

    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    dtype = getattr(torch, request.get("dtype", "float32"))
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=dtype).eval()
    settings = BenchSettings(**request["settings"])
    runner = build_runner(parse_method(request["method"]), model, settings)
    settle(model, runner, request["prompt"], settings)
    outputs: list[Any] = []
    result = peak_during(lambda: outputs.append(runner.generate(request["prompt"], settings, settings.seed)))
    result.update(model_bytes=model_bytes(model), new_tokens=len(outputs[0].tokens))
    cache = getattr(getattr(runner, "generation", None), "cache", None)
    result["kv_cache_bytes"] = cache_bytes(cache) if cache is not None else None
    return result


def measure(
    model: str,
    method: str,
    prompt: list[int],
    settings: Any,
    dtype: str = "float32",
    threads: int | None = None,
    timeout: float = 1800,
) -> dict[str, Any]:
    """Run :func:`probe` in a child process for one method; errors come back as ``{"error": ...}``."""
    request = {
        "model": model,
        "method": method,
        "prompt": prompt,
        "settings": asdict(settings),
        "dtype": dtype,
        "threads": threads,
    }
    return run_child("eesd_bench.memory", request, timeout)


def run_child(module: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``python -m module`` with ``request`` as JSON on stdin and return the JSON of its last
    line; a failure or a timeout comes back as ``{"error": ...}``."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", module],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    print(json.dumps(probe(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()
