"""A rich progress bar on stderr that long commands share."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields `advance_to(n)`; draws on stderr only when it is a terminal or long enough."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=not console.is_terminal) as prog:
        task = prog.add_task(label, total=total)
        yield lambda n: prog.update(task, completed=n)
