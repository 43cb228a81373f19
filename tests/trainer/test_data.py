"""Reading transitions by Delta version range and filters; batches, masks and packing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from agentlake.stack.ports import free_port
from schemas.config import load_settings
from schemas.lake import Lake
from tests.trainer.helpers import transition, write_transitions
from trainer.config import TrainConfig, config_from_settings
from trainer.data import Example, collate, read_transitions, to_examples
from trainer.errors import TrainerError


def test_version_range_reads_only_rows_added_after_start(lake: Path) -> None:
    v0 = write_transitions(lake, [transition(i, [3, 4], [5, 6], advantage=1.0) for i in range(3)])
    v1 = write_transitions(lake, [transition(i, [3, 4], [7], advantage=-1.0, agent="critic") for i in range(3, 5)])
    v2 = write_transitions(lake, [transition(9, [3], [8], advantage=0.5, policy_version="v0001")])
    assert (v0, v1, v2) == (0, 1, 2)

    everything = read_transitions(Lake(str(lake)))
    assert everything.rows.num_rows == 6 and (everything.version_start, everything.version_end) == (-1, 2)
    since_v0 = read_transitions(Lake(str(lake)), version_start=0)
    assert sorted(since_v0.rows["transition_id"].to_pylist()) == ["r0003/a0/0", "r0004/a0/0", "r0009/a0/0"]
    middle = read_transitions(Lake(str(lake)), version_start=0, version_end=1)
    assert middle.rows.num_rows == 2 and middle.version_end == 1
    assert read_transitions(Lake(str(lake)), agent="crit*").rows.num_rows == 2
    assert read_transitions(Lake(str(lake)), policy_versions=["v0001"]).rows["transition_id"].to_pylist() == [
        "r0009/a0/0"
    ]


def test_pending_rows_are_chosen_by_transition_id_once_each(lake: Path) -> None:
    write_transitions(lake, [transition(i, [3], [5], advantage=1.0) for i in range(4)])
    write_transitions(lake, [transition(i, [3], [6], advantage=2.0, agent="critic") for i in (2, 3, 4, 4)])
    pending = read_transitions(Lake(str(lake)), exclude_ids=pa.array(["r0000/a0/0"]))
    assert pending.rows["transition_id"].to_pylist() == ["r0001/a0/0", "r0002/a0/0", "r0003/a0/0", "r0004/a0/0"]
    assert pending.rows["rollout_id"].to_pylist()[0] == "r0001"
    ids = read_transitions(Lake(str(lake)), exclude_ids=pa.array(["r0000/a0/0"]), ids_only=True)
    assert ids.rows.column_names == ["transition_id"] and ids.rows.num_rows == 4
    # pinned: version 0 knows nothing of the second write
    assert read_transitions(Lake(str(lake)), version_end=0, ids_only=True).rows.num_rows == 4
    assert read_transitions(Lake(str(lake)), agent="critic", exclude_ids=pa.array(["r0002/a0/0"])).rows.num_rows == 2
    # explicit range: the ids absent at version 0, whatever was trained
    assert read_transitions(Lake(str(lake)), version_start=0).rows["transition_id"].to_pylist() == ["r0004/a0/0"]


def test_missing_table_says_what_to_do(lake: Path) -> None:
    with pytest.raises(TrainerError, match="run the pipeline first"):
        read_transitions(Lake(str(lake)))


def test_examples_skip_untrainable_rows_and_truncate_prompt_first(lake: Path) -> None:
    write_transitions(
        lake,
        [
            transition(0, [3, 4, 5, 6, 7, 8], [9, 10, 11], advantage=1.0, logprobs=[-1.0, -2.0, -3.0]),
            transition(1, [3], [9, 10], advantage=1.0, loss_mask=[0, 0]),  # nothing to train
            transition(2, [3], [9, 10], advantage=1.0, logprobs=[-1.0]),  # wrong length -> on-policy
        ],
    )
    examples = to_examples(read_transitions(Lake(str(lake))).rows, max_seq_len=5)
    assert len(examples) == 2
    first = examples[0]
    assert first.input_ids == [7, 8, 9, 10, 11] and first.n_prompt == 2  # the prompt's end is kept
    assert first.old_logprobs == [-1.0, -2.0, -3.0]
    assert examples[1].old_logprobs is None


def test_collate_aligns_masks_logprobs_and_advantages_to_targets() -> None:
    # prompt [3, 4], response [5, 6, 7] with the middle token an observation (mask 0)
    ex = Example([3, 4, 5, 6, 7], 2, [1, 0, 1], [-0.1, -0.2, -0.3], advantage=2.0, ret=1.0)
    short = Example([3, 9], 1, [1], None, advantage=-1.0, ret=0.0)
    b = collate([ex, short], pad_id=0)
    assert b.input_ids.tolist() == [[3, 4, 5, 6, 7], [3, 9, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # target t predicts input t+1: response tokens sit at targets 1..3 of row 0, target 0 of row 1
    assert b.mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert b.old_logprobs[0, 1:].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert math.isnan(b.old_logprobs[1, 0].item())
    assert b.advantages.tolist() == [[0, 2, 2, 2], [-1, 0, 0, 0]]
    assert b.seq_index.tolist() == [[-1, 0, -1, 0], [1, -1, -1, -1]]
    assert b.n_tokens == 7 and b.n_seqs == 2


def test_packing_gives_the_same_logprobs_as_padding(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from trainer.train import forward_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    exs = [
        Example([3, 4, 5, 6], 2, [1, 1], None, 1.0, 1.0),
        Example([3, 7, 8], 1, [1, 0], None, -1.0, -1.0),
        Example([9, 10, 11, 12, 13], 3, [1, 1], None, 0.5, 0.5),
    ]
    padded, packed = collate(exs), collate(exs, pack=True, max_seq_len=64)
    assert packed.input_ids.shape[0] == 1 and packed.attention_mask is None
    with torch.no_grad():
        a = forward_logprobs(model, padded)[padded.mask > 0]
        b = forward_logprobs(model, packed)[packed.mask > 0]
    assert torch.allclose(a, b, atol=1e-5)


def test_config_rejects_unknown_keys_by_name() -> None:
    with pytest.raises(TrainerError, match="unknown trainer config key\\(s\\): bogus, learning_rat;"):
        TrainConfig.from_dict({"learning_rat": 1e-3, "bogus": 1})
    with pytest.raises(TrainerError, match="bogus"):
        TrainConfig().replace(bogus=1)
    with pytest.raises(TrainerError, match="version_end"):
        TrainConfig(version_start=3, version_end=3).validate()


def test_config_from_settings(tmp_path: Path) -> None:
    settings = load_settings(
        environ={},
        overrides={"lake": {"root": str(tmp_path / "lake")}, "trainer": {"algorithm": "ppo", "lora_rank": 8}},
    )
    cfg = config_from_settings(settings, max_steps=3)
    assert cfg.algorithm == "ppo" and cfg.lora_rank == 8 and cfg.max_steps == 3
    assert cfg.checkpoint_dir == str(tmp_path / "lake" / "models")
    assert cfg.served_name == settings.model.served_name
    # An object-store lake: version folders on this machine under the state dir (uploaded to the lake).
    remote = load_settings(
        environ={}, overrides={"lake": {"root": "s3://bucket/lake"}, "state": {"dir": str(tmp_path / "state")}}
    )
    assert config_from_settings(remote).checkpoint_dir == str(tmp_path / "state" / "models")
    # The local stack's lake in its object store, which is stopped: one clear error, before any read.
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "objectstore.ports").write_text(json.dumps({"s3": free_port()}))
    with pytest.raises(TrainerError, match="not running: run `agentlake up`"):
        config_from_settings(load_settings(environ={}, overrides={"state": {"dir": str(stopped)}}))
    too_big = load_settings(environ={}, overrides={"trainer": {"lora_rank": 64}})
    with pytest.raises(TrainerError, match="max_lora_rank"):
        config_from_settings(too_big)
