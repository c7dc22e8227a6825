"""Measured accuracy: perplexity on WikiText-2 (:mod:`socllm.eval.perplexity`), divergence from
fp32 with paired standard errors (:mod:`socllm.eval.divergence`, :mod:`socllm.eval.stats`),
benchmark tasks through lm-eval (:mod:`socllm.eval.lmeval`), sweeps of models x plans x tasks
(:mod:`socllm.eval.sweep`, :mod:`socllm.eval.sweep_plot`), the main job's report
(:mod:`socllm.eval.report`) and benchmark helpers (:mod:`socllm.eval.bench_utils`)."""
