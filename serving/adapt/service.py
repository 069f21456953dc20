"""The site registry inside the running service: built at start-up beside the predictor,
it records relabel examples, follows the database's live version (so a promotion made by
`triage adapt --promote` or another front end reaches this predictor within `POLL_S`), and
serialises fits and promotions."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from predictors.site_features import FEATURE_VERSION
from serving.adapt.examples import TRUSTED_ROLES, example_record
from serving.adapt.registry import SiteRegistry, general_fingerprint
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)
POLL_S = 5.0


class SiteService:
    def __init__(self, registry: SiteRegistry, writer) -> None:
        self.registry = registry
        self.writer = writer
        self.lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    async def start(self) -> "SiteService":
        await asyncio.to_thread(self.registry.sync_live)
        self._task = asyncio.create_task(self._follow(), name="site-adapter-follow")
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if self.lock.locked():
                continue
            try:
                await asyncio.to_thread(self.registry.sync_live)
            except Exception as e:  # a database outage must not stop the service; say it
                log.warning("site adapter: cannot read the live version (%s)", type(e).__name__)

    def record_relabel(self, job: Any, level: int, principal: Any) -> bool:
        """Keep an operator's relabel of `job` as an example (never a client's: the relabel
        endpoint already demands the operator role; this checks it again)."""
        p = getattr(job, "prediction", None)
        feats = getattr(p, "features", None)
        if principal.role not in TRUSTED_ROLES or feats is None or getattr(p, "general_level", None) is None:
            return False
        self.writer.submit(example_record(job.id, feats, level, p.general_level, principal.key_id, principal.role,
                                          self.registry.fingerprint, FEATURE_VERSION))
        return True


async def start_site(app, settings) -> SiteService | None:
    """The site service for the app's predictor (None when the predictor is not the real one)."""
    svc = getattr(app.state, "predictor", None)
    pred = getattr(svc, "_predictor", None)  # the started PredictorService's Predictor
    slot = getattr(pred, "site", None)
    urgency = getattr(getattr(pred, "urgency", None), "dir", None)
    if slot is None or urgency is None:
        log.info("site adaptation off: the predictor is not the trained PredictorService")
        return None
    fp = await asyncio.to_thread(general_fingerprint, urgency)
    root = settings.resolved_spool_path().parent / "site_models"  # the state dir (beside the audit spool)
    site = SiteService(SiteRegistry(app.state.db, root, fp, slot), app.state.writer)
    return await site.start()
