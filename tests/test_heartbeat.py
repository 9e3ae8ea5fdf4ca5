"""The trainer's progress records state their heartbeat: within how long rank 0's next line
comes (issue 28: `wait` derives its stall timeout from it instead of waiting 30 minutes for a
hung rank)."""

from __future__ import annotations

from kubetrain.progress import Progress, format_record, parse_record
from kubetrain.train import progress


def test_each_record_but_an_epochs_last_promises_the_next_line(monkeypatch, capsys) -> None:
    """At least HEARTBEAT_SECONDS; the interval plus the slowest batch yet when that is more
    (a record is written at the end of the first batch after its interval); none at the
    epoch's last batch, which validation and a checkpoint follow."""
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress.PlainReporter, "RECORD_SECONDS", 10.0)
    reporter = progress.PlainReporter()
    reporter.start_epoch(1, 2, 6)
    for seconds in (1, 12, 1, 90, 1, 1):
        clock[0] += seconds
        reporter.advance(lambda: progress.SoFar(step=1, loss=0.5, samples=32))
    records = [parse_record(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r.batch, r.heartbeat_seconds) for r in records] == [
        (2, 60.0),  # 10 s + 12 s is less than a minute
        (4, 100.0),  # 10 s + the 90 s batch
        (6, None),
    ]


def test_a_record_without_a_heartbeat_or_with_a_bad_one() -> None:
    base = Progress(1, 2, 3, 10, 3, 0.5, 100.0)
    assert parse_record(format_record(base)).heartbeat_seconds is None
    line = format_record(base).replace("}", ',"heartbeat_seconds":60.0}')
    assert parse_record(line).heartbeat_seconds == 60.0
    for bad in ("0", "-5", '"60"', "true", "1e999"):
        assert (
            parse_record(format_record(base).replace("}", f',"heartbeat_seconds":{bad}}}')) is None
        )
