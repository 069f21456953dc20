"""Latency over the shift: the per-level report of `/audit/latency`, in time buckets.

    GET /audit/latency/series?since=...&until=...&bucket_s=300[&format=csv]

Each bucket [start, end) holds exactly what `/audit/latency?since=start&until=end`
reports for it (the same function computes both), per effective level: TTFT/TPOT
percentiles, SLO attainment, and the shed, aborted and errored counts (never hidden).
"""
from __future__ import annotations

import bisect
import csv
import io
import math
import time
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from serving.api.audit_routes import latency_report, parse_time
from serving.api.errors import APIError
from serving.auth import AuditorKey
from serving.db.models import RequestRow

router = APIRouter(prefix="/audit", tags=["auditors"])

MAX_BUCKETS = 2000


@router.get("/latency/series", responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}},
                                                "description": "the series as JSON, or CSV with format=csv"}})
async def latency_series(request: Request, _: AuditorKey, since: str | None = None, until: str | None = None,
                         bucket_s: float = Query(300.0, gt=0), format: Literal["json", "csv"] = "json"):
    now = time.time()
    t1 = parse_time(until, "until") or now
    t0 = parse_time(since, "since")
    if t0 is None:
        t0 = t1 - 3600.0
    if t1 <= t0:
        raise APIError(400, "until must be after since", param="until")
    span = (t1 - t0) / bucket_s   # inf for a vanishing bucket_s: refused below, not an OverflowError
    n = math.ceil(span) if math.isfinite(span) else MAX_BUCKETS + 1
    if n > MAX_BUCKETS:
        raise APIError(400, f"{n} buckets of {bucket_s:g} s in that range; at most {MAX_BUCKETS} (widen bucket_s)",
                       param="bucket_s")
    app = request.app

    def load():
        app.state.writer.sync(5.0)
        q = select(RequestRow).where(RequestRow.arrival >= t0, RequestRow.arrival < t1)
        with Session(app.state.db) as s:
            return list(s.scalars(q))

    try:
        rows = await run_in_threadpool(load)
    except Exception as e:
        raise APIError(503, f"audit database unreachable ({type(e).__name__})") from None
    # bucket i is [starts[i], starts[i+1]) exactly as /audit/latency?since=..&until=.. selects it
    starts = [t0 + i * bucket_s for i in range(n)]
    ends = starts[1:] + [t1]
    buckets: list[list] = [[] for _ in range(n)]
    for r in rows:
        buckets[bisect.bisect_right(starts, r.arrival) - 1].append(r)
    series = [{"start": a, "end": b, "requests": len(rs), "groups": latency_report(rs, "level")}
              for a, b, rs in zip(starts, ends, buckets)]
    levels = sorted({g["level"] for b in series for g in b["groups"]})
    if format == "csv":
        buf = io.StringIO()
        cols = None
        for b in series:
            for g in b["groups"]:
                row = {"start": b["start"], "end": b["end"], **g}
                if cols is None:
                    cols = list(row)
                    w = csv.DictWriter(buf, fieldnames=cols)
                    w.writeheader()
                w.writerow(row)
        if cols is None:
            buf.write("start,end,level,count\n")
        return Response(buf.getvalue(), media_type="text/csv",
                        headers={"Content-Disposition": 'attachment; filename="latency-series.csv"'})
    return {"since": t0, "until": t1, "bucket_s": bucket_s, "requests": len(rows), "levels": levels, "series": series}
