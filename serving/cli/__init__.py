"""`triage` console script. Each command module registers itself on the apps in `apps`."""
from serving.cli.apps import app
from serving.cli import bench_faults_cmds  # noqa: F401  (registration: triage bench faults)
from serving.cli import adapt_cmds  # noqa: F401  (registration: triage adapt)
from serving.cli import load_fuzz_cmds  # noqa: F401  (registration: triage bench load|fuzz)
from serving.cli import ui_cmds  # noqa: F401  (registration: triage bench ui)
from serving.cli import steps_cmds  # noqa: F401  (registration: triage steps)
from serving.cli import sim_cmds, predictor_cmds, engine_cmds, service_cmds, bench_cmds, error_rate_cmds, cluster_cmds  # noqa: F401  (registration)


def main() -> None:
    app()
