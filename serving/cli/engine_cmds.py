"""Engine commands: models prepare (more registered by the vLLM work)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import models_app


@models_app.command("prepare")
def models_prepare(
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: state dir)")] = None,
    force: bool = False,
) -> None:
    """Convert the embedded SmolLM2 GGUF into a Hugging Face directory vLLM can serve."""
    from serving.model_prep import prepare_default_model

    path = prepare_default_model(out, force=force)
    typer.echo(str(path))
