"""How passes run (hook ``eesd_passes``): on key/value buffers allocated once, and captured.

``compile="static"`` runs every pass of a call on buffers allocated once at the capacity it needs,
attending over all of them under a mask that eesd builds from slots and positions; ``"graphs"``
also captures each shape of pass into a CUDA graph the second time it runs and replays it after
(CUDA only). ``"auto"`` keeps eager passes on every device: eagerly, static buffers cost a little
more attention than a cache that grows, and captured passes have yet to be measured against eager
ones. Importing this package loads no torch.
"""

from __future__ import annotations

from typing import Any

from eesd_core.errors import ConfigError
from eesd_core.hookspecs import hookimpl

#: The choices this plug-in takes; any other is left to other plug-ins.
CHOICES = ("static", "graphs")


@hookimpl
def eesd_passes(adapter: Any, choice: str) -> Any:
    """:class:`~eesd_graphs.static.StaticPasses` for ``"static"`` and ``"graphs"``; ``None``
    otherwise (``"auto"`` included: see the module's note)."""
    if choice not in CHOICES:
        return None
    if choice == "graphs" and adapter.device.type != "cuda":
        raise ConfigError(
            f"compile='graphs' captures CUDA graphs, and this model is on {adapter.device}: use "
            "compile='static' (the same buffers, run eagerly) or 'off'."
        )
    from eesd_graphs.static import StaticPasses

    return StaticPasses(adapter, graphs=choice == "graphs")
