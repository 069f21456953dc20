"""Traffic that is not a dispatch request (issue 14): chat, writing, code, trivia, paperwork
and health questions go to level 5 unless they describe an emergency; metaphors are not
emergencies; a real emergency written casually stays urgent.

The texts below were written for this test, after the corpus generator and before the
model was trained on it, and were not changed after seeing its answers. None is a corpus
row (checked below); apart from the first (the issue's own example, close to the writing
templates) they follow no corpus template, so they are held out from training and from
every choice made on validation. They run on the shipped predictors (`shipped` fixture)."""
from __future__ import annotations

import pytest

from predictors.corpus import load_corpus

pytestmark = pytest.mark.slow

NOT_DISPATCH = [
    "write a story about a heart attack",
    "the build is on fire and QA is screaming, can you look at my Dockerfile",
    "what's the cleanest way to kill a stuck celery worker without losing tasks",
    "I'm dying to know who wins the bake off this year",
    "this bug is killing me: my regex won't match dates with dashes",
    "let's get to the heart of the matter before the board meeting: are we cutting the budget or not",
    "shoot me an email with the rota for next month",
    "compose a short poem about a paramedic who mends broken hearts",
    "our database choked on a million rows last night, how should I batch the inserts",
    "please print the shift schedule for the ambulance crews for december",
    "are omega 3 capsules worth it for a healthy 40 year old",
    "explain the difference between a stroke and a TIA for my biology homework",
    "tell me a joke about doctors and ambulances",
    "my houseplant is gasping for water, how often should cacti be watered",
    "translate 'call an ambulance' into french for my phrasebook",
    "draft a thank-you note to the nurses who looked after my mum last year",
    "can you summarise the plot of grey's anatomy season 3",
    "I could die of embarrassment, I sent my boss a meme by mistake, what should I say",
]

EMERGENCIES = [  # (text, most urgent level it may get ... least urgent it may get)
    ("lol my dad just collapsed and isn't breathing", 1),
    ("sorry this isn't about my essay, my roommate is turning blue and not breathing", 1),
    ("not a metaphor: my husband is clutching his chest and sweating, it's spreading to his left arm", 2),
]


def test_the_held_out_texts_are_not_corpus_rows():
    corpus = {r["text"].strip().lower().rstrip("?.!") for r in load_corpus()}
    for text in NOT_DISPATCH + [t for t, _ in EMERGENCIES]:
        assert text.strip().lower().rstrip("?.!") not in corpus, text


@pytest.mark.parametrize("text", NOT_DISPATCH)
def test_non_dispatch_text_goes_to_level_5(shipped, text):
    (p,) = shipped.predict([text])
    assert p.level == 5, (p.level, p.reasons, [round(x, 3) for x in p.probs])


@pytest.mark.parametrize("text, worst", EMERGENCIES)
def test_casual_emergency_stays_urgent(shipped, text, worst):
    (p,) = shipped.predict([text])
    assert p.level <= worst, (p.level, p.reasons, [round(x, 3) for x in p.probs])


def test_corpus_test_non_dispatch_bars(shipped):
    """Issue 14's bars on the corpus test split: no non-dispatch text at level 1-2, at
    least 90 % at 4-5, and every dispatch level-1 text still level 1."""
    from predictors.evaluate import evaluate_urgency

    rep = evaluate_urgency("corpus-test", shipped.levels)
    nd, disp = rep["by_kind"]["non_dispatch"], rep["by_kind"]["dispatch"]
    assert nd["n"] >= 80
    assert nd["level_1_2"] == 0
    assert nd["share_level_4_5"] >= 0.90
    assert disp["level1_recall"] == 1.0
