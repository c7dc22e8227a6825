"""Graceful under load (issue 37, item 6): socllm decode and prefill speed alone and with peers.

Each configuration (an environment for the worker processes) runs, in every round, worker
processes that load the default model (SmolLM2-135M, fp32) with ``--threads`` threads each and
then, on command and for ``--seconds`` each, run:

* decode: greedy-style single-token steps on a KV cache holding a ``--prompt-len`` prompt
  (tokens/s = steps / wall seconds of the phase; the step latencies' median and maximum too);
* prefill: ``--prompt-len``-token prefills on a fresh cache (tokens/s = prompt tokens / seconds);

first one worker alone, then ``--procs`` workers at once (started by the same command). The
ratio is a worker's speed beside its peers over its speed alone in the same round; the table
gives the median over rounds and the range. Rounds alternate the configurations' order (A B,
B A, ...), so that other work on the machine weighs on all of them alike, and each phase records
the CPUs other processes used meanwhile (from /proc): the table summarises the rounds in which
that stayed under ``--max-other-load``, if any. Issue 37 asks for a ratio of at least 0.40 with
two 2-thread processes on 2 cores.

``--config NAME:VAR=VALUE,...`` adds a configuration (repeatable; ``NAME:`` alone is the
environment as given). Without it there is one, ``default``: the environment as given, so the
workers use the wait policy socllm sets on import (python/socllm/__init__.py) unless the
environment sets one. libgomp's own default (300000 spins before sleeping, about 8 ms on Zen 4)
is ``GOMP_SPINCOUNT=300000``; fully passive waiting is ``OMP_WAIT_POLICY=PASSIVE``:

    python scripts/bench_load.py                      # socllm as configured
    python scripts/bench_load.py --rounds 6 --wait-quiet 600 --config before:GOMP_SPINCOUNT=300000 \
        --config after: --config passive:OMP_WAIT_POLICY=PASSIVE
    python scripts/bench_load.py --json out.json      # also the raw numbers (--json - : stdout)

The workers report the wait policy libgomp actually uses (its OMP_DISPLAY_ENV listing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The environment as given, before socllm's import sets its defaults in this process.
BASE_ENV = dict(os.environ)
REQUIRED_RATIO = 0.40
PHASES = ("decode", "prefill")


# -- worker -----------------------------------------------------------------------------------
def worker(threads: int, prompt_len: int, seconds: float) -> None:
    import socllm

    socllm.set_log_level("warn")
    m = socllm.load(socllm.DEFAULT_MODEL, progress=False)
    socllm.set_num_threads(threads)
    prompt = [1000 + (7 * i) % 20000 for i in range(prompt_len)]
    capacity = prompt_len + 4096
    m.step(m.new_cache(capacity), prompt)  # warm up: first-touch, BLAS buffers, thread team
    with open("/proc/self/maps") as f:
        maps = [ln.split()[-1] for ln in f if "libgomp" in ln]
    print(json.dumps({"ready": True, "libgomp": sorted(set(maps))}), flush=True)

    for line in sys.stdin:
        phase = line.strip()
        if phase not in PHASES:
            break
        calls: list[float] = []
        if phase == "decode":
            cache = m.new_cache(capacity)
            logits = m.step(cache, prompt)
            tokens_per_call = 1
        else:
            tokens_per_call = prompt_len
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            if phase == "decode":
                logits = m.step(cache, [int(logits[0].argmax())])
            else:
                m.step(m.new_cache(prompt_len), prompt)
            calls.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        print(
            json.dumps(
                {
                    "tok_s": tokens_per_call * len(calls) / elapsed,
                    "calls": len(calls),
                    "median_ms": 1e3 * statistics.median(calls),
                    "max_ms": 1e3 * max(calls),
                }
            ),
            flush=True,
        )


# -- driver -----------------------------------------------------------------------------------
class WorkerFailed(RuntimeError):
    pass


class Worker:
    def __init__(self, env: dict, args) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
        cmd += ["--threads", str(args.threads), "--prompt-len", str(args.prompt_len)]
        cmd += ["--seconds", str(args.seconds)]
        self.err = tempfile.TemporaryFile("w+")  # not a pipe: nobody reads it while it runs
        self.p = subprocess.Popen(
            cmd,
            env={**env, "OMP_DISPLAY_ENV": "VERBOSE"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            self.p.wait()
            err = self.stderr()
            raise WorkerFailed(f"worker exited with status {self.p.returncode}:\n{err}")
        return json.loads(line)

    def send(self, phase: str) -> None:
        self.p.stdin.write(phase + "\n")
        self.p.stdin.flush()

    def stderr(self) -> str:
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        return text

    def close(self) -> dict:
        """Stops the worker; libgomp's settings as its OMP_DISPLAY_ENV listing shows them."""
        self.p.stdin.close()
        self.p.wait()
        gomp = {}
        for ln in self.stderr().splitlines():
            key, sep, value = ln.strip().partition(" = ")
            if sep and key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"):
                gomp.setdefault(key, value.strip("'"))
        return gomp


def cpu_ticks(pids: list[int]) -> tuple[int, int]:
    """(busy ticks of the whole machine, steal included; ticks of the processes ``pids``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal
    own = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        own += int(fields[11]) + int(fields[12])  # utime stime (all threads)
    return busy, own


def timed(workers: list[Worker], phase: str) -> dict:
    """``phase`` on ``workers`` at once: their results and the CPUs other processes used
    meanwhile (``other_cpus``: machine busy time minus the workers', over the wall time)."""
    pids = [w.p.pid for w in workers]
    t0, (busy0, own0) = time.perf_counter(), cpu_ticks(pids)
    for w in workers:
        w.send(phase)
    results = [w._read() for w in workers]
    t1, (busy1, own1) = time.perf_counter(), cpu_ticks(pids)
    other = ((busy1 - busy0) - (own1 - own0)) / os.sysconf("SC_CLK_TCK") / (t1 - t0)
    return {"results": results, "other_cpus": max(0.0, other)}


def machine_load(seconds: float) -> float:
    """CPUs busy over ``seconds`` (all processes: the workers are not running)."""
    busy0, _ = cpu_ticks([])
    time.sleep(seconds)
    busy1, _ = cpu_ticks([])
    return (busy1 - busy0) / os.sysconf("SC_CLK_TCK") / seconds


def wait_quiet(limit: float, timeout: float) -> float:
    """Waits up to ``timeout`` s for 2 s in which other processes use at most ``limit`` CPUs;
    returns the last load seen."""
    end = time.monotonic() + timeout
    while True:
        load = machine_load(2.0)
        if load <= limit or time.monotonic() >= end:
            return load


def run_config(env: dict, args) -> dict:
    """One round of one configuration: each phase alone, then with ``procs`` workers at once."""
    workers: list[Worker] = []
    try:
        for _ in range(args.procs):
            workers.append(Worker(env, args))
        out: dict = {"libgomp": workers[0].info["libgomp"]}
        for phase in PHASES:
            alone = timed(workers[:1], phase)
            peers = timed(workers, phase)
            out[phase] = {
                "alone": alone["results"][0],
                "peers": peers["results"],
                "other_cpus": max(alone["other_cpus"], peers["other_cpus"]),
            }
        listings = [w.close() for w in workers]  # stops every worker
        out["gomp"] = listings[0]
        return out
    except BaseException as e:
        for w in workers:
            w.p.kill()
            w.p.wait()
        if isinstance(e, BrokenPipeError):
            raise WorkerFailed(f"a worker exited: {e}") from e
        raise


def parse_config(text: str) -> tuple[str, dict]:
    name, sep, assignments = text.partition(":")
    if not name or not sep:
        raise argparse.ArgumentTypeError(f"--config wants NAME:VAR=VALUE,..., got {text!r}")
    env = {}
    for item in filter(None, assignments.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not var:
            raise argparse.ArgumentTypeError(f"--config {text!r}: {item!r} is not VAR=VALUE")
        env[var] = value
    return name, env


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} [{min(xs):.3g}-{max(xs):.3g}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help="threads per worker (2)")
    ap.add_argument("--procs", type=int, default=2, help="workers at once (2)")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (128)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per phase (5)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per configuration (3)")
    ap.add_argument(
        "--max-other-load",
        type=float,
        default=0.25,
        help="summarise rounds in which other processes used at most this many CPUs (0.25)",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each round wait up to S s for the other load to fall under that (0)",
    )
    ap.add_argument("--config", type=parse_config, action="append", metavar="NAME:VAR=VALUE,...")
    ap.add_argument("--json", default=None, metavar="PATH|-")
    args = ap.parse_args()
    if args.worker:
        worker(args.threads, args.prompt_len, args.seconds)
        return 0
    if args.procs < 2 or args.rounds < 1 or args.seconds <= 0 or args.prompt_len < 1:
        ap.error("need --procs >= 2, --rounds >= 1, --seconds > 0 and --prompt-len >= 1")

    import socllm
    from socllm.eval.bench_utils import cpu_model, machine_line
    from socllm.io.files import check_output_path, emit_json

    if args.json:
        check_output_path(args.json, what="--json")
    configs = dict(args.config or [("default", {})])
    cpus = len(os.sched_getaffinity(0))
    blas = socllm.blas_info()
    out: dict = {
        "machine": machine_line(),
        "cpu": cpu_model(),
        "cpus": cpus,
        "isa": socllm.ops.isa(),
        "blas": blas,
        "threads": args.threads,
        "procs": args.procs,
        "prompt_len": args.prompt_len,
        "seconds": args.seconds,
        "configs": {name: {"env": env, "rounds": []} for name, env in configs.items()},
    }
    print(out["machine"])
    print(f"     ({blas['config']})")
    print(
        f"{args.procs} workers x {args.threads} threads, fp32 {socllm.DEFAULT_MODEL}, "
        f"prompt {args.prompt_len} tokens, {args.seconds:g} s per phase, {args.rounds} rounds"
    )
    names = list(configs)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if args.wait_quiet > 0:
                wait_quiet(args.max_other_load, args.wait_quiet)
            for attempt in range(3):  # a worker can die if the extension is replaced under it
                try:
                    res = run_config({**BASE_ENV, **configs[name]}, args)
                    break
                except WorkerFailed as e:
                    if attempt == 2:
                        raise
                    print(f"  round {r + 1} {name}: again ({str(e).splitlines()[0]})")
                    time.sleep(5)
            out["configs"][name]["rounds"].append(res)
            brief = "; ".join(
                f"{ph} {res[ph]['alone']['tok_s']:.0f} alone, "
                + " + ".join(f"{p['tok_s']:.0f}" for p in res[ph]["peers"])
                + f" with peers (other load {res[ph]['other_cpus']:.2f} CPUs)"
                for ph in PHASES
            )
            print(f"  round {r + 1} {name}: {brief}", flush=True)

    print()
    print(
        f"{'config':<9} {'libgomp':<14} {'phase':<8} {'rounds':<7} {'alone tok/s':<19} "
        f"{'with peers tok/s':<19} {'ratio':<19} step ms"
    )
    for name, c in out["configs"].items():
        g = c["rounds"][0]["gomp"]
        wait = f"spin {g.get('GOMP_SPINCOUNT', '?')}"
        summary = {}
        for ph in PHASES:
            # rounds in which other processes left the workers the machine, if there are any
            quiet = [x for x in c["rounds"] if x[ph]["other_cpus"] <= args.max_other_load]
            rounds = quiet or c["rounds"]
            alone = [x[ph]["alone"]["tok_s"] for x in rounds]
            peers = [p["tok_s"] for x in rounds for p in x[ph]["peers"]]
            ratios = [p["tok_s"] / x[ph]["alone"]["tok_s"] for x in rounds for p in x[ph]["peers"]]
            step = statistics.median([x[ph]["alone"]["median_ms"] for x in rounds])
            worst = max(p["max_ms"] for x in rounds for p in x[ph]["peers"])
            summary[ph] = {
                "rounds": len(rounds),
                "quiet": bool(quiet),
                "alone_tok_s": statistics.median(alone),
                "peers_tok_s": statistics.median(peers),
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
            used = f"{len(rounds)}/{len(c['rounds'])}" + ("" if quiet else "!")
            print(
                f"{name:<9} {wait:<14} {ph:<8} {used:<7} {spread(alone):<19} "
                f"{spread(peers):<19} {spread(ratios):<19} {step:.3g} / {worst:.4g}"
            )
        c["summary"] = summary
        c["pass"] = all(summary[ph]["ratio"] >= REQUIRED_RATIO for ph in PHASES)
    rounds = [x for c in out["configs"].values() for x in c["rounds"]]
    libgomp = sorted({path for x in rounds for path in x["libgomp"]})
    print(
        f"ratio: a worker's speed beside {args.procs - 1} peer(s) over its speed alone in the "
        f"same round; median [min-max] over the rounds in which other processes used at most "
        f"{args.max_other_load:g} CPUs ('!': none was, all rounds); step ms: median alone / "
        f"slowest beside peers; libgomp {', '.join(libgomp)}"
    )
    for name, c in out["configs"].items():
        verdict = "PASS" if c["pass"] else "FAIL"
        print(f"{verdict} {name}: issue 37 wants median ratios >= {REQUIRED_RATIO}")
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
