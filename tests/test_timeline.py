from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuheal.core.models.base import Stage
from gpuheal.core.models.result import StageRecord
from gpuheal.core.render import render_timeline

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def test_timeline_rows_and_bars_scale_with_duration() -> None:
    stages = [
        StageRecord(stage=Stage.TRIAGE, started_at=T0 + timedelta(seconds=1), ended_at=T0 + timedelta(seconds=2)),
        StageRecord(stage=Stage.VERIFY, started_at=T0 + timedelta(seconds=2), ended_at=T0 + timedelta(seconds=10)),
    ]
    text = render_timeline(stages, T0, width=10)
    lines = text.splitlines()
    assert lines[1].startswith("detect+start") and "1.0s" in lines[1]
    verify = next(line for line in lines if line.startswith("verify_resume"))
    assert verify.count("█") == 8  # 8 of 10 s
    assert "8.0s" in verify
