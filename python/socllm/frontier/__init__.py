"""The plan frontier (issue 41): which execution plan to ship on which phone, accuracy and time
together.

- :mod:`.pareto`: the objectives, dominance, the frontier of scored plans and the racing rule;
- :mod:`.search`: the search that scores held-out windows only for plans that may still be on
  the frontier (simulated budgets first, then rounds of more windows).
"""
