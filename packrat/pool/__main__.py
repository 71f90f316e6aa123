"""An instance process: python -m packrat.pool FD (see child.py)."""

import sys
from multiprocessing.connection import Connection

from .child import main

main(Connection(int(sys.argv[1])))
