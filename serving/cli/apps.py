"""The typer applications every command module registers on.

Command modules import heavy libraries (torch, vllm, transformers) inside their
functions, never at module level, so `triage --help` stays fast.
"""
import signal
import sys

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help="Triage: semantic priority triage for LLM serving.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (they print the figures the README quotes).")
models_app = typer.Typer(no_args_is_help=True, help="Served-model files.")
train_app = typer.Typer(no_args_is_help=True, help="Train the predictors.")
evaluate_app = typer.Typer(no_args_is_help=True, help="Evaluate the predictors.")
profile_app = typer.Typer(no_args_is_help=True, help="Latency profiles (fit, show).", invoke_without_command=True)
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
db_app = typer.Typer(no_args_is_help=True, help="Audit database.")


@bench_app.callback()
def _bench_stops_what_it_started() -> None:
    """A benchmark killed with SIGTERM unwinds like one stopped with Ctrl-C: the servers it
    started (vLLM engines included) are stopped by their context managers, not orphaned."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


app.add_typer(bench_app, name="bench")
app.add_typer(models_app, name="models")
app.add_typer(train_app, name="train")
app.add_typer(evaluate_app, name="evaluate")
app.add_typer(profile_app, name="profile")
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")
