"""The plan frontier (issue 41): which execution plan to ship on which phone, accuracy and time
together (``socllm frontier``, :func:`socllm.frontier`).

- :mod:`.space`: the axes of plan parts and the plans of their product the core composes;
- :mod:`.evaluate`: a plan's objectives on the engine (held-out accuracy, the simulated
  request of the graph it executed), cached per plan;
- :mod:`.pareto`: the objectives, dominance, the frontier and the racing rule;
- :mod:`.search`: simulated budgets first, then rounds of more windows for the plans that may
  still be on the frontier;
- :mod:`.calibrate`: the calibration a space needs, made once and cached;
- :mod:`.run`: the report, its table, plot and recommended plan files; :mod:`.html`: the same
  as one self-contained page.
"""
