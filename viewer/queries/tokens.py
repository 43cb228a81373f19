"""Token ids to text, with the policy's tokenizer (the one the gold step retokenizes with), cached.

Each id is decoded alone (what the token adds to the text); ids are cached per tokenizer, so a page of
a few thousand tokens decodes each distinct id once per process. Without a tokenizer folder the ids
are shown as ``⟨id⟩``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


class TokenText:
    """Decodes token ids one by one with a lazily loaded tokenizer; ``None`` loader: ids only."""

    def __init__(self, loader: Callable[[], Any | None] | None) -> None:
        self._loader = loader
        self._tokenizer: Any | None = None
        self._loaded = False
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def _get(self) -> Any | None:
        with self._lock:
            if not self._loaded:
                self._loaded = True
                try:
                    retok = self._loader() if self._loader is not None else None
                except (OSError, ValueError):
                    retok = None  # a missing or broken tokenizer folder: show ids rather than fail the page
                self._tokenizer = getattr(retok, "tokenizer", retok)
            return self._tokenizer

    @property
    def available(self) -> bool:
        return self._get() is not None

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each id, in order."""
        tok = self._get()
        if tok is None:
            return [f"⟨{i}⟩" for i in ids]
        missing = sorted({int(i) for i in ids if int(i) not in self._cache})
        if missing:
            texts = tok.batch_decode([[i] for i in missing], skip_special_tokens=False)
            self._cache.update(zip(missing, (str(t) for t in texts), strict=True))
        return [self._cache[int(i)] for i in ids]

    def text(self, ids: Sequence[int]) -> str:
        """All of ``ids`` decoded together (a prompt, read as one text)."""
        tok = self._get()
        if tok is None:
            return " ".join(f"⟨{i}⟩" for i in ids)
        return str(tok.decode(list(ids), skip_special_tokens=False))
