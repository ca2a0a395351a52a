"""`python -m draftlab.regenerate`: the stage's own commands without the `draftlab` table."""

from draftlab.regenerate.cli import main

raise SystemExit(main())
