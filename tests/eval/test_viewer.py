"""The trajectory viewer: self-contained pages whose timeline a real browser (headless Chromium) renders."""

from __future__ import annotations

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


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get install -y chromium")
def test_headless_chromium_renders_the_timeline(tmp_path):
    page = write_site([_record()], tmp_path / "site")[0]
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180
    ).stdout
    timeline = re.search(r'<div id="timeline">(.*?)</div></div></div>', dom, re.S)
    assert timeline, dom[:2000]
    lanes = re.findall(r'<div class="lane-name">([^<]+)</div>', dom)
    assert lanes == ["orchestrator", "agent 0"]
    assert len(re.findall(r'class="mark ', timeline.group(0))) == 4 + 5  # decisions + sub-agent steps
    shot = tmp_path / "page.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1000,700", page.as_uri()],
        capture_output=True,
        timeout=180,
    )
    assert shot.exists() and shot.stat().st_size > 1000
