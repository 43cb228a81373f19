"""``python -m collectors.gateway``: the OpenAI-compatible gateway, configured by agentlake settings."""

from __future__ import annotations

import sys

from collectors.gateway.serve import run
from collectors.process import run_server


def main() -> int:
    return run_server(run)


if __name__ == "__main__":
    sys.exit(main())
