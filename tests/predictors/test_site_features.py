"""The site adapter's structured block (predictors/site_features.py, layout version 3): how the
patient arrived and whether it is an injury, parsed when the request states them, and the
KTAS evaluation's text for them (predictors/evaluate.ktas_site_fields), which the general
model never reads."""
from __future__ import annotations

import numpy as np

from predictors.evaluate import ktas_site_fields, ktas_text
from predictors.site_features import VITALS_NAMES, site_features, vitals_block

ARRIVAL = ("arrival_walk_in", "arrival_public_ambulance", "arrival_private_vehicle", "arrival_private_ambulance",
           "arrival_other", "injury_yes", "injury_no")


def _flags(text: str) -> dict:
    v = vitals_block(text)
    assert v.shape == (len(VITALS_NAMES),)
    return {n: float(v[VITALS_NAMES.index(n)]) for n in ARRIVAL}


def test_arrival_and_injury_are_read_when_stated():
    f = _flags("abd pain, age 40, NRS 5, arrival: private ambulance, injury: no")
    assert f == {**dict.fromkeys(ARRIVAL, 0.0), "arrival_private_ambulance": 1.0, "injury_no": 1.0}
    f = _flags("fall from ladder, Arrival: Walk-in, Injury: YES")
    assert f == {**dict.fromkeys(ARRIVAL, 0.0), "arrival_walk_in": 1.0, "injury_yes": 1.0}
    assert _flags("cut finger, arrival: helicopter")["arrival_other"] == 1.0


def test_a_call_that_asks_for_an_ambulance_is_not_an_arrival():
    for text in ("please send an ambulance, he is not breathing", "arrival time 3pm, injury to the knee",
                 "the ambulance arrived, no injury"):
        assert set(_flags(text).values()) == {0.0}, text


def test_site_fields_follow_the_ktas_record_and_the_general_text_stays_the_same():
    row = {"Chief_complain": "abd pain", "Age": "67", "SBP": "85", "DBP": "50", "HR": "110", "RR": "22", "BT": "36.8",
           "Pain": "1", "NRS_pain": "7", "Mental": "1", "Arrival mode": "4", "Injury": "1", "KTAS_expert": "2"}
    assert ktas_text(row) == "abd pain, age 67, SBP 85 DBP 50 HR 110 RR 22 BT 36.8, NRS 7, mental: alert"
    assert ktas_site_fields(row) == ", arrival: private ambulance, injury: no"
    assert ktas_site_fields({**row, "Arrival mode": "6", "Injury": "2"}) == ", arrival: other, injury: yes"
    assert ktas_site_fields({"Chief_complain": "x"}) == ""
    f = _flags(ktas_text(row) + ktas_site_fields(row))
    assert f["arrival_private_ambulance"] == 1.0 and f["injury_no"] == 1.0
    # the other readings of the block do not move when the site fields are appended
    a, b = vitals_block(ktas_text(row)), vitals_block(ktas_text(row) + ktas_site_fields(row))
    keep = [i for i, n in enumerate(VITALS_NAMES) if n not in ARRIVAL]
    np.testing.assert_array_equal(a[keep], b[keep])


def test_feature_row_layout():
    x = site_features(np.zeros((2, 4)), np.full((2, 5), 0.2), ["a", "b, arrival: walk-in"])
    assert x.shape == (2, 4 + 5 + len(VITALS_NAMES)) and x.dtype == np.float32
