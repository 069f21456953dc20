"""The servers a benchmark compares, started one at a time with the same model, engine
sizes and port layout, and always stopped (process group, SIGTERM then SIGKILL).

    with start_system("triage", engine, port=8100, workdir=tmp) as srv:   # our service
        srv.url, srv.key
    with start_system("vllm-priority", engine, port=8100, workdir=tmp):   # stock vLLM
        ...
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SYSTEMS = ("triage", "vllm-fcfs", "vllm-priority", "triage-instance")
# the systems a load generator feeds *our* classifier's level as vLLM's `priority`: stock
# vLLM's priority queue, and `triage instance` (stock vLLM's server with our scheduler class
# inside: the engine half alone, as it runs behind `triage serve --backend remote`)
PRIORITY_FED = ("vllm-priority", "triage-instance")
MODEL_NAME = "smollm2-135m-instruct"
# "triage:KEY=VALUE+KEY=VALUE": our service with those options, so a benchmark compares
# settings of ours side by side in the same turns. A KEY that is a service setting
# (serving/settings.py) is passed as TRIAGE_KEY; any other is a policy option
# (TRIAGE_POLICY_PARAMS, values in JSON)
VARIANT_SEP, PARAM_SEP = ":", "+"


def alternating(names: list[str], turns: int) -> list[tuple[int, str]]:
    """(turn, name) for `turns` turns, every other turn in reverse (A B C, C B A, A B C, ...):
    a drift of the machine within a turn is not charged to the same system every time."""
    return [(t, n) for t in range(turns) for n in (names if t % 2 == 0 else names[::-1])]


def is_triage(name: str) -> bool:
    return name == "triage" or name.startswith("triage" + VARIANT_SEP)


def _variant_split(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """A `triage:...` name's raw KEY=VALUE items: (policy options, service settings)."""
    if not name.startswith("triage" + VARIANT_SEP):
        return {}, {}
    from serving.settings import Settings

    policy, settings = {}, {}
    for item in name.split(VARIANT_SEP, 1)[1].split(PARAM_SEP):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"{name!r}: options are KEY=VALUE joined by {PARAM_SEP!r}, e.g. triage:max_step_s=0.2")
        (settings if key in Settings.model_fields else policy)[key] = value
    return policy, settings


def variant_settings(name: str) -> dict[str, str]:
    """The service settings a `triage:...` system name carries, as the environment the
    service reads ({"TRIAGE_PREDICTOR_THREADS": "2"}); ValueError naming a bad value."""
    from pydantic import ValidationError

    from serving.settings import Settings

    items = _variant_split(name)[1]
    for key, value in items.items():
        try:
            Settings.__pydantic_validator__.validate_assignment(Settings.model_construct(), key, value)
        except ValidationError as e:
            raise ValueError(f"{name!r}: setting {key}={value!r}: {e.errors()[0]['msg']}") from None
    return {f"TRIAGE_{k.upper()}": v for k, v in items.items()}


def variant_params(name: str) -> dict:
    """The policy options a `triage:...` system name carries ({} for plain "triage"),
    values read as JSON; ValueError naming what is wrong."""
    out = {}
    for key, value in _variant_split(name)[0].items():
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    from serving.backends.vllm_backend import ENGINE_PROFILE
    from triage.profiles import load_profile

    try:   # as the engine will run them: over the engine profile's options
        load_profile(ENGINE_PROFILE).make_policy("triage", **out)
    except TypeError as e:       # an option the policy does not have
        raise ValueError(f"{name!r}: {e}") from None
    return out


def dir_name(name: str) -> str:
    """A system's name as a file name (its workdir, its JSON)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def check_system(name: str) -> None:
    """ValueError unless `name` is a system a benchmark can start."""
    if name in SYSTEMS:
        return
    if is_triage(name):
        variant_params(name)
        variant_settings(name)
        return
    raise ValueError(f"unknown system {name!r}; systems are {', '.join(SYSTEMS)} (or triage:KEY=VALUE+...)")


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class EngineSizes:
    """What every system runs with (the issue's burst setup: 32 seats, 2,048 batched tokens)."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0
    block_size: int = 32
    dtype: str = "float32"
    seed: int = 0
    prefix_caching: bool = True   # vLLM's default, on every system alike
    eager: bool = False           # every system without torch.compile (--enforce-eager): quick starts, for smoke runs


@dataclass
class Server:
    name: str
    url: str
    key: str | None
    proc: subprocess.Popen
    log: Path
    extra: dict = field(default_factory=dict)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def require_free_port(port: int) -> None:
    """BenchError naming the port when something already listens there."""
    if not port_free(port):
        raise BenchError(f"port {port} is in use: stop what holds it or pass --port")


def command(name: str, sizes: EngineSizes, port: int, workdir: Path, model: str,
            triage_env: dict | None = None) -> tuple[list[str], dict]:
    from serving.engine import vllm_env

    env = vllm_env()
    env["VLLM_SERVER_DEV_MODE"] = "1"   # stock vLLM's POST /reset_prefix_cache (reset_prefix_cache)
    if is_triage(name):
        params = variant_params(name)
        if params:
            env["TRIAGE_POLICY_PARAMS"] = json.dumps(params)
        env.update(variant_settings(name))
        env.update({"TRIAGE_PORT": str(port), "TRIAGE_DB_URL": f"sqlite:///{workdir / 'audit.db'}",
                    "TRIAGE_SPOOL_PATH": str(workdir / "spool.jsonl"), "TRIAGE_MAX_NUM_SEQS": str(sizes.max_num_seqs),
                    "TRIAGE_MAX_NUM_BATCHED_TOKENS": str(sizes.max_num_batched_tokens),
                    "TRIAGE_MAX_MODEL_LEN": str(sizes.max_model_len), "TRIAGE_KV_CACHE_GIB": str(sizes.kv_cache_gib),
                    "TRIAGE_PREFIX_CACHING": str(sizes.prefix_caching).lower(),
                    "TRIAGE_MODEL": model, "TRIAGE_ENGINE_ENFORCE_EAGER": str(sizes.eager).lower(),
                    # a benchmark's one client key sends every call: per-key abuse limits off
                    "TRIAGE_ROLE_LIMITS": BENCH_ROLE_LIMITS, **(triage_env or {})})
        return [sys.executable, "-m", "serving.cli", "serve", "--log-level", "warning"], env
    if name in ("vllm-fcfs", "vllm-priority"):
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", str(sizes.max_model_len), "--max-num-seqs", str(sizes.max_num_seqs),
                "--max-num-batched-tokens", str(sizes.max_num_batched_tokens), "--dtype", sizes.dtype,
                "--block-size", str(sizes.block_size), _prefix_flag(sizes), "--seed", str(sizes.seed),
                "--scheduling-policy", name.split("-", 1)[1], "--disable-uvicorn-access-log",
                *(["--enforce-eager"] if sizes.eager else [])], env
    if name == "triage-instance":
        from serving.instance.launch import instance_command

        return instance_command(port, model=model, max_num_seqs=sizes.max_num_seqs,
                                max_num_batched_tokens=sizes.max_num_batched_tokens,
                                max_model_len=sizes.max_model_len, prefix_caching=sizes.prefix_caching,
                                extra=["--enforce-eager"] if sizes.eager else None), env
    raise BenchError(f"unknown system {name!r}; systems are {', '.join(SYSTEMS)}")


def _prefix_flag(sizes: EngineSizes) -> str:
    return "--enable-prefix-caching" if sizes.prefix_caching else "--no-enable-prefix-caching"


BENCH_ROLE_LIMITS = ('{"client": {"rps": 100000, "burst": 100000, "concurrency": 100000}, '
                     '"admin": {"rps": 100000, "burst": 100000, "concurrency": 100000}}')
KEY_LINE = re.compile(r"^\s+client\s+(\S+)\s*$", re.M)
ADMIN_LINE = re.compile(r"^\s+admin\s+(\S+)\s*$", re.M)


def admin_key(log: Path) -> str | None:
    """The admin key our service printed at its first start (its log is appended to by
    later starts on the same workdir, which print none)."""
    keys = ADMIN_LINE.findall(log.read_text(errors="replace"))
    return keys[-1] if keys else None


def reset_prefix_cache(srv: Server, tries: int = 20) -> None:
    """Empty `srv`'s prefix cache: our service through its admin endpoint, stock vLLM (and
    `triage instance`) through vLLM's dev endpoint (VLLM_SERVER_DEV_MODE=1, set for every
    server a benchmark starts). A benchmark replays the same calls several times; without
    this, every repetition after the first found its prompts cached (a new call meets a
    cold cache)."""
    if is_triage(srv.name):
        url, headers = srv.url + "/admin/engine/reset-prefix-cache", {"Authorization": f"Bearer {admin_key(srv.log)}"}
    else:
        url, headers = srv.url + "/reset_prefix_cache", {}
    for _ in range(tries):
        try:
            r = httpx.post(url, headers=headers, timeout=30)
            body = r.json() if r.status_code == 200 else {}
            if body.get("success") or body.get("reset"):   # vLLM's answer, ours
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)   # refused while blocks are held: a request still finishing
    raise BenchError(f"{srv.name} did not empty its prefix cache (POST {url})")


@contextlib.contextmanager
def start_system(name: str, sizes: EngineSizes, *, port: int, workdir: Path, model: str,
                 timeout_s: float = 1200.0, triage_env: dict | None = None):
    """Start `name`, wait until it answers a chat completion, yield a `Server`, stop it.
    The wait is long: on a slow fresh machine our service's first start (compiling the
    model, then its standby engine) has taken 345 s and more."""
    require_free_port(port)
    workdir.mkdir(parents=True, exist_ok=True)
    cmd, env = command(name, sizes, port, workdir, model, triage_env)
    log = workdir / f"{dir_name(name)}.log"
    # appended: a service started again on the same workdir (bench serve --turns) finds its
    # key table filled and prints no key; the one its first start printed still holds
    with log.open("ab") as f:
        f.write(f"=== {name} started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
    srv = Server(name, f"http://127.0.0.1:{port}", None, proc, log)
    try:
        _wait_ready(srv, timeout_s)
        yield srv
    finally:
        stop(srv)


def _wait_ready(srv: Server, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if srv.proc.poll() is not None:
            raise BenchError(f"{srv.name} exited with code {srv.proc.returncode} while starting; "
                             f"its log ({srv.log}) ends:\n{srv.log_tail()}")
        if is_triage(srv.name) and srv.key is None:
            keys = KEY_LINE.findall(srv.log.read_text(errors="replace"))
            if keys:
                srv.key = keys[-1]
        if not is_triage(srv.name) or srv.key:
            try:
                r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                               headers={"Authorization": f"Bearer {srv.key or 'none'}"},
                               json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}],
                                     "max_tokens": 2, "temperature": 0})
                if r.status_code == 200 and not _standby_building(srv):
                    return
            except httpx.HTTPError:
                pass
        time.sleep(1.0)
    raise BenchError(f"{srv.name} did not become ready within {timeout_s:.0f} s; its log ({srv.log}) ends:\n"
                     f"{srv.log_tail()}")


def _standby_building(srv: Server) -> bool:
    """Our service is still building its standby engine (serving.engine): a measurement
    waits for it, since the build takes the CPU the measurement needs."""
    if not is_triage(srv.name):
        return False
    return httpx.get(srv.url + "/readyz", timeout=30).json().get("engine_standby") == "building"


def stop(srv: Server, grace_s: float = 30.0) -> None:
    p = srv.proc
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
    except ProcessLookupError:
        pass
    try:  # engine workers that outlive their parent (vLLM's worker processes)
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
