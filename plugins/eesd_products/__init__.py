"""Faster products for the linear layers of short passes on CPUs (hook ``eesd_linear_products``).

Decoding multiplies a few rows at a time by each weight matrix, and several CPU BLAS back-ends do
that row by row; :mod:`eesd_products.products` times products that read the weights once per pass
on the model's own matrices and keeps each one only where it wins clearly. Importing this package
loads no torch: the implementation loads when an adapter asks for its products.

``EESD_PRODUCTS=standard`` keeps ``F.linear`` for every model whose adapter says ``"auto"`` (the
default), as ``adapter_options={"products": "standard"}`` does for one.
"""

from __future__ import annotations

import os
from typing import Any

from eesd_core.errors import ConfigError
from eesd_core.hookspecs import hookimpl

#: The choices this plug-in takes; any other is left to other plug-ins.
CHOICES = ("auto", "transposed", "onednn")


@hookimpl
def eesd_linear_products(adapter: Any, choice: str) -> Any:
    """:class:`~eesd_products.products.CpuProducts` for a decoder adapter on a CPU, or ``None``
    where this plug-in does not apply (another choice, another layout, ``auto`` off the CPU or in
    float64, ``auto`` under ``EESD_PRODUCTS=standard``)."""
    if choice not in CHOICES or not _decoder_layout(adapter):
        return None
    if choice == "auto" and _switched_off():
        return None
    from eesd_products.products import products_for

    return products_for(adapter, choice)


def _decoder_layout(adapter: Any) -> bool:
    """Whether the adapter's model is laid out as ``model.model.layers`` and ``model.lm_head``."""
    model = getattr(adapter, "model", None)
    return hasattr(getattr(model, "model", None), "layers") and hasattr(model, "lm_head")


def _switched_off() -> bool:
    value = os.environ.get("EESD_PRODUCTS", "").strip().lower()
    if value not in ("", "auto", "standard"):
        raise ConfigError(
            f"EESD_PRODUCTS={value!r} is not understood: set EESD_PRODUCTS=standard to keep F.linear "
            "for every model, or leave it unset to let eesd time faster products on CPUs."
        )
    return value == "standard"
