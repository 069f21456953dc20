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


# --------------------------------------------------------------------------------------
# Revision 4: traffic that is not a dispatch request (see DATACARD.md). A dispatch centre's
# front end also receives chat, writing requests, code questions, trivia, paperwork and
# health questions that describe no patient. ESI has no level for "not a patient"; they
# are labelled 5 (wait behind every caller), kind "non_dispatch". Many are written to
# look alarming (metaphors, "emergency!" openers, medical words in a story request) so
# the model learns the framing, not the vocabulary. Beside them, real emergencies written
# in the same casual, off-topic framing (kind "dispatch", style "casual") keep 1 and 2.
# --------------------------------------------------------------------------------------

ND_SEED = SEED + 3

_ND_FILL = {
    "adj": ["long", "short", "funny", "sad", "heartwarming", "spooky", "500-word", "two-paragraph", "rhyming", "dramatic",
            "children's", "very short", "bittersweet", "suspenseful"],
    "form": ["story", "poem", "haiku", "essay", "limerick", "song", "blog post", "speech", "bedtime story", "screenplay scene",
             "short story", "sonnet", "diary entry", "letter", "fairy tale", "rap verse"],
    "topic": ["a dog", "a lost cat", "the ocean", "autumn leaves", "a lighthouse keeper", "a robot who learns to paint",
              "my grandmother's kitchen", "a dragon who is afraid of fire", "a haunted house", "time travel", "friendship",
              "a rainy day in Paris", "a small town bakery", "the first day of school", "a pirate ship", "a space station",
              "a detective in Tokyo", "a talking tree", "coffee", "the moon landing", "a penguin who wants to fly",
              "two rival chefs", "a forgotten umbrella", "the last bookshop in town", "a fox and a hedgehog",
              # medical or violent words, still a writing request
              "a heart attack", "a paramedic's night shift", "an ambulance crew on new year's eve", "a surgeon who saves a child",
              "a man who survives a stroke", "a nurse in the emergency room", "a firefighter rescuing a cat",
              "a hospital during a blackout", "a soldier bleeding on a battlefield", "someone drowning in sadness",
              "a zombie apocalypse", "a car crash and what came after", "a knight stabbed by a dragon", "a poisoned king",
              "a murder mystery on a train", "a heroic 911 dispatcher", "a patient waking from a coma", "a plague in a medieval town",
              "a grandfather's last day", "a seizure in a science fiction story", "a vampire who faints at the sight of blood"],
    "purpose": ["my creative writing class", "a school assignment", "my daughter's birthday", "a wedding toast", "a retirement party",
                "my blog", "a podcast intro", "a greeting card", "the company newsletter", "a bedtime read"],
    "occasion": ["my mom's 60th birthday", "a colleague leaving the team", "a wedding", "mother's day", "a graduation",
                 "our team's end-of-year party", "my best friend's engagement", "a dispatcher's retirement"],
    "author": ["dr seuss", "shakespeare", "hemingway", "edgar allan poe", "a pirate", "a noir detective", "a sports commentator"],
    "sentence": ["we regret to inform you the meeting has been moved to thursday",
                 "the results of the quarterly review were better than expected",
                 "our dog ran away and came back two days later very happy",
                 "please find attached the report you asked for",
                 "the heart of the matter is that nobody read the manual",
                 "i am writing to apply for the position of nurse educator",
                 "the hero collapsed on the floor as the villain laughed",
                 "the patient in my novel bleeds out before the doctor arrives",
                 "thank you for the lovely flowers you sent after my surgery",
                 "the new ambulance station opens on the first of march"],
    "opening": ["the ambulance siren faded into the night as", "it was a dark and stormy night and",
                "the old man clutched his chest and smiled, because", "nobody in the village had seen the dragon since",
                "she opened the letter and gasped:", "the detective found the body at dawn, and"],
    "language": ["spanish", "french", "german", "korean", "italian", "portuguese", "japanese"],
    "tone": ["more formal", "friendlier", "more persuasive", "less angry", "like a pirate", "shorter", "more professional"],
    "doc": ["cover letter", "essay", "email to my landlord", "wedding speech", "thesis abstract", "linkedin summary"],
    "n": ["2", "3", "5", "10", "12", "20"],
    "task": ["reverse a list", "read a csv file", "kill a process by name", "kill all child processes", "parse json",
             "sort a dictionary by value", "connect to postgres", "start a background thread", "handle a timeout",
             "catch an exception", "remove duplicates from an array", "merge two branches", "debug a segfault",
             "restart a dead worker", "terminate a hung thread", "profile memory usage", "fix a deadlock", "center a div",
             "shoot a request to an api", "execute a shell command", "abort a running job", "stop a runaway loop"],
    "lang": ["python", "javascript", "rust", "go", "java", "c++", "bash", "sql", "typescript", "kotlin", "php", "excel"],
    "error": ["a KeyError", "a segmentation fault", "a null pointer exception", "an out of memory error", "a stack overflow",
              "a fatal error", "exit code 137", "a broken pipe error", "an index out of range panic", "SIGKILL",
              "a heap corruption error", "'killed' and nothing else"],
    "thing": ["api server", "database", "worker", "container", "pod", "cron job", "cache", "load balancer", "build server",
              "web app", "microservice", "kafka consumer", "redis node", "test runner"],
    "action": ["save a file", "open the settings page", "upload an image", "run the migrations", "log in", "deploy"],
    "port": ["8080", "3000", "5432", "443", "8000"],
    "pct": ["3", "5", "8", "10"],
    "concept": ["recursion", "a hash table", "dependency injection", "garbage collection", "a deadlock", "kubernetes",
                "a memory leak", "big o notation", "a race condition", "the heartbeat protocol in raft"],
    "pair": ["a list and a tuple", "threads and processes", "tcp and udp", "git merge and git rebase", "sql and nosql",
             "kill -9 and kill -15", "a fork and a clone"],
    "country": ["france", "japan", "peru", "canada", "kenya", "australia", "norway", "vietnam", "chile", "egypt"],
    "book": ["pride and prejudice", "the hobbit", "one hundred years of solitude", "frankenstein", "war and peace",
             "the old man and the sea", "a tale of two cities"],
    "city": ["lisbon", "seoul", "rome", "montreal", "cape town", "kyoto", "berlin", "mexico city", "edinburgh"],
    "month": ["january", "april", "july", "october", "december"],
    "animal": ["octopuses", "penguins", "elephants", "owls", "dolphins", "bats", "giraffes", "cats"],
    "landmark": ["the eiffel tower", "mount everest", "the statue of liberty", "big ben", "the great pyramid"],
    "event": ["the fall of the berlin wall", "the first moon landing", "the printing press", "the french revolution",
              "the first heart transplant", "the discovery of penicillin"],
    "acct_field": ["mailing address", "phone number", "email address", "emergency contact", "billing address", "last name"],
    "service": ["the ambulance transport", "my clinic visit", "the first aid course", "the cpr training", "the x-ray",
                "my physio sessions", "the patient transfer"],
    "date": ["march 3rd", "last tuesday", "the 14th of june", "january", "last month", "2023"],
    "day": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday"],
    "complaint": ["the wait time last month", "a rude receptionist", "the parking fees", "a billing error",
                  "the noise from the ambulance bay at night", "the hold music on your phone line"],
    "appt": ["appointment", "physio session", "dental cleaning", "vaccination appointment", "eye test", "annual check-up"],
    "admin_topic": ["a parking permit", "my pension", "overtime pay", "the fire safety certificate renewal",
                    "the volunteer program", "a shift swap", "the new radio equipment", "my holiday allowance"],
    "supply": ["stretchers", "radios", "defibrillator batteries", "first aid kits", "oxygen cylinders", "printer cartridges"],
    "renew": ["driving licence", "first aid certificate", "paramedic registration", "parking permit", "passport"],
    "show": ["the crown", "stranger things", "the office", "grey's anatomy", "succession", "the bear"],
    "media": ["movie", "book", "podcast", "tv series", "board game", "album"],
    "title": ["the martian", "breaking bad", "the hunger games", "pride and prejudice", "er", "house md"],
    "ingredients": ["eggs, spinach and feta", "leftover rice", "chickpeas and tomatoes", "chicken and lemons", "two potatoes"],
    "game": ["candy crush", "zelda", "elden ring", "minecraft", "chess puzzles"],
    "feature": ["dark mode", "chat", "legacy export", "auto-save", "beta dashboard"],
    "supplement": ["vitamin d", "omega 3", "magnesium", "zinc", "probiotics", "green tea", "creatine", "vitamin b12", "iron tablets"],
    "condition": ["a stroke", "a heart attack", "diabetes", "sepsis", "dehydration", "high blood pressure", "anemia", "a concussion"],
    "skill": ["become a paramedic", "learn cpr", "get a first aid certificate", "train as a nurse", "become a 911 dispatcher",
              "pass the emt exam", "volunteer with the red cross"],
    "test": ["an ecg", "a ct scan", "hba1c", "a full blood count", "a cholesterol test", "an mri", "a blood oxygen reading"],
    "process": ["the immune system", "insulin", "blood clotting", "the heart's electrical system", "digestion", "sleep cycles",
                "how vaccines train the body"],
    "pair_med": ["a cold and the flu", "a heart attack and cardiac arrest", "type 1 and type 2 diabetes", "an mri and a ct scan",
                 "a virus and a bacterium", "a sprain and a strain", "ibuprofen and paracetamol"],
    "goal": ["sleeping better", "lowering cholesterol", "a healthy pregnancy diet", "running a first marathon", "quitting smoking",
             "eating less sugar", "staying hydrated in summer", "improving posture at a desk"],
    "nutrient": ["iron", "potassium", "fibre", "vitamin c", "protein", "calcium"],
    "exam": ["nursing exam", "emt exam", "anatomy midterm", "first aid test", "biology final"],
    "subject": ["cardiac anatomy", "the bones of the hand", "drug dosage maths", "the cranial nerves", "the stages of shock"],
}

ND_TEMPLATES = {
    "writing": [
        "write a {adj} {form} about {topic}", "can you write me a {form} about {topic}", "please write a {form} for {occasion}",
        "i need a {adj} {form} about {topic} for {purpose}", "write a {form} about {topic} in the style of {author}",
        "give me {n} ideas for a {form} about {topic}", "help me write a {form} about {topic}, around {n}00 words",
        "rewrite this sentence to sound {tone}: {sentence}", "make this paragraph shorter: {sentence}",
        "proofread my {doc}: {sentence}", "translate into {language}: {sentence}", "suggest a title for my {form} about {topic}",
        "continue this story: {opening}", "write a {adj} {form} that starts with '{opening}'",
        "i'm writing a novel, chapter {n}: {topic}. can you draft the opening paragraph",
        "compose a {form} for {occasion}, keep it {adj}",
    ],
    "code": [
        "how do i {task} in {lang}", "my {lang} {thing} keeps throwing {error}, any idea why",
        "write a {lang} function to {task}", "explain {concept} like im five", "what's the difference between {pair}",
        "the build is on fire again, {n} tests failing since the last merge",
        "this bug is killing me, the {thing} crashes every time i {action}",
        "how do i kill the process that is hogging port {port}", "our {thing} died overnight and nobody got paged, how do i set up alerts",
        "the {thing} is bleeding memory, how do i find the leak", "the {thing} keeps choking under load, what should i tune",
        "the heartbeat between the {thing} and the leader keeps timing out", "the health check on the {thing} fails and the pod is dead",
        "zombie processes everywhere after the deploy, how do i reap them in {lang}",
        "my laptop is dying, battery at {pct} percent, how do i save my work fast",
        "the parent process gets killed and orphans its children, how do i fix that in {lang}",
        "the ci pipeline flatlined after the upgrade, {n} jobs stuck", "production is down and my manager is having a heart attack, how do i roll back the deploy",
        "my {lang} code is a crime scene, can you help me refactor it", "execute the script and shoot me the output, it should {task}",
        "{lang} says {error} when i {action}, help", "why does my {thing} get OOM-killed after {n} hours",
        "fatal: not a git repository, what did i break", "code review: is it ok to {task} inside a loop in {lang}",
    ],
    "trivia": [
        "what is the capital of {country}", "who wrote {book}", "why is the sky blue", "when did {event} happen",
        "how tall is {landmark}", "what is the population of {city}", "fun facts about {animal}", "how do {animal} sleep",
        "how many bones are in the human body", "how long is the small intestine", "what does the appendix do",
        "how many times does the heart beat in a day", "who invented the defibrillator", "when was the first ambulance service started",
        "why do we yawn", "what is the biggest organ of the body", "which country has the most islands", "how old is the universe",
        "what language do they speak in {country}", "who painted the mona lisa", "how deep is the ocean", "is {city} bigger than {country}'s capital",
        "what's the national dish of {country}", "how long do {animal} live", "quick trivia question: {event}, what year",
    ],
    "admin": [
        "please update the {acct_field} on my account", "i need a copy of the invoice for {service} from {date}",
        "how do i request my medical records from {date}", "what are your office hours on {day}",
        "i want to file a complaint about {complaint}", "can you reset my password, i got locked out of the portal",
        "i need to reschedule my {appt} from {day} to next week", "please send HR {n} copies of the signed contract",
        "is the expense form due by {day}", "who do i talk to about {admin_topic}", "book the training room for the cpr refresher on {day}",
        "our station needs {n} new {supply}, who signs the purchase order", "when is the next fire drill",
        "shift swap request: can someone take my {day} night shift", "the coffee machine in the dispatch room is broken again, who do i call",
        "send me the form to renew my {renew}", "what's the fax number for the billing office", "please cancel my subscription from {date}",
        "can i get a receipt for {service}", "my timesheet for week {n} is wrong, i worked {n} hours overtime",
        "how do i add my newborn to the insurance policy", "where do i send the incident report from {date}",
        "reminder: staff meeting {day} at 9, agenda attached", "what's the status of my refund for {service}",
    ],
    "chat": [
        "hi how are you today", "good morning! anything fun planned", "hey can you hear me", "thanks, you're a lifesaver",
        "lol that joke killed me", "i'm dying to know how {show} ends", "tell me a joke about {animal}",
        "recommend a {media} like {title}", "what should i cook with {ingredients}", "i'm so bored, give me something to do",
        "i'm dead tired after work, what's a good show to fall asleep to", "i could murder a pizza right now, what toppings",
        "this heat is killing me, how do i keep my flat cool", "help me plan a {n}-day trip to {city}",
        "give me a beginner workout plan", "what's the weather usually like in {city} in {month}", "what's your favourite {media}",
        "my sister is driving me crazy, how do i ask her to stop borrowing my clothes", "do you dream", "say something nice",
        "i nearly died laughing at the {show} finale", "who would win, {animal} or {animal}", "what's a good name for a goldfish",
        "i'm bored at the station, night shift is quiet, tell me a story",
    ],
    "metaphor": [
        "let's get to the heart of the matter: the {feature} project is over budget", "shoot me an email when the report is ready",
        "sales flatlined in {month}, can you draft a plan to revive them", "the project is bleeding money, write a summary for the board",
        "i'm drowning in emails, help me write an out of office reply", "we need to kill the {feature} feature, how do i tell the team",
        "my boss will kill me if the {doc} is late, can you help me finish it", "the quarterly numbers are a bloodbath, how do i present them",
        "our startup is on life support, what are our options", "the stock market crashed today, should i worry about my pension",
        "that presentation was a train wreck, how do i recover", "emergency! i forgot my wife's birthday, what gift can i get today",
        "urgent: the printer on floor {n} is jammed again", "help! my sourdough starter died", "help, i'm stuck on level {n} of {game}",
        "my phone is dead, how do i move my contacts to the new one", "the plant in the office is dying, how often should i water it",
        "my car battery died in the parking lot, how do i jump start it", "break a leg at the audition! what should i write in the card",
        "this deadline is going to give me a heart attack, help me plan my week", "the team morale is on the floor, ideas for a fun friday",
        "the meeting was dead on arrival, how do i pitch the idea again", "our wifi is on its last breath, which router should i buy",
        "the old database is a ticking time bomb, how do we migrate", "i'm choking on paperwork, any tips to get organised",
        "it's a matter of life and death: which pizza place is open late in {city}",
    ],
    "health_info": [
        "what are the benefits of {supplement}", "how much water should i drink a day", "how many hours of sleep does an adult need",
        "is coffee bad for your heart", "what are the warning signs of {condition}", "how do i {skill}", "what does {test} measure",
        "explain how {process} works", "what's the difference between {pair_med}", "tips for {goal}", "what foods are high in {nutrient}",
        "quiz me on {subject} for my {exam}", "is it safe to drink coffee while breastfeeding", "how long does a flu shot take to work",
        "should i take {supplement} in the morning or at night", "what's a normal resting heart rate for adults",
        "how is {condition} treated in general", "write a summary of the latest cpr guidelines for a {exam}",
        "what are good stretches for someone who sits all day", "does cracking your knuckles cause arthritis",
        "how do i read the nutrition label on cereal", "my doctor said my cholesterol is a bit high, what should i eat",
        "what vaccines does a 1 year old usually get", "how often should i replace my toothbrush",
    ],
}
ND_TARGET = {"writing": 100, "code": 100, "trivia": 70, "admin": 90, "chat": 80, "metaphor": 80, "health_info": 90}

# Real emergencies in casual, off-topic framing: dispatch requests, labelled by their complaint.
CASUAL_OPEN = ["lol ", "ok so ", "sorry not a coding question but ", "brb actually ", "hey so um ", "not joking this time, ",
               "forget the essay, ", "stop the story, this is real: ", "idk who else to ask but ", "sorry to interrupt the chat, ",
               "this is real not a metaphor: ", "ignore my last message, ", "omg ", "guys ", "uh help?? ", "wait ",
               "the build can wait, ", "sorry for the weird question but "]
CASUAL_CLOSE = ["", "", " what do i do", " not kidding", " lol what do i do", " pls", " is this bad??", " should i call someone",
                " srsly", " what now"]
SAFETY_L1 = ["the house is on fire and {who} is still inside", "{who} fell through the ice on the lake and isnt coming up",
             "a car crashed into the bus stop and {who} is trapped under it, not moving",
             "{who} was pulled out of the smoke and isnt breathing"]
SAFETY_L2 = ["gas smell in the flat and {who} is dizzy and vomiting", "{who} got stabbed in the arm outside the bar, bleeding a lot",
             "{who} breathed in smoke from the kitchen fire and is coughing and confused"]
CASUAL_N = {1: 50, 2: 40}
_OBJECT_PRONOUN = [(" wake he ", " wake him "), (" wake she ", " wake her "), ("cut he ", "cut him "), ("cut she ", "cut her "),
                   (" he throat", " his throat"), (" she throat", " her throat"), (" he speech", " his speech"),
                   (" she speech", " her speech"), (" he head", " his head"), (" she head", " her head"),
                   (" he life", " his life"), (" she life", " her life"), (" he self", " himself"), (" she self", " herself"),
                   (" heself", " himself"), (" sheself", " herself"), ("kill he", "kill him"), ("kill she", "kill her")]


def _nd_fill(rng: random.Random, template: str) -> str:
    out = template
    while "{" in out:
        start = out.index("{")
        key = out[start + 1 : out.index("}", start)]
        out = out[:start] + rng.choice(_ND_FILL[key]) + out[out.index("}", start) + 1 :]
    return out


def _nd_surface(rng: random.Random, text: str) -> str:
    if rng.random() < 0.45:
        text = text[0].upper() + text[1:]
    if text[-1] not in "?!.:)" and rng.random() < 0.5:
        question = text.split(" ")[0].lower() in ("what", "how", "who", "why", "when", "is", "does", "should", "can", "which", "where")
        text += "?" if question else rng.choice([".", "!", ", thanks"] + ([] if "please" in text else [", please"]))
    return text


def _split_rows(rows: list[dict], key: str, rng: random.Random) -> None:
    for group in sorted({r[key] for r in rows}, key=str):
        idx = [i for i, r in enumerate(rows) if r[key] == group]
        rng.shuffle(idx)
        n_tr, n_va = int(len(idx) * SPLIT[0]), int(len(idx) * SPLIT[1])
        for j, i in enumerate(idx):
            rows[i]["split"] = "train" if j < n_tr else "validation" if j < n_tr + n_va else "test"


def non_dispatch(start_id: int, seen: set[str]) -> list[dict]:
    """Revision 4 rows, appended after revision 3's 2,810 (which keep ids, texts and splits):
    non-dispatch texts (level 5, kind "non_dispatch", style = their category) and real
    emergencies written casually (kind "dispatch", style "casual", level 1 or 2).
    Split 70/15/15 within each style (casual: within each level)."""
    rng = random.Random(ND_SEED)
    nd: list[dict] = []
    for style, n in ND_TARGET.items():
        got, tries = 0, 0
        while got < n and tries < n * 200:
            tries += 1
            core = _nd_fill(rng, rng.choice(ND_TEMPLATES[style]))
            if core.lower() in seen:  # one row per filled template, whatever its surface
                continue
            seen.add(core.lower())
            text = _nd_surface(rng, core)
            nd.append({"text": text, "level": 5, "style": style, "rule": "N:non-dispatch", "kind": "non_dispatch"})
            got += 1
    _split_rows(nd, "style", rng)
    casual: list[dict] = []
    for level, n in CASUAL_N.items():
        got, tries = 0, 0
        while got < n and tries < n * 200:
            tries += 1
            who, pro = rng.choice([w for w in WHO_LAY if w[0] != "i"])
            if rng.random() < 0.15:
                phrase, rule = rng.choice(SAFETY_L1 if level == 1 else SAFETY_L2), "A:safety" if level == 1 else "B:safety"
            else:
                phrase = rng.choice(rng.choice(L1 if level == 1 else L2)[1])
                rule = "A:life-saving-intervention" if level == 1 else "B:high-risk"
            if ("pregnant" in phrase and pro == "he") or ("testicle" in phrase and pro == "she"):
                continue
            body = phrase.format(who=who, pro=pro)
            for a, b in _OBJECT_PRONOUN:
                body = body.replace(a, b)
            text = rng.choice(CASUAL_OPEN) + body + rng.choice(CASUAL_CLOSE)
            if text.strip().lower() in seen:
                continue
            seen.add(text.strip().lower())
            casual.append({"text": text, "level": level, "style": "casual", "rule": rule, "kind": "dispatch"})
            got += 1
    _split_rows(casual, "level", rng)
    rows = nd + casual
    rng.shuffle(rows)
    for i, r in enumerate(rows):
        r["id"] = f"t{start_id + i:05d}"
    return [{k: r[k] for k in FIELDS} for r in rows]


FIELDS = ("id", "text", "level", "split", "style", "rule", "kind")


# --------------------------------------------------------------------------------------
# Revision 5 (see DATACARD.md). ESI v4's decision point A names "SpO2 < 90" among the
# conditions that need an immediate life-saving intervention (the floors used 85 until
# now). (a) Rows whose text shows a level-1 reading under the revised floors of
# `predictors.vitals` (13 rows labelled 2 with SpO2 86-89) are relabelled 1; texts, ids
# and splits are unchanged. (b) Level-1 patients who are awake: every earlier level-1
# nurse message had the patient unresponsive or responding to pain only, so the model
# could read "mental: unresponsive" as the whole of level 1. The handbook's examples of
# level-1 patients (ESI v4, chapter 3) include many who talk: severe respiratory
# distress, SpO2 < 90, anaphylactic shock, chest pain with BP 70/palp, "weak and dizzy,
# HR 30", severe bradycardia or tachycardia with hypoperfusion, hypotension with signs of
# hypoperfusion, trauma needing immediate fluid resuscitation, an overdose breathing 6
# times a minute, hypoglycemia with a change in mental status. These are written here
# (fragments of our own, none taken from any data set), alert or confused, with the vital
# sign that makes them level 1 where the style has a vitals line.
# --------------------------------------------------------------------------------------

REV5_SEED = SEED + 5
# (nurse shorthand, the reading that makes it level 1, lay phrasings); readings:
# spo2 (< 90 with a fast RR), sbp (< 70 with a fast HR), hr_low (< 40), hr_high (> 180),
# rr_low (< 8), none (the complaint itself: vitals otherwise unremarkable)
L1_AWAKE = [
    (["severe resp distress", "dyspnea, speaks in single words", "asthma attack, silent chest", "COPD exacerbation, cyanotic",
      "acute pulmonary edema, frothy sputum", "resp distress, accessory muscle use", "SOB, tripod position, cyanosis"], "spo2",
     ["{who} cant breathe, can only say one word at a time and the lips are going blue",
      "{who} is having an asthma attack, the inhaler does nothing and {pro} can barely talk",
      "{who} is sitting bolt upright gasping for air and coughing up pink froth",
      "{who} is fighting for every breath, the skin around the lips is grey"]),
    (["stridor, airway compromise", "foreign body airway, stridor", "angioedema, drooling, stridor", "epiglottitis sx, drooling"],
     "spo2",
     ["{who} is making a high pitched noise with every breath and is drooling, cant swallow",
      "{who} has something stuck in the throat, can only wheeze and point, getting blue"]),
    (["anaphylactic shock", "anaphylaxis, hypotensive", "allergic reaction, hypotension, wheeze", "bee sting, hypotensive, hives"],
     "sbp",
     ["{who} was stung by a wasp, is covered in hives, lips swelling and keeps nearly fainting",
      "{who} ate something with nuts, face is swollen, wheezing and {pro} is pale and dizzy, can hardly stand"]),
    (["chest pain, pale, diaphoretic, BP 70/palp", "cardiogenic shock", "STEMI, hypotensive", "chest pain, cold clammy, hypotension"],
     "sbp",
     ["{who} has crushing chest pain, is grey and drenched in sweat and says {pro} is going to pass out",
      "{who} has chest pain and is cold, clammy and very pale, pulse is weak"]),
    (["weak and dizzy, bradycardia", "complete heart block, dizzy", "bradycardia, near syncope", "symptomatic bradycardia"], "hr_low",
     ["{who} feels weak and dizzy, the pulse is only about 30 and {pro} nearly fainted twice",
      "{who}'s heartbeat is really slow, like 30, and {pro} is grey and woozy"]),
    (["SVT, hypotensive", "palpitation, HR over 200, dizzy", "wide complex tachycardia", "rapid AF with hypotension"], "hr_high",
     ["{who}'s heart is racing way too fast to count, {pro} is pale, sweaty and about to pass out",
      "{who} says the heart is pounding, the watch says 210 and {pro} feels faint"]),
    (["hematemesis, massive", "GI bleeding, hypotensive", "massive hemoptysis", "postpartum hemorrhage", "suspected ruptured AAA"],
     "sbp",
     ["{who} is vomiting lots of bright red blood and is pale and shaking",
      "{who} is coughing up cupfuls of blood and getting weak",
      "{who} has sudden terrible back pain, is white as a sheet and the pulse is barely there"]),
    (["MVA, hypotensive", "stab wound abdomen, shocked", "pelvic fx, hypotensive", "chest trauma, absent breath sounds",
      "crush injury, hypotensive"], "sbp",
     ["{who} was stabbed in the stomach, is very pale and cold and breathing fast",
      "{who} was thrown off a motorbike, is awake but pale, clammy and the pulse is weak",
      "{who} got crushed by a car that fell off the jack, talking but grey and sweaty"]),
    (["hypoglycemia, AMS", "BST 30, confused", "insulin OD, diaphoretic, confused", "hypoglycemia, combative"], "none",
     ["{who} is diabetic, sugar reads 30, sweating buckets and not making sense",
      "{who} took too much insulin and is now shaky, sweaty and talking gibberish"]),
    (["septic shock", "fever, hypotension, mottled skin", "petechial rash, fever, drowsy", "urosepsis, hypotensive, confused"],
     "sbp",
     ["{who} has a high fever, is confused and there is a purple rash that doesnt fade",
      "{who} has a fever, is cold and mottled on the legs and barely makes sense"]),
    (["opioid OD, RR 6, drowsy", "overdose, slow breathing", "benzo and alcohol OD, hypoventilation"], "rr_low",
     ["{who} took a lot of pain pills, is very drowsy and only breathing a few times a minute",
      "{who} overdosed, {pro} mumbles when shaken but hardly breathes"]),
]
AWAKE_MENTAL = ["alert", "A", "alert, anxious", "verbal", "V", "confused", "drowsy"]
AWAKE_MENTAL_ALTERED = ["verbal", "V", "confused", "drowsy", "disoriented"]
REV5_N = {"nurse": 90, "dispatch": 40, "lay": 30, "nonnative": 10, "typo": 10}


def _level1_vitals(rng: random.Random, age: int, reading: str) -> dict:
    """Adult vital signs whose `reading` meets ESI decision point A under `predictors.vitals`."""
    v = vitals(rng, age, "normal")
    if reading == "spo2":
        v["SpO2"], v["RR"], v["HR"] = rng.randint(72, 89), rng.randint(28, 44), rng.randint(100, 140)
    elif reading == "sbp":
        v["SBP"], v["HR"] = rng.randint(50, 68), rng.randint(118, 160)
    elif reading == "hr_low":
        v["HR"], v["SBP"] = rng.randint(24, 38), rng.randint(72, 96)
    elif reading == "hr_high":
        v["HR"], v["SBP"] = rng.randint(185, 230), rng.randint(68, 92)
    elif reading == "rr_low":
        v["RR"], v["SpO2"] = rng.randint(4, 7), rng.randint(80, 93)
    v["DBP"] = max(25, int(v["SBP"] * rng.uniform(0.55, 0.68)))
    return v


def revision5_relabel(rows: list[dict]) -> list[dict]:
    """(a): a row whose text meets a level-1 floor of `predictors.vitals` is labelled 1."""
    sys.path.insert(0, str(HERE.parents[1]))
    from predictors.vitals import parse_vitals, safety_floor

    for r in rows:
        if r["level"] > 1 and safety_floor(parse_vitals(r["text"]), r["level"]).level == 1:
            r["level"], r["rule"] = 1, "A:SpO2<90(rev5)"
    return rows


def awake_level1(start_id: int, seen: set[str]) -> list[dict]:
    """(b): level-1 patients who are awake, in the dispatch styles; split 70/15/15 per style."""
    rng = random.Random(REV5_SEED)
    rows: list[dict] = []
    for style, n in REV5_N.items():
        got, tries = 0, 0
        while got < n and tries < n * 200:
            tries += 1
            shorts, reading, lays = rng.choice(L1_AWAKE)
            age = rng.randint(18, 92)
            altered = reading in ("none", "rr_low") or "confused" in shorts[0] or "drowsy" in shorts[0]
            v = _level1_vitals(rng, age, reading)
            who, pro = rng.choice([w for w in WHO_LAY if w[0] != "i"])
            if any(w in shorts[0] + lays[0] for w in ("fever", "sepsis", "septic")):
                v["BT"] = round(rng.uniform(38.4, 40.2), 1)
            if style == "nurse":
                mental = rng.choice(AWAKE_MENTAL_ALTERED if altered else AWAKE_MENTAL)
                text = nurse(rng, rng.choice(shorts), age, v, mental, None, 1)
            elif style == "dispatch":
                text = dispatch(rng, rng.choice(lays), who, pro, age, v if reading != "none" else None)
            elif style == "nonnative":
                text = nonnative(rng, rng.choice(lays), who, pro, age)
            else:
                base = lay(rng, rng.choice(lays), who, pro, age)
                text = typo(rng, base) if style == "typo" else base
            for a, b in _OBJECT_PRONOUN:
                text = text.replace(a, b)
            if "gave birth" in text and pro == "he":
                continue
            key = text.strip().lower()
            if key in seen:
                continue
            seen.add(key)
            rows.append({"text": text, "level": 1, "style": style, "rule": "A:life-saving-intervention(awake,rev5)",
                         "kind": "dispatch"})
            got += 1
    _split_rows(rows, "style", rng)
    rng.shuffle(rows)
    for i, r in enumerate(rows):
        r["id"] = f"t{start_id + i:05d}"
    return [{k: r[k] for k in FIELDS} for r in rows]


def corpus_rows() -> list[dict]:
    """Every row of the current revision, in file order (deterministic)."""
    rows = build()
    seen = {r["text"].strip().lower() for r in rows}
    rows += [r for r in supplement(len(rows)) if r["text"].strip().lower() not in seen]
    rows = revision3(rows)
    for r in rows:  # revision 4: every row says whether it is a dispatch request
        r["kind"] = "dispatch"
    seen = {r["text"].strip().lower() for r in rows}
    rows += non_dispatch(len(rows), seen)
    rows = revision5_relabel(rows)
    seen = {r["text"].strip().lower() for r in rows}
    return rows + awake_level1(len(rows), seen)


def main() -> None:
    rows = corpus_rows()
    with OUT.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {OUT}")
    print("levels", sorted(Counter(r["level"] for r in rows).items()))
    print("splits", sorted(Counter((r["split"], r["level"]) for r in rows).items()))
    print("styles", sorted(Counter(r["style"] for r in rows).items()))
    print("kinds", sorted(Counter((r["kind"], r["split"]) for r in rows).items()))


if __name__ == "__main__":
    main()
