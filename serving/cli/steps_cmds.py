"""`triage steps FILE`: read a step log (setting `step_log`) — where a busy spell's engine
steps and time went (serving/steplog_report.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import app


@app.command("steps")
def steps(
    path: Annotated[Path, typer.Argument(help="a step log: TRIAGE_STEP_LOG=FILE triage serve writes one")],
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="also draw the busy spell to this PNG")] = None,
    idle_gap: Annotated[float, typer.Option(help="seconds without a step that end a busy spell")] = 1.0,
    spell: Annotated[int, typer.Option(help="which busy spell to read in full, from 1 (a log can hold several: "
                                            "bursts apart in time, or engines run one after another)")] = 1,
    request: Annotated[Optional[str], typer.Option(help="follow one call instead: its client request id "
                                                        "(X-Request-Id / the audit row's id)")] = None,
) -> None:
    """Where a busy spell's engine steps went: seats filling, steps until the queue emptied,
    the tail, a step's cost (fixed + per decode + per prompt token, fitted), the steps that
    stalled far past it (and whether the engine computed or waited for a core), preemptions
    by reason, and each level's answer lengths; a line for each spell when the log holds several.
    Client ids and levels only: a step log holds no text."""
    import json

    from serving.steplog_report import StepLogError, follow, load, plot as draw, summarize

    if idle_gap <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--idle-gap")
    if spell < 1:
        raise typer.BadParameter("must be 1 or more (the first busy spell is 1)", param_hint="--spell")
    try:
        rows = load(path)
        one = follow(rows, request) if request is not None else None
        rep = summarize(rows, idle_gap, spell) if one is None else None
    except StepLogError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if one is not None:
        typer.echo(json.dumps(one) if as_json else _one_call(one))
        return
    if plot is not None:
        draw(rows, plot, idle_gap, spell)
    if as_json:
        typer.echo(json.dumps(rep))
        return
    _print(rep, plot)


def _print(rep: dict, plot: Optional[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    b, c, p = rep["busy"], rep["step_cost"], rep["preemptions"]
    con = Console()
    if len(rep["spells"]) > 1:
        t = Table("spell", "steps", "s", "seats full after", "every seat", "tail", "model s",
                  "seat-s free while waiting", "stalls (s lost)", "cores shared (s lost)", title=f"{len(rep['spells'])} busy spells in the log")
        for k, x in enumerate(rep["spells"], 1):
            st, sh = x["stalls"], x["shared_cores"]
            t.add_row(str(k), f"{x['first_step']}-{x['last_step']} ({x['steps']})", f"{x['wall_s']:.2f}",
                      str(x["seats_full_after"]["steps"]), str(x["steps_every_seat"]), str(x["tail"]["steps"]),
                      f"{x['model_s']:.2f}", f"{x['seats_free_while_waiting']['seat_s']:.2f}",
                      f"{st['n']} ({st['lost_s']:.2f})" if st else "-", f"{sh['n']} ({sh['lost_s']:.2f})" if sh else "-")
        con.print(t)
        con.print(f"spell {rep['spell']} in full (--spell K for another):")
    con.print(f"[bold]busy spell[/bold]: steps {b['first_step']}-{b['last_step']} ({b['steps']} of {rep['steps']} "
              f"with work), {b['wall_s']:.2f} s; model {b['model_s']:.2f} s, scheduling {b['sched_s']:.2f} s, "
              f"update {b['update_s']:.2f} s")
    con.print(f"seats ({b['seats_seen']} at most) full after {b['seats_full_after']['steps']} steps "
              f"({b['seats_full_after']['s']:.2f} s); queue empty after {b['steps_to_last_admission']} steps; "
              f"{b['steps_every_seat']} steps ran every seat; "
              f"tail {b['tail']['steps']} steps ({b['tail']['s']:.2f} s); {b['mean_running']} running a step on average; "
              f"{b['decodes']} decodes, {b['prompt_tokens']} prompt tokens")
    f = b["seats_free_while_waiting"]
    con.print(f"seats free while calls waited: {f['seat_steps']} seat-steps in {f['steps']} steps "
              f"({f['seat_s']:.2f} seat-seconds)")
    if c:
        con.print(f"a step's model time ≈ {c['fixed_ms']} ms + {c['per_decode_ms']} ms a decode + "
                  f"{c['per_prompt_token_ms']} ms a prompt token (residual s.d. {c['residual_sd_ms']} ms, {c['steps']} steps)")
    _print_stalls(con, b["stalls"])
    _print_shared(con, b["shared_cores"])
    con.print(f"preemptions: {p['n']}" + (f" (reasons {p['by_reason']}, modes {p['by_mode']})" if p["n"] else ""))
    for lv, o in p["out_of_seat"].items():
        back = f"out of its seat p50 {o['p50_s']} s, max {o['max_s']} s" if o["p50_s"] is not None else "none ran again"
        con.print(f"  level {lv}: {o['n']} preempted, {back}" + (f", {o['not_resumed']} never ran again" if o["not_resumed"] and o["p50_s"] is not None else ""))
    t = Table("level", "requests", "answer tokens, mean", "at the longest", "prompt tokens, mean")
    for lvl, v in rep["levels"].items():
        t.add_row(lvl, str(v["requests"]), str(v["mean_tokens"]), str(v["at_longest"]), str(v["mean_prompt_tokens"]))
    con.print(t)
    if plot is not None:
        con.print(f"plot: {plot}")


def _print_stalls(con, st: dict | None) -> None:
    from serving.steplog_report import STALL_X

    if not st or not st["n"]:
        return
    usual, n = st["usual_cpu_share"], st["n"]
    con.print(f"[bold]stalls[/bold]: {n} step{'s' if n > 1 else ''} ran {STALL_X:g}x the fitted cost or more, {st['lost_s']:.2f} s lost"
              + (f" (the model's CPU in an ordinary step: {usual:.0%} of its time)" if usual else ""))
    for x in st["worst"]:
        cpu = "" if x["cpu_share"] is None else f", model CPU {x['cpu_share']:.0%} of it"
        why = {"starved": ": starved (it waited for a core: other work on its cores, or the VM's host)",
               "computing": ": computing (the engine itself worked longer: a compilation, page faults)"}.get(x["verdict"], "")
        con.print(f"  step {x['step']} at {x['at_s']:.2f} s: {x['exec_ms']:.0f} ms against {x['expected_ms']:.0f} expected{cpu}{why}")


def _print_shared(con, sh: dict | None) -> None:
    from serving.steplog_report import SHARED_X

    if not sh or not sh["n"]:
        return
    n, at = sh["n"], sh["at_s"]
    when = ", ".join(f"{x:.2f}" for x in at) if n <= 8 else f"{at[0]:.2f}-{at[-1]:.2f}"
    con.print(f"[bold]cores shared[/bold]: {n} step{'s' if n > 1 else ''} (at {when} s) "
              f"ran {SHARED_X:g}x the fitted cost or more, {sh['lost_s']:.2f} s lost, with the model's CPU at "
              f"{sh['cpu_share_min']:.0%}-{sh['cpu_share_max']:.0%} of their time against {sh['usual_cpu_share']:.0%} in an "
              "ordinary step: other work held its cores (on cores it shares with the front end, the classifier "
              "reading an arrival spike; else another process or the VM's host)")


def _one_call(c: dict) -> str:
    ft = c["first_token"]
    lines = [f"{c['id']} (level {c['level']}): steps {c['first_step']}-{c['last_step']}, {c['decodes']} decodes",
             "prompt: " + ", ".join(f"step {p['step']} ({p['tokens']} tokens beside {p['beside']} others)"
                                   for p in c["prompt_steps"]),
             f"first token: end of step {ft['step']}, {ft['s_after_first_step']} s after its first step" if ft
             else "first token: before the log began"]
    lines += [f"preempted at step {p['step']} ({p['reason']}, {p['mode']}) for {p['for']} (level {p['for_level']})"
              for p in c["preempted"]]
    lines += [f"displaced {d['id']} (level {d['level']}) at step {d['step']} ({d['reason']}, {d['mode']})"
              for d in c["displaced"]]
    return "\n".join(lines)
