"""The trajectory viewer: self-contained pages whose timeline a real browser (headless Chromium) renders."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from porch_jax.eval.viewer import page_name, render_episode, write_site
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, Outcome, RoleCost, SubStep, TrajectoryStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPO = Path(__file__).resolve().parents[2]


def _record(episode_id: str = "proactive/task<1>", success: bool = True) -> EpisodeRecord:
    seg0 = [
        SubStep(0, 0, "tool", "<tool_call>search</tool_call>", "search", "found <b>x</b>"),
        SubStep(0, 0, "notification", "User: also invite Greg"),
        SubStep(0, 0, "comm", "<tool_call>revise</tool_call>", "revise"),
    ]
    seg1 = [SubStep(0, 1, "tool", "", "calendar_add", "ok"), SubStep(0, 1, "comm", "", "submit")]
    decisions = [
        DecisionRecord(
            0,
            [{"role": "system", "content": "You orchestrate."}, {"role": "user", "content": "task"}],
            "<tool_call>delegate</tool_call>",
            [],
            [],
            {"name": "delegate", "arguments": {}},
            "[agent 0 revise]",
            0,
            seg0,
            meta={"clock": 0},
        ),
        DecisionRecord(
            1,
            [],
            "<tool_call>revise</tool_call>",
            [],
            [],
            {"name": "revise", "arguments": {"agent_id": 0}},
            "[agent 0 submit]",
            0,
            seg1,
            meta={"clock": 2},
        ),
        DecisionRecord(2, [], "oops", [], [], None, "invalid", None, [], parse_error="no tool call", meta={"clock": 4}),
        DecisionRecord(
            3,
            [],
            "<tool_call>finish</tool_call>",
            [],
            [],
            {"name": "finish", "arguments": {}},
            "",
            None,
            [],
            meta={"clock": 4},
        ),
    ]
    return EpisodeRecord(
        episode_id=episode_id,
        task_id="task<1>",
        env="gaia2",
        system="proactive",
        config_hash="abc",
        seed=0,
        outcome=Outcome(success, float(success), "judge: success"),
        cost={"orchestrator": RoleCost(4, 1000, 200), "subagent": RoleCost(4, 3000, 100)},
        decisions=decisions,
        meta={"steps": 4, "answer": "done & dusted"},
    )


def test_page_marks_decisions_revisions_and_messages_and_is_self_contained():
    html = render_episode(_record(), prices={"orchestrator": (1.0, 2.0), "subagent": (0.5, 1.0)})
    timeline = html.split('<div id="timeline">')[1].split("<h2>")[0]
    assert timeline.count('class="mark revision"') == 1 and timeline.count('class="mark comm"') == 2
    assert timeline.count('class="mark notification"') == 1 and timeline.count('class="mark error"') == 1
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html  # observations are escaped
    assert "done &amp; dusted" in html and "<th>3.0000</th>" in html  # (1.0 + 0.4) + (1.5 + 0.1)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from a network


def test_site_writes_one_page_per_episode_and_an_index(tmp_path):
    store = TrajectoryStore(tmp_path / "episodes.jsonl")
    store.append_many([_record("a/1"), _record("a/2", success=False)])
    subprocess.run(
        [sys.executable, "-m", "launch.view", f"--store={store.path}", f"--out={tmp_path / 'site'}"],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    names = sorted(p.name for p in (tmp_path / "site").iterdir())
    assert names == sorted(["index.html", page_name("a/1"), page_name("a/2")])
    index = (tmp_path / "site" / "index.html").read_text()
    assert f'href="{page_name("a/2")}"' in index and 'class="fail"' in index


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,900",
]


def _chromium(tmp_path: Path, *args: str) -> str:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout


def _probe(tmp_path: Path, page: Path, script: str, fragment: str = "") -> dict:
    """Runs ``script`` in Chromium after the page's own script, beside the page (links resolve the same); the
    script returns a JSON-able value, read back from the dumped DOM."""
    probe = page.with_name(f"probe-{page.name}")
    js = (
        "<pre id=probe></pre><script>document.getElementById('probe').textContent="
        f"JSON.stringify((function(){{{script}}})())</script>"
    )
    probe.write_text(page.read_text().replace("</body>", js + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri() + fragment)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found and found.group(1), dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get install -y chromium")
def test_headless_chromium_renders_the_timeline_across_the_page(tmp_path):
    page = write_site([_record()], tmp_path / "site")[0]
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    timeline = re.search(r'<div id="timeline">(.*?)</div></div></div>', dom, re.S)
    assert timeline, dom[:2000]
    lanes = re.findall(r'<div class="lane-name">([^<]+)</div>', dom)
    assert lanes == ["step", "orchestrator", "agent 0"]
    assert len(re.findall(r'class="mark ', timeline.group(0))) == 4 + 5  # decisions + sub-agent steps
    sizes = _probe(
        tmp_path,
        page,
        "var r=function(q){return document.querySelector(q).getBoundingClientRect();};"
        "var marks=[].map.call(document.querySelectorAll('#timeline .mark'),function(m){"
        "return m.getBoundingClientRect().right;});"
        "return {viewport:innerWidth,timeline:r('#timeline').width,track:r('.lane:not(.axis) .track').width,"
        "right:Math.max.apply(null,marks)};",
    )
    assert sizes["viewport"] == 1400
    assert sizes["timeline"] >= 0.8 * sizes["viewport"] and sizes["track"] >= 0.75 * sizes["viewport"]
    assert sizes["right"] >= 0.5 * sizes["viewport"]  # marks spread over the width, not crowded at its left
    shot = tmp_path / "page.png"
    _chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get install -y chromium")
def test_headless_chromium_sorts_and_filters_the_index(tmp_path):
    records = []
    for i, (system, score) in enumerate([("alpha", 1.0), ("beta", 0.0), ("alpha", 2 / 3), ("beta", 0.5)]):
        r = _record(f"{system}/{i}", success=score == 1.0)
        r.system, r.outcome = system, Outcome(score == 1.0, score, "ok" if score == 1.0 else "failed: answer")
        records.append(r)
    write_site(records, tmp_path / "site")
    seen = _probe(
        tmp_path,
        tmp_path / "site" / "index.html",
        "var heads=[].slice.call(document.querySelectorAll('#episodes th'));"
        "function col(name){var i=heads.indexOf(document.querySelector('th[data-col='+name+']'));"
        "return [].filter.call(document.querySelectorAll('#episodes tbody tr'),function(r){return !r.hidden;})"
        ".map(function(r){return r.cells[i].textContent;});}"
        "function click(name){document.querySelector('th[data-col='+name+'] button').click();}"
        "var out={fromHash:col('outcome'),shown:document.getElementById('shown').textContent};"
        "document.getElementById('reset').click();"
        "click('score');out.asc=col('score');click('score');out.desc=col('score');"
        "var s=document.getElementById('filter-system');s.value='beta';s.dispatchEvent(new Event('change'));"
        "out.beta=col('episode');out.hash=location.hash;return out;",
        fragment="#outcome=failure",
    )
    assert seen["fromHash"] == ["failure"] * 3 and seen["shown"] == "3"  # filters read from the address
    assert seen["asc"] == ["0.00", "0.50", "0.67", "1.00"]
    assert seen["desc"] == ["1.00", "0.67", "0.50", "0.00"]
    assert seen["beta"] == ["beta/3", "beta/1"] and seen["hash"] == "#system=beta"  # sorted by score, descending
