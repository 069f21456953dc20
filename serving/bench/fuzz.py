"""Fuzz a running server's whole OpenAPI surface with schemathesis, then send the
hand-made hostile requests (serving/bench/hostile.py).

Every operation in /openapi.json gets cases in turn, positive (valid by the schema) and
negative (invalid by the schema), until `cases` calls have been made; each response is
checked by schemathesis:

    server error      : not_a_server_error (any 5xx)
    schema violation  : the response's status code, content type or body does not match
                        what the schema documents for it (status_code_conformance,
                        content_type_conformance, response_schema_conformance), or
                        invalid input was accepted (negative_data_rejection)

Random generation rarely makes a valid streaming call (one in ~2,000 cases), so each
streaming operation also gets one fixed valid `"stream": true` case (`STREAM_CASES`), whose
every server-sent event is checked against the schema.

    report = fuzz("http://127.0.0.1:8000", admin_key, cases=2000)
    report -> {"cases", "server_errors", "schema_violations", "by_operation", "findings"}
"""
from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from typing import Callable

SCHEMA_CHECKS = ("status_code_conformance", "content_type_conformance", "response_schema_conformance",
                 "negative_data_rejection")
# one valid streaming call per streaming operation (checked beside the generated cases)
STREAM_CASES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "chest pain, HR 120"}],
                                         "stream": True, "max_tokens": 4},
                "/v1/completions": {"prompt": "chest pain, HR 120", "stream": True, "max_tokens": 4}}


def _checks():
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi import checks as oc

    return not_a_server_error, [getattr(oc, n) for n in SCHEMA_CHECKS]


def _kind(exc: BaseException) -> str:
    """'server_error' or 'schema_violation' for a schemathesis check failure."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "server_error" if ("server error" in text or "servererror" in text) else "schema_violation"


def fuzz(url: str, key: str, cases: int, *, seed: int = 0, timeout_s: float = 60.0,
         on_case: Callable[[int], None] | None = None, operations: list[str] | None = None,
         hostile: bool = True, body_limit: int = 1_000_000) -> dict:
    import hypothesis
    import hypothesis.errors
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    if operations:
        ops = [o for o in ops if o.label in operations]
    server_error, schema_checks = _checks()
    headers = {"Authorization": f"Bearer {key}"}
    session = requests.Session()
    made = 0
    counts: Counter = Counter()
    by_op: dict = defaultdict(lambda: {"cases": 0, "server_errors": 0, "schema_violations": 0, "seconds": 0.0,
                                       "status": Counter()})
    findings: list[dict] = []
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)

    def check(label: str, mode: str, case) -> None:
        """Call the server with `case` and count what schemathesis finds in the response."""
        st = by_op[label]
        st["cases"] += 1
        t_call = time.perf_counter()
        try:
            resp = case.call(base_url=url, session=session, headers=headers, timeout=timeout_s)
            st["seconds"] += time.perf_counter() - t_call
        except requests.RequestException as e:
            counts["server_errors"] += 1
            st["server_errors"] += 1
            findings.append({"operation": label, "mode": mode, "kind": "server_error",
                             "detail": f"no response: {type(e).__name__}"})
            return
        st["status"][resp.status_code] += 1
        # a 5xx is a server error (its undocumented status is not counted again)
        groups = [("server_error", [server_error])] if resp.status_code >= 500 else \
            [("server_error", [server_error]), ("schema_violation", schema_checks)]
        for kind, checks in groups:
            try:
                case.validate_response(resp, checks=checks, headers=headers)
            except (Exception, BaseExceptionGroup) as e:   # schemathesis: a FailureGroup of check failures
                counts[kind + "s"] += 1
                st[kind + "s"] += 1
                if len(findings) < 50:
                    findings.append({"operation": label, "mode": mode, "kind": kind,
                                     "status": resp.status_code, "detail": str(e)[:600]})
        if on_case:
            on_case(made)
    budget = max(1, cases)
    rnd = 0
    stalled = 0
    while made < budget and stalled < 3:
        before = made
        per = max(1, math.ceil((budget - made) / (len(ops) * len(modes))))
        for op in ops:
            for mode in modes:
                if made >= budget:
                    break
                left = budget - made
                try:
                    strategy = op.as_strategy(generation_mode=mode)
                except Exception as e:   # an operation with nothing to negate, say
                    findings.append({"operation": op.label, "mode": mode.value, "note": f"no strategy: {e}"})
                    continue

                @settings(max_examples=min(per, left), deadline=None, database=None, derandomize=False,
                          phases=[Phase.generate], suppress_health_check=list(HealthCheck))
                @hypothesis.seed(seed * 1000 + rnd)
                @given(case=strategy)
                def one(case) -> None:
                    nonlocal made
                    if made >= budget:
                        return
                    made += 1
                    check(op.label, mode.value, case)

                try:
                    one()
                except hypothesis.errors.Unsatisfiable:   # nothing to generate (negative mode, no parameters)
                    pass
        rnd += 1
        stalled = stalled + 1 if made == before else 0
    for path, body in STREAM_CASES.items():
        op = schema[path]["POST"]
        if not operations or op.label in operations:
            made += 1
            check(op.label, "stream", op.Case(body=body, media_type="application/json"))
    out = {"cases": made, "server_errors": counts["server_errors"], "schema_violations": counts["schema_violations"]}
    hostile_out = []
    if hostile:
        import httpx

        from serving.bench.hostile import hostile_cases, send

        with httpx.Client(base_url=url, timeout=timeout_s) as c:
            for h in hostile_cases(body_limit):
                r = send(c, h, key)
                hostile_out.append(r)
                out["cases"] += 1
                out["server_errors"] += int(r["server_error"])
                out["schema_violations"] += int(r["schema_violation"])
                if on_case:
                    on_case(out["cases"])
    out["schemathesis_cases"] = made
    out["hostile"] = hostile_out
    out["by_operation"] = {k: {**v, "seconds": round(v["seconds"], 2), "status": dict(v["status"])}
                           for k, v in by_op.items()}
    out["findings"] = findings
    return out


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")
