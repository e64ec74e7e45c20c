"""The index page of a viewer site: a per-system summary, then every episode in one sortable, filterable table.

A store of a few hundred rollouts is read to answer questions such as "which failures are invalid replies?" or
"what does this system spend per task?", so the summary comes first and the table can be sorted (click a column
header) and filtered by system, outcome, failure reason and invalid-reply kind. Filters are kept in the address's
fragment (``index.html#system=proactive&outcome=failure``), so a results page or a note can link a filtered view.
The page stays self-contained: inline CSS and a small vanilla script, no network, so it works from ``file://``.
All record text is escaped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from porch_jax.trajectories import EpisodeRecord, Outcome

OUTCOMES = ("success", "failure", "retryable")
ANY_KIND = "*"  # the error-kind filter's value for "any invalid reply"

INDEX_CSS = """
.summary td,.summary th{text-align:right}.summary td:first-child,.summary th:first-child{text-align:left}
.summary{margin:8px 0 16px}.summary tr.all{border-top:1px solid #999;font-weight:600}
.filters{display:flex;flex-wrap:wrap;gap:12px;align-items:end;margin:8px 0;padding:8px;background:#f4f6f9}
.filters label{display:flex;flex-direction:column;font-size:12px;color:#555}
.filters select,.filters input{font:inherit;min-width:140px}
#episodes{width:100%}#episodes tbody tr:nth-child(even){background:#fafafa}#episodes tbody tr:hover{background:#eef3fb}
#episodes th button{font:inherit;font-weight:600;border:0;background:none;padding:0;cursor:pointer}
#episodes th[aria-sort=ascending] button::after{content:" \\25B2"}
#episodes th[aria-sort=descending] button::after{content:" \\25BC"}
#episodes td.num,#episodes th.num{text-align:right}#episodes td.reason{max-width:40em;overflow-wrap:anywhere}
.retry{color:#8a6d00}.back{font-size:13px;margin-bottom:8px;display:block}
"""

# Sorts by the clicked header (numbers by data-v, text naturally: "t2" before "t10"), filters by the selects, and
# mirrors the filters in location.hash. Record values reach it only through escaped attributes, never as code.
_SCRIPT = """
(function(){
var table=document.getElementById('episodes'),body=table.tBodies[0],rows=[].slice.call(body.rows);
var heads=[].slice.call(table.tHead.rows[0].cells),shown=document.getElementById('shown');
var controls=[].slice.call(document.querySelectorAll('[data-filter]'));
function value(r,i){var c=r.cells[i];return c.hasAttribute('data-v')?c.getAttribute('data-v'):c.textContent;}
heads.forEach(function(th,i){th.querySelector('button').addEventListener('click',function(){
  var asc=th.getAttribute('aria-sort')!=='ascending',num=th.classList.contains('num');
  heads.forEach(function(h){h.removeAttribute('aria-sort');});
  th.setAttribute('aria-sort',asc?'ascending':'descending');
  rows.sort(function(a,b){var x=value(a,i),y=value(b,i);
    var d=num?parseFloat(x)-parseFloat(y):x.localeCompare(y,undefined,{numeric:true});return asc?d:-d;});
  rows.forEach(function(r){body.appendChild(r);});
});});
function keep(r,c){var v=c.value,f=c.getAttribute('data-filter');if(!v)return true;
  if(f==='text')return r.textContent.toLowerCase().indexOf(v.toLowerCase())>=0;
  if(f==='kinds'){var k=r.getAttribute('data-kinds');return v==='*'?k!=='':k.split('|').indexOf(v)>=0;}
  return r.getAttribute('data-'+f)===v;}
function apply(){var n=0,hash=[];
  rows.forEach(function(r){var ok=controls.every(function(c){return keep(r,c);});r.hidden=!ok;n+=ok;});
  controls.forEach(function(c){if(c.value)hash.push(c.getAttribute('data-filter')+'='+encodeURIComponent(c.value));});
  shown.textContent=n;history.replaceState(null,'',hash.length?'#'+hash.join('&'):location.pathname);}
location.hash.slice(1).split('&').forEach(function(p){var kv=p.split('='),
  c=document.querySelector('[data-filter="'+kv[0]+'"]');if(c&&kv.length===2)c.value=decodeURIComponent(kv[1]);});
controls.forEach(function(c){c.addEventListener(c.tagName==='INPUT'?'input':'change',apply);});
document.getElementById('reset').addEventListener('click',function(){
  controls.forEach(function(c){c.value='';});apply();});
apply();
})();
"""


def tokens(record: EpisodeRecord) -> int:
    """Every call of every role, prompt and completion: what the episode cost."""
    return sum(c.prompt_tokens + c.completion_tokens for c in record.cost.values())


def outcome_label(outcome: Outcome) -> str:
    """success, failure or retryable (a placeholder whose backend could not answer: neither a success nor a
    failure of the policy)."""
    return "retryable" if outcome.retryable else "success" if outcome.success else "failure"


def reason_kind(outcome: Outcome) -> str:
    """The reason's leading label, with the exception class for errors and quoted values and numbers masked, so
    reasons group into a short list: "failed: text Greg the phone" is "failed", "error: TimeoutError: ..." is
    "error: TimeoutError", "expected '4', got '5'" is "expected …, got …"."""
    head, rest = re.match(r"([^:;]*)[:;]?(.*)", outcome.reason, re.S).groups()
    head = head.strip()
    if head in ("error", "backend_unavailable"):
        exc = re.match(r"\s*([A-Za-z_][\w.]*)\s*:", rest)
        if exc:
            head = f"{head}: {exc.group(1)}"
    masked = re.sub(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?", "…", head)
    return masked[:60] or "(none)"


def error_kinds(record: EpisodeRecord) -> Counter[str]:
    """Invalid replies by "role: kind", as the engine counts them in ``meta["invalid_kinds"]`` (the ProtocolError
    class names). A record without those counts (scripted or hand-built) falls back to what it shows: decisions with
    a ``parse_error`` ("orchestrator: invalid") and sub-agent steps of kind "error" ("subagent: error")."""
    counted = record.meta.get("invalid_kinds")
    if isinstance(counted, dict):
        return Counter(
            {f"{role}: {kind}": n for role, kinds in counted.items() for kind, n in (kinds or {}).items() if n}
        )
    out: Counter[str] = Counter()
    for d in record.decisions:
        out["orchestrator: invalid"] += d.parse_error is not None
        out["subagent: error"] += sum(s.kind == "error" for s in d.segment)
    return +out


@dataclass(frozen=True)
class SystemSummary:
    """One system's finished episodes (retryable attempts are placeholders, counted apart)."""

    system: str
    episodes: int
    tasks: int
    successes: int
    mean_score: float
    tokens_per_task: float
    decisions_per_task: float
    invalid_replies: int
    retryable: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def _summarize(system: str, records: Sequence[EpisodeRecord]) -> SystemSummary:
    done = [r for r in records if not r.outcome.retryable]
    n = max(len(done), 1)
    return SystemSummary(
        system=system,
        episodes=len(done),
        tasks=len({r.task_id for r in done}),
        successes=sum(r.outcome.success for r in done),
        mean_score=sum(r.outcome.score for r in done) / n,
        tokens_per_task=sum(tokens(r) for r in done) / n,
        decisions_per_task=sum(len(r.decisions) for r in done) / n,
        invalid_replies=sum(sum(error_kinds(r).values()) for r in done),
        retryable=len(records) - len(done),
    )


def system_summaries(records: Sequence[EpisodeRecord]) -> list[SystemSummary]:
    """One row per system, by name; then "all systems" when there are several."""
    by_system: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        by_system.setdefault(r.system, []).append(r)
    rows = [_summarize(s, by_system[s]) for s in sorted(by_system)]
    return rows + [_summarize("all systems", records)] if len(rows) > 1 else rows


def _summary_table(rows: Sequence[SystemSummary]) -> str:
    head = (
        "<tr><th>system</th><th>episodes</th><th>tasks</th><th>successes</th><th>success rate</th>"
        "<th>mean score</th><th>tokens / task</th><th>decisions / task</th><th>invalid replies</th>"
        "<th>retryable attempts</th></tr>"
    )
    body = "".join(
        f"<tr{' class=all' if i == len(rows) - 1 and len(rows) > 1 else ''}><td>{escape(s.system or '(none)')}"
        f"</td><td>{s.episodes}</td><td>{s.tasks}</td><td>{s.successes}</td><td>{s.success_rate:.2f}</td>"
        f"<td>{s.mean_score:.2f}</td><td>{s.tokens_per_task:,.0f}</td><td>{s.decisions_per_task:.1f}</td>"
        f"<td>{s.invalid_replies}</td><td>{s.retryable}</td></tr>"
        for i, s in enumerate(rows)
    )
    return f'<table class="summary" id="summary"><thead>{head}</thead><tbody>{body}</tbody></table>'


def _select(
    name: str, label: str, counts: Counter[str], extra: Sequence[tuple[str, str]] = (), order: Sequence[str] = ()
) -> str:
    """A filter over one row attribute: "all", then ``extra``, then each value (``order``, else sorted) with its
    count."""
    values = order or sorted(counts)
    options = [("", "all"), *extra] + [(v, f"{v or '(none)'} ({counts[v]})") for v in values]
    opts = "".join(f'<option value="{escape(v)}">{escape(t)}</option>' for v, t in options)
    return f'<label>{label}<select data-filter="{name}" id="filter-{name}">{opts}</select></label>'


_COLUMNS = (  # (header, numeric)
    ("episode", False),
    ("system", False),
    ("task", False),
    ("outcome", False),
    ("score", True),
    ("decisions", True),
    ("steps", True),
    ("tokens", True),
    ("invalid", True),
    ("reason", False),
)


def _row(record: EpisodeRecord, href: str) -> str:
    o, kinds = record.outcome, error_kinds(record)
    label, n_tokens = outcome_label(o), tokens(record)
    css = {"success": "ok", "failure": "fail", "retryable": "retry"}[label]
    steps = record.meta.get("steps")
    steps_cell = f'<td class="num" data-v="{steps}">{steps}</td>' if isinstance(steps, int) else '<td data-v="-1"></td>'
    kinds_title = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))
    return (
        f'<tr data-system="{escape(record.system)}" data-outcome="{label}" data-reason="{escape(reason_kind(o))}" '
        f'data-kinds="{escape("|".join(sorted(kinds)))}">'
        f'<td><a href="{escape(href)}">{escape(record.episode_id)}</a></td><td>{escape(record.system)}</td>'
        f'<td>{escape(record.task_id)}</td><td class="{css}">{label}</td>'
        f'<td class="num {css}" data-v="{o.score!r}">{o.score:.2f}</td>'
        f'<td class="num" data-v="{len(record.decisions)}">{len(record.decisions)}</td>{steps_cell}'
        f'<td class="num" data-v="{n_tokens}">{n_tokens:,}</td>'
        f'<td class="num" data-v="{sum(kinds.values())}" title="{escape(kinds_title)}">{sum(kinds.values())}</td>'
        f'<td class="reason" title="{escape(o.reason[:2000])}">{escape(o.reason[:160])}</td></tr>'
    )


def _natural(text: str) -> list[tuple[int, int | str]]:
    return [(1, int(p)) if p.isdigit() else (0, p) for p in re.split(r"(\d+)", text) if p]


def render_index(
    pages: Sequence[tuple[EpisodeRecord, str]], css: str, title: str | None = None, results_href: str | None = None
) -> str:
    """The index of ``pages`` (each record with its page's href), in system, task, episode order; ``css`` is the
    episode pages' style, so the site reads as one.

    ``title`` heads the page (default "episodes"); ``results_href``, when given, is linked above it, so a run's
    results page and its episodes link each other.
    """
    records = [r for r, _ in pages]
    ordered = sorted(pages, key=lambda p: (p[0].system, _natural(p[0].task_id), _natural(p[0].episode_id)))
    systems = Counter(r.system for r in records)
    heading = title or "episodes"
    back = f'<a class="back" href="{escape(results_href)}">← results</a>' if results_href else ""
    filters = (
        '<div class="filters">'
        + _select("system", "system", systems)
        + _select("outcome", "outcome", Counter(outcome_label(r.outcome) for r in records), order=OUTCOMES)
        + _select("reason", "failure reason", Counter(reason_kind(r.outcome) for r in records if not r.outcome.success))
        + _select(
            "kinds",
            "invalid-reply kind",
            Counter(k for r in records for k in error_kinds(r)),
            [(ANY_KIND, f"any ({sum(bool(error_kinds(r)) for r in records)})")],
        )
        + '<label>search<input data-filter="text" id="filter-text" type="search" '
        'placeholder="id, task, reason"></label>'
        + f'<button type="button" id="reset">clear filters</button><span><b id="shown">{len(records)}</b> of '
        f"{len(records)} shown</span></div>"
    )
    head = "".join(
        f'<th{" class=num" if num else ""} data-col="{name}"><button type="button">{name}</button></th>'
        for name, num in _COLUMNS
    )
    rows = "".join(_row(r, href) for r, href in ordered)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{css}{INDEX_CSS}</style></head>'
        f"<body>{back}<h1>{escape(heading)}</h1><p>{len(records)} episodes from {len(systems)} "
        f"system{'s' * (len(systems) != 1)}. Click a column header to sort; filters are kept in the address.</p>"
        f"{_summary_table(system_summaries(records))}{filters}"
        f'<table id="episodes"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
        f"<script>{_SCRIPT}</script></body></html>"
    )
