"""`triage steps`: reading a step log written in the format of serving/vllm_scheduler.py
(`_step_record`), here written by the test: a busy spell whose phases, step cost,
preemptions and answer lengths are known."""
from __future__ import annotations

import json

from typer.testing import CliRunner

import serving.cli  # noqa: F401  (registers the commands)
from serving.cli.apps import app
from serving.steplog_report import busy_window, engine_steps, follow, load, summarize

FIXED, PER_DECODE, PER_TOKEN = 40.0, 2.5, 1.7
runner = CliRunner()


def _step(i: int, t: float, ran: list, waiting: int, preempted=(), slow_ms: float = 0.0) -> dict:
    dec = sum(1 for x in ran if x[3] == "decode")
    tok = sum(x[2] for x in ran if x[3] != "decode")
    return {"step": i, "t": round(t, 4), "budget_s": 0.3, "predicted_s": 0.2, "sched_ms": 1.0, "stop": "time",
            "running": len(ran), "waiting": waiting, "ran": ran, "preempted": list(preempted),
            "exec_ms": FIXED + PER_DECODE * dec + PER_TOKEN * tok + slow_ms, "update_ms": 0.5}


def _log(tmp_path, slow_steps=()):
    """An idle call (2 steps), a 1.5 s gap, then a spell: 4 seats; 6 requests arrive at once
    (levels 1, 1, 2, 5, 5, 5); two prompts a step; a level-5 request is preempted once for
    the second level-1 call; the last admission at step 12; a 3-step tail."""
    rows, t = [], 100.0
    rows.append(_step(0, t, [["idle", 5, 20, "prefill"]], 0))
    rows.append(_step(1, t + 0.05, [["idle", 5, 1, "decode"]], 0))
    t += 1.6
    lengths = {"a": 3, "b": 3, "c": 4, "d": 6, "e": 2, "f": 5}   # answer tokens (the first with the prompt)
    level = {"a": 1, "b": 1, "c": 2, "d": 5, "e": 5, "f": 5}
    order = ["d", "a", "b", "c", "e", "f"]                         # admission order
    waiting, running, done, i = list(order), {}, {}, 2
    pre_for = None
    while waiting or running:
        ran = [[r, level[r], 1, "decode"] for r in running]
        for r in list(running):
            running[r] += 1
        started = []
        while waiting and len(running) + len(started) < 4 and len(started) < 2:
            started.append(waiting.pop(0))
        if i == 3 and "d" in running:   # the level-5 'd' gives its seat to 'b'
            pre_for = "d"
        for r in started:
            ran.append([r, level[r], 10, "prefill"])
        for r in started:
            running[r] = 1
        for r in [r for r, n in running.items() if n >= lengths[r]]:
            done[r] = running.pop(r)
        pre = []
        if pre_for:
            pre = [{"id": "d", "level": 5, "reason": "seat", "for": "b", "for_level": 1, "mode": "recompute"}]
            pre_for = None
        rows.append(_step(i, t, ran, len(waiting), pre, slow_ms=500.0 if i in slow_steps else 0.0))
        t += rows[-1]["exec_ms"] / 1000
        i += 1
    f = tmp_path / "steps.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 99, "t": 1', encoding="utf-8")  # a partial last line
    return f, rows


def test_the_busy_spell_starts_with_the_first_arrivals_after_the_idle_call_and_its_phases_are_counted(tmp_path):
    f, rows = _log(tmp_path)
    got = load(f)
    assert len(got) == len(rows)                        # the partial line is skipped
    a, b = busy_window(got)
    assert (a, b) == (2, len(rows) - 1)                 # the idle call before the 1.6 s gap is not in it
    rep = summarize(got)["busy"]
    last_wait = max(i for i, r in enumerate(rows[2:]) if r["waiting"] > 0)
    assert rep["steps"] == len(rows) - 2
    assert rep["steps_to_last_admission"] == last_wait
    assert rep["tail"]["steps"] == len(rows) - 3 - last_wait
    assert rep["seats_seen"] == 4
    assert rep["decodes"] == sum(1 for r in rows[2:] for x in r["ran"] if x[3] == "decode")
    assert rep["prompt_tokens"] == 60                   # six prompts of 10 tokens


def test_two_policies_replaying_the_same_calls_are_read_from_the_same_first_call():
    """One engine takes the first arrivals in a few growing steps that leave nobody waiting
    (as vLLM's queue does), another queues from its second step: both spells start at the
    first arrival after the engine stood empty, not at the step before each one's first
    wait, so their seconds and prompt tokens compare (the large policy's were a second short)."""
    idle = [_step(0, 50.0, [["idle", 5, 20, "prefill"]], 0), _step(1, 50.05, [], 0)]
    ramp = [_step(2, 50.1, [["a", 5, 30, "prefill"]], 0),
            _step(3, 50.2, [["a", 5, 1, "decode"], ["b", 5, 300, "prefill"], ["c", 1, 300, "prefill"]], 0),
            _step(4, 50.8, [["a", 5, 1, "decode"], ["b", 5, 1, "decode"], ["c", 1, 1, "decode"],
                            ["d", 5, 400, "prefill"]], 3),
            _step(5, 51.6, [["d", 5, 1, "decode"], ["e", 5, 40, "prefill"]], 0)]
    quick = [_step(2, 50.1, [["a", 5, 30, "prefill"]], 2)] + ramp[1:]
    large, small = summarize(idle + ramp)["busy"], summarize(idle + quick)["busy"]
    assert busy_window(idle + ramp) == busy_window(idle + quick) == (2, 5)   # not (3, 5) for the first
    assert large["prompt_tokens"] == small["prompt_tokens"] == 30 + 300 + 300 + 400 + 40
    assert large["first_step"] == small["first_step"] == 2


def test_the_step_cost_fit_recovers_the_model_and_drops_steps_slowed_by_other_work(tmp_path):
    _, rows = _log(tmp_path)
    # more steps of varied shape in the same spell (its tail), so the fit has something to separate
    t0 = rows[-1]["t"]
    extra = [_step(100 + k, t0 + 0.1 * (k + 1), [["x", 3, 1, "decode"]] * (k % 5 + 1) + [["y", 3, 7 * (k % 3), "prefill"]], 0)
             for k in range(20)]
    f = tmp_path / "more.jsonl"
    slowed = dict(extra[4], exec_ms=extra[4]["exec_ms"] + 400)   # the classifier took a core
    body = rows + extra[:4] + [slowed] + extra[5:]
    f.write_text("".join(json.dumps(r) + "\n" for r in body), encoding="utf-8")
    cost = summarize(load(f))["step_cost"]
    assert cost["dropped"] >= 1
    assert abs(cost["fixed_ms"] - FIXED) < 1e-6 and abs(cost["per_decode_ms"] - PER_DECODE) < 1e-3
    assert abs(cost["per_prompt_token_ms"] - PER_TOKEN) < 1e-3 and cost["residual_sd_ms"] < 1e-6


def _stalled_log(tmp_path, cpu_share_of_stalls: float):
    """The fit's spell plus varied steps in its tail, each with the model's CPU time (a
    one-thread engine: CPU = wall), and two steps that ran 4 s and 1.5 s over their cost
    with `cpu_share_of_stalls` of a core; one 300-ms hiccup that is no stall."""
    _, rows = _log(tmp_path)
    t0 = rows[-1]["t"]
    extra = [_step(100 + k, t0 + 0.1 * (k + 1), [["x", 3, 1, "decode"]] * (k % 5 + 1) + [["y", 3, 7 * (k % 3), "prefill"]], 0)
             for k in range(24)]
    body = [dict(r, exec_cpu_ms=round(r["exec_ms"]), exec_sys_ms=1) for r in rows + extra]
    for i, over in ((-20, 4000.0), (-10, 1500.0)):
        r = body[i]
        body[i] = dict(r, exec_ms=r["exec_ms"] + over, exec_cpu_ms=round(cpu_share_of_stalls * (r["exec_ms"] + over)))
    body[-5] = dict(body[-5], exec_ms=body[-5]["exec_ms"] + 300.0, exec_cpu_ms=round(body[-5]["exec_ms"] + 300.0))
    f = tmp_path / f"stalls-{cpu_share_of_stalls}.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in body), encoding="utf-8")
    return f, body


def test_a_step_far_past_its_cost_is_a_stall_and_its_cpu_says_whether_the_engine_waited_for_a_core(tmp_path):
    """An instance's steps all froze for seconds in a cluster burst (every stream on it,
    an ESI-1 answer's too): the report lists such steps, worst first, with the seconds they
    lost, and reads the model's CPU time beside the wall time: a step that got a tenth of a
    core waited for one (other work on its cores, or the VM's host); one that used a whole
    core computed (a compilation, page faults). A 300-ms hiccup is no stall."""
    f, body = _stalled_log(tmp_path, 0.1)
    st = summarize(load(f))["busy"]["stalls"]
    assert st["n"] == 2 and abs(st["lost_s"] - 5.5) < 0.01
    assert [x["step"] for x in st["worst"]] == [body[-20]["step"], body[-10]["step"]]
    assert all(x["verdict"] == "starved" and abs(x["cpu_share"] - 0.1) < 0.01 for x in st["worst"])
    assert abs(st["usual_cpu_share"] - 1.0) < 0.01
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "2 steps ran 3x the fitted cost" in r.stdout and "starved" in r.stdout
    st = summarize(load(_stalled_log(tmp_path, 1.0)[0]))["busy"]["stalls"]
    assert st["n"] == 2 and all(x["verdict"] == "computing" for x in st["worst"])


def test_steps_slowed_by_other_work_on_the_engines_cores_are_counted_with_the_seconds_they_lost(tmp_path):
    """A burst's first steps ran twice their cost on a 2-core VM while the front end's
    classifier read the arrivals on the engine's cores: an SRE reads how many steps ran on
    shared cores, when, and what they cost. A step as slow but on its usual share of the
    CPU (the engine computing longer) is not one of them, nor is a short step (its CPU is
    counted in 10-ms ticks)."""
    _, rows = _log(tmp_path)
    t0 = rows[-1]["t"]
    work = [["x", 3, 1, "decode"]] * 6 + [["y", 3, 60, "prefill"]]            # 157 ms by the fit
    body = rows + [_step(100 + k, t0 + 0.2 * (k + 1), work[: 1 + k % 7], 0) for k in range(30)]
    body = [dict(r, exec_cpu_ms=round(2 * r["exec_ms"])) for r in body]      # two busy threads
    for k, (share, x) in {3: (1.1, 2.0), 10: (1.2, 2.2), 17: (2.0, 2.0)}.items():   # 17: slow, but its usual CPU
        r = body[len(rows) + k]
        slow = r["exec_ms"] * x
        body[len(rows) + k] = dict(r, exec_ms=slow, exec_cpu_ms=round(share * slow))
    f = tmp_path / "shared.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in body), encoding="utf-8")
    sh = summarize(load(f))["busy"]["shared_cores"]
    assert sh["n"] == 2 and 1.85 < sh["usual_cpu_share"] <= 2.0   # the slow steps count in it too
    lost = sum(body[len(rows) + k]["exec_ms"] * (1 - 1 / x) for k, x in ((3, 2.0), (10, 2.2)))
    assert abs(sh["lost_s"] - lost / 1000) < 0.005
    assert sh["at_s"] == sorted(sh["at_s"]) and len(sh["at_s"]) == 2
    assert abs(sh["cpu_share_min"] - 1.1) < 0.01 and abs(sh["cpu_share_max"] - 1.2) < 0.01
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "cores shared: 2 steps" in " ".join(r.stdout.split())
    plain = [{k: v for k, v in r.items() if k != "exec_cpu_ms"} for r in body]
    f.write_text("".join(json.dumps(r) + "\n" for r in plain), encoding="utf-8")
    assert summarize(load(f))["busy"]["shared_cores"] is None
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "cores shared" not in r.stdout


def test_a_log_without_cpu_times_still_lists_its_stalls_without_a_verdict(tmp_path):
    f, body = _stalled_log(tmp_path, 0.1)
    old = [{k: v for k, v in r.items() if k not in ("exec_cpu_ms", "exec_sys_ms")} for r in body]
    f.write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    st = summarize(load(f))["busy"]["stalls"]
    assert st["n"] == 2 and st["usual_cpu_share"] is None
    assert all(x["verdict"] is None and x["cpu_share"] is None for x in st["worst"])
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "stalls" in r.stdout and "starved" not in r.stdout


def test_preemptions_and_each_levels_answers_are_reported(tmp_path):
    f, _ = _log(tmp_path)
    rep = summarize(load(f))
    pre = rep["preemptions"]
    assert {k: pre[k] for k in ("n", "by_reason", "by_mode")} == {"n": 1, "by_reason": {"seat": 1}, "by_mode": {"recompute": 1}}
    # the level-5 victim ran again one step later: out of its seat for that step's length
    rows = load(f)
    at = next(i for i, r in enumerate(rows) if r["preempted"])
    assert pre["out_of_seat"] == {"5": {"n": 1, "p50_s": round(rows[at + 1]["t"] - rows[at]["t"], 3),
                                        "max_s": round(rows[at + 1]["t"] - rows[at]["t"], 3), "not_resumed": 0}}
    lv = rep["levels"]
    assert lv["1"]["requests"] == 2 and lv["2"]["requests"] == 1 and lv["5"]["requests"] == 3
    assert lv["1"]["mean_tokens"] == 3.0 and lv["5"]["at_longest"] == 1 and lv["5"]["mean_prompt_tokens"] == 10.0


def test_the_command_prints_json_draws_a_png_and_refuses_what_is_not_a_step_log(tmp_path):
    f, _ = _log(tmp_path)
    png = tmp_path / "plots" / "steps.png"   # a folder not made yet: the plot makes it
    r = runner.invoke(app, ["steps", str(f), "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["busy"]["seats_seen"] == 4 and rep["preemptions"]["n"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "tail" in r.stdout and "preemptions: 1" in r.stdout
    assert "level 5: 1 preempted, out of its seat p50" in r.stdout
    r = runner.invoke(app, ["steps", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "no step log" in r.output
    other = tmp_path / "audit.jsonl"
    other.write_text('{"id": 1, "level": 2}\n', encoding="utf-8")
    r = runner.invoke(app, ["steps", str(other)])
    assert r.exit_code == 2 and "no step record" in r.output
    r = runner.invoke(app, ["steps", str(f), "--idle-gap", "0"])
    assert r.exit_code == 2 and "--idle-gap" in r.output


def test_following_one_call_shows_its_prompt_its_first_token_and_what_it_displaced(tmp_path):
    f, rows = _log(tmp_path)
    b = follow(load(f), "b")
    assert b["level"] == 1 and b["first_step"] == 3 and b["decodes"] == 2
    assert b["prompt_steps"] == [{"step": 3, "tokens": 10, "beside": 3}]
    step3 = next(r for r in rows if r["step"] == 3)
    assert b["first_token"] == {"step": 3, "s_after_first_step": round(step3["exec_ms"] / 1000, 3)}
    assert b["displaced"] == [{"step": 3, "id": "d", "level": 5, "reason": "seat", "mode": "recompute"}]
    assert follow(load(f), "d")["preempted"] == [{"step": 3, "reason": "seat", "for": "b", "for_level": 1, "mode": "recompute"}]
    r = runner.invoke(app, ["steps", str(f), "--request", "b"])
    assert r.exit_code == 0 and "displaced d (level 5) at step 3" in r.stdout
    r = runner.invoke(app, ["steps", str(f), "--request", "b", "--json"])
    assert json.loads(r.stdout.strip().splitlines()[-1])["displaced"][0]["id"] == "d"
    r = runner.invoke(app, ["steps", str(f), "--request", "nobody"])
    assert r.exit_code == 2 and "never ran 'nobody'" in r.output


def test_a_long_step_is_not_an_idle_gap():
    """A step's `t` is when it was scheduled: the 1.5-s prefill step that admitted the first
    arrivals is followed 1.52 s later by the next, with no idle time between them."""
    idle = _step(0, 0.0, [["idle", 5, 1, "decode"]], 0)
    big = dict(_step(1, 3.0, [[r, 2, 40, "prefill"] for r in "abcd"], 0), exec_ms=1500.0)
    rows = [idle, big, _step(2, 4.52, [[r, 2, 1, "decode"] for r in "abcd"], 2),
            _step(3, 4.7, [[r, 2, 1, "decode"] for r in "abcd"], 0)]
    assert busy_window(rows) == (1, 3)
    assert summarize(rows)["busy"]["prompt_tokens"] == 160


def test_seats_left_free_while_calls_waited_are_counted_in_seat_seconds():
    """4 seats. Step 0 runs one prompt with three calls waiting (3 seats free, 3 waiting:
    3 for 0.5 s); step 1 runs two with three waiting (2 free for 0.25 s); step 2 runs all
    four seats with one waiting (none free); step 3 runs three with nobody waiting (free
    seats but no queue: not counted)."""
    p = [["p", 1, 60, "prefill"]]
    d = [["d", 5, 1, "decode"]]
    rows = [_step(0, 10.0, p, 3), _step(1, 10.5, p + d, 3), _step(2, 10.75, p + d * 3, 1), _step(3, 11.0, d * 3, 0)]
    f = summarize(rows)["busy"]["seats_free_while_waiting"]
    assert f == {"steps": 2, "seat_steps": 5, "seat_s": 2.0}   # 3 x 0.5 + 2 x 0.25


def test_a_log_of_several_engines_and_bursts_is_read_spell_by_spell(tmp_path):
    """`bench serve` taking turns appends each engine's steps to one file: the second engine's
    steps follow the first's within a second (only their step numbers start again), and a
    later burst on the second engine comes after an idle gap. Three spells, each read on its
    own; merged, the first would have counted all three bursts' prompts."""
    _, rows = _log(tmp_path)
    spell = rows[2:]
    second = [dict(r, step=r["step"] - 2, t=r["t"] - spell[0]["t"] + spell[-1]["t"] + 0.2) for r in spell]
    third = [dict(r, step=r["step"] + 100, t=r["t"] + 30.0) for r in second]
    f = tmp_path / "turns.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows + second + third), encoding="utf-8")
    got = load(f)
    rep = summarize(got)
    assert len(rep["spells"]) == 3
    assert [s["prompt_tokens"] for s in rep["spells"]] == [60, 60, 60]
    assert rep["busy"] == rep["spells"][0] and rep["busy"]["steps"] == len(spell)
    assert rep["busy"]["tail"]["steps"] == summarize(rows)["busy"]["tail"]["steps"]
    assert summarize(got, spell=3)["busy"]["first_step"] == spell[0]["step"] + 98
    assert sum(r["requests"] for r in summarize(got, spell=2)["levels"].values()) == 6
    r = runner.invoke(app, ["steps", str(f)])
    assert r.exit_code == 0 and "3 busy spells in the log" in r.stdout
    r = runner.invoke(app, ["steps", str(f), "--spell", "2", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout.strip().splitlines()[-1])["spell"] == 2
    r = runner.invoke(app, ["steps", str(f), "--spell", "4"])
    assert r.exit_code == 2 and "holds 3 busy spells, not a spell 4" in r.output


def test_each_step_becomes_the_simulators_measured_work_with_the_kv_each_call_had():
    """`engine_steps` (what `simulate --truth steplog:FILE` reads): per request the tokens it
    computed in the step and the tokens already in its KV, counted through the log; a call
    preempted to be recomputed starts again from an empty KV; untimed steps are left out."""
    a = [["a", 5, 30, "prefill"]]
    rows = [_step(1, 0.0, a, 0), _step(2, 0.1, [["a", 5, 1, "decode"], ["b", 1, 20, "prefill"]], 0,
                                          preempted=[{"id": "a", "mode": "recompute"}]),
            dict(_step(3, 0.2, [["b", 1, 1, "decode"]], 1), exec_ms=None), _step(4, 0.3, [["a", 5, 31, "prefill"]], 0)]
    got = engine_steps(rows)
    assert [w for w, _ in got] == [[(30, 0)], [(1, 30), (20, 0)], [(31, 0)]]
    assert got[0][1] == rows[0]["exec_ms"] / 1000
