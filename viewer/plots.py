"""Reward plots as server-rendered SVG (matplotlib, Agg): one line per series with its interval drawn.

A plot is drawn once per distinct data (an LRU cache keyed by what it shows), since the same page asked
again draws the same picture. Pages embed it as a base64 ``data:`` image, so labels taken from the lake
(agent names, versions) never become markup in the page.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported anywhere in this process

import matplotlib.dates as mdates  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

MAX_SERIES = 8  # lines a plot draws: the series with the most rollouts
CACHE_SIZE = 64


@dataclass(frozen=True)
class Plot:
    """A drawn plot: its SVG as a ``data:`` URI, and what it left out (series beyond ``MAX_SERIES``)."""

    uri: str
    series: tuple[str, ...]
    left_out: tuple[str, ...]
    empty: bool


_cache: OrderedDict[tuple[object, ...], Plot] = OrderedDict()
_lock = threading.Lock()


_BUCKET_WIDTH = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1), "week": dt.timedelta(weeks=1)}


def reward_plot(frame: pl.DataFrame, *, title: str, series_label: str, bucket: str) -> Plot:
    """Mean reward per ``bucket`` for each series of ``frame`` (columns bucket, key, n, mean, low, high, as
    ``viewer.queries.versions.reward_over_time`` returns), the 95% interval of each mean drawn as a bar and a band."""
    key = (title, series_label, bucket, tuple(frame.select("bucket", "key", "n", "mean", "low", "high").rows()))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    plot = _draw(frame, title=title, series_label=series_label, bucket=bucket)
    with _lock:
        _cache[key] = plot
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return plot


def _draw(frame: pl.DataFrame, *, title: str, series_label: str, bucket: str) -> Plot:
    sizes = frame.group_by("key").agg(pl.col("n").sum()).sort(["n", "key"], descending=[True, False])
    keys = [str(k) for k in sizes["key"]]
    shown, rest = keys[:MAX_SERIES], keys[MAX_SERIES:]
    fig = Figure(figsize=(7.5, 3.2), dpi=100)
    ax = fig.add_subplot()
    for name in sorted(shown):
        s = frame.filter(pl.col("key") == name).sort("bucket")
        x = s["bucket"].to_list()
        line = ax.plot(x, s["mean"].to_list(), marker="o", markersize=3, linewidth=1.5, label=name)[0]
        lows, highs = s["low"].to_list(), s["high"].to_list()
        if any(v is not None for v in lows):  # a bucket of one rollout has no interval: a gap in the band
            nan = float("nan")
            low = [nan if v is None else v for v in lows]
            high = [nan if v is None else v for v in highs]
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            ax.vlines(x, low, high, color=line.get_color(), alpha=0.6, linewidth=1)  # seen where a band cannot be
    ax.set_title(
        f"{title}\nmean per {bucket}; bars and band: 95% normal interval of the mean (2+ rollouts)", fontsize=9
    )
    ax.set_xlabel(f"rollout end ({bucket}, UTC)", fontsize=8)
    ax.set_ylabel("mean final reward", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if shown:
        # one bucket either side: a single bucket would otherwise get matplotlib's default span of years
        pad = _BUCKET_WIDTH[bucket]
        first, last = frame["bucket"].min(), frame["bucket"].max()
        ax.set_xlim(mdates.date2num(first - pad), mdates.date2num(last + pad))  # type: ignore[operator]
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.legend(title=series_label, fontsize=7, title_fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no rollouts with a final reward", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as <text>, not glyph paths: a third the size
        fig.savefig(buf, format="svg", metadata={"Date": None})
    uri = "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return Plot(uri=uri, series=tuple(sorted(shown)), left_out=tuple(rest), empty=not shown)
