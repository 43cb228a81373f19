"""``python -m collectors``: the OTLP/HTTP and OTLP/gRPC receivers, configured by agentlake settings."""

from __future__ import annotations

import sys

from collectors.process import run_server
from collectors.receivers import run


def main() -> int:
    return run_server(run)


if __name__ == "__main__":
    sys.exit(main())
