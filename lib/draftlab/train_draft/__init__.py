"""Notebook 04: EAGLE-3 (and EAGLE-1-style) draft training with training-time test (`draftlab train`, `export`).

The names below are the stage's public API; other stages import only these."""

from draftlab.train_draft.checkpoint import (  # noqa: F401
    RESUME_FREE,
    Logs,
    find_checkpoint,
    load_checkpoint_draft,
    save_checkpoint,
    summarize,
)
from draftlab.train_draft.config import (  # noqa: F401
    TrainConfig,
)
from draftlab.train_draft.figures import (  # noqa: F401
    plot_step_accuracy,
    plot_training,
    read_logs,
)
from draftlab.train_draft.loop import (  # noqa: F401
    train,
)
from draftlab.train_draft.objective import (  # noqa: F401
    ATTENTION_KERNELS,
    LOSSES,
    OBJECTIVE_VARIANTS,
    Features,
    Targets,
    TTTObjective,
    attention_kernel,
    collate,
    dist_info,
    epoch_plans,
    plan_epoch,
    targets_at,
)
from draftlab.train_draft.parallel import (  # noqa: F401
    child_env,
    cli_args,
    precompute_first,
    tokenize_first,
)
