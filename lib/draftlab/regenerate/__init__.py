"""Notebook 03: the target answers every prompt again, resumable and monitored (`draftlab regenerate`, `monitor`).

The names below are the stage's public API; other stages import only these."""

from draftlab.regenerate.batch import (  # noqa: F401
    generate_turns,
    plan_batches,
    regenerate_batch,
    sweep_batch_sizes,
)
from draftlab.regenerate.client import (  # noqa: F401
    ChatClient,
    Endpoint,
    RequestFailed,
    ServerPool,
    parse_completion,
    reason_kind,
)
from draftlab.regenerate.config import (  # noqa: F401
    RETRY_STATUS,
    SYSTEM_POLICIES,
    TRUNCATION_POLICIES,
    RegenConfig,
    load_conversations,
    plan_turns,
    slots,
)
from draftlab.regenerate.outputs import (  # noqa: F401
    IDENTITY_FIELDS,
    JsonlAppender,
    Outputs,
    Progress,
    RunStats,
    WorkLock,
    WorkState,
    build_row,
    finalize,
    outcome,
    repair_jsonl,
    scan_work,
    shard_paths,
    write_manifest,
)
from draftlab.regenerate.stage import (  # noqa: F401
    regenerate,
    regenerate_async,
    regenerate_row,
    regenerate_splits,
    run_sync,
)
