"""An instance process: python -m packrat.serving.pool FD [PARENT_PID] (see child.py)."""

import os
import sys
from multiprocessing.connection import Connection

from packrat.serving.pool.child import main

main(Connection(int(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else None)
# Told to stop, its parent gone, or done reporting why it could not start: exit now. Nothing here
# needs the interpreter's orderly shutdown (the parent owns the shared memory; what loading wrote,
# compiled packages or schedules, was written and closed before), and with torch loaded that
# shutdown takes about half a second, which a pool being closed or reconfigured would wait for.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
