"""Static HTML pages for episodes: the orchestrator's decisions and each sub-agent's steps on a timeline.

One self-contained page per episode (inline CSS, no script, no network), so a folder of pages can be
opened anywhere or archived with a run; ``write_site`` adds the index (``viewer_index``: summary per system,
sorting, filters). The timeline has one lane for the orchestrator and one per sub-agent, on the engine's
global step clock: decisions sit at the clock they were taken at, and sub-agent steps follow from there
(notifications take no step). It spans the page's width, whatever the episode's length. Communication
messages (submit / revise / stop), invalid replies and harness revisions are marked; below it, every
decision shows the model's raw reply, the parsed action or the parse error, the feedback and the
sub-agent segment (tool calls, messages, results), with the exact context the orchestrator saw one click
away. The header gives the outcome, tokens per role and, with prices, the cost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path

from porch_jax.eval.viewer_index import error_kinds, outcome_label, render_index, tokens
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, SubStep

# role -> (price per 1k prompt tokens, price per 1k completion tokens), in any currency
Prices = Mapping[str, tuple[float, float]]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:18px;margin:0 0 8px}h2{font-size:16px}table{border-collapse:collapse}
td,th{padding:2px 10px;text-align:left}
.ok{color:#17752d}.fail{color:#b3261e}.meta td:first-child{color:#666}a.back{font-size:13px}
#timeline{width:100%;box-sizing:border-box;overflow-x:auto;margin:16px 0;border:1px solid #ddd;padding:8px}
.lane{display:flex;align-items:flex-start;min-height:26px;border-bottom:1px dotted #ccc}
.lane-name{width:110px;flex:none;color:#555;line-height:24px}
.track{position:relative;flex:1 1 auto;min-width:var(--min)}
.axis .track{height:16px}
.tick{position:absolute;top:0;font-size:10px;color:#888;border-left:1px solid #ccc;padding-left:2px}
.mark{position:absolute;height:18px;width:calc(var(--w) - 3px);min-width:4px;border-radius:3px;background:#9bb8d3;
  font-size:10px;line-height:16px;text-align:center;color:#fff;text-decoration:none;overflow:hidden;
  border:1px solid #fff;box-sizing:border-box}
.mark.decision{background:#3d6fb6}.mark.comm{background:#e08a00}.mark.revision{background:#8e3fb5}
.mark.notification{background:#2a9d8f;width:5px;min-width:5px}.mark.error{background:#b3261e}
.mark.finish{background:#17752d}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:12px;height:12px;
  border-radius:3px;margin-right:4px;vertical-align:middle}
details{margin:6px 0;border-left:3px solid #3d6fb6;padding-left:8px}details.revision{border-color:#8e3fb5}
details.error{border-color:#b3261e}details.finish{border-color:#17752d}details.context{border-color:#ccc}
summary{cursor:pointer}.label{color:#666;font-size:12px;margin-top:4px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:6px;margin:2px 0;max-height:320px;
  overflow:auto}
pre.raw{background:#eef3fb}pre.parse-error{background:#fbeeee}
.step{margin:4px 0 4px 12px;padding-left:8px;border-left:3px solid #9bb8d3}.step.comm{border-color:#e08a00}
.step.notification{border-color:#2a9d8f}.step.error{border-color:#b3261e}
.step b{text-transform:uppercase;font-size:11px}
"""
_LEGEND = (
    ("step", "sub-agent tool call"),
    ("decision", "orchestrator decision"),
    ("revision", "revision of a sub-agent"),
    ("comm", "communication (submit / revise / stop)"),
    ("notification", "notification"),
    ("error", "invalid reply"),
    ("finish", "finish"),
)
_MIN_STEP_PX = 6  # below this a step's marks would blur together: the track scrolls instead
_ROW_PX = 20  # marks at the same step stack (invalid replies take no step) one row apart


def page_name(episode_id: str) -> str:
    """A file name for an episode that is safe on every filesystem and unique per id."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", episode_id).strip("_")[:80]
    return f"{slug}-{hashlib.sha1(episode_id.encode()).hexdigest()[:8]}.html"


def _decision_kind(d: DecisionRecord) -> str:
    name = (d.action or {}).get("name")
    return {"revise": "revision", "finish": "finish"}.get(name or "", "decision" if d.action else "error")


class _Lane:
    """One lane's marks, placed in percent of the track so the timeline scales with the page."""

    def __init__(self) -> None:
        self.marks: list[str] = []
        self.stack: Counter[tuple[int, bool]] = Counter()

    def add(self, kind: str, clock: int, span: int, anchor: str, title: str, label: str = "") -> None:
        between = kind == "notification"  # notifications arrive between steps, at the end of one
        row = self.stack[clock, between]
        self.stack[clock, between] += 1
        left = f"calc({(clock + between) * 100 / span:.3f}% - 6px)" if between else f"{clock * 100 / span:.3f}%"
        self.marks.append(
            f'<a class="mark {kind}" style="left:{left};top:{2 + row * _ROW_PX}px" href="#{anchor}" '
            f'title="{escape(title)}">{escape(label)}</a>'
        )

    def html(self, name: str) -> str:
        rows = max(self.stack.values(), default=1)
        return (
            f'<div class="lane"><div class="lane-name">{escape(name)}</div>'
            f'<div class="track" style="height:{rows * _ROW_PX + 4}px">{"".join(self.marks)}</div></div>'
        )


def _ticks(span: int) -> str:
    every = next(k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if span / k <= 20)
    return "".join(f'<span class="tick" style="left:{c * 100 / span:.3f}%">{c}</span>' for c in range(0, span, every))


def _solo(record: EpisodeRecord) -> list[SubStep]:
    """A ReAct episode's one agent: its steps are in ``meta["segment"]``, with no decisions."""
    return [SubStep(**s) for s in record.meta.get("segment") or ()]


def _timeline(record: EpisodeRecord) -> tuple[str, int]:
    """The lanes as HTML (an axis of steps, the orchestrator, one per sub-agent), and the number of steps they span.

    Positions are percentages of the track, which fills the page's width (down to a few pixels per step, then it
    scrolls), so a short episode is as readable as a long one. A ReAct episode's steps follow clock 0 as a
    segment would."""
    segments = [(int(d.meta.get("clock", 0)), d.segment, f"d{d.index}s") for d in record.decisions]
    segments.append((0, _solo(record), "s"))
    span = 2 + max(clock + sum(s.kind != "notification" for s in seg) for clock, seg, _ in segments)
    lanes: dict[str, _Lane] = {}
    for d in record.decisions:
        name = (d.action or {}).get("name", "invalid")
        lanes.setdefault("orchestrator", _Lane()).add(
            _decision_kind(d),
            int(d.meta.get("clock", 0)),
            span,
            f"d{d.index}",
            f"decision {d.index}: {name}",
            str(d.index),
        )
    for clock, segment, anchor in segments:
        for j, s in enumerate(segment):
            if s.kind != "notification":
                clock += 1
            kind = s.kind if s.kind in ("comm", "notification", "error") else "step"
            title = f"agent {s.agent_id} v{s.harness_version} {s.kind}: {s.tool or s.text[:80]}"
            lanes.setdefault(f"agent {s.agent_id}", _Lane()).add(kind, clock, span, f"{anchor}{j}", title)
    axis = f'<div class="lane axis"><div class="lane-name">step</div><div class="track">{_ticks(span)}</div></div>'
    body = "".join(lane.html(n) for n, lane in lanes.items())
    return (
        f'<div class="lanes" style="--w:{100 / span:.3f}%;--min:{span * _MIN_STEP_PX}px">{axis}{body}</div>',
        span - 2,
    )


def _cost(record: EpisodeRecord, prices: Prices | None) -> str:
    rows, total = [], 0.0
    for role, c in sorted(record.cost.items()):
        cell = ""
        if prices and role in prices:
            money = c.prompt_tokens / 1000 * prices[role][0] + c.completion_tokens / 1000 * prices[role][1]
            total += money
            cell = f"{money:.4f}"
        rows.append(
            f"<tr><td>{escape(role)}</td><td>{c.calls}</td><td>{c.prompt_tokens}</td>"
            f"<td>{c.completion_tokens}</td><td>{cell}</td></tr>"
        )
    foot = f"<tr><th>total</th><td></td><td></td><td></td><th>{total:.4f}</th></tr>" if prices else ""
    return (
        '<table id="cost"><tr><th>role</th><th>calls</th><th>prompt tokens</th><th>completion tokens</th>'
        f"<th>cost</th></tr>{''.join(rows)}{foot}</table>"
    )


_STEP_LABELS = {"tool": "tool call", "comm": "message", "notification": "notification", "error": "invalid reply"}


def _step(s: SubStep, anchor: str) -> str:
    """A sub-agent step: what it wrote (raw), the tool or message it named, and what came back."""
    what = f" <code>{escape(s.tool)}</code>" if s.tool else ""
    text = f'<pre class="raw">{escape(s.text)}</pre>' if s.text else ""
    obs = f'<div class="label">result</div><pre>{escape(s.observation)}</pre>' if s.observation else ""
    return (
        f'<div class="step {s.kind}" id="{anchor}"><b>{_STEP_LABELS[s.kind]}</b>{what} · agent {s.agent_id} '
        f"v{s.harness_version}{text}{obs}</div>"
    )


def _decision(d: DecisionRecord) -> str:
    """A decision, open: the model's raw reply, the action it parsed to (or why not), the feedback, then the
    sub-agent segment it started; the exact context is one click away (it repeats from decision to decision)."""
    name = (d.action or {}).get("name", "invalid")
    context = "".join(
        f"<pre><b>{escape(str(m.get('role')))}</b>: {escape(str(m.get('content')))}</pre>" for m in d.context
    )
    parsed = (
        f'<div class="label">parsed action</div><pre>{escape(json.dumps(d.action, ensure_ascii=False))}</pre>'
        if d.action
        else f'<div class="label">parse error</div><pre class="parse-error">{escape(d.parse_error or "")}</pre>'
    )
    steps = "".join(_step(s, f"d{d.index}s{j}") for j, s in enumerate(d.segment))
    event = f" · event: {escape(str(d.meta['event']))}" if d.meta.get("event") else ""
    return (
        f'<details open class="{_decision_kind(d)}" id="d{d.index}"><summary>decision {d.index} '
        f"(step {escape(str(d.meta.get('clock', '?')))}): <b>{escape(name)}</b>"
        f"{'' if d.agent_id is None else f' → agent {d.agent_id}'}{event}</summary>"
        f'<details class="context"><summary>context ({len(d.context)} messages)</summary>{context}</details>'
        f'<div class="label">model reply (raw)</div><pre class="raw">{escape(d.action_text)}</pre>{parsed}'
        f'<div class="label">feedback</div><pre>{escape(d.feedback)}</pre>{steps}</details>'
    )


def render_episode(record: EpisodeRecord, prices: Prices | None = None, index_href: str | None = None) -> str:
    """One episode as a self-contained HTML page; ``index_href`` links back to the site's index when given."""
    lanes, steps = _timeline(record)
    o = record.outcome
    label = outcome_label(o)
    status = f'<span class="{"ok" if o.success else "fail"}">{label}</span>'
    meta = [
        ("episode", record.episode_id),
        ("task", record.task_id),
        ("environment", record.env),
        ("system", record.system),
        ("seed", str(record.seed)),
        ("config", record.config_hash),
        ("score", f"{o.score:.2f}"),
        ("reason", o.reason),
        ("steps", str(record.meta.get("steps", steps))),
        ("tokens", f"{tokens(record):,}"),
        ("invalid replies", ", ".join(f"{k} ×{n}" for k, n in sorted(error_kinds(record).items())) or "none"),
        ("answer", str(record.meta.get("answer", ""))),
    ]
    rows = "".join(f"<tr><td>{k}</td><td>{escape(v)}</td></tr>" for k, v in meta)
    legend = "".join(f'<span><i class="mark {k}" style="position:static"></i>{v}</span>' for k, v in _LEGEND)
    solo_html = "".join(_step(s, f"s{j}") for j, s in enumerate(_solo(record)))
    back = f'<a class="back" href="{escape(index_href)}">← all episodes</a>' if index_href else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(record.episode_id)}</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{_CSS}</style></head><body>{back}<h1>{escape(record.episode_id)} — {status}</h1>"
        f'<table class="meta">{rows}</table>{_cost(record, prices)}'
        f'<div class="legend">{legend}</div><div id="timeline">{lanes}</div>'
        f'<h2>{"Decisions" if record.decisions else "Steps"}</h2><div id="decisions">{"".join(_decision(d) for d in record.decisions)}{solo_html}</div>'
        "</body></html>"
    )


def _page_names(records: list[EpisodeRecord]) -> list[str]:
    """One file per record. A finished episode gets ``page_name(episode_id)`` (so other pages can link it by id), or
    ``page_name("system/episode_id")`` where stores of several systems share its id; its retryable attempts get a
    numbered name of their own."""
    systems: dict[str, set[str]] = {}
    for r in records:
        systems.setdefault(r.episode_id, set()).add(r.system)
    names = [""] * len(records)
    taken: set[str] = set()
    for i in sorted(range(len(records)), key=lambda i: records[i].outcome.retryable):
        r = records[i]
        key = f"{r.system}/{r.episode_id}" if len(systems[r.episode_id]) > 1 else r.episode_id
        name, n = page_name(key), 1
        while name in taken:
            name, n = page_name(f"{key}#{n}"), n + 1
        names[i] = name
        taken.add(name)
    return names


def write_site(
    records: Iterable[EpisodeRecord],
    out_dir: str | Path,
    prices: Prices | None = None,
    *,
    title: str | None = None,
    results_href: str | None = None,
) -> list[Path]:
    """One page per record plus ``index.html`` (summary, sortable and filterable table); returns the episode pages.

    Records of several systems (several stores) share one index. ``title`` heads the index; ``results_href`` is a
    link from the index back to the run's results page that links it.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    pages = [out / name for name in _page_names(records)]
    for r, path in zip(records, pages, strict=True):
        path.write_text(render_episode(r, prices, index_href="index.html"), encoding="utf-8")
    index = render_index([(r, p.name) for r, p in zip(records, pages, strict=True)], _CSS, title, results_href)
    (out / "index.html").write_text(index, encoding="utf-8")
    return pages
