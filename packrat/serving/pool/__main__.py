"""An instance process: python -m packrat.serving.pool FD (see child.py)."""

import sys
from multiprocessing.connection import Connection

from packrat.serving.pool.child import main

main(Connection(int(sys.argv[1])))
