"""The closed-loop demo: the math agent acts, Dagster learns, vLLM serves the new policy.

Run it from a source checkout with ``python -m examples.closed_loop`` (``--smoke`` for the data
path alone, synthetic traces and no model), or through its launcher ``agentlake demo`` / ``make demo``.

- ``loop``: the rounds (rollouts through the gateway, wait for transitions, train, publish) and the
  held-out scoring before and after;
- ``smoke``: synthetic traces through the stack, no model;
- ``assets``: one Dagster run of pipeline assets through the stack's instance;
- ``report``: the rich tables the command prints.
"""
