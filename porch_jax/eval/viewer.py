"""Static HTML pages for episodes: the orchestrator's decisions and each sub-agent's steps on a timeline.

One self-contained page per episode (inline CSS, no script, no network), so a folder of pages can be
opened anywhere or archived with a run. The timeline has one lane for the orchestrator and one per
sub-agent, on the engine's global step clock: decisions sit at the clock they were taken at, and
sub-agent steps follow from there (notifications take no step). Communication messages
(submit / revise / stop) and harness revisions are marked; below it, every decision shows the exact
context the orchestrator saw, its action, the feedback and the sub-agent segment. The header gives
the outcome, tokens per role and, with prices, the cost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path

from porch_jax.trajectories import DecisionRecord, EpisodeRecord, SubStep

# role -> (price per 1k prompt tokens, price per 1k completion tokens), in any currency
Prices = Mapping[str, tuple[float, float]]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:18px;margin:0 0 8px}table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left}
.ok{color:#17752d}.fail{color:#b3261e}.meta td:first-child{color:#666}
#timeline{overflow-x:auto;margin:16px 0;border:1px solid #ddd;padding:8px}
.lane{display:flex;align-items:center;height:26px}.lane-name{width:120px;flex:none;color:#555}
.track{position:relative;height:22px;flex:none;border-bottom:1px dotted #ccc}
.mark{position:absolute;top:2px;height:18px;width:14px;border-radius:3px;background:#9bb8d3;
  font-size:10px;text-align:center;color:#fff;text-decoration:none}
.mark.decision{background:#3d6fb6}.mark.comm{background:#e08a00}.mark.revision{background:#8e3fb5}
.mark.notification{background:#2a9d8f;width:6px}.mark.error{background:#b3261e}.mark.finish{background:#17752d}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:12px;height:12px;
  border-radius:3px;margin-right:4px;vertical-align:middle}
details{margin:6px 0;border-left:3px solid #3d6fb6;padding-left:8px}details.revision{border-color:#8e3fb5}
pre{white-space:pre-wrap;background:#f6f6f6;padding:6px;margin:4px 0;max-height:320px;overflow:auto}
.step{margin:2px 0 2px 12px}.step.comm{color:#a65f00}.step.notification{color:#1f7a6f}.step.error{color:#b3261e}
"""
_LEGEND = (
    ("decision", "orchestrator decision"),
    ("revision", "revision of a sub-agent"),
    ("comm", "communication (submit / revise / stop)"),
    ("notification", "notification"),
    ("error", "invalid action"),
    ("finish", "finish"),
)
_STEP_PX = 18


def page_name(episode_id: str) -> str:
    """A file name for an episode that is safe on every filesystem and unique per id."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", episode_id).strip("_")[:80]
    return f"{slug}-{hashlib.sha1(episode_id.encode()).hexdigest()[:8]}.html"


def _mark(kind: str, clock: int, anchor: str, title: str, label: str = "") -> str:
    left = clock * _STEP_PX + (_STEP_PX - 4 if kind == "notification" else 0)  # notifications arrive between steps
    return f'<a class="mark {kind}" style="left:{left}px" href="#{anchor}" title="{escape(title)}">{escape(label)}</a>'


def _decision_kind(d: DecisionRecord) -> str:
    name = (d.action or {}).get("name")
    return {"revise": "revision", "finish": "finish"}.get(name or "", "decision" if d.action else "error")


def _timeline(record: EpisodeRecord) -> tuple[str, int]:
    """The lanes as HTML, and the number of steps they span."""
    lanes: dict[str, list[str]] = {"orchestrator": []}
    end = 0
    for d in record.decisions:
        clock = int(d.meta.get("clock", 0))
        name = (d.action or {}).get("name", "invalid")
        lanes["orchestrator"].append(
            _mark(_decision_kind(d), clock, f"d{d.index}", f"decision {d.index}: {name}", str(d.index))
        )
        for j, s in enumerate(d.segment):
            if s.kind != "notification":
                clock += 1
            kind = s.kind if s.kind in ("comm", "notification", "error") else "step"
            title = f"agent {s.agent_id} v{s.harness_version} {s.kind}: {s.tool or s.text[:80]}"
            lanes.setdefault(f"agent {s.agent_id}", []).append(_mark(kind, clock, f"d{d.index}s{j}", title))
        end = max(end, clock)
    width = (end + 2) * _STEP_PX
    rows = "".join(
        f'<div class="lane"><div class="lane-name">{escape(n)}</div>'
        f'<div class="track" style="width:{width}px">{"".join(m)}</div></div>'
        for n, m in lanes.items()
    )
    return rows, end


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


def _step(s: SubStep, anchor: str) -> str:
    body = escape(s.text if s.kind == "notification" else f"{s.tool or ''} {s.text}".strip())
    obs = f"<pre>{escape(s.observation)}</pre>" if s.observation else ""
    return (
        f'<div class="step {s.kind}" id="{anchor}">agent {s.agent_id} v{s.harness_version} '
        f"<b>{escape(s.kind)}</b> <pre>{body}</pre>{obs}</div>"
    )


def _decision(d: DecisionRecord) -> str:
    name = (d.action or {}).get("name", "invalid")
    context = "".join(
        f"<pre><b>{escape(str(m.get('role')))}</b>: {escape(str(m.get('content')))}</pre>" for m in d.context
    )
    action = json.dumps(d.action, indent=1, ensure_ascii=False) if d.action else d.parse_error or ""
    steps = "".join(_step(s, f"d{d.index}s{j}") for j, s in enumerate(d.segment))
    return (
        f'<details class="{_decision_kind(d)}" id="d{d.index}"><summary>decision {d.index} '
        f"(step {d.meta.get('clock', '?')}): <b>{escape(name)}</b>"
        f"{'' if d.agent_id is None else f' → agent {d.agent_id}'}</summary>"
        f"<details><summary>context ({len(d.context)} messages)</summary>{context}</details>"
        f"<div>action</div><pre>{escape(action)}</pre><div>feedback</div><pre>{escape(d.feedback)}</pre>"
        f"{steps}</details>"
    )


def render_episode(record: EpisodeRecord, prices: Prices | None = None) -> str:
    """One episode as a self-contained HTML page."""
    lanes, steps = _timeline(record)
    o = record.outcome
    status = f'<span class="{"ok" if o.success else "fail"}">{"success" if o.success else "failure"}</span>'
    meta = [
        ("episode", record.episode_id),
        ("task", record.task_id),
        ("environment", record.env),
        ("system", record.system),
        ("seed", str(record.seed)),
        ("config", record.config_hash),
        ("score", f"{o.score:g}"),
        ("reason", o.reason),
        ("steps", str(record.meta.get("steps", steps))),
        ("answer", str(record.meta.get("answer", ""))),
    ]
    rows = "".join(f"<tr><td>{k}</td><td>{escape(v)}</td></tr>" for k, v in meta)
    legend = "".join(f'<span><i class="mark {k}" style="position:static"></i>{v}</span>' for k, v in _LEGEND)
    solo = record.meta.get("segment")  # ReAct: one agent, no decisions
    solo_html = "".join(_step(SubStep(**s), f"s{j}") for j, s in enumerate(solo)) if solo else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(record.episode_id)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{escape(record.episode_id)} — {status}</h1>"
        f'<table class="meta">{rows}</table>{_cost(record, prices)}'
        f'<div class="legend">{legend}</div><div id="timeline">{lanes}</div>'
        f'<h2>Decisions</h2><div id="decisions">{"".join(_decision(d) for d in record.decisions)}{solo_html}</div>'
        "</body></html>"
    )


def write_site(records: Iterable[EpisodeRecord], out_dir: str | Path, prices: Prices | None = None) -> list[Path]:
    """One page per episode plus ``index.html`` linking them; returns the episode pages."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pages, rows = [], []
    for r in records:
        path = out / page_name(r.episode_id)
        path.write_text(render_episode(r, prices), encoding="utf-8")
        pages.append(path)
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in r.cost.values())
        rows.append(
            f'<tr><td><a href="{path.name}">{escape(r.episode_id)}</a></td><td>{escape(r.system)}</td>'
            f'<td class="{"ok" if r.outcome.success else "fail"}">{r.outcome.score:g}</td>'
            f"<td>{len(r.decisions)}</td><td>{tokens}</td><td>{escape(r.outcome.reason[:120])}</td></tr>"
        )
    index = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>episodes</title>'
        f"<style>{_CSS}</style></head><body><h1>{len(pages)} episodes</h1><table><tr><th>episode</th>"
        "<th>system</th><th>score</th><th>decisions</th><th>tokens</th><th>reason</th></tr>"
        f"{''.join(rows)}</table></body></html>"
    )
    (out / "index.html").write_text(index, encoding="utf-8")
    return pages
