#!/usr/bin/env python3
"""Engine speed of two socllm checkouts, A/B, in one run on this machine: did a change to the
engine make it slower? Each checkout runs in its own subprocess with its own built module
(``<checkout>/python/socllm/_core*.so`` or the module its build directory holds), alternating
A, B, A, B ... so that both see the same machine; the best of ``--repeats`` per workload and
round is kept, and the table gives B / A per workload with the spread over rounds.

    git worktree add /tmp/before <commit> && (build it: cmake -S /tmp/before -B /tmp/before/build
        -DSOCLLM_BUILD_TESTS=OFF -G Ninja && ninja -C /tmp/before/build _core
        && cp /tmp/before/build/cpp/_core*.so /tmp/before/python/socllm/)
    python scripts/bench_engine_ab.py /tmp/before . [--rounds 3] [--json PATH]

Workloads (SmolLM2-135M, 2 threads): fp32 prefill of 512 and 2048 tokens, w8-group and w4a16
prefill of 512 (the plans whose fp16 float ops the engine emulates), 64 fp32 decode steps after
a 128-token prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, sys, time
# the checkout's package, not the one an editable install's import hook redirects to
sys.meta_path = [f for f in sys.meta_path if "socllm" not in type(f).__module__.lower()]
sys.path.insert(0, sys.argv[1])
import socllm
assert socllm.__file__.startswith(sys.argv[1]), socllm.__file__
socllm.set_log_level("warn"); socllm.set_num_threads(2)
m = socllm.load("smollm2-135m", progress=False)
from socllm.data import wikitext2_test_text
ids = m.tokenize(wikitext2_test_text()[:40000])[:2048]
reps = int(sys.argv[2])
def best(fn):
    fn(); xs = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); xs.append(time.perf_counter() - t)
    return min(xs)
res = {}
for plan, lens in (("fp32", (512, 2048)), ("w8-group", (512,)), ("w4a16", (512,))):
    for n in lens:
        res[f"{plan} prefill {n}"] = best(lambda: m.step(m.new_cache(n), ids[:n], plan=plan))
def decode():
    c = m.new_cache(200); m.step(c, ids[:128])
    for i in range(64): m.step(c, [ids[128 + i]])
res["fp32 decode 64"] = best(decode)
print(json.dumps(res))
"""


def package_root(checkout: Path, scratch: Path) -> Path:
    """The folder holding the checkout's ``socllm`` package with a built module: its
    ``python/`` when the module was copied there, else a folder of links to the package's files
    and to the newest module in the checkout's build directories (an editable install)."""
    pkg = checkout.resolve() / "python" / "socllm"
    if list(pkg.glob("_core*.so")):
        return pkg.parent
    built = sorted(
        checkout.resolve().glob("build/*/cpp/_core*.so"), key=lambda p: p.stat().st_mtime
    )
    if not built:
        raise SystemExit(
            f"bench_engine_ab: {checkout} has no built module (python/socllm or build/)"
        )
    root = scratch / checkout.resolve().name
    (root / "socllm").mkdir(parents=True, exist_ok=True)
    for entry in [*pkg.iterdir(), built[-1]]:
        link = root / "socllm" / entry.name
        if not link.exists():
            link.symlink_to(entry)
    return root


def run(root: Path, repeats: int, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(root), str(repeats)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode:
        raise SystemExit(f"bench_engine_ab: the worker for {root} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="checkout A (before)")
    ap.add_argument("b", type=Path, help="checkout B (after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    # The workers get the environment as it was: importing socllm here (for the machine line)
    # sets OPENBLAS_CORETYPE and libgomp's wait policy, which each checkout chooses for itself.
    env = dict(os.environ)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from socllm.eval.bench_utils import machine_line

    print(machine_line(), flush=True)
    t0 = time.time()
    scratch = Path(tempfile.mkdtemp(prefix="bench_engine_ab-"))
    try:
        a, b = package_root(args.a, scratch / "a"), package_root(args.b, scratch / "b")
        rounds = [
            (run(a, args.repeats, env), run(b, args.repeats, env)) for _ in range(args.rounds)
        ]
    finally:
        shutil.rmtree(scratch)
    keys = list(rounds[0][0])
    rows = {}
    print(f"{'workload':<22} {'A s':>8} {'B s':>8} {'B/A':>6}  (B/A per round)")
    for k in keys:
        ratios = [b[k] / a[k] for a, b in rounds]
        a_s = statistics.median(a[k] for a, _ in rounds)
        b_s = statistics.median(b[k] for _, b in rounds)
        rows[k] = {"a_s": a_s, "b_s": b_s, "b_over_a": statistics.median(ratios), "rounds": ratios}
        print(
            f"{k:<22} {a_s:>8.3f} {b_s:>8.3f} {rows[k]['b_over_a']:>6.2f}  "
            + " ".join(f"{r:.2f}" for r in ratios)
        )
    print(f"({args.rounds} rounds x {args.repeats} repeats, {time.time() - t0:.0f} s)")
    if args.json:
        from socllm.io.files import atomic_write_text

        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
