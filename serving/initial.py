"""The first served policy: the base model plus a LoRA adapter that changes nothing.

Agents always call one stable name (``model.served_name``), which vLLM only knows as a LoRA
adapter. Before any training there is nothing to load under it, so the stack publishes one:
a fresh peft adapter (its ``lora_B`` matrices start at zero: exactly the base model), published as the
first version.
Every later version continues from the serving one, and base-vs-trained comparisons run through
the same adapter path in vLLM.

With policy lines (``trainer.agents``) every line gets its own first version, published under its
own name (``agentlake-policy-<agent>``), next to the single policy's, which the agents not listed
keep calling.
"""

from __future__ import annotations

import logging
from pathlib import Path

from schemas.config import Settings
from schemas.config.serving import policy_served_name
from schemas.lake import Lake
from serving.publish import Publisher
from trainer.artifacts import store_version
from trainer.checkpoints import save_checkpoint
from trainer.config import config_from_settings
from trainer.registry import Registry

log = logging.getLogger(__name__)


def ensure_initial_policy(settings: Settings, *, vllm_url: str | None = None, agent: str | None = None) -> str:
    """Make sure some version of ``agent``'s line (None: the single policy) is published under its served
    name; return that line's serving version."""
    from trainer.train import load_policy  # torch loads here

    cfg = config_from_settings(settings, finetune="lora")
    registry = Registry(Lake(cfg.lake_root, cfg.storage_options))
    publisher = Publisher.from_settings(settings, vllm_url=vllm_url)
    serving = registry.serving(agent=agent)
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
        meta={
            "version": version,
            "parent_version": None,
            "base_model": cfg.base_model,
            "initial": True,
            "agent": agent,
        },
    )
    stored = store_version(path, lake_root=cfg.lake_root, version=version, storage_options=cfg.storage_options)
    registry.add(
        version=version,
        version_number=number,
        parent_version=None,
        base_model=cfg.base_model,
        kind="lora",
        path=str(path),
        served_name=policy_served_name(cfg.served_name, agent),
        train_table=None,
        train_version_start=None,
        train_version_end=None,
        n_transitions=0,
        config=cfg.recorded(),
        metrics={"initial": 1.0, **stored.metrics()},
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
        agent=agent,
    )
    publisher.publish(version)
    name = policy_served_name(cfg.served_name, agent)
    log.info("published %s (identity adapter over %s) as %s", version, cfg.base_model, name)
    return version


def ensure_initial_policies(settings: Settings, *, vllm_url: str | None = None) -> dict[str | None, str]:
    """The single policy and every listed agent's line (``trainer.agents``), each with a published
    version; line (None: the single policy) -> its serving version."""
    from trainer.lines import max_loras_warning

    warning = max_loras_warning(settings)
    if warning:
        log.warning(warning)
    lines: list[str | None] = [None, *settings.trainer.agents]
    return {line: ensure_initial_policy(settings, vllm_url=vllm_url, agent=line) for line in lines}
