"""The features a site adapter reads for one request: what the general model already computes
(its pooled sentence vector and its calibrated P(level 1-5)) plus structured vital signs
parsed from the text.

    x = [pooled vector (hidden size) | log P_general(1..5) | vitals block (VITALS_NAMES)]

Since version 4 the pooled vector is `predictors.embedding.PooledHead`'s two halves, the
first-token vector the classifier reads and the mean of the token states (2 x the encoder's
width, 768 for MiniLM-L6), from the same encoder pass.

The vitals block gives a linear head what it cannot get from digits in an embedding: each
reading (missing -> a normal value, with a missing flag), how far it lies outside the
normal adult range (hinges), the pain score (NRS 0-10, as "NRS 7" or "pain 7/10"), AVPU
one-hot and the ESI floor flags of `predictors.vitals` (A, B, D), and the pain score split
by the complaint's site (version 2): triage scales grade pain by where it is (KTAS: NRS
8-10 is level 2 for central pain - chest, abdomen, head, back, flank, pelvis - and 3 for
peripheral pain), an interaction a head cannot build from the pain score and the pooled
vector alone. The complaint is the text before its first comma (at most 120 characters).
Version 3 adds how the patient arrived and whether it is an injury, when the request
states them as "arrival: walk-in | public ambulance | private vehicle | private ambulance |
<other>" and "injury: yes | no" (a triage nurse records both; a request that does not
state them gets zeros: "send an ambulance" is not an arrival).
Nothing here is fitted: ranges are textbook adult normals and the site words a fixed
list, not learned from any data set.
"""
from __future__ import annotations

import re

import numpy as np

from predictors.vitals import Vitals, danger_zone_limits, parse_vitals, safety_floor

FEATURE_VERSION = 4  # bump when the layout below changes (stored examples carry it); 4: pooled + token mean

# (field, normal value used when missing, scale, hinge below, hinge above)
_READINGS = (
    ("age", 40.0, 25.0, None, 65.0),
    ("sbp", 125.0, 25.0, 90.0, 180.0),
    ("dbp", 78.0, 15.0, 50.0, 110.0),
    ("hr", 80.0, 20.0, 50.0, 100.0),
    ("rr", 18.0, 5.0, 10.0, 22.0),
    ("bt", 36.8, 0.7, 35.5, 38.0),
    ("spo2", 98.0, 3.0, 94.0, None),
    ("nrs", 0.0, 3.0, None, 6.5),
)
_AVPU = ("A", "V", "P", "U")
_CENTRAL = re.compile(r"chest|abdom|epigastr|flank|head|back|pelvi|thora|stomach|[rl][lu]q\b|periumbil|loin", re.I)
_PAIN = re.compile(r"pain|ache|tender", re.I)
# how the patient arrived and whether it is an injury, when the request states them as
# "arrival: <mode>" and "injury: yes|no" (version 3; absent: all zeros)
_ARRIVALS = ("walk-in", "public ambulance", "private vehicle", "private ambulance")
_ARRIVAL_RE = re.compile(r"\barrival\s*:\s*([a-z -]+?)\s*(?:,|$)", re.I)
_INJURY_RE = re.compile(r"\binjury\s*:\s*(yes|no)\b", re.I)
_NRS = (re.compile(r"\bNRS\s*:?\s*(\d{1,2})\b", re.I), re.compile(r"\bpain(?: score| scale)?\s*:?\s*(\d{1,2})\s*/\s*10\b", re.I))


def _names() -> tuple[str, ...]:
    out: list[str] = []
    for name, _, _, lo, hi in _READINGS:
        out += [f"{name}", f"{name}_missing"]
        if lo is not None:
            out.append(f"{name}_below_{lo:g}")
        if hi is not None:
            out.append(f"{name}_above_{hi:g}")
    out += [f"avpu_{a}" for a in _AVPU] + ["avpu_missing", "child_under_8", "floor_A", "floor_B", "floor_D_zone"]
    out += ["nrs_central", "nrs_peripheral", "nrs8_central", "nrs8_peripheral", "nrs4_7_central", "nrs4_7_peripheral"]
    out += [f"arrival_{a.replace('-', '_').replace(' ', '_')}" for a in _ARRIVALS] + ["arrival_other", "injury_yes", "injury_no"]
    return tuple(out)


VITALS_NAMES = _names()


def pain_score(text: str) -> float | None:
    head = text[:4000]
    for pat in _NRS:
        m = pat.search(head)
        if m:
            v = float(m.group(1))
            return v if 0 <= v <= 10 else None
    return None


def _pain_site(text: str, nrs: float | None) -> list[float]:
    """Pain score x complaint site: (NRS/10 central, NRS/10 peripheral, NRS 8-10 central,
    NRS 8-10 peripheral, NRS 4-7 central, NRS 4-7 peripheral)."""
    complaint = text[:120].split(",", 1)[0]
    n = 0.0 if nrs is None else float(nrs)
    central = bool(_CENTRAL.search(complaint))
    peripheral = not central and bool(_PAIN.search(complaint))
    return [n / 10 * central, n / 10 * peripheral, float(n >= 8 and central), float(n >= 8 and peripheral),
            float(4 <= n < 8 and central), float(4 <= n < 8 and peripheral)]


def _arrival_injury(text: str) -> list[float]:
    head = text[:4000]
    m, i = _ARRIVAL_RE.search(head), _INJURY_RE.search(head)
    mode = m.group(1).lower() if m else None
    injury = i.group(1).lower() if i else None
    return [float(mode == a) for a in _ARRIVALS] + [float(mode is not None and mode not in _ARRIVALS),
                                                    float(injury == "yes"), float(injury == "no")]


def vitals_block(text: str) -> np.ndarray:
    v: Vitals = parse_vitals(text)
    vals = {"age": v.age, "sbp": v.sbp, "dbp": v.dbp, "hr": v.hr, "rr": v.rr, "bt": v.bt, "spo2": v.spo2, "nrs": pain_score(text)}
    out: list[float] = []
    for name, normal, scale, lo, hi in _READINGS:
        x = vals[name]
        missing = x is None
        x = normal if missing else float(x)
        out += [(x - normal) / scale, float(missing)]
        if lo is not None:
            out.append(max(0.0, lo - x) / scale)
        if hi is not None:
            out.append(max(0.0, x - hi) / scale)
    out += [float(v.avpu == a) for a in _AVPU] + [float(v.avpu is None), float(v.age is not None and v.age <= 8)]
    floor_a = safety_floor(v, 5).level == 1
    floor_b = not floor_a and safety_floor(v, 5).level == 2
    hr_max, rr_max = danger_zone_limits(v.age)
    zone = (v.hr is not None and v.hr > hr_max) or (v.rr is not None and v.rr > rr_max)
    out += [float(floor_a), float(floor_b), float(zone)]
    out += _pain_site(text, vals["nrs"])
    out += _arrival_injury(text)
    return np.asarray(out, dtype=np.float32)


def site_features(pooled: np.ndarray, general_probs: np.ndarray, texts: list[str]) -> np.ndarray:
    """One feature row per text (float32): see the module docstring for the layout."""
    pooled = np.asarray(pooled, dtype=np.float32).reshape(len(texts), -1)
    logp = np.log(np.clip(np.asarray(general_probs, dtype=np.float32).reshape(len(texts), 5), 1e-6, 1.0))
    vit = np.stack([vitals_block(t) for t in texts]) if texts else np.zeros((0, len(VITALS_NAMES)), np.float32)
    return np.concatenate([pooled, logp, vit], axis=1).astype(np.float32)


def split_features(x: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pooled, log P_general, vitals block) views of a feature matrix."""
    return x[:, :hidden], x[:, hidden:hidden + 5], x[:, hidden + 5:]
