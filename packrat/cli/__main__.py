"""`python -m packrat.cli ...`: the same as the `packrat` command."""
import sys

from packrat.cli.main import main

sys.exit(main())
