"""Prometheus metrics, one registry per app (so tests can run several apps in a process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_depth = Gauge("triage_queue_depth", "Requests waiting in the admission queue", ["level"], registry=r)
        self.inflight = Gauge("triage_inflight", "Requests handed to the backend", ["level"], registry=r)
        self.queue_time = Histogram("triage_queue_time_seconds", "Time in the admission queue", ["level"],
                                    buckets=LAT_BUCKETS, registry=r)
        self.classify_time = Histogram("triage_classify_seconds",
                                       "From a call's arrival to its level: checks, tokenising, the classifier's queue "
                                       "and pass (before the admission queue)", buckets=LAT_BUCKETS, registry=r)
        self.ttft = Histogram("triage_ttft_seconds", "Time to first token", ["level"], buckets=LAT_BUCKETS, registry=r)
        self.tpot = Histogram("triage_tpot_seconds", "Time per output token (each gap)", ["level"],
                              buckets=TPOT_BUCKETS, registry=r)
        self.requests = Counter("triage_requests_total", "Finished requests by outcome", ["level", "outcome"], registry=r)
        self.relabels = Counter("triage_relabels_total", "Operator relabels", ["level"], registry=r)
        self.limited = Counter("triage_rate_limited_total", "Calls refused by a key's limits (429)", ["role", "reason"],
                               registry=r)
        self.shed = Counter("triage_shed_total", "Requests shed by admission control", ["level"], registry=r)
        self.step_time = Histogram("triage_engine_step_seconds", "Engine step time", buckets=LAT_BUCKETS, registry=r)
        self.engine_steps = Counter("triage_engine_steps", "Engine steps run (vLLM's schedule calls; read "
                                    "every 0.5 s from the engine's scheduler)", registry=r)
        self.engine_tokens = Counter("triage_engine_tokens", "Tokens the engine computed: prompt chunks, decodes "
                                     "and the prompts of preempted requests recomputed (read as engine_steps)",
                                     registry=r)
        self.engine_preemptions = Counter("triage_engine_preemptions", "Running requests preempted in the engine, "
                                          "by our scheduler or by vLLM itself (read as engine_steps)", registry=r)
        self.estimator_error = Histogram("triage_estimator_relative_error", "|T_real - T_pred| / T_real per step",
                                         buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2), registry=r)
        self.audit_spool = Gauge("triage_audit_spool_records", "Audit records waiting in the spool file", registry=r)
        self.db_up = Gauge("triage_database_up", "1 when the audit database accepts writes", registry=r)
        self.db_up.set(1)
        # reliability (docs/service.md, Reliability)
        self.engine_up = Gauge("triage_engine_up", "1 while the engine serves, 0 while it is down or restarting",
                               registry=r)
        self.engine_up.set(1)
        self.engine_restarts = Counter("triage_engine_restarts", "Engine restart attempts by result (ok, failed)",
                                       ["result"], registry=r)
        self.engine_restart_seconds = Histogram("triage_engine_restart_seconds",
                                                "From the engine's death to serving again",
                                                buckets=(1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 300), registry=r)
        self.standby_ready = Gauge("triage_engine_standby_ready",
                                   "1 while a standby engine is started and idle (an engine death is then "
                                   "survived without a cold start)", registry=r)
        self.standby_takeovers = Counter("triage_engine_standby_takeovers",
                                         "Engine deaths answered by the standby engine taking over", registry=r)
        self.requeued = Counter("triage_requeued_total", "Calls re-queued after an engine death (nothing streamed yet)",
                                registry=r)
        self.draining = Gauge("triage_draining", "1 while the service drains after SIGTERM", registry=r)
        self.loop_stall = Histogram("triage_event_loop_stall_seconds",
                                    "Times the service's event loop was blocked longer than loop_stall_warn_s "
                                    "(serving/loop_watchdog.py; each is logged with where it was blocked)",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)

        from serving.gc_heap import GcPauses

        self.gc = GcPauses()   # process-wide: started and stopped with the app (serving/app.py)
        r.register(self.gc)

    def render(self) -> bytes:
        return generate_latest(self.registry)
