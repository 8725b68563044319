"""What every scenario's figure is drawn with: the file-only backend, the colours, markers and a new figure.

Raw is grey and PeerCache blue in every figure (and the report's tables say which is which).
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

#: Raw is grey and PeerCache blue in every figure (and the report's tables say which is which).
RAW_COLOR, PEERCACHE_COLOR, OVER_COLOR = "#7f7f7f", "#1f77b4", "#d62728"
MARKERS = ("o", "s", "^", "D", "v", "P")


def new_fig(ncols: int = 1, nrows: int = 1, w: float = 7.0, h: float = 4.2):
    """A figure of ``nrows`` x ``ncols`` axes (always a 2-D array of them) ``w`` x ``h`` inches."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), squeeze=False)
    return fig, axes


def series_colors(n: int, raw: bool) -> list:
    """n colours for the lines of one figure: shades of grey for raw tools, of blue for PeerCache."""
    cmap = plt.get_cmap("Greys" if raw else "Blues")
    return [cmap(0.45 + 0.5 * i / max(1, n - 1)) for i in range(n)] if n > 1 else [RAW_COLOR if raw
                                                                                  else PEERCACHE_COLOR]


def raw_legend(ax) -> None:
    """The legend saying which colour is raw and which PeerCache (every figure uses the same two)."""
    ax.legend(handles=[Patch(color=RAW_COLOR, label="raw tool"), Patch(color=PEERCACHE_COLOR, label="PeerCache")],
              fontsize=7, loc="upper right")
