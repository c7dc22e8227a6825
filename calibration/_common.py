"""What the calibration scripts share: their command line (model, corpus windows, the file to
continue and the file to write) and the atomic save. Not a step: see the scripts beside it."""

from __future__ import annotations

import argparse

import socllm
from socllm.calibration import load_calibration, save_calibration


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m", help="built-in name or model file")
    ap.add_argument("--corpus", default="wikitext2", help="wikitext2 or a UTF-8 text file")
    ap.add_argument("--samples", type=int, default=128, help="calibration windows")
    ap.add_argument("--seqlen", type=int, default=512, help="tokens per window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib", default=None, help="continue this calibration file")
    ap.add_argument("--out", required=True, help="calibration file to write (atomically)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def windows(args) -> dict:
    """The calibration-window options of the command line."""
    return {
        "corpus": args.corpus,
        "samples": args.samples,
        "seqlen": args.seqlen,
        "seed": args.seed,
    }


def load(args):
    """(model, the --calib statistics or None)."""
    socllm.set_log_level("warn")
    model = socllm.load(args.model, progress=not args.quiet)
    return model, (load_calibration(args.calib, model) if args.calib else None)


def run(args, calibrate, report) -> int:
    """A script's body: the model (and the --calib statistics), ``calibrate(model, data) ->
    data``, its report printed, the file saved."""
    model, data = load(args)
    data = calibrate(model, data)
    report(data)
    save(args, data, model)
    return 0


def save(args, data, model) -> None:
    save_calibration(args.out, data, model)
    print(f"wrote {args.out} (steps {data.provenance.get('steps', '')})")
