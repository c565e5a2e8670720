"""What the store says, summarised: `feedback stats`, `feedback export --jsonl`, `feedback report --html`.

`compute_stats` reads the store once and returns plain JSON: acceptance rate (completions accepted,
wholly or in part, over completions shown), persistence at each checkpoint (share of tracked regions
in each status, and the kept share: unchanged + mostly unchanged), revert rate (regions whose last
checkpoint found them reverted), the same per model and per language, per day, and the churn signals
(sessions per active day, days since the last session, model switches right after an output), and
completions split by their context: composed with the repository's reference documents (Squid) or
not, so a team sees whether the repository context is what its members accept.
"""

from __future__ import annotations

import html
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from context.config import FeedbackConfig

from .store import FeedbackStore, named_references
from .tracking import STATUSES

__all__ = ["compute_stats", "export_jsonl", "render_html", "checkpoint_label"]

_ACCEPTED = ("accepted", "partially_accepted")


def checkpoint_label(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


class _Tally:
    def __init__(self) -> None:
        self.episodes = 0
        self.shown = 0
        self.accepted = 0
        self.applied = 0
        self.checkpoints: dict[float, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
        self.final: dict[str, int] = dict.fromkeys(STATUSES, 0)

    def add(self, item) -> None:
        self.episodes += 1
        kinds = {e["kind"] for e in item.events}
        if item.episode["kind"] == "completion" and "shown" in kinds:
            self.shown += 1
            self.accepted += bool(kinds & set(_ACCEPTED))
        self.applied += "applied" in kinds
        for outcome in item.outcomes:
            self.checkpoints[outcome["checkpoint_s"]][outcome["status"]] += 1
        for outcome in item.final_outcomes():
            self.final[outcome["status"]] += 1

    def summary(self) -> dict[str, Any]:
        regions = sum(self.final.values())
        return {
            "episodes": self.episodes,
            "shown": self.shown,
            "accepted": self.accepted,
            "applied": self.applied,
            "acceptance_rate": _rate(self.accepted, self.shown),
            "persistence": {
                checkpoint_label(cp): _persistence(counts) for cp, counts in sorted(self.checkpoints.items())
            },
            "revert_rate": _rate(self.final["reverted"], regions),
            "tracked_regions": regions,
        }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _persistence(counts: dict[str, int]) -> dict[str, Any]:
    total = sum(counts.values())
    return {
        "n": total,
        "kept_rate": _rate(counts["unchanged"] + counts["mostly_unchanged"], total),
        **{status: _rate(n, total) for status, n in counts.items()},
    }


def compute_stats(
    store: FeedbackStore,
    since: float | None = None,
    until: float | None = None,
    config: FeedbackConfig | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The `feedback stats --json` object."""
    now = time.time() if now is None else now
    overall, by_model, by_language, by_day, by_context = (
        _Tally(),
        defaultdict(_Tally),
        defaultdict(_Tally),
        defaultdict(_Tally),
        defaultdict(_Tally),
    )
    for item in store.episodes_with_outcomes(since, until):
        overall.add(item)
        by_model[item.episode["model_id"] or "unknown"].add(item)
        by_language[item.episode["language"] or "unknown"].add(item)
        by_day[datetime.fromtimestamp(item.episode["ts"]).strftime("%Y-%m-%d")].add(item)
        if item.episode["kind"] == "completion":
            with_references = bool(named_references(item.episode))
            by_context["with reference documents" if with_references else "without"].add(item)
    sessions = list(store.rows("sessions", since, until))
    days = {s["day"] for s in sessions}
    last_seen = max((s["last_seen"] for s in sessions), default=None)
    switches = list(store.rows("model_switches", since, until))
    window = (config or FeedbackConfig()).switch_window_s
    return {
        "db": str(store.path),
        **overall.summary(),
        "by_model": {name: tally.summary() for name, tally in sorted(by_model.items())},
        "by_language": {name: tally.summary() for name, tally in sorted(by_language.items())},
        # Completions composed with reference documents (Squid) and without.
        "by_context": {name: tally.summary() for name, tally in sorted(by_context.items())},
        "over_time": [{"day": day, **_day(tally)} for day, tally in sorted(by_day.items())],
        "sessions": {
            "count": len(sessions),
            "active_days": len(days),
            "per_active_day": round(len(sessions) / len(days), 3) if days else None,
            "days_since_last": round((now - last_seen) / 86400, 3) if last_seen else None,
        },
        "model_switches": {
            "count": len(switches),
            "right_after_output": sum(
                1
                for s in switches
                if s["seconds_after_output"] is not None and s["seconds_after_output"] <= window
            ),
        },
    }


def _day(tally: _Tally) -> dict[str, Any]:
    summary = tally.summary()
    return {k: summary[k] for k in ("episodes", "shown", "accepted", "acceptance_rate", "revert_rate")}


def export_jsonl(
    store: FeedbackStore, since: float | None = None, until: float | None = None
) -> Iterator[str]:
    """One JSON object a line: episodes (with their events and outcomes), sessions, model switches."""
    for item in store.episodes_with_outcomes(since, until):
        yield json.dumps(
            {"type": "episode", **item.episode, "events": item.events, "outcomes": item.outcomes}
        )
    for table, kind in (("sessions", "session"), ("model_switches", "model_switch")):
        for row in store.rows(table, since, until):
            yield json.dumps({"type": kind, **row})


def render_html(stats: dict[str, Any]) -> str:
    """A self-contained page (no network): the figures as tables and SVG charts drawn by inline JS.

    The script sets `data-charts-drawn` on <body> to the number of charts it drew.
    """
    data = json.dumps(stats).replace("</", "<\\/")
    return _PAGE.replace("__DATA__", data).replace(
        "__TITLE__", html.escape(f"squidcode feedback: {stats['db']}")
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
h2 { margin-top: 1.6em; } .chart { display: block; margin: .5em 0; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
.none { color: #888; }
</style></head>
<body data-charts-drawn="0">
<h1>squidcode feedback</h1>
<p id="summary"></p>
<h2>Acceptance rate per day</h2><div id="over_time"></div>
<h2>Persistence at each checkpoint</h2>
<p id="legend"></p><div id="persistence"></div>
<h2>By model</h2><div id="by_model"></div>
<h2>By language</h2><div id="by_language"></div>
<h2>Completions with and without reference documents</h2><div id="by_context"></div>
<script id="stats" type="application/json">__DATA__</script>
<script>
"use strict";
const stats = JSON.parse(document.getElementById("stats").textContent);
const NS = "http://www.w3.org/2000/svg";
const COLORS = {unchanged: "#2e7d32", mostly_unchanged: "#9ccc65", modified: "#ffb300",
                removed: "#8d6e63", reverted: "#c62828", value: "#1565c0"};
function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%"; }
// bars: [{label, parts: [[key, fraction]]}] drawn as stacked horizontal bars, one row each.
function barChart(target, bars) {
  const host = document.getElementById(target);
  if (!bars.length) { host.innerHTML = '<p class="none">no data yet</p>'; return 0; }
  const row = 26, width = 640, left = 170;
  const svg = el("svg", {width: width, height: bars.length * row + 10, class: "chart",
                         "data-chart": target}, host);
  bars.forEach((bar, i) => {
    const label = el("text", {x: 4, y: i * row + 18, "font-size": 12}, svg);
    label.textContent = bar.label;
    let x = left;
    for (const [key, fraction] of bar.parts) {
      const w = Math.max(0, (width - left - 10) * (fraction || 0));
      const rect = el("rect", {x: x, y: i * row + 4, width: w, height: row - 8, fill: COLORS[key] || "#999",
                               "data-key": key}, svg);
      el("title", {}, rect).textContent = key + ": " + pct(fraction);
      x += w;
    }
    if (bar.parts.length === 1) {
      el("text", {x: x + 6, y: i * row + 18, "font-size": 12}, svg).textContent = pct(bar.parts[0][1]);
    }
  });
  return 1;
}
const statuses = ["unchanged", "mostly_unchanged", "modified", "removed", "reverted"];
document.getElementById("summary").textContent =
  `${stats.episodes} episodes, acceptance ${pct(stats.acceptance_rate)}, ` +
  `revert rate ${pct(stats.revert_rate)}, ` +
  `${stats.sessions.count} sessions, days since last ${stats.sessions.days_since_last ?? "n/a"}`;
document.getElementById("legend").innerHTML = statuses
  .map(s => `<span style="color:${COLORS[s]}">&#9632;</span> ${s.replace("_", " ")}`).join(" &nbsp; ");
let drawn = 0;
drawn += barChart("over_time", stats.over_time.filter(d => d.acceptance_rate !== null)
  .map(d => ({label: d.day, parts: [["value", d.acceptance_rate]]})));
drawn += barChart("persistence", Object.entries(stats.persistence)
  .map(([cp, p]) => ({label: `${cp} (n=${p.n})`, parts: statuses.map(s => [s, p[s]])})));
for (const group of ["by_model", "by_language", "by_context"]) {
  drawn += barChart(group, Object.entries(stats[group]).filter(([, s]) => s.acceptance_rate !== null)
    .map(([name, s]) => ({label: name.slice(-24), parts: [["value", s.acceptance_rate]]})));
}
document.body.setAttribute("data-charts-drawn", String(drawn));
</script>
</body></html>
"""
