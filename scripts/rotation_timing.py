#!/usr/bin/env python3
"""What the online rotation costs on a modelled phone (issue 39 item 5): the same plan with and
without ``rotate_down=hadamard`` (QuaRot's online Hadamard on the down projection's input, op
``down_rotate`` in the task graph), prefill and decode, on the Snapdragon 8 Gen 3 and 8 Elite
profiles. The folded rotations (``rotate``, ``rotate_heads``) change weights only and cost
nothing; the table shows that too. The rotation runs where the plan places the activation (the
NPU in fp16 under llm.npu's placement), or with ``activation=cpu`` on the CPU. Times are
simulated from the task graph the engine would execute (its shapes, formats and placement), not
measured; ``--characterizations`` adds a profile's named cost-model variants (the 8 Gen 3's
``heterollm``: seed 002's NPU FP16 matmul rates instead of seed 001's). A config whose d_ff has
no Hadamard construction (Qwen1.5-1.8B's 5504 = 43 x 128) cannot take the online rotation.

    python scripts/rotation_timing.py [--json docs/results/rotation_timing.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.configs import known as known_configs  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402
from socllm.sim import simulate  # noqa: E402

QUAROT = "rotate=hadamard,rotate_down=hadamard,rotate_heads=hadamard"
ROTATIONS = {
    "none": "",
    "hadamard+heads (folded)": "rotate=hadamard,rotate_heads=hadamard",
    "quarot, down_rotate with act": QUAROT,
    "quarot, act on the CPU": QUAROT + ",activation=cpu",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="smollm2-135m,qwen2-1.5b,llama-3-8b")
    ap.add_argument("--characterizations", default=",heterollm")
    ap.add_argument("--devices", default="snapdragon-8gen3,snapdragon-8elite")
    ap.add_argument("--plans", default="w8a8,w4a16")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    print(f"prompt {a.prompt_len} tokens in chunks of {a.chunk}; decode: one step on that cache")
    print(
        f"{'config':<14}{'device':<18}{'cost':<10}{'plan':<7}{'rotation':<30}{'TTFT ms':>10}"
        f"{'decode ms':>10}  (vs none)"
    )
    for config in split_list(a.configs):
        # a shape-only config by name, else a real model's config
        cfg = (
            config
            if config in known_configs()
            else dict(socllm.load(config, progress=False).config)
        )
        for device in split_list(a.devices):
            have = {"", *socllm.sim.load_device(device).characterizations()}
            for char in [c for c in a.characterizations.split(",") if c in have]:
                for plan in split_list(a.plans):
                    base = {}
                    for name, parts in ROTATIONS.items():
                        p = f"{plan}:{parts}" if parts else plan
                        o = {"characterization": char}
                        pre = simulate(cfg, device, p, a.prompt_len, chunk=a.chunk, **o).summary()
                        dec = simulate(
                            cfg, device, p, a.prompt_len, chunk=None, phase="decode", **o
                        )
                        row = {"config": config, "device": device,
                               "characterization": char or "default", "plan": plan,
                               "rotation": name, "ttft_ms": pre["ttft_ms"],
                               "decode_ms": dec.summary()["tpot_ms"]}  # fmt: skip
                        base = base or row
                        row["ttft_overhead"] = row["ttft_ms"] / base["ttft_ms"] - 1
                        row["decode_overhead"] = row["decode_ms"] / base["decode_ms"] - 1
                        rows.append(row)
                        print(f"{config:<14}{device:<18}{row['characterization']:<10}{plan:<7}"
                              f"{name:<30}{row['ttft_ms']:>10.1f}{row['decode_ms']:>10.2f}  "
                              f"({100 * row['ttft_overhead']:+.1f}% / "
                              f"{100 * row['decode_overhead']:+.1f}%)")  # fmt: skip
    if a.json:
        atomic_write_text(Path(a.json), json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
