"""Notebook 02: a blend from a YAML spec (`draftlab blend`).

The names below are the stage's public API; other stages import only these."""

from draftlab.blend.bench import (  # noqa: F401
    bench_blend,
    synthetic_raw_rows,
)
from draftlab.blend.pipeline import (  # noqa: F401
    BlendResult,
    blend,
    histogram_bins,
    length_stats,
    plot_report,
    read_blend,
    resolve_tokenizer,
    run_pipeline,
    write_parquet,
)
from draftlab.blend.spec import (  # noqa: F401
    DEFAULTS,
    EVAL_SETS,
    KINDS,
    RULES,
    SOURCE_KEYS,
    SPLITS,
    TOP_KEYS,
    BlendSpecError,
    load_source,
    load_spec,
    quotas,
    spec_sha256,
)
from draftlab.blend.text import (  # noqa: F401
    Contamination,
    NearDuplicates,
    TokenCounter,
    dedup_text,
    split_key,
    split_of,
)
