"""The trackers behind trainer.tracking's seam, on real rounds of the tiny model: TensorBoard event files read
back with its EventAccumulator, a W&B offline run's files, a tracker that fails or a server that does not answer
(a warning, and the round is recorded all the same), and the step metrics the trackers plot (entropy, the
batch's reward and advantage statistics) on hand-computed cases. MLflow's own server: tests/trainer/test_mlflow.py."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from schemas.lake import Lake
from tests.trainer.helpers import build_tokenizer, small_round_config, transition, write_transitions
from trainer import losses, tracking
from trainer.data import Example
from trainer.losses import masked_entropy
from trainer.registry import Registry
from trainer.round import RoundResult, train_once
from trainer.trackers import SafeTracker, tracker_for
from trainer.tracking import MemoryTracker, NoTracker, Tracker, make_tracker
from trainer.train import batch_stats

STEP_KEYS = {"loss", "kl", "clip_frac", "ratio", "grad_norm", "tokens_per_s", "entropy", "reward_mean"}
STEP_KEYS |= {"adv_std", "zero_adv_frac"}


def write_round(lake: Path, *, zero: int = 0) -> None:
    """Four rows (two steps per epoch at batch 2): advantages +-1, the first ``zero`` of them 0."""
    tok = build_tokenizer()
    prompt = tok("what is two plus three")["input_ids"]
    rows = [
        transition(i, prompt, tok("good" if i % 2 else "bad")["input_ids"], advantage=0.0 if i < zero else (-1.0) ** i)
        for i in range(4)
    ]
    write_transitions(lake, rows)


def registry_row(lake: Path, version: str) -> dict[str, object]:
    return Registry(Lake(str(lake))).get(version)


def test_entropy_and_batch_stats_on_hand_computed_cases() -> None:
    # uniform logits over V tokens: entropy log V; a one-hot-ish row: about 0. Only masked targets count.
    V = 8
    logits = torch.zeros(1, 3, V)
    logits[0, 1] = torch.tensor([100.0] + [0.0] * (V - 1))
    assert masked_entropy(logits, torch.tensor([[1.0, 0.0]])).item() == pytest.approx(math.log(V))
    assert masked_entropy(logits, torch.tensor([[0.0, 1.0]])).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_entropy(logits, torch.tensor([[1.0, 1.0]])).item() == pytest.approx(math.log(V) / 2)
    assert masked_entropy(logits, torch.zeros(1, 2)).item() == 0.0
    torch.manual_seed(0)  # chunked (3 rows at a time) as in one piece
    many, mask = torch.randn(2, 40, V), (torch.rand(2, 39) > 0.3).float()
    whole = masked_entropy(many, mask).item()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(losses, "ENTROPY_CHUNK", 3)
        assert masked_entropy(many, mask).item() == pytest.approx(whole, rel=1e-6)
        mp.setattr(losses, "ENTROPY_MAX_ROWS", 4)  # beyond the cap an estimate: 4 evenly spaced positions
        spaced = torch.zeros(1, 41, V)
        spaced[0, ::10] = torch.tensor([100.0] + [0.0] * (V - 1))  # every 10th row certain
        # targets 0, 13, 26, 39 are averaged: row 0 certain, the other three uniform
        assert masked_entropy(spaced, torch.ones(1, 40)).item() == pytest.approx(math.log(V) * 3 / 4, rel=1e-5)

    def ex(adv: float, ret: float) -> Example:
        return Example([1, 2], 1, [1], None, adv, ret)

    stats = batch_stats([ex(0.0, 1.0), ex(0.0, 1.0), ex(1.0, 1.0), ex(-1.0, 0.0)])
    assert stats["zero_adv_frac"] == 0.5
    assert stats["reward_mean"] == 0.75 and stats["reward_std"] == pytest.approx(math.sqrt(0.1875))
    assert stats["adv_std"] == pytest.approx(math.sqrt(0.5)) and stats["adv_abs_mean"] == 0.5
    assert batch_stats([]) == {}


def test_tensorboard_event_files_read_back(lake: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_round(lake, zero=2)
    tracker = make_tracker("tensorboard", root=str(tmp_path / "runs"), experiment="exp", run_name="r1")
    result = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=tracker)

    folder = tmp_path / "runs" / "tensorboard" / "exp" / "r1"
    assert result.version == "v0001" and result.tracking_url == folder.as_uri()
    assert registry_row(lake, "v0001")["tracking_url"] == folder.as_uri()
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert STEP_KEYS <= set(events.Tags()["scalars"])
    for key in ("loss", "entropy", "zero_adv_frac", "reward_mean"):
        read = [(e.step, e.value) for e in events.Scalars(key)]
        assert read == [(int(h["step"]), pytest.approx(h[key], rel=1e-5, abs=1e-6)) for h in result.history]
    entropy = [e.value for e in events.Scalars("entropy")]
    assert all(0 < e <= math.log(len(build_tokenizer())) + 1e-4 for e in entropy)  # nats, at most log V
    params = events.Tensors("params/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert json.loads(params)["version"] == "v0001" and json.loads(params)["n_trained"] == 4


def wandb_records(path: Path) -> list[object]:
    """The records of an offline run's ``run-<id>.wandb`` file: W&B's 7-byte header, then LevelDB-log framing
    (32 KiB blocks; per record a crc32c, a length, a type: 1 full, 2 first, 3 middle, 4 last), each a
    ``wandb_internal_pb2.Record``. Read here because offline runs of wandb 0.2x+ write no summary file."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, out, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # a block's zero padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def test_wandb_offline_run_files_hold_the_metrics(lake: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    write_round(lake)
    tracker = make_tracker("wandb", root=str(tmp_path / "runs"), experiment="exp", run_name="r1")
    result = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=tracker)

    assert result.version == "v0001" and result.tracking_url and result.tracking_url.startswith("file://")
    run_dir = Path(result.tracking_url.removeprefix("file://"))
    assert run_dir.name.startswith("offline-run-") and run_dir.is_dir()
    (log_file,) = run_dir.glob("run-*.wandb")
    records: list[Any] = wandb_records(log_file)
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    assert [h["_step"] for h in history] == [int(h["step"]) for h in result.history] == [1, 2, 3, 4]
    for logged, computed in zip(history, result.history, strict=True):
        assert STEP_KEYS <= set(logged)
        for key in ("loss", "entropy", "zero_adv_frac", "grad_norm"):
            assert logged[key] == pytest.approx(computed[key], rel=1e-6)
    config_keys = {i.key: json.loads(i.value_json) for r in records if r.HasField("config") for i in r.config.update}
    assert config_keys["version"] == "v0001" and config_keys["n_trained"] == 4


class Exploding:
    """A tracker whose server goes away mid-round: the second step's call raises."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def log_params(self, params: Mapping[str, object]) -> None:
        pass

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls += 1
        if step == 2:
            raise ConnectionResetError("the tracking server went away")

    def close(self) -> None:
        self.closed = True


def test_a_failing_tracker_warns_once_and_the_round_is_recorded(
    lake: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_round(lake)
    inner = Exploding()
    safe = SafeTracker("exploding", lambda: inner)
    with caplog.at_level(logging.WARNING, logger="trainer.trackers"):
        result = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=safe)

    assert result.version == "v0001" and len(result.history) == 4
    assert inner.calls == 2 and not inner.closed, "after its error the tracker is called no more"
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainer.trackers"]
    assert len(warnings) == 1 and "ConnectionResetError" in warnings[0] and "model_versions" in warnings[0]
    row = registry_row(lake, "v0001")
    assert json.loads(str(row["metrics"]))["final_loss"] == pytest.approx(result.history[-1]["loss"])


def test_an_unreachable_mlflow_server_warns_and_the_round_keeps_its_metrics(
    lake: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agentlake.stack.ports import free_port

    write_round(lake)
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="trainer.trackers"):
        tracker = make_tracker("mlflow", uri=uri, experiment="agentlake", run_name="r")
        result = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=tracker)

    assert result.version == "v0001" and result.tracking_url is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainer.trackers"]
    assert len(warnings) == 1 and f"no MLflow tracking server answers at {uri}" in warnings[0]
    row = registry_row(lake, "v0001")
    metrics = json.loads(str(row["metrics"]))
    assert row["tracking_url"] is None and metrics["steps"] == 4.0
    assert metrics["final_entropy"] > 0 and "final_zero_adv_frac" in metrics


def test_a_missing_package_is_a_warning_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: its import raises ImportError
    tracker = make_tracker("wandb", root="/nonexistent", experiment="e", run_name="r")
    assert isinstance(tracker, SafeTracker) and "agentlake[trackers]" in tracker.error
    tracker.log_params({"a": 1})
    tracker.log_metrics(1, {"loss": 1.0})
    tracker.close()
    assert tracker.url is None


def test_settings_choose_the_tracker(tmp_path: Path) -> None:
    from schemas.config import load_settings

    def settings(**tracking_settings: object) -> object:
        return load_settings(
            environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")},
            overrides={"tracking": {"dir": str(tmp_path / "runs"), **tracking_settings}},
            discover=False,
        )

    assert isinstance(tracker_for(settings()), NoTracker)  # auto without a server: none
    assert isinstance(tracker_for(settings(tracker="mlflow")), NoTracker)  # no uri: a warning, none
    made: Tracker = tracker_for(settings(tracker="tensorboard"), line="planner")
    assert isinstance(made, SafeTracker) and made.url and "/tensorboard/agentlake/round-" in made.url
    assert made.url.endswith("-planner")
    made.close()
    auto = tracker_for(settings(uri="http://127.0.0.1:9"))  # auto with a uri: mlflow (which cannot connect)
    assert isinstance(auto, SafeTracker) and auto.name == "mlflow" and "no MLflow" in auto.error
    assert {"mlflow", "tensorboard", "wandb", "none", "memory"} <= set(tracking.tracker_names())


def test_round_result_carries_no_url_without_a_tracker(lake: Path, tiny_model_dir: Path) -> None:
    write_round(lake)
    result: RoundResult = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=MemoryTracker())
    assert result.version == "v0001" and result.tracking_url is None
    assert registry_row(lake, "v0001")["tracking_url"] is None


def test_the_policy_asset_links_the_run_and_finds_the_stacks_server(
    lake: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import os

    import psutil
    from dagster import MetadataValue, build_asset_context

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource
    from schemas.config.stack_file import STACK_FILE_VERSION, stack_file

    write_round(lake)
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:1", spans_topic="s", rewards_topic="r")
    resource = TrainerResource(
        lake=LakeResource(root=str(lake)),
        kafka=kafka,
        trainer={"min_new_transitions": 1, "lora_rank": 4, "batch_size": 2},
        model={"base": str(tiny_model_dir)},
        tracking={"tracker": "tensorboard", "dir": str(tmp_path / "runs")},
        state_dir=str(tmp_path / "state"),
        publish=False,
    )
    meta = policy(build_asset_context(), trainer=resource).metadata
    url = Registry(Lake(str(lake))).get("v0001")["tracking_url"]
    assert isinstance(url, str) and url.startswith((tmp_path / "runs" / "tensorboard").as_uri())
    assert meta["tracking_run"] == MetadataValue.url(url)

    # a running stack's MLflow server (its stack file; this process stands in for it) is found at run time
    me = psutil.Process()
    doc = {
        "version": STACK_FILE_VERSION,
        "processes": {"mlflow": {"pid": os.getpid(), "create_time": me.create_time(), "address": "http://h:1"}},
        "settings": {"tracking": {"uri": "http://h:1"}},
    }
    stack_file(tmp_path / "state").parent.mkdir(parents=True, exist_ok=True)
    stack_file(tmp_path / "state").write_text(json.dumps(doc))
    assert resource.settings().tracking.uri == "http://h:1"
    pinned = resource.model_copy(update={"tracking": {"uri": "http://mine:5000"}})
    assert pinned.settings().tracking.uri == "http://mine:5000"  # an explicit one wins


@pytest.mark.slow  # a torchrun job of 2 ranks: 15-60 s on 2 busy cores
def test_under_torchrun_only_rank_0_tracks(tmp_path: Path, tiny_model_dir: Path) -> None:
    from dagster import materialize
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource
    from tests.trainer.test_ddp import TRAIN, _rows

    lake = tmp_path / "lake"
    write_transitions(lake, _rows())
    resource = TrainerResource(
        lake=LakeResource(root=str(lake)),
        kafka=KafkaResource(bootstrap_servers="127.0.0.1:1", spans_topic="s", rewards_topic="r"),
        trainer={**TRAIN, "nproc": 2, "epochs": 1},
        model={"base": str(tiny_model_dir)},
        tracking={"tracker": "tensorboard", "dir": str(tmp_path / "runs")},
        state_dir=str(tmp_path / "state"),
        publish=False,
    )
    result = materialize([policy], resources={"trainer": resource})
    assert result.success
    [mat] = result.asset_materializations_for_node("policy")
    assert mat.metadata["world_size"].value == 2.0
    (run,) = (tmp_path / "runs" / "tensorboard" / "agentlake").iterdir()  # one run: rank 0's
    assert mat.metadata["tracking_run"].value == run.as_uri()
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # one writer: rank 1 made no tracker
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("loss")]
    assert steps == list(range(1, int(mat.metadata["steps"].value) + 1))  # each step once, not once per rank
