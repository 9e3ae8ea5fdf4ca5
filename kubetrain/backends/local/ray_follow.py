"""Follow a Ray job's driver output into stdout (node 0's log), as KubeRay's submitter follows
it with ``ray job logs --follow``, but through Ray's SDK (``JobSubmissionClient.tail_job_logs``)
rather than that CLI: the CLI, once the log ends, prints the job's status with Ray's banners
and, for a failed job, Ray's message, which repeats the driver's last lines (ray 2.60
``dashboard/modules/job/cli.py`` ``_tail_logs`` then ``_log_job_status``). Here the driver's
lines are written once; the job's end is said by the supervisor in one line of its own. Ray's
client logs to stderr (e.g. "INFO sdk.py -- WebSocket closed for job ..."): the supervisor
sends that to a file of its own, not to node 0's log.

Run as ``python -m kubetrain.backends.local.ray_follow DASHBOARD_URL SUBMISSION_ID``; exits 0
once Ray closes the log (the job ended), 1 with one ``kubetrain:`` line on stdout when it cannot
follow.
"""

from __future__ import annotations

import asyncio
import sys
from typing import BinaryIO

from kubetrain.errors import terminal_text


async def follow(dashboard_url: str, submission_id: str, out: BinaryIO) -> None:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard_url)
    async for chunk in client.tail_job_logs(submission_id):
        # Bytes as UTF-8, whatever this process's locale: the driver's text as Ray sends it.
        out.write(chunk.encode(errors="replace"))
        out.flush()


def main(argv: list[str]) -> int:
    dashboard_url, submission_id = argv
    try:
        asyncio.run(follow(dashboard_url, submission_id, sys.stdout.buffer))
    except Exception as error:  # noqa: BLE001 - any failure to follow, said in one line
        said = " ".join(str(error).split())
        print(
            terminal_text(
                f"kubetrain: cannot follow the Ray job's log: {type(error).__name__}: {said}"
            )
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
