"""A worker that never uses Run and leaves a grandchild in a session of its own: only the launcher can end them.

goodput launch --run-dir DIR --grace 2s -- tests/scripts/sleeper.py
"""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
if os.environ.get("RANK", "0") == "0":
    with open(os.path.join(os.environ["GOODPUT_RUN_DIR"], "training"), "w") as f:
        f.write(str(child.pid))
while True:
    time.sleep(3600)
