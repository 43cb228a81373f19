"""``python -m examples.sql_agent --base-url URL --model NAME``: score the agent on the held-out set.

Spans go nowhere (a no-op tracer) unless ``--otlp`` names a collector, so an evaluation never
becomes training data by accident.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from opentelemetry import trace

from examples.sql_agent.agent import run_batch
from examples.sql_agent.tasks import heldout_tasks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.sql_agent", description=__doc__)
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible server (gateway or vLLM)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--otlp", help="collector base URL, e.g. http://127.0.0.1:4318 (default: no spans)")
    args = parser.parse_args(argv)
    tracer: trace.Tracer = trace.NoOpTracer()
    if args.otlp:
        import agentlake

        tracer = agentlake.init(args.otlp, agent_name="sql-agent", instrument_openai=False).get_tracer(__name__)
    results = run_batch(
        args.base_url,
        heldout_tasks(args.tasks),
        model=args.model,
        concurrency=args.concurrency,
        temperature=args.temperature,
        tracer=tracer,
    )
    errors = Counter((r.error or "ok").split(":")[0][:40] for r in results)
    print(f"held-out execution match: {statistics.fmean(r.reward for r in results):.3f} over {len(results)} tasks")
    print(f"retries used: {sum(r.calls > 1 for r in results)}; outcomes: {dict(errors)}")
    if args.otlp:
        import agentlake

        agentlake.flush()


if __name__ == "__main__":
    main()
