"""`agentlake train --once` and `agentlake model list | show | publish` on a temporary lake."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlake.cli import app
from agentlake.stack.ports import free_port
from schemas.lake import Lake
from serving.evaluation import compare
from serving.evaluation_table import paired_rows, record
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.registry import Registry


@pytest.mark.slow  # a training round through the CLI: ~12 s
def test_train_once_then_list_show_and_a_failed_publish(tmp_path: Path, lake: Path, tiny_model_dir: Path) -> None:
    config = tmp_path / "agentlake.toml"
    config.write_text(
        f"""
[lake]
root = "{lake}"
[state]
dir = "{tmp_path / "state"}"
[model]
base = "{tiny_model_dir}"
[trainer]
lora_rank = 4
batch_size = 8
min_new_transitions = 4
[viewer]
public_url = "https://viewer.example/"
"""
    )
    runner = CliRunner()
    skipped = runner.invoke(app, ["train", "--once", "--config", str(config)])
    assert skipped.exit_code == 0 and "skipped" in skipped.output

    tok = build_tokenizer()
    prompt = tok("what is six plus seven")["input_ids"]
    write_transitions(lake, [transition(i, prompt, tok("good yes")["input_ids"], advantage=1.0) for i in range(4)])
    trained = runner.invoke(app, ["train", "--once", "--max-steps", "1", "--config", str(config)])
    assert trained.exit_code == 0, trained.output
    assert "v0001 from 4 transitions" in trained.output

    listed = runner.invoke(app, ["model", "list", "--config", str(config)])
    assert listed.exit_code == 0 and "v0001" in listed.output and "pending" in listed.output
    shown = runner.invoke(app, ["model", "show", "v0001", "--config", str(config)])
    assert shown.exit_code == 0 and "lineage" in shown.output and "lora_rank" in shown.output
    trained_on = " ".join(shown.output.split())  # rich wraps long lines
    assert f"trained on: 4 transitions of {lake}/transitions read at table version 0" in trained_on
    assert "the first round on this table" in trained_on
    assert "latest evaluation: none" in trained_on
    assert "viewer: https://viewer.example/versions/v0001" in trained_on  # the version's page

    # an evaluation of v0001 against the base model (as the demo or the eval gate store one): list and show carry it
    paired = compare({str(i): 0.0 for i in range(30)}, {str(i): float(i < 20) for i in range(30)})
    rows = paired_rows(paired, before_version="base", after_version="v0001")
    record(Lake(str(lake)), rows, task_set="heldout", n_tasks=30, n_samples=2, confidence=0.95, source="gate")
    listed = " ".join(runner.invoke(app, ["model", "list", "--config", str(config)]).output.split())
    assert "v0001: 0.667 [0." in listed and "vs base +0.667 [+0." in listed and "gain beyond noise" in listed, listed
    shown = " ".join(runner.invoke(app, ["model", "show", "v0001", "--config", str(config)]).output.split())
    assert "latest evaluation: 0.667 [0." in shown and "on heldout (30 tasks x 2); vs base +0.667 [+0." in shown
    assert "gain beyond noise, gate, " in shown

    # Nothing listens on this port: the publish fails, exits 1, and the registry says why.
    url = f"http://127.0.0.1:{free_port()}"
    failed = runner.invoke(app, ["model", "publish", "v0001", "--vllm-url", url, "--config", str(config)])
    assert failed.exit_code == 1 and "unreachable" in failed.output
    assert Registry(Lake(str(lake))).get("v0001")["publish_status"] == "failed"
    missing = runner.invoke(app, ["model", "show", "v0009", "--config", str(config)])
    assert missing.exit_code == 1 and "no model version" in missing.output
