"""A worker that always fails right after 'restoring' step 5: a crash loop.

goodput launch --nproc 1 --max-restarts 8 --crash-loop 2 --run-dir DIR -- tests/scripts/crashloop_worker.py
"""

import os

from goodput.job.crashloop import CrashLoopDetector

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
detector = CrashLoopDetector(
    os.environ["GOODPUT_RUN_DIR"], attempt, limit=int(os.environ["GOODPUT_CRASH_LOOP"])
)
detector.check()
detector.start(5)
raise RuntimeError("this worker fails every time")
