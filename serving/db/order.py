"""The calls of an arrival window as the order check reads them (triage/order_audit.py):
each request's level, since when the service had it at that level (its arrival, or its last
relabel), its first token, its end and its engine. Shared by `GET /audit/order` and
`triage db order`."""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from serving.db.models import RelabelRow, RequestRow, arrived
from triage.order_audit import Served

MAX_CALLS = 20000


def order_calls(s: Session, t0: float | None, t1: float | None, limit: int = MAX_CALLS) -> tuple[list[Served], bool]:
    """The first `limit` calls that arrived in [t0, t1) (either end open when None), and
    whether there were more."""
    q = arrived(select(RequestRow.id, RequestRow.effective_level, RequestRow.arrival, RequestRow.first_token,
                       RequestRow.finish, RequestRow.instance), t0, t1)
    rows = s.execute(q.order_by(RequestRow.arrival, RequestRow.id).limit(limit + 1)).all()
    more, rows = len(rows) > limit, rows[:limit]
    ids = [r.id for r in rows]
    relabelled: dict[str, float] = {}
    for i in range(0, len(ids), 500):
        rq = select(RelabelRow.request_id, func.max(RelabelRow.at)).where(RelabelRow.request_id.in_(ids[i:i + 500]))
        relabelled.update(s.execute(rq.group_by(RelabelRow.request_id)).all())
    return [Served(r.id, r.effective_level, max(r.arrival, relabelled.get(r.id) or 0.0), r.first_token, r.finish,
                   r.instance) for r in rows], more
