"""`python -m draftlab.blend`: the stage's own commands without the `draftlab` table."""

from draftlab.blend.cli import main

raise SystemExit(main())
