"""Redaction of span text before it is stored: named detectors (emails, API keys, phone numbers, a
deployment's own regexes) chosen per tenant by the ``[redaction]`` settings.

What is redacted: the message content, tool definitions and attribute string values of a `spans` Arrow
table (``input_messages``, ``output_messages`` with their tool calls' arguments, ``tools``, ``attributes``,
``resource_attributes``: JSON, every string value at any depth; ``status_message``: text). Each match
becomes ``[REDACTED:<detector>]`` and the row's ``redacted`` column lists the detectors that fired. A
value nothing matches keeps its exact text (JSON is rewritten only when one of its strings changed).

Not redacted: token ids (``prompt_token_ids``, ``completion_token_ids``) encode the same text the
messages hold; a tenant that must not keep it should not send token ids, or drop them.

Pure functions over Arrow: the ingestion step calls ``redact_spans`` on each decoded batch.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.config import RedactionSettings
from schemas.config.redaction import REDACTION_DETECTORS

JSON_COLUMNS = ("input_messages", "output_messages", "tools", "attributes", "resource_attributes")
TEXT_COLUMNS = ("status_message",)
REDACTED_COLUMN = "redacted"
REDACTED_TYPE = pa.list_(pa.string())


def marker(name: str) -> str:
    """What a match of detector ``name`` is replaced with."""
    return f"[REDACTED:{name}]"


@dataclass(frozen=True)
class Detector:
    """A named regex; ``accept`` may veto a match (a phone number needs 8 to 15 digits).

    Every match contains one of ``triggers`` (as written) or ``itriggers`` (lower case, in any case):
    text holding none is skipped without running the regex, which is most text (Python's ``re``
    tries each alternative at each position: ~160 us per KB for ``api_key``). Neither set: always run.
    """

    name: str
    pattern: re.Pattern[str]
    triggers: tuple[str, ...] = ()
    itriggers: tuple[str, ...] = ()
    accept: Callable[[str], bool] | None = None

    def maybe(self, text: str) -> bool:
        """Whether ``text`` may hold a match (False: it holds none)."""
        if not self.triggers and not self.itriggers:
            return True
        if any(t in text for t in self.triggers):
            return True
        if self.itriggers:
            low = text.lower()
            return any(t in low for t in self.itriggers)
        return False

    def search(self, text: str) -> bool:
        """Whether ``text`` holds a match this detector would replace."""
        if not self.maybe(text):
            return False
        return any(self.accept is None or self.accept(m.group(0)) for m in self.pattern.finditer(text))

    def sub(self, text: str) -> tuple[str, bool]:
        """``text`` with every match replaced, and whether any was."""
        if not self.maybe(text):
            return text, False
        hit = False

        def repl(m: re.Match[str]) -> str:
            nonlocal hit
            if self.accept is not None and not self.accept(m.group(0)):
                return m.group(0)
            hit = True
            return marker(self.name)

        out = self.pattern.sub(repl, text)
        return out, hit


_EMAIL = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@"  # local part: RFC 5322 atext and dots
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+"  # domain labels
    r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"  # top-level domain (xn-- forms included)
)
_AWS_PREFIXES = ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA")
_API_KEY = re.compile(
    "|".join(
        [
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
            r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}",  # OpenAI, Anthropic (sk-ant-...), most sk- keys
            # an Authorization header's token: 16+ characters, one of them not a letter (not prose)
            r"(?i:\bbearer)\s+(?=[A-Za-z0-9._~+/=-]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{16,}",
            r"(?<![A-Z0-9])(?:" + "|".join(_AWS_PREFIXES) + r")[A-Z0-9]{16}(?![A-Z0-9])",  # AWS access key id
            r"(?i:aws_?secret_?access_?key)[\"'\s:=]+[A-Za-z0-9/+=]{40}",  # AWS secret key, when named
            r"\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub
            r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
            r"\bAIza[0-9A-Za-z_-]{35}",  # Google API key
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+",  # a JWT
        ]
    )
)
_API_TRIGGERS = (*_AWS_PREFIXES, "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "AIza", "eyJ")
_API_ITRIGGERS = ("private key", "bearer", "secret")
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\w])"  # international, with its +
    r"|(?<![\w(])\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?![\w])"  # North American: (415) 555-0100
)


def _phone_digits(text: str) -> bool:
    return 8 <= sum(c.isdigit() for c in text) <= 15


BUILTIN: dict[str, Detector] = {
    "email": Detector("email", _EMAIL, ("@",)),
    "api_key": Detector("api_key", _API_KEY, _API_TRIGGERS, _API_ITRIGGERS),
    "phone": Detector("phone", _PHONE, ("+", *"0123456789"), accept=_phone_digits),
}
assert set(BUILTIN) == set(REDACTION_DETECTORS)
ORDER = ("api_key", "email", "phone")  # secrets first: a key may hold an @ or digits


class Redactor:
    """The detectors of each tenant, compiled once from ``RedactionSettings``."""

    def __init__(self, settings: RedactionSettings | None = None) -> None:
        self.settings = settings or RedactionSettings()
        self.custom = {name: Detector(name, re.compile(rx)) for name, rx in self.settings.patterns.items()}

    @functools.cache  # noqa: B019 - one Redactor per settings, a handful of tenants
    def detectors(self, tenant: str) -> tuple[Detector, ...]:
        """``tenant``'s detectors, built-in ones first in a fixed order."""
        names = set(self.settings.detectors(tenant))
        built = [BUILTIN[n] for n in ORDER if n in names]
        return (*built, *(self.custom[n] for n in sorted(names) if n in self.custom))

    def text(self, text: str, tenant: str) -> tuple[str, set[str]]:
        """Plain text with ``tenant``'s detectors applied, and the names of those that fired."""
        return _apply(text, self.detectors(tenant))

    def json_text(self, raw: str, tenant: str) -> tuple[str, set[str]]:
        """A JSON document with every string value redacted; the same text when nothing fired."""
        return _json_cell(raw, self.detectors(tenant))

    def spans(self, table: pa.Table) -> pa.Table:
        """``table`` (spans) with its text columns redacted and a ``redacted`` column of detector names."""
        return redact_spans(table, self)


def _apply(text: str, detectors: Sequence[Detector]) -> tuple[str, set[str]]:
    found: set[str] = set()
    for d in detectors:
        text, hit = d.sub(text)
        if hit:
            found.add(d.name)
    return text, found


def _walk(value: Any, detectors: Sequence[Detector], found: set[str]) -> Any:
    if isinstance(value, str):
        out, names = _apply(value, detectors)
        found |= names
        return out
    if isinstance(value, list):
        return [_walk(v, detectors, found) for v in value]
    if isinstance(value, dict):
        return {k: _walk(v, detectors, found) for k, v in value.items()}
    return value


def _json_cell(raw: str, detectors: Sequence[Detector]) -> tuple[str, set[str]]:
    if all(d.name in BUILTIN for d in detectors) and "\\" not in raw:
        # No escapes: every string value is a piece of ``raw`` between quotes, and no built-in
        # detector matches a quote, so no match in ``raw`` means none in any value.
        if not any(d.search(raw) for d in detectors):
            return raw, set()
    try:
        doc = json.loads(raw)
        found: set[str] = set()
        new = _walk(doc, detectors, found)
        if not found:
            return raw, set()
        return json.dumps(new), found  # the decoder's own style (json.dumps defaults)
    except (ValueError, RecursionError):
        # not JSON after all, or nested deeper than Python recurses (a hostile message list: it
        # must not fail the batch it came in): redact it as text. No marker holds a quote or a
        # backslash, so a JSON document stays one.
        return _apply(raw, detectors)


def _candidates(column: pa.ChunkedArray, triggers: Iterable[str]) -> pa.ChunkedArray:
    """Rows that may hold a match: one of the literals appears (RE2 on Arrow, no Python per row)."""
    alternatives = "|".join(re.escape(t) for t in sorted(set(triggers)))
    return pc.fill_null(pc.match_substring_regex(column, alternatives, ignore_case=True), False)


def redact_spans(table: pa.Table, redactor: Redactor | None = None) -> pa.Table:
    """Redact the text columns of a `spans` table per row's tenant; add the ``redacted`` column.

    ``redactor``: default, one from the settings of this process (``agentlake.toml``, environment).
    """
    redactor = redactor or configured()
    n = table.num_rows
    tenants = table.column("tenant").to_pylist() if "tenant" in table.column_names else ["default"] * n
    dets = {t: redactor.detectors(t) for t in set(tenants)}
    redacted: list[set[str]] = [set() for _ in range(n)]
    if any(dets.values()):
        always = {t for t, ds in dets.items() if any(not (d.triggers or d.itriggers) for d in ds)}
        triggers = {x for ds in dets.values() for d in ds for x in (*d.triggers, *d.itriggers)}
        for name in (*JSON_COLUMNS, *TEXT_COLUMNS):
            if name not in table.column_names:
                continue
            col = table.column(name)
            maybe = _candidates(col, triggers).to_pylist() if triggers else [False] * n
            if not any(maybe) and not always:
                continue
            values = col.to_pylist()
            changed = False
            for i, raw in enumerate(values):
                t = tenants[i]
                if raw is None or not dets[t] or not (maybe[i] or t in always):
                    continue
                cell = _json_cell if name in JSON_COLUMNS else _apply
                new, found = cell(raw, dets[t])
                if found:
                    values[i] = new
                    redacted[i] |= found
                    changed = True
            if changed:
                idx = table.column_names.index(name)
                table = table.set_column(idx, table.field(name), pa.array(values, type=col.type))
    column = pa.array([sorted(r) for r in redacted], type=REDACTED_TYPE)
    if REDACTED_COLUMN in table.column_names:
        return table.set_column(table.column_names.index(REDACTED_COLUMN), REDACTED_COLUMN, column)
    return table.append_column(REDACTED_COLUMN, column)


@functools.cache
def configured() -> Redactor:
    """The redactor of this process's settings, made once per process."""
    from schemas.config import load_settings

    return Redactor(load_settings().redaction)
