"""Notebook 07: acceptance vs number of training conversations for both architectures, fitted and extrapolated.

The names below are the stage's public API; other stages import only these."""

from draftlab.data_scaling.evaluate import (  # noqa: F401
    HeldOut,
    chain_acceptance,
    heldout_prompts,
    load_val,
    simulated_acceptance,
)
from draftlab.data_scaling.figures import (  # noqa: F401
    extrapolation_table,
    findings,
    fits_as_dict,
    plot_chain_scaling,
    plot_extrapolation,
    plot_scaling,
    print_notes,
    print_plan,
    print_regeneration,
    study_findings,
    study_metrics,
    summary_table,
)
from draftlab.data_scaling.fits import (  # noqa: F401
    MODELS,
    Fit,
    chain_ceiling,
    extrapolate,
    fit_all,
    fit_curve,
    logistic,
    loglinear,
    regen_throughput,
    saturating,
    sim_ceiling,
)
from draftlab.data_scaling.plan import (  # noqa: F401
    ARCHS,
    NOT_IN_KEY,
    RECIPE_KEYS,
    ScalingError,
    StudyPlan,
    done_keys,
    load_results,
    prepare,
    recipe_from_04,
    settings_key,
)
from draftlab.data_scaling.sglang_curve import read_size_curve, size_curve_figures, size_curve_lines  # noqa: F401
from draftlab.data_scaling.study import (  # noqa: F401
    StudySettings,
    points_from_04,
    run_study,
    study_settings,
    work_items,
)
