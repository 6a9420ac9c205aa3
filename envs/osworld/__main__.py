"""`python -m envab.envs.osworld`: freeze an OSWorld folder or a tasks.jsonl (source.py)."""

import sys

from envab.envs.osworld.source import main

sys.exit(main())
