"""Progress while ``reproci run`` runs: the worker's step lines, and the live bar they feed."""

from __future__ import annotations

import io
from collections import deque

from rich.console import Console

from reproci.backends.base import take_line
from reproci.reports.progress import RunProgress
from reproci.worker.process import progress


def test_step_lines_are_throttled_but_the_last_step_always_goes_out(capsys, monkeypatch):
    clock = iter([0.0, 0.1, 0.2, 0.7, 0.8, 0.9])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    line = progress.StepLine(stop=6)
    for step in range(1, 7):
        line(step)
    out = capsys.readouterr().out.splitlines()
    assert out == ["@reproci:step 1/6", "@reproci:step 4/6", "@reproci:step 6/6"]
    assert [progress.parse(x) for x in out] == [(1, 6), (4, 6), (6, 6)]


def test_other_output_is_not_progress():
    assert progress.parse("step 3/4") is None and progress.parse("@reproci:step x/4") is None


def test_backends_route_step_lines_away_from_the_log_tail():
    tail: deque[str] = deque(maxlen=5)
    heard: list[tuple[int, int]] = []
    for line in ["loading", "@reproci:step 2/9", "Traceback", "@reproci:step 9/9"]:
        take_line(line, tail, lambda s, n: heard.append((s, n)))
    assert list(tail) == ["loading", "Traceback"] and heard == [(2, 9), (9, 9)]
    take_line("@reproci:step 3/9", tail, None)  # nobody listening: dropped, not logged
    assert list(tail) == ["loading", "Traceback"]


def test_a_terminal_shows_a_bar_per_run_with_its_step_count():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RunProgress(console, log=False) as p:
        p("conv: run A started (30 steps)")
        p.step("conv", "A", 12, 30)
        assert [t.description for t in p._bar.tasks] == ["conv: run A started (30 steps) (0 runs done)",  # type: ignore[union-attr]
                                                          "  conv run A"]
        assert p._bar.tasks[1].completed == 12  # type: ignore[union-attr]
        p.step("conv", "A", 30, 30)
        p("conv: run A done: 30 steps, 40.0 steps/s, 1.0 s")
        assert len(p._bar.tasks) == 1 and p.finished == 1  # type: ignore[union-attr]


def test_a_log_gets_one_line_per_event_and_no_step_counts():
    out = io.StringIO()
    with RunProgress(Console(file=out, width=80), log=True) as p:
        p("conv: run A started (30 steps)")
        p.step("conv", "A", 12, 30)
        p("conv: run A done: 30 steps, 40.0 steps/s, 1.0 s")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("] conv: run A started (30 steps)")
    assert lines[1].startswith("[") and " s] conv: run A done: 30 steps" in lines[1]


def test_a_long_run_in_a_log_says_where_it_is_every_30_seconds(monkeypatch):
    from reproci.reports import progress as run_progress

    now = [0.0]
    monkeypatch.setattr(run_progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with RunProgress(Console(file=out, width=80), log=True) as p:
        p("conv: run A started (300 steps)")
        for step, t in ((10, 5.0), (40, 29.0), (90, 34.0), (120, 45.0), (200, 62.0), (250, 76.0), (300, 95.0)):
            now[0] = t
            p.step("conv", "A", step, 300)
    lines = out.getvalue().splitlines()
    # 30 s after its first step line, then every 30 s; never once it has reached its last step
    assert lines == ["[    0.0 s] conv: run A started (300 steps)", "[   45.0 s] conv: run A at step 120/300",
                     "[   76.0 s] conv: run A at step 250/300"]
