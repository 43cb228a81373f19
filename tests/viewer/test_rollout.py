"""/rollouts/{id} over a lake the pipeline built: spans, calls with tool calls and results, tokens coloured
by mask and advantage (decoded with the gold step's tokenizer), rewards by source, the judge's words,
credit variants side by side, the versions that trained it; 404 for a missing rollout."""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from pipelines.gold.retokenize import policy_retokenizer
from tests.viewer.conftest import viewer_settings
from tests.viewer.lake import JUDGE_REASON, OBSERVATION, TOOL_RESULT


def section(page: str, anchor: str) -> str:
    """The HTML from ``<h2 id=anchor>`` to the next ``<h2``."""
    start = page.index(f'<h2 id="{anchor}">')
    end = page.find("<h2", start + 1)
    return page[start : end if end > 0 else None]


def test_rollout_page_shows_spans_calls_rewards_and_tokens(client: TestClient, tmp_path: Path) -> None:
    page = client.get("/rollouts/r0", params={"tenant": "default"})
    assert page.status_code == 200
    text = page.text
    assert '<h1>Rollout <span class="mono">r0</span></h1>' in text
    assert 'href="/rollouts/r0?tenant=acme"' in text  # the other tenant's r0, for the operator

    spans = section(text, "spans")
    # the root with its children: 3 LLM calls, 3 tool spans, the reward span, each with a duration
    assert spans.count("<b>agentlake.rollout</b>") == 1 and spans.count("<b>agentlake.llm.call</b>") == 3
    assert spans.count("<b>tool.calc</b>") == 3 and "5.0 ms" in spans
    assert spans.index("agentlake.rollout") < spans.index('<ul class="spans">')  # children nested under it

    calls = section(text, "calls")
    assert calls.count('<section class="call">') == 3
    assert "tool call <b>calc</b>" in calls and html.escape(TOOL_RESULT) in calls and "result of call-0-1" in calls
    assert "The answer is 42." in calls and 'class="badge exact"' in calls

    rewards = section(text, "rewards")
    assert "<td>span</td><td>primary</td>" in rewards and "<td>event</td><td>human</td>" in rewards
    assert "r0 checked the tool and answered 42" in rewards and "fn:judge@1" in rewards

    transitions = section(text, "transitions")
    tok = policy_retokenizer(viewer_settings(tmp_path))()
    assert tok is not None
    # one merged transition: 3 answers of 3 trained tokens, 2 masked observation tokens between them
    trained = re.findall(
        r'<span class="tok" style="background: rgba\(22,163,74,[0-9.]+\)" title="([^"]*)">', transitions
    )
    masked = re.findall(r'<span class="tok masked" style="" title="[^"]*">([^<]*)</span>', transitions)
    main = transitions[transitions.index('<div class="variants">') : transitions.index("disc09")]
    assert main.count('class="tok"') + main.count('class="tok masked"') == 13
    assert "logprob -0.2500 · trained · advantage +1.0000" in trained
    obs = html.escape(tok.tokenizer.decode([OBSERVATION[0]]), quote=False)
    assert obs in masked
    assert "3 calls merged" in transitions
    assert "<h3>disc09</h3>" in transitions and "discounted/rloo" in transitions and "identical/grpo" in transitions
    assert 'trained <span class="trained-in"><a href="/versions/v0002">v0002</a>' in transitions


def test_the_judges_words_and_a_negative_advantage(client: TestClient) -> None:
    page = client.get("/rollouts/r1")
    assert page.status_code == 200
    assert JUDGE_REASON.replace("'", "&#39;") in page.text
    assert "rgba(220,38,38," in section(page.text, "transitions")  # below its group's mean: red
    assert "trained-in" not in page.text  # no version trained on r1


def test_a_missing_rollout_is_a_404_page(client: TestClient) -> None:
    page = client.get("/rollouts/no-such-rollout")
    assert page.status_code == 404
    assert "<h1>Not found</h1>" in page.text and "rollout &#39;no-such-rollout&#39; is not in the lake" in page.text
    assert client.get("/rollouts/r0", params={"attempt": "nope"}).status_code == 404


def test_bad_rollout_parameters_are_a_400(client: TestClient) -> None:
    page = client.get("/rollouts/r0", params={"foo": "1"})
    assert page.status_code == 400 and "unknown parameter &#39;foo&#39;" in page.text
    assert client.get("/rollouts/r0", params={"tenant": "x" * 300}).status_code == 400


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rollout_id=st.text(min_size=1, max_size=40), attempt=st.none() | st.text(max_size=20))
def test_any_rollout_id_is_a_page_or_a_404_never_a_500(
    client: TestClient, rollout_id: str, attempt: str | None
) -> None:
    params = {} if attempt is None else {"attempt": attempt}
    page = client.get("/rollouts/" + quote(rollout_id, safe=""), params=params)
    assert page.status_code in (200, 400, 404), (rollout_id, page.text[:300])
