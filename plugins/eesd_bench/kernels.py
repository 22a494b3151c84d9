"""``--sdpa``: which of torch's attention kernels a benchmark lets ``scaled_dot_product_attention`` use.

On a GPU torch may pick cuDNN's attention, which builds a plan the first time it meets each (query
length, key length) shape. Decoding meets a new key length at every step, so a benchmark's first
calls pay for plans that its later calls find cached, and a decoder that learns its costs while
they are paid learns the wrong ones. ``--sdpa flash,efficient,math`` leaves cuDNN's kernel out, for
every method of the run alike. Without ``--sdpa`` torch chooses as it always does.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

KERNELS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def parse_kernels(text: str) -> list[str]:
    """``"flash,efficient"`` -> ``["flash", "efficient"]``; an argparse ``type``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(KERNELS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--sdpa takes a comma list of kernels among {', '.join(KERNELS)}, not {unknown or 'nothing'}"
        )
    return list(dict.fromkeys(names))


def add_sdpa_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sdpa",
        type=parse_kernels,
        default=None,
        metavar="KERNELS",
        help="comma list of the attention kernels torch may use (flash, efficient, cudnn, math; "
        "default: torch's own choice), e.g. flash,efficient,math to leave cuDNN's per-shape plans out",
    )


@contextlib.contextmanager
def attention_kernels(names: list[str] | None) -> Iterator[None]:
    """Run the block with only ``names``' kernels allowed (nothing changes when ``names`` is None)."""
    if not names:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, KERNELS[name]) for name in names]):
        yield
