"""``LlmJudge``: the ``[judge]`` settings as a group reward function (`pipelines.silver.reward_functions`).

For each group it is handed, it asks the served model to score the members against the rubric
(`prompt`), answered from the `judgements` table when the same question was asked before (`cache`),
else by vLLM (`client`, a call that is never recorded as training data). An answer that is not the
JSON asked for is shown back to the model once with what was wrong; a second bad answer leaves the
group without a judge reward (logged, and cached: at temperature 0 asking again gives the same), it
never fails the run. A server that cannot be reached does fail it (`JudgeUnavailableError`): nothing
advances, and the next run judges the same groups.

Its reward source is ``fn:<name>@<version>-<fingerprint>``, the fingerprint a hash of the rubric, the
model and the prompt's version: changing any of them is a new function to the watermarks, which then
judge every trajectory again (the earlier rewards stay in `rewards`, as history).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from pipelines.silver.judging import cache
from pipelines.silver.judging.client import JudgeClient
from pipelines.silver.judging.prompt import (
    PROMPT_VERSION,
    JudgeAnswerError,
    answer_schema,
    build_messages,
    parse,
    ranks,
    retry_messages,
)
from schemas.config import JudgeSettings
from schemas.lake import Lake

_log = logging.getLogger(__name__)


@dataclass
class JudgeStats:
    """What one run of the judge did: model calls, cache hits, groups judged and left unparsed."""

    calls: int = 0
    cache_hits: int = 0
    judged: int = 0
    unparsed: int = 0

    def metadata(self) -> dict[str, int]:
        return {
            "judge_calls": self.calls,
            "judge_cache_hits": self.cache_hits,
            "judge_groups": self.judged,
            "judge_unparsed": self.unparsed,
        }


@dataclass(frozen=True)
class _Answer:
    status: Literal["ok", "unparsed"]
    scores: list[float] | None
    reasons: list[str]
    calls: int


def fingerprint(settings: JudgeSettings) -> str:
    """8 hex digits of what the judge's meaning rests on besides its version: rubric, model, prompt."""
    text = "\x1f".join([PROMPT_VERSION, settings.model, settings.rubric.strip()])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class LlmJudge:
    """Ranks groups of trajectories with an LLM; ``settings`` resolved (``JudgeSettings.resolved``)."""

    def __init__(
        self,
        settings: JudgeSettings,
        lake: Lake,
        *,
        transport: httpx.BaseTransport | None = None,
        log: Callable[[str], object] = _log.warning,
    ) -> None:
        if not settings.url or not settings.model:
            raise ValueError("LlmJudge needs resolved settings (JudgeSettings.resolved): a url and a model")
        self.settings = settings
        self.lake = lake
        self.name = settings.name
        self.version = f"{settings.version}-{fingerprint(settings)}"
        self.group_by: Literal["task", "agent"] = settings.group_by
        self.window = settings.window
        self.stats = JudgeStats()
        self.log = log
        self.client = JudgeClient(
            settings.url,
            settings.model,
            api_key_env=settings.api_key_env,
            timeout_s=settings.timeout_s,
            transport=transport,
        )

    @property
    def source(self) -> str:
        return f"fn:{self.name}@{self.version}"

    def _params(self) -> dict[str, Any]:
        s = self.settings
        return {"max_tokens": s.max_tokens, "temperature": s.temperature, "guided": s.guided, "model": s.model}

    def score_groups(self, groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[float | None]]:
        """Each group's rewards, member by member: its rank in [0, 1], or None (a group of one, or unparsed)."""
        asks: dict[int, tuple[str, list[cache.Member], list[dict[str, str]]]] = {}
        for i, rows in enumerate(groups):
            if len(rows) < 2:  # nothing to rank against
                continue
            members = [(r["tenant"], r["rollout_id"], r["attempt_id"]) for r in rows]
            messages = build_messages(self.settings.rubric, rows, max_chars=self.settings.max_chars)
            asks[i] = (cache.judgement_id(self.source, self._params(), members, messages), members, messages)
        stored = cache.lookup(self.lake, {jid for jid, _, _ in asks.values()})
        hits = {i for i, (jid, members, _) in asks.items() if cache.complete(stored.get(jid, []), members)}
        self.stats.cache_hits += len(hits)
        todo = [i for i in asks if i not in hits]
        answers: dict[int, _Answer] = {}
        failure: BaseException | None = None
        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            futures = {i: pool.submit(self._ask, asks[i][2], len(asks[i][1])) for i in todo}
            for i, future in futures.items():
                try:
                    answers[i] = future.result()
                except Exception as exc:  # stored what was answered first: a rerun does not ask again
                    failure = failure or exc
        new_rows = [row for i, answer in answers.items() for row in self._rows(asks[i][0], asks[i][1], answer)]
        cache.store(self.lake, new_rows)
        self.stats.judged += len(answers)
        self.stats.calls += sum(a.calls for a in answers.values())
        self.stats.unparsed += sum(1 for a in answers.values() if a.status == "unparsed")
        if failure is not None:
            raise failure
        out: list[list[float | None]] = []
        for i, rows in enumerate(groups):
            if i in hits:
                out.append([r["reward"] for r in stored[asks[i][0]]])
            elif (answer := answers.get(i)) is not None and answer.scores is not None:
                out.append(list(ranks(answer.scores)))
            else:
                out.append([None] * len(rows))
        return out

    def _ask(self, messages: list[dict[str, str]], n: int) -> _Answer:
        """Ask once; on an unusable answer, once more with what was wrong; then give up on the group."""
        s = self.settings
        schema = answer_schema(n) if s.guided else None
        text = self.client.complete(messages, max_tokens=s.max_tokens, temperature=s.temperature, schema=schema)
        try:
            return self._answer(parse(text, n), 1)
        except JudgeAnswerError as first:
            again = retry_messages(messages, text, str(first), n)
            text = self.client.complete(again, max_tokens=s.max_tokens, temperature=s.temperature, schema=schema)
            try:
                return self._answer(parse(text, n), 2)
            except JudgeAnswerError as second:
                self.log(
                    f"judge {self.source}: no usable answer for a group of {n} after a retry ({second}); "
                    f"its members get no judge reward. The answer began: {text[:200]!r}"
                )
                return _Answer("unparsed", None, [""] * n, 2)

    @staticmethod
    def _answer(parsed: list[tuple[float, str]], calls: int) -> _Answer:
        return _Answer("ok", [s for s, _ in parsed], [r for _, r in parsed], calls)

    def _rows(self, jid: str, members: list[cache.Member], answer: _Answer) -> list[dict[str, Any]]:
        rewards = ranks(answer.scores) if answer.scores is not None else [None] * len(members)
        return [
            {
                "judgement_id": jid,
                "source": self.source,
                "tenant": tenant,
                "rollout_id": rollout,
                "attempt_id": attempt,
                "position": pos,
                "members": len(members),
                "status": answer.status,
                "score": answer.scores[pos - 1] if answer.scores is not None else None,
                "reward": rewards[pos - 1],
                "reason": answer.reasons[pos - 1] or None,
                "model": self.settings.model,
                "calls": answer.calls,
            }
            for pos, (tenant, rollout, attempt) in enumerate(members, start=1)
        ]

    def close(self) -> None:
        self.client.close()
