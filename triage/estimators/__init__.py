"""Batch latency estimators behind one interface (`base.LatencyEstimator`)."""
from triage.estimators.base import LatencyEstimator, Work
from triage.estimators.proserve import ProServeEstimator
from triage.estimators.slidingserve import SlidingServeEstimator

__all__ = ["LatencyEstimator", "Work", "ProServeEstimator", "SlidingServeEstimator"]
