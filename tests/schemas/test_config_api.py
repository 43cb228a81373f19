"""``schemas.config`` is the public settings API: every section class its modules define is exported."""

from __future__ import annotations

import importlib
import pkgutil

import schemas.config as config
from schemas.config.base import Section


def test_every_section_is_exported_in_one_sorted_list() -> None:
    defined = set()
    for module in pkgutil.iter_modules(config.__path__):
        for name, obj in vars(importlib.import_module(f"schemas.config.{module.name}")).items():
            if isinstance(obj, type) and issubclass(obj, Section) and obj is not Section:
                defined.add(name)
    assert defined == set(config.__all__) - {"load_settings"}
    assert config.__all__ == sorted(config.__all__)
    assert all(getattr(config, name) is not None for name in config.__all__)
