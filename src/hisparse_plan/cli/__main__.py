"""`python -m hisparse_plan.cli`, the same as the `hisparse-plan` command."""

import sys

from hisparse_plan.cli.launch import main

sys.exit(main())
