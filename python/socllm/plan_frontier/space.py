"""The frontier's search space (issue 41 item 1): axes of plan parts the core composes, and the
plans of their product that the core accepts.

An axis is a name and a list of values; a plan is one value per axis:

* ``linear``: a linear scheme with its options (``w8a8``, ``smoothquant``,
  ``shadow-outlier:pruning_rate=0.5``, ``edgeflow:bits=4``, ...): the plan's base;
* ``attention``: ``fp32`` (the base's own attention) or a scheme with its options
  (``sparse:keep=0.2``, ``shadow-attn:keep=0.3``, ``npu-int8``);
* ``partition``: ``none`` or a HeteroLLM partition mode (``solver``, ...);
* ``chunk_len``: the prompt's chunk length on static graphs (0: the whole prompt).

Products the core refuses (e.g. shadow outliers with a row partition) are left out, each with
the core's reason (:attr:`Space.refused`); an axis name the space does not know, an empty axis
or a space with no plan left is an error naming it.

The core's preset plans (``Plan.known()``: the papers' systems as they ship) join the space as
candidates of their own, at the space's chunk length, so the frontier says which of them a
composed plan beats (:attr:`Space.presets`; a preset that is one of the products is not added
twice).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import _core
from ..errors import InvalidArgumentError

AXES = ("linear", "attention", "partition", "chunk_len")
# The default axes: the four papers' knobs at the values they study (shadow-outlier's pruning
# rate, shadowAttn's keep ratio, EdgeFlow's bits, HeteroLLM's solver), the plain baselines every
# paper compares against, llm.npu's K-quant baseline (w8-group) and HeteroLLM's engine with 8-bit
# instead of 4-bit weights (a composition no paper ships; the presets join these, space doc).
DEFAULT_AXES: dict[str, tuple[str, ...]] = {
    "linear": (
        "fp32",
        "w8a8",
        "smoothquant",
        "shadow-outlier:pruning_rate=0.85",
        "shadow-outlier:pruning_rate=0.5",
        "edgeflow:bits=4",
        "edgeflow:bits=6",
        "edgeflow:bits=8",
        "w8-group",
        "hetero-layer:weight_bits=8",
    ),
    "attention": ("fp32", "sparse:keep=0.2", "shadow-attn:keep=0.3", "npu-int8"),
    "partition": ("none", "solver"),
    "chunk_len": ("256",),
}


@dataclass
class Space:
    axes: dict[str, tuple[str, ...]]
    plans: list[str] = field(default_factory=list)  # the composable products, plan text
    parts: dict[str, dict[str, str]] = field(default_factory=dict)  # plan -> its axis values
    refused: dict[str, str] = field(default_factory=dict)  # product -> the core's reason
    presets: dict[str, str] = field(default_factory=dict)  # preset name -> its plan in the space
    plan_options: str = ""  # options every plan has

    @property
    def chunk_len(self) -> str:
        """The chunk length the presets run at: the axis's first (0: the whole prompt)."""
        return self.axes.get("chunk_len", ("0",))[0]

    def preset_text(self, name: str) -> str:
        """The text of core preset ``name`` as a plan of this space (its chunk length and plan
        options)."""
        return compose({"linear": name, "chunk_len": self.chunk_len}, self.plan_options)

    @property
    def size(self) -> int:
        """Products of the axes, composable or not."""
        n = 1
        for v in self.axes.values():
            n *= len(v)
        return n


def parse_axes(specs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``["linear=w8a8|edgeflow:bits=4", "chunk_len=256|512"]`` -> axes over the defaults
    (values are separated by '|': plan options use ','); names and values are checked by
    :func:`build_space`."""
    axes = dict(DEFAULT_AXES)
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep:
            raise InvalidArgumentError(f"frontier: axis {spec!r} is not NAME=V1|V2|...")
        axes[name.strip()] = tuple(v.strip() for v in values.split("|") if v.strip())
    return axes


def parse_presets(spec: str) -> list[str]:
    """``all`` (the core's every preset), ``none`` or ``NAME,NAME`` -> preset names (checked
    by :func:`build_space`)."""
    spec = spec.strip()
    if spec == "all":
        return list(_core.Plan.known())
    if spec == "none":
        return []
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise InvalidArgumentError(f"frontier: --presets {spec!r} names no preset")
    return names


def compose(parts: Mapping[str, str], extra: str = "") -> str:
    """One plan's text from its axis values (partition ``none``: the linear value's own, e.g.
    Hetero-layer's) and ``extra`` options every plan gets (e.g. ``residual_scale=auto``)."""
    linear = parts["linear"]
    options = [extra] if extra else []
    if parts.get("attention", "fp32") != "fp32":
        options.append(f"attention={parts['attention']}")
    if parts.get("partition", "none") != "none":
        options.append(f"partition={parts['partition']}")
    if int(parts.get("chunk_len", "0")):
        options.append(f"chunk_len={int(parts['chunk_len'])}")
    if not options:
        return linear
    return linear + ("," if ":" in linear else ":") + ",".join(options)


def build_space(
    axes: Mapping[str, Sequence[str]], presets: Sequence[str] = (), plan_options: str = ""
) -> Space:
    """Every product of ``axes`` the core composes, in the axes' order, then the ``presets``
    (core preset names) at the first chunk length of the axes; every plan with
    ``plan_options`` (plan text options, e.g. ``residual_scale=auto``: Gemma 3's residual
    stream overflows binary16 without it)."""
    plan_options = plan_options.strip().strip(",")
    for name, values in axes.items():
        if name not in AXES:
            raise InvalidArgumentError(f"frontier: unknown axis {name!r} (axes: {', '.join(AXES)})")
        if not values:
            raise InvalidArgumentError(f"frontier: axis {name!r} has no value")
        if name == "chunk_len":
            for v in values:
                if not str(v).isdigit():
                    raise InvalidArgumentError(
                        f"frontier: chunk_len {v!r} is not a token count (0: the whole prompt)"
                    )
    if "linear" not in axes:
        raise InvalidArgumentError("frontier: the space needs a linear axis")
    space = Space(
        {k: tuple(str(v) for v in vs) for k, vs in axes.items()}, plan_options=plan_options
    )
    names = list(space.axes)
    seen: dict[str, str] = {}
    for combo in itertools.product(*space.axes.values()):
        parts = dict(zip(names, combo, strict=True))
        text = compose(parts, plan_options)
        try:
            canonical = str(_core.Plan(text).to_json())
        except _core.SocllmError as e:
            space.refused[text] = str(e)
            continue
        if canonical in seen:  # two spellings of one plan (e.g. attention=fp32 on fp32)
            continue
        seen[canonical] = text
        space.plans.append(text)
        space.parts[text] = parts
    if not space.plans:  # the axes are wrong, whatever presets join them
        reasons = "; ".join(f"{p}: {r}" for p, r in list(space.refused.items())[:3])
        raise InvalidArgumentError(
            f"frontier: the search space is empty: none of its {space.size} plans composes"
            + (f" ({reasons})" if reasons else "")
        )
    known = set(_core.Plan.known())
    for name in presets:
        if name not in known:
            raise InvalidArgumentError(
                f"frontier: unknown preset {name!r} (presets: {', '.join(_core.Plan.known())})"
            )
        text = space.preset_text(name)
        canonical = str(_core.Plan(text).to_json())
        if canonical not in seen:
            seen[canonical] = text
            space.plans.append(text)
            space.parts[text] = {"preset": name}
        space.presets[name] = seen[canonical]
    return space
