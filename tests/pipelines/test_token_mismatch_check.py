"""The `transitions` asset reports calls per token_status in its metadata, and its asset check warns when
the share of mismatched calls is above ``credit.max_token_mismatch_rate``: a real Dagster run on real
Delta tables; the mismatch comes from a real vLLM whose template is not the retokenizer's (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckSeverity, materialize

from pipelines.defs.assets import transitions
from pipelines.defs.checks import transitions_token_mismatch
from pipelines.defs.resources import CreditResource, TokenizerResource, resources_from_settings
from schemas.config import load_settings
from schemas.lake import Lake
from tests.fixtures_vllm import VllmServer
from tests.pipelines.otel import Call, Rollout
from tests.pipelines.test_retokenize_and_defs import traj_of


def _run(tmp_path: Path, tokenizer: TokenizerResource, credit: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Write two rollouts' trajectories (one messages-only call each) and run the asset and its check."""
    settings = load_settings(
        environ={},
        overrides={"state": {"dir": str(tmp_path / "state")}, "lake": {"root": str(tmp_path / "lake")}},
    )
    rollouts = [
        Rollout(
            f"r{i}",
            task_id="t",
            calls=[
                Call(
                    messages_in=[{"role": "user", "content": f"What is {i}+{i}?"}],
                    messages_out=[{"role": "assistant", "content": str(2 * i)}],
                    policy_version=None,
                )
            ],
            final_reward=float(i),
        )
        for i in range(2)
    ]
    Lake(settings.lake.root).write("trajectories", traj_of(rollouts[0]).vstack(traj_of(rollouts[1])).to_arrow())
    resources: dict[str, Any] = {**resources_from_settings(settings), "tokenizer": tokenizer}
    if credit:
        resources["credit"] = CreditResource(credit={**resources["credit"].credit, **credit})
    result = materialize([transitions, transitions_token_mismatch], resources=resources)
    assert result.success
    (mat,) = result.asset_materializations_for_node("transitions")
    (check,) = result.get_asset_check_evaluations()
    return {k: v.value for k, v in mat.metadata.items()}, check


def test_unverified_calls_pass_the_check(tmp_path: Path, smollm2_dir: Path) -> None:
    """No server answers /tokenize: the calls are trained on as unverified, and the check passes."""
    tokenizer = TokenizerResource(path=str(smollm2_dir), verify_url="http://127.0.0.1:9", verify_model="m")
    meta, check = _run(tmp_path, tokenizer)
    assert meta["token_status_unverified"] == 2 and meta["token_status_mismatch"] == 0 and meta["rows"] == 2
    assert check.passed and check.metadata["mismatch_rate"].value == 0.0


@pytest.mark.slow
@pytest.mark.vllm
def test_a_server_with_another_template_makes_mismatches_and_the_check_warns(
    tmp_path: Path, smollm2_dir: Path, vllm_server: VllmServer
) -> None:
    other = tmp_path / "plain.jinja"  # the retokenizer renders with this; vLLM with the folder's own
    other.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>{% endfor %}assistant: ")
    tokenizer = TokenizerResource(
        path=str(smollm2_dir),
        chat_template=str(other),
        verify_url=vllm_server.url,
        verify_model=vllm_server.served_name,
    )
    meta, check = _run(tmp_path / "a", tokenizer)
    assert meta["token_status_mismatch"] == 2 and meta["dropped_token_mismatch"] == 2 and meta["rows"] == 0
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert check.metadata["mismatch_rate"].value == 1.0
    # trained on when the setting says so: the rows stay, flagged
    meta, _ = _run(tmp_path / "b", tokenizer, {"train_token_mismatch": True, "max_token_mismatch_rate": 1.0})
    assert meta["rows"] == 2 and "dropped_token_mismatch" not in meta
