"""Writing a finished matplotlib figure to a file (every plot the CLI draws)."""
from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Lay `fig` out, write it to `path` (its folder made if missing) and free it."""
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
