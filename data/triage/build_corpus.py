"""Build the project's triage corpus (`data/triage/corpus.jsonl`) from hand-written fragments.

Run:  .venv/bin/python data/triage/build_corpus.py        (deterministic, seed 20240601)

Every message is composed from fragments written for this project (complaints grouped
by the ESI level the ESI v4 handbook rules give them, vital-sign lines, ages, caller
styles). Labels are assigned by the rules below, never by a model and never from the
evaluation sets (KTAS, Semigran), which this script does not read.

ESI rules used (ESI Implementation Handbook v4, decision points A-D):
  A  needs an immediate life-saving intervention (unresponsive / AVPU P or U, apnoea,
     pulseless, severe respiratory distress, SpO2 < 85, shock SBP < 70)      -> 1
  B  high-risk situation, new confusion/lethargy (AVPU V), severe pain/distress
     (pain >= 7/10 in a complaint needing work-up)                              -> 2
  C  expected resources: >= 2 -> 3, one -> 4, none -> 5
  D  a level-3 candidate whose vitals are in the danger zone (age-dependent HR/RR,
     SpO2 < 92) or with SBP < 90                                                -> 2
"""
from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

SEED = 20240601
HERE = Path(__file__).resolve().parent
OUT = HERE / "corpus.jsonl"
TARGET = {1: 420, 2: 680, 3: 620, 4: 450, 5: 400}
SPLIT = (0.70, 0.15, 0.15)  # train / validation / test, stratified by level

# --------------------------------------------------------------------------------------
# Complaints. Each: (nurse shorthand variants, lay phrasings). "{who}" is the patient in
# the caller's words, "{pro}" a pronoun.
# --------------------------------------------------------------------------------------

L1 = [  # immediate life-saving intervention
    (["cardiac arrest", "CPA", "pulseless, CPR in progress", "arrest, bystander CPR"],
     ["{who} collapsed and is not breathing, no pulse, we started CPR", "{who} just dropped to the floor and isnt breathing at all",
      "{who} has no heartbeat, somebody is doing chest compressions"]),
    (["unresponsive", "found down, unresponsive", "GCS 3", "unresponsive, agonal breathing"],
     ["{who} wont wake up, {pro} is making gasping sounds", "found {who} on the floor, cant wake {pro} up, barely breathing",
      "{who} is unconscious and not responding to anything"]),
    (["post-CPR state", "ROSC after CPR", "post arrest"],
     ["{who} had no pulse, we did CPR and now {pro} is breathing again but not awake"]),
    (["severe resp distress", "apnea", "resp arrest", "respiratory failure, cyanotic"],
     ["{who} cant breathe at all, lips are blue", "{who} is choking and turning blue, cant get any air",
      "{who} stopped breathing for a while and is grey"]),
    (["anaphylaxis, stridor", "anaphylaxis", "angioedema w/ stridor"],
     ["{who} ate peanuts and {pro} throat is closing, cant breathe, face swelling", "bee sting, {who} is wheezing and passing out, throat tight"]),
    (["major trauma, hypotensive", "MVA, unresponsive", "GSW chest", "stab wound chest", "fall from height, GCS 6"],
     ["{who} was hit by a car and is not moving, lots of blood", "{who} got shot in the chest and is barely breathing",
      "{who} fell off the roof, not waking up"]),
    (["massive hemorrhage", "uncontrolled bleeding", "amputation, active bleeding"],
     ["{who} is bleeding everywhere from the leg, it wont stop, {pro} is going pale", "blood is spurting from {who}'s arm, cant stop it"]),
    (["status epilepticus", "seizure ongoing >5min", "continuous seizure"],
     ["{who} has been seizing for ten minutes and wont stop", "{who} keeps having fits one after another and doesnt wake in between"]),
    (["overdose, unresponsive", "OD, RR 6", "opioid OD, apneic"],
     ["{who} took a lot of pills and now wont respond, breathing very slow", "think {who} overdosed on heroin, not breathing right, lips blue"]),
    (["hypoglycemia, unresponsive", "BST 25, unresponsive"],
     ["{who} is diabetic and is now unconscious, sugar reads LOW"]),
    (["drowning", "near drowning, apneic"], ["pulled {who} out of the pool, not breathing"]),
    (["hanging", "electrocution, unresponsive"], ["found {who} hanging, cut {pro} down, not breathing", "{who} got electrocuted and is not moving"]),
    (["neonate not breathing", "newborn apnea"], ["the baby was just born and is not breathing and is blue"]),
    (["shock, septic, SBP 60", "hypotension, unresponsive"], ["{who} is cold and grey and doesnt answer, pulse very weak"]),
]

L2 = [  # high risk / confused / severe pain
    (["chest pain", "ant. chest pain", "Lt chest pain", "chest discomfort", "pain, chest", "chest tightness", "crushing chest pain", "substernal chest pain"],
     ["{who} has chest pain going to the left arm and is sweating", "{who} has pressure on the chest and feels sick",
      "{who} says it feels like an elephant on the chest"]),
    (["dyspnea", "acute dyspnea", "SOB", "shortness of breath", "resp difficulty"],
     ["{who} is very short of breath and cant finish a sentence", "{who} is struggling to breathe since this morning"]),
    (["mental change", "altered mentality", "confusion", "AMS", "drowsy mentality"],
     ["{who} is suddenly confused and doesnt know where {pro} is", "{who} is talking nonsense and very sleepy since this afternoon"]),
    (["Rt. side weakness", "Lt side motor weakness", "dysarthria", "facial palsy", "hemiparesis", "stroke sx", "slurred speech", "facial droop"],
     ["{who}'s face is drooping on one side and {pro} speech is slurred", "{who} suddenly cant move the right arm and leg",
      "{who} started talking funny and the left side is weak"]),
    (["syncope", "LOC", "fainting", "loss of consciousness"],
     ["{who} fainted and was out for a minute", "{who} passed out at the table and hit the floor"]),
    (["hematemesis", "melena", "hematochezia", "GI bleeding", "coffee ground vomiting"],
     ["{who} is vomiting blood", "{who} has black tarry stool and feels faint", "{who} is passing a lot of blood from the back passage"]),
    (["post seizure", "seizure", "convulsion", "seizure like activity"],
     ["{who} had a fit and is still drowsy", "{who} had a seizure, first time ever"]),
    (["suicidal attempt", "suicidal ideation w/ plan", "drug intoxication", "intentional OD"],
     ["{who} says {pro} wants to kill {pro}self and has a plan", "{who} swallowed a bottle of tablets an hour ago, still awake"]),
    (["vaginal bleeding, pregnant", "ectopic r/o", "pregnant w/ abd pain"],
     ["{who} is pregnant and bleeding with bad belly pain", "{who} is 8 weeks pregnant, heavy bleeding and dizzy"]),
    (["testicular pain, sudden", "scrotal pain"], ["{who} has sudden terrible pain in the testicle and is vomiting"]),
    (["head trauma on anticoag", "head injury, on warfarin", "fall, head injury, vomiting"],
     ["{who} fell and hit {pro} head, {pro} takes blood thinners", "{who} hit the head and keeps vomiting"]),
    (["open fracture", "deformity, open wound leg"], ["{who} broke the leg and the bone is sticking out"]),
    (["fever, chills, hypotension", "sepsis r/o", "fever, lethargic"],
     ["{who} has high fever and shaking and is very weak and pale"]),
    (["severe headache, sudden", "thunderclap headache", "worst headache of life"],
     ["{who} has the worst headache of {pro} life, came on suddenly"]),
    (["palpitation w/ chest pain", "tachycardia", "palpitation, dizziness"],
     ["{who}'s heart is racing really fast and {pro} feels like fainting"]),
    (["hyperglycemia, vomiting", "DKA r/o"], ["{who} is diabetic, sugar over 500, vomiting and breathing fast"]),
    (["sexual violence", "sexual assault"], ["{who} was sexually assaulted an hour ago"]),
    (["burn, face and airway", "inhalation injury", "large burn"], ["{who} got burned on the face in a fire, voice is hoarse"]),
    (["hemoptysis", "massive epistaxis on anticoag"], ["{who} is coughing up blood", "{who} has a nosebleed that wont stop, {pro} is on blood thinners"]),
    (["fever in infant", "neonate fever"], ["my 3 week old baby has a fever of 38.5"]),
]

L3 = [  # two or more resources (labs, imaging, IV, consult)
    (["abd pain", "abdominal pain", "epigastric pain", "RUQ pain", "RLQ pain", "LLQ pain", "pain, abdominal", "diffuse abd pain",
      "upper abdominal pain", "Abd. pain", "distension, abd"],
     ["{who} has stomach pain since yesterday and it is getting worse", "{who} has pain on the right lower belly and no appetite",
      "{who} has belly pain and threw up twice"]),
    (["flank pain", "Rt. flank pain", "Lt flank pain", "renal colic r/o", "CVA tenderness"],
     ["{who} has pain in the side of the back going to the groin", "{who} thinks it is a kidney stone again"]),
    (["fever", "fever & chill", "fever, cough", "fever, sore throat, elderly"],
     ["{who} has fever and chills for two days", "{who} has a fever of 39 and a bad cough"]),
    (["vomiting", "diarrhea", "watery diarrhea", "N/V/D", "vomiting x6"],
     ["{who} keeps vomiting and cant keep water down", "{who} has diarrhea many times since morning and feels weak"]),
    (["dizziness", "vertigo", "whirling type vertigo", "DZ - Dizziness"],
     ["{who} is dizzy and the room is spinning", "{who} feels dizzy and unsteady since this morning"]),
    (["headache", "HA", "H-Headache", "headache w/ vomiting"], ["{who} has a headache for three days that pills dont help"]),
    (["general weakness", "generalized weakness", "fatigue, poor oral intake"], ["{who} is weak all over and not eating for days"]),
    (["hip pain after fall", "Lt. hip joint pain", "fall, hip pain, elderly"], ["{who} fell and now {pro} hip hurts, cant walk on it"]),
    (["cough, sputum", "cough", "pneumonia sx"], ["{who} has cough with yellow phlegm and fever"]),
    (["cellulitis, leg", "leg swelling, redness", "swelling, leg"], ["{who}'s leg is red hot and swollen"]),
    (["vaginal bleeding", "Vaginal Bleeding", "menorrhagia"], ["{who} has heavy bleeding between periods"]),
    (["urinary retention", "voiding difficulty", "hematuria"], ["{who} cant pee since last night and belly is full", "{who} has blood in the urine"]),
    (["low back pain w/ fever", "back pain, urinary sx"], ["{who} has back pain and burning when peeing and fever"]),
    (["facial injury", "head trauma, minor", "facial swelling after assault"], ["{who} got punched in the face, swollen and hurts"]),
    (["chest wall pain after fall", "rib pain after MVA"], ["{who} was in a car accident and the ribs hurt"]),
    (["leg pain", "both leg pain", "calf pain, swelling"], ["{who}'s calf is painful and swollen after the flight"]),
    (["AVF malfunction", "dialysis pt, missed HD", "ascites tapping", "PEG tube malfunction"],
     ["{who} is on dialysis and missed a session, feeling unwell"]),
    (["jaundice", "melena, small amount", "anemia sx"], ["{who}'s eyes are yellow and belly is big"]),
    (["asthma exac", "wheezing"], ["{who} has asthma and is wheezing, inhaler not helping much"]),
]

L4 = [  # one resource
    (["finger laceration", "scalp lac.", "lip laceration", "eyebrow laceration", "face laceration", "open wound", "hand laceration"],
     ["{who} cut the finger with a knife, needs stitches", "{who} has a cut on the forehead, bleeding stopped"]),
    (["ankle injury", "ankle sprain", "Ankle Injury", "knee pain after twist", "wrist pain after fall", "Finger Injury",
      "injury, finger", "toe injury", "arm pain", "pain, arm", "Arm Injury", "shoulder pain after fall", "foot pain"],
     ["{who} twisted the ankle playing football, swollen", "{who} fell on the wrist, it hurts to move", "{who} jammed a finger in the door"]),
    (["dysuria", "UTI sx", "frequency, burning urination"], ["{who} has burning when peeing and needs to go all the time"]),
    (["sore throat", "sorethroat", "throat pain", "odynophagia"], ["{who} has a sore throat and fever, hard to swallow"]),
    (["FB in eye", "ocular pain", "ocular pain, Rt.", "red eye, pain"], ["something flew into {who}'s eye and it hurts"]),
    (["catheter removal", "foley catheter change", "foley blocked"], ["{who}'s urine catheter is blocked"]),
    (["epistaxis", "nosebleed"], ["{who} has a nosebleed, stopped and started again"]),
    (["back pain", "LBP - Low back pain", "pain, low back", "neck pain", "post neck pain"],
     ["{who} hurt the back lifting boxes", "{who} has neck pain after sleeping wrong"]),
    (["ear pain", "otalgia w/ discharge"], ["{who}'s ear hurts and there is pus coming out"]),
    (["minor burn", "burn, hand", "forearm burn"], ["{who} burned the hand on the stove, blister"]),
    (["dog bite", "animal bite"], ["a dog bit {who} on the hand"]),
    (["rash w/ fever", "skin rash", "urticarial rash"], ["{who} has itchy hives all over after new medicine, breathing fine"]),
    (["mild abd cramps, pregnancy test", "missed period, abd cramp"], ["{who} missed a period and has mild cramps"]),
    (["toe pain", "ingrown toenail, infected"], ["{who}'s toenail is infected and pus"]),
]

L5 = [  # no resources
    (["prescription refill", "med refill", "Rx refill"], ["{who} ran out of blood pressure pills and needs a refill"]),
    (["cold sx", "runny nose", "URI sx", "nasal congestion"], ["{who} has a runny nose and sneezing for two days"]),
    (["insect bite", "mosquito bites", "bug bite"], ["{who} got bitten by a mosquito and it itches"]),
    (["suture removal", "stitch removal", "wound check"], ["{who} needs the stitches taken out"]),
    (["sunburn", "mild sunburn"], ["{who} got a sunburn at the beach"]),
    (["toothache", "dental pain"], ["{who} has a toothache since last week"]),
    (["mild rash", "rash, no fever", "eczema flare"], ["{who} has a small itchy rash on the arm"]),
    (["pink eye", "conjunctivitis", "eye discharge"], ["{who}'s eye is red and crusty in the morning"]),
    (["work note", "medical certificate request"], ["{who} needs a note for work"]),
    (["chronic back pain, unchanged", "chronic knee pain"], ["{who}'s knee has hurt for years, same as always"]),
    (["wart", "callus", "skin tag"], ["{who} has a wart on the finger"]),
    (["med question", "question about dose"], ["{who} wants to know if {pro} can take ibuprofen with the cold medicine"]),
    (["minor abrasion", "scrape, knee"], ["{who} scraped the knee, small scratch"]),
    (["earache, child, afebrile", "ear pain, mild"], ["{who} says the ear hurts a little, no fever"]),
    (["tetanus shot", "vaccination request"], ["{who} wants a tetanus shot"]),
    (["hiccups", "constipation x3d", "mild constipation"], ["{who} hasnt pooped in three days, no pain"]),
    (["lice", "dandruff, itchy scalp"], ["{who} has lice"]),
]

# Complaints of levels 3-5 that a severe pain score moves to ESI 2 (level-3 candidates only).
WHO_LAY = [("my husband", "he"), ("my wife", "she"), ("my father", "he"), ("my mother", "she"), ("my son", "he"),
           ("my daughter", "she"), ("my neighbour", "he"), ("my grandma", "she"), ("my friend", "he"),
           ("the patient", "she"), ("my brother", "he"), ("my sister", "she"), ("i", "i"), ("this man", "he"), ("this lady", "she")]
MENTAL_OK = ["alert", "alert", "alert", "A", "A&Ox3", "alert, oriented"]

TYPO_MAP = {"breathing": "breathng", "because": "becuase", "really": "realy", "stomach": "stomache", "pain": "pian",
            "since": "sence", "their": "there", "chest": "chset", "bleeding": "bleding", "vomiting": "vomitting",
            "seizure": "seizur", "ambulance": "ambulanse", "please": "pls", "you": "u", "are": "r", "fever": "fevr",
            "hurts": "hurst", "unconscious": "unconcious", "breathe": "breath", "dizzy": "dizy"}


def age_for(rng: random.Random, child_ok: bool = True) -> int:
    r = rng.random()
    if child_ok and r < 0.12:
        return rng.choice([1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 15])
    if r < 0.55:
        return rng.randint(18, 59)
    return rng.randint(60, 92)


def hr_rr_limits(age: int) -> tuple[int, int]:
    """ESI v4 danger-zone heart and respiratory rates (exclusive upper limits)."""
    if age < 3:
        return 160, 40
    if age <= 8:
        return 140, 30
    return 100, 20


def vitals(rng: random.Random, age: int, kind: str) -> dict:
    """kind: normal | danger (ESI-2 danger zone) | crit (ESI-1)."""
    hr_max, rr_max = hr_rr_limits(age)
    v = {"SBP": rng.randint(90, 118) if age < 13 else rng.randint(105, 165), "HR": rng.randint(58, hr_max - 2), "RR": rng.choice([14, 16, 18, 18, 20, 20]),
         "BT": round(rng.uniform(36.1, 37.4), 1), "SpO2": rng.randint(94, 100)}
    if age <= 8:
        v["RR"] = rng.randint(18, rr_max - 2)
        v["HR"] = rng.randint(80, hr_max - 5)
    if kind == "danger":
        which = rng.choice(["hr", "hr", "rr", "spo2", "sbp", "hr+rr", "sbp+hr"])
        if "hr" in which:
            v["HR"] = rng.randint(hr_max + 5, hr_max + 45)
        if "rr" in which:
            v["RR"] = rng.randint(rr_max + 2, rr_max + 12)
        if "spo2" in which:
            v["SpO2"] = rng.randint(86, 91)
        if "sbp" in which:
            v["SBP"] = rng.randint(72, 88)
        if rng.random() < 0.3:
            v["BT"] = round(rng.uniform(38.1, 39.8), 1)
    elif kind == "crit":
        which = rng.choice(["spo2", "sbp", "hr", "rr"])
        if which == "spo2":
            v["SpO2"] = rng.randint(60, 84)
            v["RR"] = rng.choice([6, 8, 34, 38, 44])
        elif which == "sbp":
            v["SBP"] = rng.randint(40, 68)
            v["HR"] = rng.choice([rng.randint(130, 170), rng.randint(30, 38)])
        elif which == "hr":
            v["HR"] = rng.choice([rng.randint(180, 220), rng.randint(25, 38)])
            v["SBP"] = rng.randint(55, 80)
        else:
            v["RR"] = rng.choice([4, 6, 40, 46])
            v["SpO2"] = rng.randint(70, 88)
    v["DBP"] = max(25, int(v["SBP"] * rng.uniform(0.55, 0.68)))
    return v


def vitals_line(rng: random.Random, v: dict) -> str:
    spo2 = rng.random() > 0.45  # SpO2 often not recorded at intake
    fmt = rng.random()
    if fmt < 0.45:  # KTAS-like field list
        parts = [f"SBP {v['SBP']}", f"DBP {v['DBP']}", f"HR {v['HR']}", f"RR {v['RR']}", f"BT {v['BT']}"]
        if spo2:
            parts.append(f"SpO2 {v['SpO2']}")
        return " ".join(parts)
    if fmt < 0.8:
        s = f"BP {v['SBP']}/{v['DBP']} HR {v['HR']} RR {v['RR']} T {v['BT']}"
        return s + (f" SpO2 {v['SpO2']}%" + rng.choice(["", " RA", " on RA"]) if spo2 else "")
    s = f"V/S {v['SBP']}/{v['DBP']}-{v['HR']}-{v['RR']}-{v['BT']}"
    return s + (f", sat {v['SpO2']}" if spo2 else "")


def nurse(rng, complaint, age, v, mental, pain=None, level=3) -> str:
    sex = rng.choice(["M", "F"])
    f = rng.random()
    pain_s = f", NRS {pain}" if pain is not None else ""
    if f < 0.5:
        age_s = rng.choice([f"age {age}", f"age {age}", f"{age}{sex}", f"{age} y/o"])
        return f"{complaint}, {age_s}, {vitals_line(rng, v)}{pain_s}, mental: {mental}"
    if f < 0.8:
        durs = ["x10min", "x30min", "onset 15min ago", ""] if level == 1 else ["x1d", "x2d", "x3h", "since this AM", "x30min", "x1wk", "onset 2h ago", ""]
        dur = rng.choice(durs)
        return f"{age}{sex} c/o {complaint} {dur}. {vitals_line(rng, v)}.{pain_s} mental {mental}".replace("  ", " ")
    return f"pt {age} y/o {sex}, CC: {complaint}; {vitals_line(rng, v)}{pain_s}; AVPU {mental}"


def lay(rng, phrase, who, pro, age) -> str:
    text = phrase.format(who=who, pro=pro if who != "i" else "i")
    if who == "i":
        text = (text.replace("i's", "my").replace("i has", "i have").replace("i is", "i am").replace("i was", "i was")
                .replace("i wants", "i want").replace("i says", "i say").replace("i keeps", "i keep")
                .replace("i thinks", "i think").replace("i feels", "i feel").replace("i needs", "i need")
                .replace("i ran", "i ran").replace("i cant", "i cant").replace(" i self", " myself").replace("iself", "myself"))
    openers = ["", "", "help ", "please send someone, ", "hello, ", "hi i need advice, ", "emergency! ", "not sure if urgent but "]
    age_bits = ["", f", {pro} is {age}", f" ({age} years old)", f". {age} yrs"] if who != "i" else ["", f", im {age}"]
    return rng.choice(openers) + text + rng.choice(age_bits)


def dispatch(rng, phrase, who, pro, age, v=None) -> str:
    sex = "male" if pro == "he" else "female"
    core = phrase.format(who="pt", pro=pro).replace("pt's", "pt's")
    s = f"caller reports {age} y/o {sex}: {core}"
    if v is not None and rng.random() < 0.6:
        s += f". crew vitals {vitals_line(rng, v)}"
    return s


def nonnative(rng, phrase, who, pro, age) -> str:
    t = phrase.format(who=who, pro=pro)
    subs = [(" has ", " have "), (" is ", " "), ("isnt", "not"), ("cant", "no can"), (" the ", " "), ("since", "from"),
            ("wont", "not"), ("doesnt", "not"), ("really", "very much"), ("he ", "he "), ("yesterday", "yesterday day")]
    for a, b in subs:
        if rng.random() < 0.55:
            t = t.replace(a, b)
    return rng.choice(["please help, ", "hello sir ", "excuse me, ", "", "urgent please "]) + t + rng.choice(
        ["", ", what we do?", " please come fast", f", age {age}", ", sorry my english"])


def typo(rng, text) -> str:
    words = text.split(" ")
    out = []
    for w in words:
        if w in TYPO_MAP and rng.random() < 0.6:
            w = TYPO_MAP[w]
        elif len(w) > 4 and rng.random() < 0.08:
            i = rng.randrange(1, len(w) - 1)
            w = w[:i] + w[i + 1] + w[i] + w[i + 2:]
        out.append(w)
    t = " ".join(out)
    return t.lower() if rng.random() < 0.5 else t.upper() if rng.random() < 0.1 else t


def make(rng: random.Random, level: int) -> dict:
    bank = {1: L1, 2: L2, 3: L3, 4: L4, 5: L5}
    style = rng.choices(["nurse", "lay", "dispatch", "nonnative", "typo"], weights=[0.42, 0.22, 0.12, 0.12, 0.12])[0]
    rule = "complaint"
    # ESI-2 messages built from a level-3 complaint with danger-zone vitals or severe pain.
    if level == 2 and style in ("nurse", "dispatch") and rng.random() < 0.45:
        shorts, lays = rng.choice(L3)
        age = age_for(rng)
        if rng.random() < 0.75:
            v, pain, rule = vitals(rng, age, "danger"), None, "D:danger-zone-vitals"
        else:
            v, pain, rule = vitals(rng, age, "normal"), rng.randint(7, 10), "B:severe-pain"
        if style == "nurse":
            text = nurse(rng, rng.choice(shorts), age, v, rng.choice(MENTAL_OK), pain)
        else:
            who, pro = rng.choice(WHO_LAY[:-3])
            text = dispatch(rng, rng.choice(lays), who, pro, age, v)
            if "crew vitals" not in text:
                text += f". crew vitals {vitals_line(rng, v)}"
            if pain is not None:
                text += rng.choice([f", pain {pain}/10", f", NRS {pain}", f", says pain is {pain} out of 10"])
        return {"text": text, "level": 2, "style": style, "rule": rule}
    shorts, lays = rng.choice(bank[level])
    age = age_for(rng, child_ok=level != 2 or rng.random() < 0.5)
    kind = {1: "crit", 2: "normal"}.get(level, "normal")
    if level == 1 and rng.random() < 0.3:
        kind = "normal_unresp"
    v = vitals(rng, age, "crit" if kind == "crit" else "normal")
    if level == 1:
        mental = rng.choice(["unresponsive", "U", "P", "pain", "responds to pain only", "unresponsive"])
        rule = "A:life-saving-intervention"
    elif level == 2:
        mental = rng.choice(MENTAL_OK + ["verbal", "V", "confused", "drowsy"]) if rng.random() < 0.5 else rng.choice(MENTAL_OK)
        if mental in ("verbal", "V", "confused", "drowsy") and style == "nurse":
            rule = "B:altered-mental-status"
        else:
            rule = "B:high-risk"
        if rng.random() < 0.25:
            v = vitals(rng, age, "danger")
    else:
        mental = rng.choice(MENTAL_OK)
        rule = {3: "C:2+resources", 4: "C:1-resource", 5: "C:no-resources"}[level]
    pain = None
    if level in (3, 4, 5) and rng.random() < 0.3:
        pain = rng.randint(1, 6) if level == 3 else rng.randint(1, 9 if level == 4 else 4)
    who, pro = rng.choice(WHO_LAY)
    if style == "nurse":
        short = rng.choice(shorts)
        text = nurse(rng, short, age, v, mental, pain, level)
        if level == 2 and rule == "B:high-risk" and short in STABLE_TO_3 and not _danger(v, age):
            # revision 2: a stable, alert presentation of these complaints needs >= 2 resources but
            # meets no level-2 criterion (ESI v4: high risk is judged with the vital signs)
            return {"text": text, "level": 3, "style": style, "rule": "C:2+resources(stable,rev2)"}
    elif style == "dispatch":
        if who == "i":
            who, pro = "my father", "he"
        text = dispatch(rng, rng.choice(lays), who, pro, age, v if level <= 2 else (v if rng.random() < 0.3 else None))
    elif style == "nonnative":
        text = nonnative(rng, rng.choice(lays), who, pro, age)
    else:
        base = lay(rng, rng.choice(lays), who, pro, age)
        text = typo(rng, base) if style == "typo" else base
    return {"text": text, "level": level, "style": style, "rule": rule}


# Revision 2 (see DATACARD.md): nurse-shorthand complaints that are level 2 only when the patient
# is unstable; with normal vital signs and alert they are level 3 (two or more resources).
STABLE_TO_3 = {"dyspnea", "SOB", "shortness of breath", "resp difficulty", "melena", "hematochezia",
               "post seizure", "seizure", "convulsion", "seizure like activity", "palpitation, dizziness"}


def _danger(v: dict, age: int) -> bool:
    hr_max, rr_max = hr_rr_limits(age)
    return v["HR"] > hr_max or v["RR"] > rr_max or v["SpO2"] < 92 or v["SBP"] < 90


def build() -> list[dict]:
    rng = random.Random(SEED)
    rows: list[dict] = []
    seen: set[str] = set()
    for level, n in TARGET.items():
        got, tries = 0, 0
        while got < n and tries < n * 50:
            tries += 1
            r = make(rng, level)
            key = r["text"].strip().lower()
            if key in seen:
                continue
            seen.add(key)
            rows.append(r)
            got += 1
    # stratified split
    for level in TARGET:
        idx = [i for i, r in enumerate(rows) if r["level"] == level]
        rng.shuffle(idx)
        n_tr, n_va = int(len(idx) * SPLIT[0]), int(len(idx) * SPLIT[1])
        for j, i in enumerate(idx):
            rows[i]["split"] = "train" if j < n_tr else "validation" if j < n_tr + n_va else "test"
    rng.shuffle(rows)
    for i, r in enumerate(rows):
        r["id"] = f"t{i:05d}"
    return [{k: r[k] for k in ("id", "text", "level", "split", "style", "rule")} for r in rows]


SUPPLEMENT_SEED = SEED + 2
SUPPLEMENT_N = 240
STABLE_L3 = [  # revision 2: stable, alert presentations (>= 2 resources, no level-2 criterion)
    "dyspnea", "SOB", "shortness of breath", "dyspnea on exertion", "cough, SOB", "resp difficulty", "palpitation",
    "chest palpitation", "irregular heartbeat", "melena", "hematochezia", "blood in stool", "post seizure",
    "seizure, known epilepsy", "convulsion, now alert", "seizure like activity", "vaginal bleeding", "hemoptysis, small amount",
    "epigastric pain", "fever", "vomiting", "facial palsy, isolated", "anxiety, hyperventilation", "head injury, minor"]


def supplement(start_id: int) -> list[dict]:
    """Revision 2 rows, appended after the original 2,570 (which keep their ids and texts):
    nurse-style level-3 messages for complaints that are level 2 only when unstable, each
    with normal vitals and an alert patient; one in four is written with danger-zone vitals
    instead and labelled 2 (decision point D), so the pair teaches the vital signs."""
    rng = random.Random(SUPPLEMENT_SEED)
    rows = []
    for i in range(SUPPLEMENT_N):
        age = rng.randint(18, 90)
        danger = rng.random() < 0.25
        v = vitals(rng, age, "danger" if danger else "normal")
        pain = rng.randint(1, 6) if rng.random() < 0.3 else None
        text = nurse(rng, rng.choice(STABLE_L3), age, v, rng.choice(MENTAL_OK), pain, 3)
        rows.append({"text": text, "level": 2 if danger else 3, "style": "nurse",
                     "rule": "D:danger-zone-vitals(rev2)" if danger else "C:2+resources(stable,rev2)"})
    for level in (2, 3):
        idx = [i for i, r in enumerate(rows) if r["level"] == level]
        n_tr, n_va = int(len(idx) * SPLIT[0]), int(len(idx) * SPLIT[1])
        for j, i in enumerate(idx):
            rows[i]["split"] = "train" if j < n_tr else "validation" if j < n_tr + n_va else "test"
    for i, r in enumerate(rows):
        r["id"] = f"t{start_id + i:05d}"
    return [{k: r[k] for k in ("id", "text", "level", "split", "style", "rule")} for r in rows]


def revision3(rows: list[dict]) -> list[dict]:
    """Revision 3: a row labelled 2 by decision point D must show its danger-zone reading.
    The generator drew danger vitals and then printed a vitals line that may leave SpO2
    out (and judged SBP < 90 in children, where ESI's limit is lower), so some D rows read
    as normal. Those are relabelled 3 (their complaint's level: two or more resources).
    "Shows" means: the ESI floors of `predictors.vitals`, run on the text as written,
    raise a level-3 candidate to 2. Texts and ids are unchanged."""
    sys.path.insert(0, str(HERE.parents[1]))
    from predictors.vitals import parse_vitals, safety_floor

    for r in rows:
        if r["rule"].startswith("D:") and safety_floor(parse_vitals(r["text"]), 3).level > 2:
            r["level"], r["rule"] = 3, "C:2+resources(danger vitals not in text,rev3)"
    return rows


def corpus_rows() -> list[dict]:
    """Every row of the current revision, in file order (deterministic)."""
    rows = build()
    seen = {r["text"].strip().lower() for r in rows}
    rows += [r for r in supplement(len(rows)) if r["text"].strip().lower() not in seen]
    return revision3(rows)


def main() -> None:
    rows = corpus_rows()
    with OUT.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {OUT}")
    print("levels", sorted(Counter(r["level"] for r in rows).items()))
    print("splits", sorted(Counter((r["split"], r["level"]) for r in rows).items()))
    print("styles", sorted(Counter(r["style"] for r in rows).items()))


if __name__ == "__main__":
    main()
