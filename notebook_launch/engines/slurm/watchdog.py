"""The process that ends a SLURM job when the notebook that started it dies.

A SIGKILLed kernel runs no cleanup; its ranks would end (their connections to the notebook
close, and ``slurm.task`` then exits), but the job's allocation would stay held, and a job still
waiting in the queue would start later for nobody. So each SLURM launch starts this small process
first (its own session: an interrupt of the notebook does not reach it), with the job's name and a
pipe on its stdin whose write end only the notebook holds. End-of-file on the pipe, whether the
notebook closed it after its own scancel or died, means: cancel every job of that name, then exit.
Standard library only; run as ``python -I path/to/watchdog.py JOB_NAME`` (``slurm.launcher``).
"""
from __future__ import annotations

import getpass
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    job_name = argv[0]
    while os.read(0, 4096):   # the notebook writes nothing; the read returns b"" when it is gone
        pass
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    subprocess.run(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"], env=env,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
