"""`triage adapt`: fit a site adapter on the operators' relabel log (serving/adapt), list the
versions, promote, roll back. Works on the service's database directly (like `triage keys`);
a running service follows the promoted version within seconds (it polls the database).

The k-fold measurement on KTAS is `triage evaluate urgency --dataset ktas --adapt kfold=5`.
"""
from __future__ import annotations

import getpass
import json
from typing import Annotated, Optional

import typer

from serving.cli.apps import app
from serving.cli.service_cmds import DbOpt, _settings


def _registry(db: str | None):
    from predictors.model import META_FILE, default_model_dir
    from serving.adapt.registry import SiteRegistry, general_fingerprint
    from serving.db.session import make_engine, upgrade

    s = _settings(db_url=db)
    urgency = (s.predictors_dir / "urgency") if s.predictors_dir else default_model_dir("urgency")
    if not (urgency / META_FILE).exists():
        typer.echo(f"error: no trained urgency model at {urgency}: run `triage train all`", err=True)
        raise typer.Exit(2)
    url = s.resolved_db_url()
    upgrade(url)
    return SiteRegistry(make_engine(url), s.resolved_spool_path().parent / "site_models", general_fingerprint(urgency))


@app.command("adapt")
def adapt(
    db: DbOpt = None,
    promote: Annotated[bool, typer.Option("--promote", help="promote the new version if it passes the gate")] = False,
    min_per_level: Annotated[int, typer.Option(help="refuse unless every level 1-5 has this many relabels", min=2)] = 10,
    holdout: Annotated[float, typer.Option(help="newest share of the log held out for the gate", min=0.1, max=0.5)] = 0.25,
    list_: Annotated[bool, typer.Option("--list", help="list the versions and their figures; fit nothing")] = False,
    promote_version: Annotated[Optional[int], typer.Option("--promote-version", help="promote a stored version; fit nothing")] = None,
    rollback: Annotated[bool, typer.Option("--rollback", help="retire the live version (the previous one or the general model serves)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Fit a site adapter on the operators' relabels, gate it on the newest relabels, store it
    as a version (refused ones too), and optionally promote it."""
    from predictors.adapter import AdaptError
    from serving.adapt.registry import NotPromotable

    reg = _registry(db)
    actor = f"cli:{getpass.getuser()}"
    try:
        if list_:
            out = reg.listing()
        elif rollback:
            out = reg.rollback(actor)
        elif promote_version is not None:
            out = reg.promote(promote_version, actor)
        else:
            from serving.cli.progress import progress_bar

            with progress_bar("fit site adapter", 1) as advance:
                out = reg.adapt(actor, min_per_level=min_per_level, holdout=holdout,
                                progress=lambda _p, done, total: advance(done / max(total, 1)))
            if promote and out["passed"]:
                out["promoted"] = reg.promote(out["version"], actor)
    except (AdaptError, NotPromotable) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    except KeyError as e:
        typer.echo(f"error: no site model version {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(out))
        return
    if "models" in out:
        typer.echo(f"serving: {out['serving']}")
        for m in out["models"]:
            a = m["figures"].get("adapted", {})
            typer.echo(f"  v{m['version']:<3} {m['status']:<9} n_train {m['n_train']:<5} held-out acc "
                       f"{a.get('accuracy', float('nan')):.3f} under-triage 1-2 {a.get('under_triage_1_2') or 0:.3f}  {m['verdict']}")
        return
    typer.echo(json.dumps(out, indent=2))
