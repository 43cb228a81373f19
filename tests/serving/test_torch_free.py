"""A replica's loader installs and runs without torch: with torch, transformers and peft made unimportable,
`agentlake loader` is there and a loader carries out a release (fetch, verify, hot-load) against a stand-in vLLM.

Run in a fresh interpreter, so what this test process already imported does not hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "peft")

# Any import of HEAVY fails as on a host where they are not installed (optional imports still degrade).
BLOCK = f"""
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed on a replica)", name=name)
        return None

sys.meta_path.insert(0, Absent())
"""

RELEASE = """
import json, sys
from pathlib import Path

from typer.testing import CliRunner

from agentlake.cli import app
from schemas.config import load_settings
from schemas.lake import Lake
from serving.loader import Loader
from serving.releases import release_command
from tests.serving.helpers import register_stored, running_fake_vllm
from trainer.registry import Registry

cli = CliRunner().invoke(app, ["loader", "--help"])
assert cli.exit_code == 0 and "--replica" in cli.output, cli.output

tmp = Path(sys.argv[1])
adapter = tmp / "lake" / "models" / "v0001"
adapter.mkdir(parents=True)
(adapter / "adapter_config.json").write_text("{}")
(adapter / "adapter_model.safetensors").write_bytes(b"weights")
settings = load_settings(environ={}, discover=False, overrides={
    "state": {"dir": str(tmp / "state")}, "lake": {"root": str(tmp / "lake")}, "model": {"cache_dir": str(tmp / "m")}})
registry = Registry(Lake.from_settings(settings))
row = registry.get(register_stored(registry, adapter, 1))
with running_fake_vllm() as vllm:
    loader = Loader.from_settings(settings, replica="r1", vllm_url=vllm.url)
    ack = loader.handle(release_command(row, served_name="agentlake-policy", targets=["r1"]))
    loads = vllm.loads()
print(json.dumps({"ack": ack, "loads": loads, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)},
                 default=str))
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = BLOCK + f"HEAVY = {HEAVY!r}\n" + script
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_blocker_stops_a_torch_import() -> None:
    """The check below can fail: a module that imports torch is refused under the same blocker."""
    done = _run("import serving.initial\n")  # the first policy is a fresh peft adapter: it needs torch
    assert done.returncode != 0 and "not installed on a replica" in done.stderr, done.stderr


def test_a_loader_releases_a_version_without_torch(tmp_path: Path) -> None:
    done = _run(RELEASE, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    # fetched and verified against the manifest hash, then hot-loaded; the stand-in vLLM then lists no such
    # adapter, which the loader's check reports: every step of a release ran, none of them needed torch
    assert [Path(p).name for p in out["loads"]] == ["v0001"], out
    assert out["ack"]["replica"] == "r1" and out["ack"]["version"] == "v0001"
    assert not out["ack"]["ok"] and out["ack"]["error"].startswith("after loading, vLLM lists"), out["ack"]
