"""``python -m shardkit`` runs the command line."""

import sys

from shardkit.cli import main

sys.exit(main())
