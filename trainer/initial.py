"""The first served policy: the base model plus a LoRA adapter that changes nothing.

Agents always call one stable name (``model.served_name``), which vLLM only knows as a LoRA
adapter. Before any training there is nothing to load under it, so the stack publishes one:
a fresh peft adapter (its ``lora_B`` matrices start at zero: exactly the base model), published as the
first version.
Every later version continues from the serving one, and base-vs-trained comparisons run through
the same adapter path in vLLM.
"""

from __future__ import annotations

import logging
from pathlib import Path

from schemas.config import Settings
from schemas.lake import Lake
from trainer.artifacts import store_version
from trainer.checkpoints import save_checkpoint
from trainer.config import config_from_settings
from trainer.publish import Publisher
from trainer.registry import Registry

log = logging.getLogger(__name__)


def ensure_initial_policy(settings: Settings, *, vllm_url: str | None = None) -> str:
    """Make sure some version is published under the served name; return the serving version."""
    from trainer.train import load_policy  # torch loads here

    cfg = config_from_settings(settings, finetune="lora")
    registry = Registry(Lake(cfg.lake_root, cfg.storage_options))
    publisher = Publisher.from_settings(settings, vllm_url=vllm_url)
    serving = registry.serving()
    if serving is not None:
        # vLLM may have restarted since: load the serving version again (idempotent in place).
        publisher.publish(serving["version"])
        return str(serving["version"])
    version, number = registry.next_version()
    model, tokenizer = load_policy(cfg)
    path = save_checkpoint(
        Path(cfg.checkpoint_dir) / version,
        model=model,
        tokenizer=tokenizer,
        cfg=cfg,
        meta={"version": version, "parent_version": None, "base_model": cfg.base_model, "initial": True},
    )
    stored = store_version(path, lake_root=cfg.lake_root, version=version, storage_options=cfg.storage_options)
    registry.add(
        version=version,
        version_number=number,
        parent_version=None,
        base_model=cfg.base_model,
        kind="lora",
        path=str(path),
        served_name=cfg.served_name,
        train_table=None,
        train_version_start=None,
        train_version_end=None,
        n_transitions=0,
        config=cfg.recorded(),
        metrics={"initial": 1.0, **stored.metrics()},
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
    )
    publisher.publish(version)
    log.info("published %s (identity adapter over %s) as %s", version, cfg.base_model, cfg.served_name)
    return version
