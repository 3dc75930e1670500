"""Stops what a driver started when the driver itself is killed (kill -9 gives it no chance to).

    python -m qeval.run.executors.reaper DRIVER_PID PID:START_TIME ...

The ray executor starts one of these, in a session of its own, right after it started a local
Ray: it waits for the driver to exit and then kills the listed processes that are still the
same processes (pid and start time). Ray's GCS and raylet share the driver's fate already, but
its dashboard and runtime-env agents outlived a killed driver by more than 50 s (measured:
they report the raylet's death to the dead GCS and wait out its timeout). After a normal exit
`ray.shutdown()` has stopped them all, and the reaper finds nothing left to stop."""

from __future__ import annotations

import sys
import time

import psutil

POLL_S = 0.2


def main(argv: list[str]) -> int:
    driver = int(argv[0])
    targets = [tuple(map(float, a.split(":"))) for a in argv[1:]]
    while psutil.pid_exists(driver) and psutil.Process(driver).status() != psutil.STATUS_ZOMBIE:
        time.sleep(POLL_S)
    for pid, started in targets:
        try:
            proc = psutil.Process(int(pid))
            if abs(proc.create_time() - started) < 0.01:  # not a new process that reused the pid
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
