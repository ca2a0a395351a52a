"""The reference speculative-decoding engine shared by notebooks 05, 06 and 07 (chain and tree, EAGLE3 and EAGLE modes).

The names below are the stage's public API; other stages import only these."""

from draftlab.engine.runners import (  # noqa: F401
    MODES,
    TREE_ATTENTION,
    DraftRunner,
    Graphed,
    SlotCache,
    SpecConfig,
    TargetRunner,
    build_mask,
)
from draftlab.engine.runs import (  # noqa: F401
    chain_sweep,
    compare,
    encode_prompts,
    graphed_engine,
    public,
    run_prompts,
    summarize,
)
from draftlab.engine.spec import (  # noqa: F401
    PromptResult,
    SpecEngine,
)
