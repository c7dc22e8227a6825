"""socllm.eval.bench_utils.machine_line (issue 38 item 1): the one line on the machine that every
scripts/bench_*.py prints first and `socllm run` puts in its report: CPU, ISA features, CPU
count, BLAS library, version and kernels, and whether those are the best the CPU supports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from socllm.eval import bench_utils

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse3 avx avx2 fma bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni \
avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs \
paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU part\t: 0xd40

processor\t: 1
Features\t: fp asimd
CPU implementer\t: 0x41
CPU part\t: 0xd40

processor\t: 2
Features\t: fp asimd
"""


def _isa_words(line: str) -> list[str]:
    return re.search(r", ISA (.*?);", line).group(1).split()


def test_machine_line_of_a_fallback_core():
    """What the Xeon of issue 38 ran: its features, and Prescott named as not its best."""
    line = bench_utils.machine_line(
        SAPPHIRE_RAPIDS,
        {"corename": "Prescott", "config": "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH Prescott"},
        "avx512-vnni",
    )
    assert line.startswith("CPU Intel(R) Xeon(R) Platinum 8488C (family 6 model 143), 2 CPUs,")
    assert _isa_words(line) == ["AVX2", "AVX-512", "VNNI", "BF16", "AMX"]
    assert "OpenBLAS 0.3.21 Prescott kernels (NOT the best: this CPU supports Cooperlake)" in line
    assert line.endswith("INT8 kernels avx512-vnni")
    best = {"corename": "Cooperlake", "config": "OpenBLAS 0.3.21 DYNAMIC_ARCH"}
    assert "Cooperlake kernels (the best this CPU supports)" in bench_utils.machine_line(
        SAPPHIRE_RAPIDS, best, "avx512-vnni"
    )


def test_machine_line_on_aarch64():
    line = bench_utils.machine_line(
        GRAVITON3, {"corename": "NEOVERSEV1", "config": "OpenBLAS 0.3.26 DYNAMIC_ARCH"}, "scalar"
    )
    assert "implementer 0x41 part 0xd40, 3 CPUs," in line
    assert _isa_words(line) == ["asimd", "asimddp", "i8mm", "bf16", "sve"]
    assert "OpenBLAS 0.3.26 NEOVERSEV1 kernels (OpenBLAS's own choice)" in line


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs /proc/cpuinfo")
def test_machine_line_describes_this_machine():
    """Against /proc/cpuinfo read here, by other code than the line's."""
    import socllm
    from socllm import blas_core

    text = Path("/proc/cpuinfo").read_text()
    line = bench_utils.machine_line()
    names = re.findall(r"^model name\s*:\s*(.*?)\s*$", text, re.M)
    if names:
        assert f"CPU {names[0]}" in line
    cpus = len(re.findall(r"^processor\s*:", text, re.M))
    assert f"{cpus} CPUs" in line
    flags = set(re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M).group(1).split())
    isa = _isa_words(line)
    if "avx2" in flags or "avx" in flags:  # x86-64
        for word, flag in [
            ("AVX2", "avx2"),
            ("AVX-512", "avx512f"),
            ("VNNI", "avx512_vnni"),
            ("BF16", "avx512_bf16"),
            ("AMX", "amx_tile"),
        ]:
            assert (word in isa) == (flag in flags), (word, line)
    else:
        for flag in ("asimddp", "i8mm"):
            assert (flag in isa) == (flag in flags), (flag, line)
    blas = socllm.blas_info()
    library, version = blas["config"].split()[:2]
    assert f"{library} {version} {blas['corename']} kernels (" in line
    best = blas_core.best_core(frozenset(flags))
    if best is not None and blas_core.rank(blas["corename"]) <= blas_core.rank(best):
        assert "(the best this CPU supports)" in line
    assert line.endswith(f"INT8 kernels {socllm.ops.isa()}")
    assert bench_utils.run_provenance()["machine"] == line


def test_report_names_the_machine():
    """`socllm run`'s report.md: the machine line (CPU and BLAS core) under the model."""
    from socllm.eval.report import render_markdown

    machine = bench_utils.machine_line()
    report = {
        "model": {
            "name": "m",
            "config": {"name": "m", "arch": "llama", "n_layers": 1, "d_model": 8, "vocab_size": 9},
        },
        "load_seconds": 0.1,
        "machine": {"description": machine, "python": "3.11.7", "threads": 2},
        "generation": {"prompt": "p", "text": " t", "new_tokens": 1, "tokens_per_s": 1.0},
        "calibration": {"samples": 1, "seqlen": 8, "slice": "start", "seed": 0},
        "wikitext2": [],
    }
    md = render_markdown(report)
    assert f"Machine: {machine}; 2 threads, Python 3.11.7." in md.splitlines()
    assert md.index("Machine:") < md.index("## Generation")
    import socllm

    assert socllm.blas_info()["corename"] in md and bench_utils.cpu_model() in md
