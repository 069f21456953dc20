"""Vital signs parsed from triage text, and the explicit ESI safety floors built on them.

The learned classifier reads numbers poorly, so the urgency predictor combines it with
the ESI v4 handbook's explicit rules (never thresholds fitted to any data set):

* Decision point A (level 1): responds only to pain or unresponsive (AVPU P/U, or a
  Glasgow Coma Scale of 8 or less: "unresponsive" in the handbook's sense, nonverbal and
  not following commands); SpO2 < 90 % (listed by name in decision point A of the ESI v4
  algorithm: "intubated, apneic, pulseless, severe respiratory distress, SpO2 < 90, acute
  mental status changes, or unresponsive"; until revision 5 this was SpO2 < 85); and, as
  handbook examples of an immediate life-saving intervention, SBP < 70 mmHg or (age > 8
  or unknown) HR < 40 / > 180 or RR < 8 / > 40 per minute. "Acute mental status changes"
  is not applied here: the handbook's own chapter on level 2 sends new confusion or
  lethargy to decision point B (level 2), which is what the rule below does.
* Decision point B (level 2): new confusion, lethargy or disorientation (AVPU V); we also
  count SpO2 90-91 % (< 92, decision point D's limit) and SBP < 90 mmHg here (hypoxia and
  hypotension are high-risk at any level).
* Decision point D (level 2): a level-3 candidate (the model says 3) whose HR or RR is in
  the age-dependent danger zone: < 3 y HR > 160 / RR > 40; 3-8 y HR > 140 / RR > 30;
  > 8 y (or age unknown) HR > 100 / RR > 20. As in the handbook, D is not applied to
  patients expected to need 0-1 resources (levels 4 and 5).

A rule only ever makes a level more urgent (a floor); it never lowers one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_NUM = r"(\d{1,3}(?:\.\d)?)"
SPO2_LEVEL1 = 90  # ESI v4 algorithm, decision point A: "SpO2 < 90"
SPO2_LEVEL2 = 92  # ESI v4 algorithm, decision point D: "SaO2 < 92 %"


@dataclass(frozen=True)
class Vitals:
    """What could be read from the text; None where absent."""

    age: float | None = None
    sbp: float | None = None
    dbp: float | None = None
    hr: float | None = None
    rr: float | None = None
    bt: float | None = None
    spo2: float | None = None
    avpu: str | None = None  # "A", "V", "P" or "U"
    gcs: float | None = None  # Glasgow Coma Scale, 3-15

    def any(self) -> bool:
        return any(v is not None for v in (self.sbp, self.hr, self.rr, self.bt, self.spo2, self.avpu, self.gcs))


@dataclass(frozen=True)
class Floor:
    """The most urgent level the rules demand (5 = no constraint) and why."""

    level: int = 5
    reasons: tuple[str, ...] = field(default_factory=tuple)


_AVPU_WORDS = {
    "a": "A", "alert": "A", "a&ox3": "A", "oriented": "A",
    "v": "V", "verbal": "V", "confused": "V", "drowsy": "V", "lethargic": "V", "disoriented": "V",
    "p": "P", "pain": "P", "responds to pain": "P",
    "u": "U", "unresponsive": "U", "unconscious": "U",
}


def _f(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text, flags=re.IGNORECASE)
    if not m:
        return None
    try:
        return float(m.group(1))
    except (TypeError, ValueError):
        return None


# Keywords that are also everyday words or office/code abbreviations ("send HR 2 copies",
# "PR 12 broke the build", "we sat 40 people", "oxygen is 21 % of air", "the mental pain of
# it"): a reading behind one of them counts only beside a reading of another vital sign,
# as in every vitals line the corpus, KTAS and crews write. The unambiguous spellings
# (SBP, SpO2, "heart rate", "blood pressure 85/50", "AVPU", "mental:") count on their own.
_WEAK = {
    "hr": r"\b(?:HR|PR|pulse)(?: of| is)?\s*:?\s*" + _NUM,
    "rr": r"\bRR(?: of| is)?\s*:?\s*" + _NUM,
    "bt": r"\b(?:T|temp)\s*:?\s*(\d{2}(?:\.\d)?)\b",
    "spo2": r"\b(?:sats?|oxygen)(?: of| is)?\s*:?\s*" + _NUM,
    # "GCS" is also Google Cloud Storage ("upload GCS 3 files"): read beside another vital only
    "gcs": r"\bGCS\s*:?\s*(\d{1,2})\b",
}
_STRONG = {
    "hr": r"\b(?:pulse rate|heart rate)(?: of| is)?\s*:?\s*" + _NUM,
    "rr": r"\bresp(?:iratory)? rate(?: of| is)?\s*:?\s*" + _NUM,
    "bt": r"\bBT\s*:?\s*(\d{2}(?:\.\d)?)\b",
    "spo2": r"\b(?:SpO2|SaO2|O2 sat|oxygen sat(?:uration)?)(?: of| is)?\s*:?\s*" + _NUM,
}


def parse_vitals(text: str) -> Vitals:
    """Read age, BP, HR, RR, temperature, SpO2 and AVPU from nurse-style text.

    Understands `SBP 85 DBP 50`, `BP 128/80`, `blood pressure 85/50`,
    `V/S 128/80-88-18-36.8`, `HR 110`, `PR 110`, `pulse 110`, `heart rate of 110`, `RR 22`,
    `resp rate 30`, `BT 36.8`, `T 38.2`, `SpO2 95`, `sat 91%`, `sats 88`, `oxygen 85`,
    `age 67`, `67M`, `67 y/o`, `mental: verbal`, `AVPU P`. Text without such fields
    yields an empty `Vitals`. The ambiguous keywords (HR, PR, pulse, RR, T, temp, sat(s),
    oxygen, "mental" without a colon) are read only beside another vital sign (`_WEAK`).
    """
    t = text[:4000]
    got: dict[str, float | None] = {}
    weak: set[str] = set()
    for k in ("hr", "rr", "bt", "spo2"):
        got[k] = _f(_STRONG[k], t)
        if got[k] is None:
            got[k] = _f(_WEAK[k], t)
            if got[k] is not None:
                weak.add(k)
    got["sbp"] = _f(r"\bSBP\s*:?\s*" + _NUM, t)
    got["dbp"] = _f(r"\bDBP\s*:?\s*" + _NUM, t)
    m = re.search(r"\b(?:BP|blood pressure)(?: of| is)?\s*:?\s*(\d{2,3})\s*/\s*(\d{2,3})", t, flags=re.IGNORECASE)
    if m and got["sbp"] is None:
        got["sbp"], got["dbp"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"\bV/?S\s*:?\s*(\d{2,3})/(\d{2,3})-(\d{2,3})-(\d{1,2})-(\d{2}(?:\.\d)?)", t, flags=re.IGNORECASE)
    if m:
        got["sbp"], got["dbp"], got["hr"], got["rr"], got["bt"] = (float(g) for g in m.groups())
        weak -= {"hr", "rr", "bt"}
    age = _f(r"\bage\s*:?\s*(\d{1,3})\b", t)
    if age is None:
        age = _f(r"\b(\d{1,3})\s*(?:y/?o|yo|yrs?|years? old|[MF])\b", t)
    # The first mention that states a level: "mental change, age 77, ..., mental: pain" is a
    # chief complaint ("mental change") followed by the AVPU reading ("mental: pain").
    avpu = None
    for m in re.finditer(r"\b(?:mental(?:\s+status)?|AVPU|mentality)(\s*:?\s*)(responds to pain|a&ox3|[a-z]+)", t,
                         flags=re.IGNORECASE):
        avpu = _AVPU_WORDS.get(m.group(2).lower())
        if avpu is None:
            continue
        word = m.group(0).split()[0].lower().rstrip(":")
        if word in ("mental", "mentality") and ":" not in m.group(1) \
                and not m.group(0).lower().startswith("mental status"):
            weak.add("avpu")
        break
    got["avpu"] = avpu
    got["gcs"] = _f(_WEAK["gcs"], t)
    if got["gcs"] is not None:
        if 3 <= got["gcs"] <= 15:
            weak.add("gcs")
        else:
            got["gcs"] = None
    if got["bt"] is not None and not 30.0 <= got["bt"] <= 45.0:
        got["bt"] = None
    if got["spo2"] is not None and got["spo2"] > 100:
        got["spo2"] = None
    fields = ("sbp", "hr", "rr", "bt", "spo2", "avpu", "gcs")  # dbp comes with sbp
    for k in weak:
        if got[k] is not None and not any(got[o] is not None for o in fields if o != k):
            got[k] = None
    return Vitals(age=age, sbp=got["sbp"], dbp=got["dbp"], hr=got["hr"], rr=got["rr"], bt=got["bt"], spo2=got["spo2"],
                  avpu=got["avpu"], gcs=got["gcs"])


def danger_zone_limits(age: float | None) -> tuple[int, int]:
    """ESI v4 danger-zone (HR, RR) upper limits for an age in years (None: adult)."""
    if age is not None and age < 3:
        return 160, 40
    if age is not None and age <= 8:
        return 140, 30
    return 100, 20


def safety_floor(v: Vitals, model_level: int) -> Floor:
    """The ESI floor for these vitals given the level the model (after escalation) chose."""
    reasons: list[str] = []
    level = 5
    adult = v.age is None or v.age > 8
    # Decision point A
    a = []
    if v.avpu in ("P", "U"):
        a.append(f"AVPU {v.avpu}")
    if v.gcs is not None and v.gcs <= 8:
        a.append("GCS<=8")
    if v.spo2 is not None and v.spo2 < SPO2_LEVEL1:
        a.append(f"SpO2<{SPO2_LEVEL1}")
    if adult and v.sbp is not None and v.sbp < 70:
        a.append("SBP<70")
    if adult and v.hr is not None and (v.hr < 40 or v.hr > 180):
        a.append("HR<40|>180")
    if adult and v.rr is not None and (v.rr < 8 or v.rr > 40):
        a.append("RR<8|>40")
    if a:
        return Floor(1, tuple("A:" + x for x in a))
    # Decision point B
    if v.avpu == "V":
        reasons.append("B:AVPU V")
    if v.spo2 is not None and v.spo2 < SPO2_LEVEL2:
        reasons.append(f"B:SpO2<{SPO2_LEVEL2}")
    if v.sbp is not None and v.sbp < 90 and adult:
        reasons.append("B:SBP<90")
    # Decision point D (level-3 candidates only)
    if model_level == 3:
        hr_max, rr_max = danger_zone_limits(v.age)
        if v.hr is not None and v.hr > hr_max:
            reasons.append(f"D:HR>{hr_max}")
        if v.rr is not None and v.rr > rr_max:
            reasons.append(f"D:RR>{rr_max}")
    if reasons:
        level = 2
    return Floor(level, tuple(reasons))
